"""The corpus: programs beyond the suite (hazards.py, zoo.py, hf.py), each run as eager, inductor, pt2_cg and grace, for whether each
runs (ok, mismatch against eager, crash with the error's class and first line), how fast (interleaved
rounds) and how much of it CUDA graphs replay.

    python run.py experiment=corpus ['corpus.programs=[timm/]']     # or, without Hydra:
    python -m experiments.corpus [--out results/corpus] [--only NAME|FAMILY/ ...] [--force]
    python run.py -m experiment=corpus 'corpus.programs=[hazards/],[timm/],[hf/]' hydra/launcher=gpus gpus=3

One process runs every program in turn; a program's variants are built side by side from the same seed
and timed in rounds, in an order drawn afresh each. Records are appended to
<out>/<device>/records.jsonl, one per (program, variant); a rerun passes over programs recorded with
this code (Environment.code and .corpus; --force: again).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import torch
from tqdm import tqdm

import grace
from experiments import environment
from experiments.cores import pin_threads, timing_cores
from experiments.corpus import hf, zoo
from experiments.corpus.hazards import HAZARDS, Program
from experiments.instrument import pytree
from experiments.records import error_line
from grace import recording, scg
from grace.profile import count, trace

VARIANTS: dict[str, dict | None] = {  # torch.compile's arguments; None: eager
    "eager": None,
    "inductor": {"backend": "inductor"},
    "pt2_cg": {"backend": "inductor", "mode": "reduce-overhead"},
    "grace": {"backend": "grace"},  # its default options (CGCT, PI and SCG), as a user gets it
}
NEEDS_CUDA = {"pt2_cg"}
RTOL, ATOL = 1e-3, 1e-3  # float32 programs: Inductor's fusions round differently from eager
NORM = 1e-2  # deep float32 models: convolutions in TF32, summed differently by eager and Inductor
NEGLIGIBLE = 1e-4  # of the largest output's norm: an output this small is compared against that, not its own
# (a gradient that is zero but for rounding, as a key projection's bias has through softmax, is noise)
PROGRAMS = {**HAZARDS, **zoo.MODELS, **hf.MODELS}


def _host(value: Any) -> Any:
    return pytree.tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, value)


def difference(got: Any, want: Any, compare: str = "close") -> str | None:
    """Why `got` is not what eager computed (`want`), or None (Program.compare says how): the same
    structure, each tensor of the same shape and dtype, and equal (integers, bools) or close (floating and
    complex: elementwise, or within NORM of eager's norm, or of NEGLIGIBLE times the largest output's
    where that is more); `random`: shape, dtype and finiteness only (see `draws` for the rest)."""
    if compare == "none":
        return None
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    if got_spec != want_spec:
        return f"structure {got_spec} is not eager's {want_spec}"
    largest = max((float(w.double().norm()) for w in want_leaves
                   if isinstance(w, torch.Tensor) and (w.is_floating_point() or w.is_complex())), default=0.0)
    for k, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        if not isinstance(w, torch.Tensor):
            if g != w:
                return f"output {k}: {g!r} is not {w!r}"
            continue
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {k}: {g.dtype} {list(g.shape)} is not eager's {w.dtype} {list(w.shape)}"
        if compare == "random":
            if g.is_floating_point() and not torch.isfinite(g).all():
                return f"output {k}: not finite"
            continue
        if (g.is_floating_point() or g.is_complex()) and compare == "norm":
            off = float((g - w).double().norm() / max(float(w.double().norm()), NEGLIGIBLE * largest, 1e-30))
            if not off <= NORM:
                return f"output {k}: off by {off:.3g} of its norm"
        elif g.is_floating_point() or g.is_complex():
            if not torch.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True):
                return f"output {k}: off by up to {float((g - w).abs().max()):.3g}"
        elif not torch.equal(g, w):
            return f"output {k}: {int((g != w).sum())} of {w.numel()} elements differ"
    return None


def draws(got: Any, got_before: Any, want: Any, want_before: Any) -> str | None:
    """Where random numbers are drawn inside (`random`), eager's values cannot be matched, but whether
    a call drew the same numbers as the call before can: the same seed again, or new draws. Why `got`
    departs from that pattern of eager's (`want`), or None: a replay that does not advance or reseed
    the generator repeats its numbers, or one that ignores a reseed draws new ones. The outputs are
    host copies (_host), which a later replay writing its output buffer again cannot change."""
    same, want_same = _identical(got, got_before), _identical(want, want_before)
    if same == want_same:
        return None
    return ("the same random numbers as the call before, where eager drew new ones" if same else
            "new random numbers, where eager drew the same as the call before (the same seed)")


def _identical(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
               for x, y in zip(pytree.tree_leaves(a), pytree.tree_leaves(b)))


def _is_grace(variant: str) -> bool:
    return VARIANTS[variant] is not None and VARIANTS[variant]["backend"] == "grace"


def _compiler(kwargs: dict | None) -> Callable:
    return (lambda m: m) if kwargs is None else (lambda m: torch.compile(m, **kwargs))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _lock(device: torch.device, kind: str) -> Path:
    """A lock file shared by the jobs on `device`, named by its GPU's UUID (jobs of hydra/launcher=gpus each
    see theirs as cuda:0)."""
    gpu = device.index if device.index is not None else torch.cuda.current_device() if device.type == "cuda" else None
    name = "cpu" if gpu is None else torch.cuda.get_device_properties(gpu).uuid
    return Path(tempfile.gettempdir()) / f"grace-corpus-{kind}-{name}.lock"


@contextlib.contextmanager
def _held(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _sharing(device: torch.device) -> Iterator[None]:
    """A job's work on the device outside its timed rounds: jobs side by side, but none while a job times
    its rounds, and none starts while a job waits to (the turnstile): without MPS the GPU takes turns
    between the processes' contexts, and a synchronized call timed beside another context's kernels
    waits for its turn (docs/harness.md)."""
    with _held(_lock(device, "turn"), fcntl.LOCK_EX):
        f = open(_lock(device, "gpu"), "a")
        fcntl.flock(f, fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


@contextlib.contextmanager
def _alone(device: torch.device, cores: Sequence[int] = ()) -> Iterator[None]:
    """Timed rounds of one job at a time per device, with no other job's work on it (_sharing; the others
    compile meanwhile), on `cores` where given (which the jobs compile beside, not on): rounds timed beside
    other jobs' GPU work and compiles slowed the variants with more host work most (docs/harness.md)."""
    with _held(_lock(device, "turn"), fcntl.LOCK_EX), _held(_lock(device, "gpu"), fcntl.LOCK_EX):
        compiling = sorted(os.sched_getaffinity(0))
        if cores:
            pin_threads(cores)
        try:
            yield
        finally:
            if cores:
                pin_threads(compiling)


def _repair(device: torch.device) -> None:
    """After a variant failed: a failed capture of stock's leaves the generator capturing, which would fail
    the variants after it (their random ops) for a fault that is not theirs."""
    if device.type == "cuda":
        recording.repair(torch.cuda.default_stream(device))


def run_program(name: str, device: torch.device, variants: list[str], calls: int = 4, rounds: int = 10,
                iters: int = 5, timing_cpus: Sequence[int] = ()) -> list[dict]:
    """One record per variant: status, why, and where it ran, its latency and kernels in graphs."""
    # The variants compile the same code in one process: each keeps Dynamo's recompile limit to itself
    # (with one limit for all, the last variant of a model that recompiles ran eager).
    compiled = max(1, sum(VARIANTS[v] is not None for v in variants))
    with torch._dynamo.config.patch(recompile_limit=compiled * torch._dynamo.config.recompile_limit):
        return _run_variants(PROGRAMS[name], name, device, variants, calls, rounds, iters, timing_cpus)


def _run_variants(builder: Callable, name: str, device: torch.device, variants: list[str], calls: int,
                  rounds: int, iters: int, timing_cpus: Sequence[int]) -> list[dict]:
    torch.compiler.reset()
    grace.reset()
    built: dict[str, Program] = {}
    records = {v: {"program": name, "variant": v, "status": "ok", "reason": None} for v in variants}
    reference: list[Any] = []
    for v in variants:  # eager first: the reference of every comparison
        r = records[v]
        if v in NEEDS_CUDA and device.type != "cuda":
            r.update(status="skipped", reason=f"{v} needs CUDA, and this machine has none")
            continue
        start = len(grace.REPORTS)
        if _is_grace(v):  # named by its options, ok or not
            r["grace"] = {"options": [dataclasses.asdict(grace.Options.parse(VARIANTS[v].get("options")))]}
        # grace's calls after the first record graphs and SCG times their candidates: alone on the GPU,
        # as a user's program would have it, not beside other jobs' work
        on_gpu = functools.partial(_alone if _is_grace(v) else _sharing, device)
        try:
            torch.manual_seed(0)
            program = builder(device, _compiler(VARIANTS[v]))
            before = None  # the previous call's output, for `random`
            for i in range(calls):  # the first compiles (minutes, for some): no other job's rounds wait on it
                with on_gpu() if i else contextlib.nullcontext():
                    out = _host(program.step(*program.inputs(i)))
                if v == "eager":
                    reference.append(out)
                elif r["status"] == "ok":
                    why = difference(out, reference[i], program.compare)
                    if why is None and program.compare == "random" and i:
                        why = draws(out, before, reference[i], reference[i - 1])
                    if why:
                        r.update(status="mismatch", reason=f"call {i}: {why}")
                before = out
        except Exception as e:
            _repair(device)
            if v == "eager":
                for other in records.values():
                    other.update(status="failed", reason=f"eager fails: {error_line(e)}")
                return list(records.values())
            r.update(status="crash", reason=error_line(e))
            continue
        built[v] = program
        if _is_grace(v):
            with on_gpu():
                summary = grace.explain_call(lambda p=program: p.step(*p.inputs(calls - 1)), start).summary()
            r["grace"] = {k: v2 for k, v2 in summary.items()
                          if k in ("options", "graphs", "partitions", "captured", "replays_per_call", "not_captured",
                                   "without_graph", "fallbacks", "cgct", "lean_graphs", "call_paths")}
            if summary["scg"]:  # SCG's choices, counted; the numbers only of those that declined a graph
                r["grace"]["scg"] = {c: n for c, n in summary["scg"].items() if c in scg.CANDIDATES}
                r["grace"]["scg"]["declined"] = [d for d in summary["scg"]["decisions"] if d["choice"] == scg.Choice.EAGER]
    _time(built, records, device, calls - 1, rounds, iters, timing_cpus)
    return list(records.values())


def _time(built: dict[str, Program], records: dict[str, dict], device: torch.device, call: int, rounds: int,
          iters: int, timing_cpus: Sequence[int] = ()) -> None:
    """Per variant, microseconds of each synchronized call, by round (`iter_us`), the variants in turn
    (in an order drawn afresh each round), and their median; on a GPU, kernels per call and the share replayed from
    CUDA graphs."""
    names = list(built)
    times: dict[str, list[list[float]]] = {v: [] for v in names}
    order = random.Random(0)  # drawn afresh each round: no variant always follows the same one
    with _alone(device, timing_cpus):
        for _ in range(rounds):
            for v in order.sample(names, len(names)):
                p = built[v]
                args = p.inputs(call)
                try:
                    p.step(*args)
                    _sync(device)
                    per_call = []
                    for _ in range(iters):
                        t0 = time.perf_counter()
                        p.step(*args)
                        _sync(device)
                        per_call.append((time.perf_counter() - t0) * 1e6)
                    times[v].append(per_call)
                except Exception as e:  # a variant that ran its checks but fails when called again
                    _repair(device)
                    records[v].update(status="crash", reason=f"timing: {error_line(e)}")
                    built.pop(v)
                    names.remove(v)
                    break
    for v, p in built.items():
        records[v]["median_us"] = statistics.median(x for r in times[v] for x in r) if times[v] else None
        records[v]["iter_us"] = times[v]
        if device.type == "cuda":
            k = count(trace(lambda p=p: p.step(*p.inputs(call))))
            records[v]["kernels"], records[v]["kernels_in_graphs"] = k.kernels, k.in_graphs
            records[v]["device_us"] = k.device_us  # GPU time of one call: a gap in host time or in GPU time


def select(only: Sequence[str] = (), variants: Sequence[str] = tuple(VARIANTS)) -> list[str]:
    """The programs named in `only`, or of its families ('timm/', 'hazards/'); all when it is empty.
    ValueError, in one line, for an unknown program, family or variant, or variants not led by eager."""
    def of(o: str, n: str) -> bool:
        return n == o or (o == "hazards/" and n in HAZARDS) or (o.endswith("/") and n.startswith(o))

    unknown = [o for o in only if not any(of(o, n) for n in PROGRAMS)] + sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown program, family or variant {unknown} (families: hazards/, torchvision/, timm/, hf/)")
    if list(variants[:1]) != ["eager"]:
        raise ValueError("the variants must start with eager, the reference")
    return [n for n in PROGRAMS if not only or any(of(o, n) for o in only)]


def where(out: Path) -> tuple[environment.Environment, Path]:
    """This machine's environment, the corpus's code hash in it, and its records file under `out`."""
    env = dataclasses.replace(environment.current(), corpus=environment.code_hash(environment.CORPUS, leave_out=()))
    return env, out / environment.device_tag(env) / "records.jsonl"


def recorded(path: Path, env: environment.Environment) -> set[str]:
    """The programs `path` holds records of, made with env's code and corpus."""
    return set() if not path.is_file() else {
        r["program"] for r in map(json.loads, path.read_text().splitlines())
        if (r["env"].get("code"), r["env"].get("corpus")) == (env.code, env.corpus)}


def run(programs: Sequence[str], variants: Sequence[str], out: Path, force: bool = False,
        timing_cpus: Sequence[int] = ()) -> Path:
    """Run `programs` (select) with `variants`, appending to <out>/<device>/records.jsonl; returns its path.
    `timing_cpus`: the cores the rounds run on (as cores.timing_cores gives them), none of the job's compiling."""
    cores = list(timing_cpus)
    if cores:
        pin_threads(sorted(os.sched_getaffinity(0) - set(cores)) or cores)
    env, path = where(out)
    device = torch.device("cuda" if env.device == "cuda" else "cpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    done = set() if force else recorded(path, env)
    for name in tqdm([n for n in programs if n not in done], desc="corpus", unit="program"):
        lines = [json.dumps({**record, "timing_cpus": cores, "env": dataclasses.asdict(env)}, sort_keys=True,
                            default=str) + "\n"
                 for record in run_program(name, device, list(variants), timing_cpus=cores)]
        with path.open("a") as f:  # a program's records in one write: jobs side by side share the file
            f.write("".join(lines))
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("results/corpus"))
    p.add_argument("--only", nargs="*", default=[], help="programs, or families ('timm/', 'hazards/'), to run (default: all)")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    p.add_argument("--force", action="store_true", help="run again what this code recorded")
    p.add_argument("--timing-cpus", nargs="*", type=int, default=[-2, -1],
                   help="cores the timed rounds run on, and compiling does not (-2 -1: the last two)")
    args = p.parse_args(argv)
    try:
        programs = select(args.only, args.variants)
        cores = timing_cores(args.timing_cpus, setting="--timing-cpus")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(run(programs, args.variants, args.out, args.force, cores))
    return 0
