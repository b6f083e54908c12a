"""Where an iteration's time goes beyond its GPU time: one workload's step, per variant, traced with
torch.profiler as the harness times it (synchronized before and after): the host's time before the first
device activity, the device's busy time, the idle gaps between activities, and for the largest gaps the
Python functions that ran wholly inside them (what the GPU waited for); when on the host's clock each
CUDA graph was launched, when its first kernel began on the GPU and how long its launch call took; how
long after its launch call the first device activity began; how many kernel nodes PI re-pointed in each
step, and in the set-up and warm-up steps, in which graph, with each captured graph's nodes by kind; and where the
host's time before the first device activity went, function by function (the time each spent there
outside the functions it called). Then, without the profiler (CUPTI can slow a graph's launch), each
step's time and the host time of each graph's replay() call; with --touch, again after one kernel node
of each graph is set to its own parameters, and after an upload of each.

    python scripts/gpu_gaps.py MTCG-T pt2_cg grace [--iters 5] [--touch] > results/gaps/<device>/MTCG-T.md

Why: a variant can be slower at the same GPU time (MTCG-T, docs/losses.md); the records' cProfile says
how much host time each part takes, not which of it the GPU waited on.
"""
import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grace  # noqa: E402
from experiments import workloads  # noqa: E402
from experiments.task import Task  # noqa: E402
from experiments.variants import Variant  # noqa: E402
from grace import cuda_driver, pi, recording  # noqa: E402
from grace.profile import DEVICE_CATEGORIES, GRAPH_LAUNCHES  # noqa: E402

MARK = "gpu_gaps.iteration"
WARMUP = 8
SHOWN = 5  # gaps, and functions per gap
SHOWN_LEAD = 12  # functions of the lead, by their own time in it
LONG = 10.0  # us: a gap longer than the spacing of a graph's or a queue's kernels, the host's doing
UNPROFILED = 20  # steps timed without the profiler


def build(workload: str, variant: str, device: str = "cuda", hf: dict[str, str] | None = None) -> tuple[Task, object]:
    """The workload's task and the variant's compiled target, as a harness worker sets them up
    (conf/workload, conf/variant, the optimizer's step compiled too); `hf`: entries of a HuggingFace
    workload's config to change (integers)."""
    w = OmegaConf.load(ROOT / "conf" / "workload" / f"{workload}.yaml")[workload]
    v = Variant.from_config(variant, OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "variant" / f"{variant}.yaml")[variant]))
    model = workloads.get(w.name)
    if hf:
        if not isinstance(getattr(model, "config", None), dict):
            raise SystemExit(f"error: {workload} is not a HuggingFace workload: no config entries to change")
        model = type(model.__name__, (model,), {"config": {**model.config, **{k: int(v) for k, v in hf.items()}}})
    task = Task(model(w.mode, w.batch, w.size, device), seed=0)
    if task.optimizer is not None:
        task.optimizer_step = v.optimizer_step(task.optimizer, True)
    return task, v.apply(task.target)


def merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _correlation(e: dict) -> int | None:
    """The id that ties a launch to what it ran on the device (CUPTI's correlation id)."""
    return (e.get("args") or {}).get("correlation")


def _began(began: dict[int, float], launch: dict) -> float:
    """When the launch's first kernel began, or nan: none carries its id, or one that began before the
    launch does (CUPTI before CUDA 13.1 Update 1 can give a graph's kernels wrong ids in a session after
    the first)."""
    t = began.get(_correlation(launch), math.nan)
    return t if t >= launch["ts"] else math.nan


def iterations(events: list[dict]) -> list[dict]:
    """Per marked iteration (us): its span, the host's lead before the first device activity (and that
    activity's name: a variant that copies inputs first starts the device sooner), busy time, idle time
    between activities, the tail after the last, and its gaps (start, end), the longest first."""
    activities = sorted((e for e in events if e.get("cat") in DEVICE_CATEGORIES), key=lambda e: e["ts"])
    device = [(e["ts"], e["ts"] + e.get("dur", 0.0)) for e in activities]
    calls = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: e["ts"])
    launches = [e for e in calls if e.get("name") in GRAPH_LAUNCHES]
    call_of = {c: e for e in calls if (c := _correlation(e)) is not None}
    # a graph's kernels carry its launch's correlation id: when the GPU began each launched graph
    began: dict[int, float] = {}
    for e in activities:
        if (c := _correlation(e)) is not None:
            began.setdefault(c, e["ts"])
    found = []
    for m in sorted((e for e in events if e.get("name") == MARK and e.get("cat") == "user_annotation"),
                    key=lambda e: e["ts"]):
        start, end = m["ts"], m["ts"] + m["dur"]
        busy = merged([(a, b) for a, b in device if start <= a < end])
        if not busy:
            continue
        gaps = [(a[1], b[0]) for a, b in zip(busy, busy[1:])]
        mine = [e for e in launches if start <= e["ts"] < end]
        first = next(e for e in activities if e["ts"] == busy[0][0])
        call = call_of.get(_correlation(first))
        found.append({"start": start, "tid": m.get("tid"), "span": end - start, "lead": busy[0][0] - start, "first": first.get("name", "?"),
                      # when the first activity began after its launch call began, and how long that call took
                      "first after call": busy[0][0] - call["ts"] if call else math.nan,
                      "first call": call.get("dur", math.nan) if call else math.nan,
                      "busy": sum(b - a for a, b in busy),
                      "idle": sum(b - a for a, b in gaps), "tail": end - busy[-1][1],
                      "long idle": sum(b - a for a, b in gaps if b - a > LONG),
                      "graph launches": [e["ts"] - start for e in mine],
                      "graph starts": [_began(began, e) - start for e in mine],
                      "graph calls": [e.get("dur", math.nan) for e in mine],
                      "gaps": sorted(gaps, key=lambda g: g[0] - g[1])})
    return found


def inside(events: list[dict], gap: tuple[float, float]) -> list[tuple[float, str]]:
    """The longest Python functions and operators that ran wholly within `gap`."""
    within = [(e["dur"], e["name"]) for e in events if e.get("cat") in ("python_function", "cpu_op")
              and gap[0] <= e["ts"] and e["ts"] + e.get("dur", 0.0) <= gap[1]]
    return sorted(within, reverse=True)[:SHOWN]


def own_time(events: list[dict], window: tuple[float, float], tid: object) -> list[tuple[float, str]]:
    """The Python functions and operators that ran in `window` on thread `tid`, by the time each spent
    there outside the functions and operators it called (from how their spans nest), the longest first."""
    spans = [e for e in events if e.get("cat") in ("python_function", "cpu_op") and e.get("tid") == tid
             and e["ts"] < window[1] and e["ts"] + e.get("dur", 0.0) > window[0]]

    def end(e: dict) -> float:
        return e["ts"] + e.get("dur", 0.0)

    def overlap(e: dict) -> float:
        return max(0.0, min(end(e), window[1]) - max(e["ts"], window[0]))
    spent: dict[str, float] = {}
    stack: list[dict] = []
    for e in sorted(spans, key=lambda e: (e["ts"], -e.get("dur", 0.0))):
        # the caller is the innermost span that holds this one whole (an operator's record, such as
        # AOTAutograd's prologue, may end inside the Python call it began)
        while stack and end(e) > end(stack[-1]):
            stack.pop()
        here = overlap(e)
        spent[e["name"]] = spent.get(e["name"], 0.0) + here
        if stack:  # the caller's own time excludes this call's
            spent[stack[-1]["name"]] -= here
        stack.append(e)
    return sorted(((us, name) for name, us in spent.items() if us > 0), reverse=True)


def traced(task: Task, fn, iters: int, stack: bool, repointed: list[int]) -> list[dict]:
    """Chrome-trace events of `iters` steps, each marked and synchronized (grace.profile.trace, with the
    Python functions too where `stack`), each step's count of re-pointed nodes appended to `repointed`."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, with_stack=stack) as prof:
        for _ in range(iters):
            repointed.append(0)
            torch.cuda.synchronize()
            with torch.profiler.record_function(MARK):
                task.step(fn)
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        prof.export_chrome_trace(f"{d}/trace.json")
        return json.loads(Path(f"{d}/trace.json").read_text())["traceEvents"]


@contextlib.contextmanager
def counting():
    """The kernel nodes PI re-points, counted into the list's last entry (a re-pointed node may cost its
    graph's later launches); the nodes of each graph captured, by kind; and the nodes PI re-pointed in
    each captured graph, all told."""
    repointed: list[int] = [0]
    captured: list[dict[str, int] | None] = []
    per_graph: list[int] = []
    index: dict[int, int] = {}  # a captured graph's executable (its driver handle) -> its place in captured
    point, capture = pi.Indirection.point, recording.capture

    def counted(self, ptrs):
        updated = point(self, ptrs)
        repointed[-1] += updated
        graph = index.get(int(self.exec)) if hasattr(self, "exec") else None
        if graph is not None:
            per_graph[graph] += updated
        return updated

    def census(*args, **kwargs):
        got = capture(*args, **kwargs)
        if got.graph is not None:
            index[got.graph.raw_cuda_graph_exec()] = len(captured)
        captured.append(got.nodes)
        per_graph.append(0)
        return got
    with mock.patch.object(pi.Indirection, "point", counted), mock.patch.object(recording, "capture", census):
        yield repointed, captured, per_graph


def unprofiled(task: Task, fn, iters: int) -> tuple[list[float], list[list[float]]]:
    """Without the profiler: each of `iters` synchronized steps' time (ms), and the host time of each
    CUDA graph's replay() call in it, in the order called (us)."""
    replay = torch.cuda.CUDAGraph.replay
    calls: list[list[float]] = []

    def timed(self):
        t = time.perf_counter()
        replay(self)
        calls[-1].append((time.perf_counter() - t) * 1e6)
    steps = []
    with mock.patch.object(torch.cuda.CUDAGraph, "replay", timed):
        for _ in range(iters):
            calls.append([])
            torch.cuda.synchronize()
            t = time.perf_counter()
            task.step(fn)
            torch.cuda.synchronize()
            steps.append((time.perf_counter() - t) * 1e3)
    return steps, calls


def replayed(task: Task, fn) -> list[torch.cuda.CUDAGraph]:
    """The CUDA graphs one step replays, in the order replayed."""
    replay, graphs = torch.cuda.CUDAGraph.replay, []

    def noted(self):
        graphs.append(self)
        replay(self)
    with mock.patch.object(torch.cuda.CUDAGraph, "replay", noted):
        task.step(fn)
    return graphs


def touch(graph: torch.cuda.CUDAGraph) -> bool:
    """Set the graph's first kernel node to the parameters it has: the driver call PI's re-pointing makes
    (cuGraphExecKernelNodeSetParams), changing nothing. False for a graph not kept after instantiation."""
    try:
        raw = graph.raw_cuda_graph()
    except RuntimeError:  # captured with keep_graph=False (not by GraCE): no nodes to read
        return False
    node = next(n for n, kind in cuda_driver.nodes(raw) if kind == "kernel")
    params, _ = cuda_driver.kernel_params(node)
    cuda_driver.set_kernel_params(cuda_driver.exec_handle(graph.raw_cuda_graph_exec()), node, params)
    return True


def touched(task: Task, fn) -> str:
    """Whether one kernel node set once costs its graph's later launches (MTCG-T's first graph launches
    longer with PI, which set its nodes once), and whether an upload after it takes that back: the step
    and each replay() timed after one node of each graph is set to its own parameters, then after
    cuGraphUpload of each."""
    graphs = [g for g in dict.fromkeys(replayed(task, fn)) if touch(g)]
    lines = [f"After one kernel node of each graph ({len(graphs)} kept) was set to its own parameters: "
             + report_unprofiled(*unprofiled(task, fn, UNPROFILED))]
    for g in graphs:
        cuda_driver.upload(cuda_driver.exec_handle(g.raw_cuda_graph_exec()), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    lines.append("Then after cuGraphUpload of each: " + report_unprofiled(*unprofiled(task, fn, UNPROFILED)))
    return "".join(lines)


def report_setup(repointed: int, captured: list[dict[str, int] | None], per_graph: list[int]) -> str:
    """What the set-up and warm-up steps left: the graphs captured, their nodes, and how many kernel nodes
    PI re-pointed, in which graph (a node set once, then never again, may still cost every later launch)."""
    kinds = "; ".join(", ".join(f"{k} {n}" for k, n in nodes.items() if n) if nodes else "not read"
                      for nodes in captured)
    where = ", ".join(f"graph {i + 1}: {n}" for i, n in enumerate(per_graph) if n)
    return (f"Set-up and {WARMUP} warm-up steps: {len(captured)} CUDA graphs captured ({kinds or 'none'});"
            f" PI re-pointed {repointed} kernel nodes" + (f" ({where})" if where else "") + ".\n")


def report_unprofiled(steps: list[float], calls: list[list[float]]) -> str:
    line = f"Without the profiler, {len(steps)} steps: {statistics.median(steps):.3f} ms a step (median)"
    counts = {len(c) for c in calls}
    if len(counts) == 1 and counts != {0}:
        took = [statistics.median(c[k] for c in calls) for k in range(counts.pop())]
        line += f"; its CUDA graphs' replay() calls took (us, medians): {', '.join(f'{t:.0f}' for t in took)}"
    return line + ".\n"


def _median(values: list[float]) -> float:
    """The median of the known values (nan: unknown), or nan."""
    known = [v for v in values if not math.isnan(v)]
    return statistics.median(known) if known else math.nan


def _us(t: float, sign: str = "") -> str:
    return "?" if math.isnan(t) else f"{sign}{t:.0f}"


def report(variant: str, plain: list[dict], stacked: list[dict], repointed: list[int] | None = None) -> str:
    its = iterations(plain)
    med = {k: statistics.median(i[k] for i in its) for k in ("span", "lead", "busy", "idle", "long idle", "tail")}
    lines = [f"## {variant}", "",
             f"{len(its)} iterations, medians: span {med['span'] / 1e3:.3f} ms = lead {med['lead']:.0f} us"
             f" + busy {med['busy'] / 1e3:.3f} ms + idle between activities {med['idle']:.0f} us (in gaps over"
             f" {LONG:.0f} us: {med['long idle']:.0f}) + tail {med['tail']:.0f} us", ""]
    counts = {len(i["graph launches"]) for i in its}
    if len(counts) == 1 and counts != {0}:  # the same graphs each iteration: the median time of each launch
        n = counts.pop()
        at = [statistics.median(i["graph launches"][k] for i in its) for k in range(n)]
        began = [_median([i["graph starts"][k] for i in its]) for k in range(n)]
        took = [_median([i["graph calls"][k] for i in its]) for k in range(n)]
        lines += [f"CUDA graphs launched at (us from the iteration's start, medians): {', '.join(f'+{t:.0f}' for t in at)}",
                  f"and their first kernels began at: {', '.join(_us(t, '+') for t in began)}",
                  f"and their launch calls took (us): {', '.join(_us(t) for t in took)}", ""]
    lines += [f"The first device activity began {_us(_median([i['first after call'] for i in its]))} us after its launch"
              f" call began, a call of {_us(_median([i['first call'] for i in its]))} us (medians).", ""]
    if repointed is not None:
        lines += [f"Kernel nodes PI re-pointed, in each iteration: {', '.join(map(str, repointed))}.", ""]
    for one in iterations(stacked)[:1]:
        lines += [f"The first device activity: {one['first'][:90]}.", "",
                  "Under with_stack (a slower host), one iteration's lead and longest gaps (us, from its start)",
                  "and the longest functions that ran wholly inside each:", ""]
        lead = (one["start"], one["start"] + one["lead"])
        for a, b in [lead, *one["gaps"][:SHOWN]]:
            names = "; ".join(f"{name[:70]} {dur:.0f}" for dur, name in inside(stacked, (a, b)))
            what = "lead" if (a, b) == lead else f"at +{a - one['start']:.0f}"
            lines.append(f"- {b - a:.0f} {what}: {names or 'no function wholly inside'}")
        lines += ["", "The lead's host time on the step's thread by function, each outside the functions it called (us):", "",
                  "; ".join(f"{name[:70]} {us:.0f}" for us, name in own_time(stacked, lead, one["tid"])[:SHOWN_LEAD]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", help="a conf/workload name: MTCG-T")
    p.add_argument("variants", nargs="+", help="conf/variant names: pt2_cg grace")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--touch", action="store_true", help="then set one node of each graph to its own parameters"
                   " and time again, then after an upload")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: gpu_gaps needs a CUDA device", file=sys.stderr)
        return 2
    print(f"# {args.workload}: {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    for variant in args.variants:
        grace.reset()  # Dynamo's caches, and the CUDA graphs of the variant before
        with counting() as (repointed, captured, per_graph):
            task, fn = build(args.workload, variant)
            for _ in range(WARMUP):
                task.step(fn)
            setup = report_setup(repointed.pop(), captured, list(per_graph))
            plain = traced(task, fn, args.iters, False, repointed)
            steps = list(repointed)
            stacked = traced(task, fn, 1, True, repointed)
        print(report(variant, plain, stacked, steps) + "\n" + setup, flush=True)
        print(report_unprofiled(*unprofiled(task, fn, UNPROFILED)), flush=True)
        if args.touch:
            print(touched(task, fn), flush=True)
        del task, fn
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
