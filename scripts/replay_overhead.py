"""Host cost of one call of a CUDA-graphed model: GraCE's runtime and stock graph trees against a bare
torch.cuda.CUDAGraph.replay() of the same compiled work (issue: the runtime's replay path).

    python scripts/replay_overhead.py [--out results/replay_overhead] [--calls 300] [--rounds 15] [--synchronize]

Per model, these ways to run one forward are timed interleaved, round by round: `bare` replays one CUDA
graph captured around the Inductor-compiled model (no input copy, no checks: the floor), `partition` is
GraCE's replay path around that same work (its checks and bookkeeping, nothing else), `runtime` is
backend="grace" with no optimization on (Dynamo's guards and wrappers, and the input copy, included),
`grace` with all three on and `grace_aa` the same compiled again (the A/A control: two instances of one
way differ by this much without any option differing), `cgct`, `pi` and `scg` with one on, `pt2_cg` is
mode="reduce-overhead", `inductor` is Inductor without graphs; `dynamo` is torch.compile with a backend
that does the least any backend can (its compiled function replays `bare`'s graph and returns that
graph's outputs: Dynamo's own cost per call over one replay, out of a backend's reach; models called on
one input set only); with --synchronize, `sync` is an empty synchronize. Each round times `calls`
back-to-back calls and one synchronization, so the host's cost per call is what shows when it exceeds
the GPU's; with --synchronize, each call is synchronized and a round's value is the median of `calls`
such calls: the latency a caller waits. The models: the suite's MLP, ResNet-18 and EOS chain (the same
input tensor each call), `pointwise` (six elementwise ops on 4096 elements, fused into one kernel) and
`vit_tiny` (timm's ViT-Tiny at batch 1, a new input tensor each call, as a user's loop feeds it). Writes
one JSON record per model (median per call over rounds, every round's value, environment).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.utils._pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments and grace

import grace  # noqa: E402  (backend="grace", and its reports)
from grace import runtime  # noqa: E402
from grace.calibrate import per_call_us  # noqa: E402
from grace.torch_adapter import Partition  # noqa: E402
from experiments import environment, workloads  # noqa: E402
from experiments.task import Task  # noqa: E402

MODELS = [("mlp", "full"), ("resnet18", "full"), ("eos_chain", "tiny"), ("pointwise", "full"), ("vit_tiny", "full")]
OPTIONS = {"runtime": {"cgct": False, "pi": False, "scg": False}, "grace": {}, "grace_aa": {},
           "cgct": {"cgct": True, "pi": False, "scg": False}, "pi": {"cgct": False, "pi": True, "scg": False},
           "scg": {"cgct": False, "pi": False, "scg": True}}
NEW_INPUTS = 8  # vit_tiny cycles through this many input tensors: each call's is another


def pointwise(x):
    return ((x * 2 + 1).sin() * x.cos() - x).relu()


def build(name: str, size: str) -> tuple[torch.nn.Module | object, list[tuple]]:
    """The model and its inputs, one tuple per call in turn (a single one: the same tensors each call)."""
    if name == "pointwise":
        return pointwise, [(torch.randn(4096, device="cuda"),)]
    if name == "vit_tiny":
        import timm

        model = timm.create_model("vit_tiny_patch16_224", pretrained=False).cuda().eval()
        return model, [(torch.randn(1, 3, 224, 224, device="cuda"),) for _ in range(NEW_INPUTS)]
    task = Task(workloads.get(name)("eval", size=size, device="cuda"), seed=0)
    return task.model, [tuple(task.input_sets[0])]


def in_turn(fn, input_sets: list[tuple]):
    """A call of `fn` on the next input set each time."""
    sets = itertools.cycle(input_sets)
    return lambda: fn(*next(sets))


def bare_replay(compiled, inputs):
    """One CUDA graph captured around `compiled(*inputs)`: its replay, with no input copy and no checks,
    and the outputs it writes."""
    for _ in range(3):
        compiled(*inputs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = compiled(*inputs)
    return graph.replay, outputs


def dynamo_replay(model, replay, outputs):
    """`model` under torch.compile with a backend whose compiled function replays `replay` and returns
    `outputs`, the graph's tensors: Dynamo's frame, guards and wrappers around one replay, and nothing of
    a backend's own (right only for the input tensors `replay` was captured on). None where Dynamo makes
    other than one graph with those outputs."""
    leaves = tuple(pytree.tree_leaves(outputs))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(len(next(iter(reversed(gm.graph.nodes))).args[0]))  # the output node's values

        def call(*args):
            replay()
            return leaves
        return call

    fn = torch.compile(model, backend=backend)
    return fn, lambda: graphs == [len(leaves)]


def partition_graph(compiled, n_inputs: int, static: bool = True, pi: bool = False):
    """GraCE's replay path around the same compiled work as `bare_replay`: a PartitionGraph whose inputs
    are all static (read in place: what it adds over `bare` is the runtime's own checks and bookkeeping),
    or all copied into placeholders, or with `pi` all re-pointed by PI."""

    def fn(args):
        xs = list(args)
        args.clear()
        return (compiled(*xs),)

    inputs = frozenset(range(n_inputs)) if static else frozenset()
    return runtime.PartitionGraph(fn, Partition(0, inputs, frozenset()), runtime.Stats(0, False, 0),
                                  pi=pi)


def measure(name: str, size: str, calls: int, rounds: int, synchronize: bool) -> dict:
    model, input_sets = build(name, size)
    inputs = input_sets[0]
    device = torch.device("cuda")
    with torch.inference_mode():
        compiled = torch.compile(model)
        part = partition_graph(compiled, len(inputs))
        for _ in range(3):
            part(list(inputs))
        replay, outputs = bare_replay(compiled, inputs)
        ways = {"bare": replay, "partition": lambda: part(list(inputs))}
        if synchronize:
            ways["sync"] = lambda: None
        chosen = {}  # per grace way: each graph's call path and its partitions' SCG choices
        for way, kwargs in {**{w: {"backend": "grace", "options": o} for w, o in OPTIONS.items()},
                            "pt2_cg": {"mode": "reduce-overhead"}, "inductor": {}}.items():
            torch.compiler.reset()
            start = len(grace.REPORTS)
            ways[way] = in_turn(torch.compile(model, **kwargs), input_sets)
            for _ in range(5):
                ways[way]()
            if way in OPTIONS:
                chosen[way] = [{"call_path": g.call_path, "scg": [s.scg["choice"] for s in g.partitions if s.scg]}
                               for g in grace.REPORTS[start:]]
        if len(input_sets) == 1:
            torch.compiler.reset()
            fn, one_graph = dynamo_replay(model, replay, outputs)
            for _ in range(5):
                fn(*inputs)
            if one_graph():
                ways["dynamo"] = lambda: fn(*inputs)
        per_round = {way: [] for way in ways}
        for r in range(rounds):
            order = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]
            for way in order:
                per_round[way].append(statistics.median(per_call_us(ways[way], 1, device) for _ in range(calls))
                                      if synchronize else per_call_us(ways[way], calls, device))
    median = {way: statistics.median(v) for way, v in per_round.items()}
    return {"model": name, "size": size, "calls": calls, "rounds": rounds, "synchronized": synchronize,
            "median_us_per_call": median, "over_bare_us": {w: median[w] - median["bare"] for w in median},
            "us_per_call_by_round": per_round, "grace": chosen, "env": dataclasses.asdict(environment.current())}


def bench_args(doc: str, name: str, calls: int, rounds: int, **flags: dict) -> argparse.Namespace:
    """A host-cost benchmark's command line (--out, --calls, --rounds and `flags`: flag -> add_argument's
    keywords); exits with one line without CUDA."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=f"results/{name}")
    parser.add_argument("--calls", type=int, default=calls)
    parser.add_argument("--rounds", type=int, default=rounds)
    for flag, kwargs in flags.items():
        parser.add_argument(flag, **kwargs)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(f"error: {name} needs a CUDA GPU")
    return args


def append_records(out: str, name: str, records: list[dict], key: str) -> Path:
    """Append a benchmark's records to <out>/<device>/<name> (not records.jsonl: they are not sweep
    records), and print each one's medians per call, under its `key`."""
    path = Path(out) / environment.device_tag(environment.current()) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    for r in records:
        print(r[key], {w: round(v, 1) for w, v in r["median_us_per_call"].items()})
    print(f"records: {path}")
    return path


def main() -> None:
    args = bench_args(__doc__, "replay_overhead", calls=300, rounds=15,
                      **{"--synchronize": {"action": "store_true", "help": "time each call synchronized (latency)"},
                         "--models": {"nargs": "*", "help": "of those this script knows (default: all)"}})
    models = [(n, s) for n, s in MODELS if not args.models or n in args.models]
    append_records(args.out, "replay.jsonl", [measure(name, size, args.calls, args.rounds, args.synchronize)
                                              for name, size in models], "model")


if __name__ == "__main__":
    main()
