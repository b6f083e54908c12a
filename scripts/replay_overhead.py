"""Host cost of one call of a CUDA-graphed model: GraCE's runtime and stock graph trees against a bare
torch.cuda.CUDAGraph.replay() of the same compiled work (issue: the runtime's replay path).

    python scripts/replay_overhead.py [--out results/replay_overhead] [--calls 300] [--rounds 7]

Per model, five ways to run one forward are timed interleaved, round by round: `bare` replays one
CUDA graph captured around the Inductor-compiled model (no input copy, no checks: the floor),
`partition` is GraCE's replay path around that same work (its checks and bookkeeping, nothing else),
`runtime` is backend="grace" with no optimization on (Dynamo's guards and wrappers, and the input
copy, included), `pt2_cg` is mode="reduce-overhead", `inductor` is Inductor without graphs. Each round times `calls` back-to-back calls and one synchronization, so the
host's cost per call is what shows when it exceeds the GPU's. The input is the same tensor each call.
Writes one JSON record per model (median per call over rounds, every round's value, environment).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch

import grace  # noqa: F401  (backend="grace")
from grace import runtime
from grace.calibrate import per_call_us
from grace.torch_adapter import Partition
from experiments import environment, workloads
from experiments.task import Task

MODELS = [("mlp", "full"), ("resnet18", "full"), ("eos_chain", "tiny")]


def _bare(model, inputs):
    compiled = torch.compile(model)
    for _ in range(3):
        compiled(*inputs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        compiled(*inputs)
    return graph.replay


def _partition(model, inputs):
    """GraCE's replay path alone: its PartitionGraph around the same compiled work as `bare`, every input
    static (read in place), so what it adds over `bare` is the runtime's own checks and bookkeeping."""
    compiled = torch.compile(model)

    def fn(args):
        xs = list(args)
        args.clear()
        return (compiled(*xs),)

    part = runtime.PartitionGraph(fn, Partition(0, frozenset(range(len(inputs))), frozenset()),
                                  runtime.Stats(0, False, 0))
    for _ in range(3):
        part(list(inputs))
    return lambda: part(list(inputs))


def measure(name: str, size: str, calls: int, rounds: int) -> dict:
    task = Task(workloads.get(name)("eval", size=size, device="cuda"), seed=0)
    model, inputs = task.model, task.input_sets[0]
    with torch.inference_mode():
        ways = {"bare": _bare(model, inputs), "partition": _partition(model, inputs)}
        for way, kwargs in {"runtime": {"backend": "grace", "options": {"cgct": False}},
                            "pt2_cg": {"mode": "reduce-overhead"}, "inductor": {}}.items():
            torch.compiler.reset()
            compiled = torch.compile(model, **kwargs)
            ways[way] = lambda c=compiled: c(*inputs)
            for _ in range(5):
                ways[way]()
        per_round = {way: [] for way in ways}
        for r in range(rounds):
            order = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]
            for way in order:
                per_round[way].append(per_call_us(ways[way], calls, torch.device("cuda")))
    median = {way: statistics.median(v) for way, v in per_round.items()}
    return {"model": name, "size": size, "calls": calls, "rounds": rounds,
            "median_us_per_call": median, "over_bare_us": {w: median[w] - median["bare"] for w in median},
            "us_per_call_by_round": per_round, "env": dataclasses.asdict(environment.current())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/replay_overhead")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: replay_overhead needs a CUDA GPU")
    records = [measure(name, size, args.calls, args.rounds) for name, size in MODELS]
    out = Path(args.out) / environment.device_tag(environment.current())
    out.mkdir(parents=True, exist_ok=True)
    path = out / "replay.jsonl"  # not records.jsonl: these are not sweep records
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    for r in records:
        print(r["model"], {w: round(v, 1) for w, v in r["median_us_per_call"].items()})
    print(f"records: {path}")


if __name__ == "__main__":
    main()
