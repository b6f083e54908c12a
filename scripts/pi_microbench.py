"""PI microbenchmark: host time per call of one replayed graph as its input grows, for the three ways
to feed it a new input: stock-style copy into the placeholder, PI (re-point the kernel at the input),
and a bare replay of the same graph on the same input (the floor).

    python scripts/pi_microbench.py [--out results/pi_microbench] [--calls 200] [--rounds 5]

The graph is an EOS-like elementwise chain over three float32 inputs (one Triton kernel under
Inductor), for 2^10 .. 2^24 elements. Each call passes fresh input tensors (three are cycled), so the
copy path copies and the PI path re-points every call. Writes one JSON line per size and, with
`python scripts/make_figures.py`, paper_figures/pi_microbench.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch

import grace  # noqa: F401  (backend="grace")
from experiments import environment
from grace.calibrate import per_call_us

SIZES = [2**k for k in range(10, 25, 2)]


def chain(a, b, c):
    return (a * b + c).sin() * a - b / (c.abs() + 1)


def measure(n: int, calls: int, rounds: int) -> dict:
    device = torch.device("cuda")
    sets = [tuple(torch.randn(n, device=device) for _ in range(3)) for _ in range(3)]
    ways = {}
    for way, options in {"copy": {"pi": False}, "pi": {"pi": True}}.items():
        torch.compiler.reset()
        compiled = torch.compile(chain, backend="grace", options={"cgct": False, **options})
        state = {"i": 0}

        def call(c=compiled, s=state):
            s["i"] += 1
            return c(*sets[s["i"] % 3])

        for _ in range(4):
            call()
        ways[way] = call
    graph, static = torch.cuda.CUDAGraph(), sets[0]
    with torch.cuda.graph(graph):
        chain(*static)
    ways["bare"] = graph.replay
    per_round = {way: [] for way in ways}
    with torch.no_grad():
        for r in range(rounds):
            for way in list(ways)[r % 3:] + list(ways)[:r % 3]:
                per_round[way].append(per_call_us(ways[way], calls, device))
    return {"elements": n, "bytes_per_input": 4 * n, "calls": calls, "rounds": rounds,
            "median_us_per_call": {w: statistics.median(v) for w, v in per_round.items()},
            "us_per_call_by_round": per_round, "env": dataclasses.asdict(environment.current())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/pi_microbench")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: pi_microbench needs a CUDA GPU")
    out = Path(args.out) / environment.device_tag(environment.current())
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sizes.jsonl"
    with torch.no_grad():
        for n in SIZES:
            record = measure(n, args.calls, args.rounds)
            with path.open("a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
            print(n, {w: round(v, 1) for w, v in record["median_us_per_call"].items()})
    print(f"records: {path}")


if __name__ == "__main__":
    main()
