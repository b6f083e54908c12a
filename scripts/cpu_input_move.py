"""Host cost of bringing a small CPU tensor, new each call, to the GPU: the per-call price of CGCT's
cpu_inputs pass (a CPU tensor input that feeds only GPU work is moved at the graph's start, outside it).

    python scripts/cpu_input_move.py [--out results/cpu_input_move] [--calls 300] [--rounds 7]

Each call makes a CPU tensor (0-dim, or 16 values), brings it to the GPU one way,
and runs one small kernel on it: `scalar` passes the 0-dim tensor to the kernel as a CPU scalar (what
eager and Inductor do with it, and what a CUDA graph cannot: it would freeze the value), `pageable`
copies it as CGCT did first (`.to(device)`: PyTorch then waits for the stream), `nonblocking` as CGCT
does now (`.to(device, non_blocking=True)`: the driver stages the values and returns), `pinned` through the pinned-memory cache
(`.pin_memory().to(device, non_blocking=True)`), `fill` writes its value with a fill kernel
(`torch.full`, 0-dim only), and `none` skips the move (the kernel alone, on a GPU tensor). Rounds
interleave the ways; each round's value is the median of `calls` synchronized calls (latency) and, in
`back_to_back`, `calls` calls between two synchronizations (the host's cost), and in `behind_busy_gpu` the host's time
for one call queued behind a kernel that keeps the GPU busy for about a millisecond (what a host-bound
program loses where a move waits for the GPU). One JSON line per shape.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments and grace

from experiments import environment  # noqa: E402
from grace.calibrate import SPIN_CYCLES, per_call_us  # noqa: E402
from grace.torch_adapter import gpu_spin  # noqa: E402
from replay_overhead import append_records, bench_args  # noqa: E402


def ways(shape: tuple, device: torch.device) -> dict:
    x = torch.randn(256, *shape, device=device)
    on_gpu = torch.full(shape, 2.0, device=device)
    state = {"i": 0}

    def value() -> torch.Tensor:  # a new CPU tensor each call, as a caller's loop makes it
        state["i"] += 1
        return torch.full(shape, 2.0 + state["i"] % 7)

    chosen = {
        "none": lambda: x / on_gpu,
        "pageable": lambda: x / value().to(device),
        "nonblocking": lambda: x / value().to(device, non_blocking=True),
        "pinned": lambda: x / value().pin_memory().to(device, non_blocking=True),
    }
    if shape == ():
        chosen["scalar"] = lambda: x / value()
        chosen["fill"] = lambda: x / torch.full((), value().item(), device=device)
    return chosen


def _behind_busy_gpu(fn, device: torch.device) -> float:
    """Host microseconds of one call of `fn` issued while a spinning kernel keeps the GPU busy."""
    torch.cuda.synchronize(device)
    gpu_spin(SPIN_CYCLES)
    t0 = time.perf_counter()
    fn()
    host = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize(device)
    return host


def measure(shape: tuple, calls: int, rounds: int) -> dict:
    device = torch.device("cuda")
    fns = ways(shape, device)
    for fn in fns.values():
        for _ in range(5):
            fn()
    synchronized = {w: [] for w in fns}
    back_to_back = {w: [] for w in fns}
    behind = {w: [] for w in fns}
    for r in range(rounds):
        order = list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]
        for w in order:
            synchronized[w].append(statistics.median(per_call_us(fns[w], 1, device) for _ in range(calls)))
            back_to_back[w].append(per_call_us(fns[w], calls, device))
            behind[w].append(statistics.median(_behind_busy_gpu(fns[w], device) for _ in range(20)))
    return {"shape": list(shape), "calls": calls, "rounds": rounds,
            "median_us_per_call": {w: statistics.median(v) for w, v in synchronized.items()},
            "back_to_back_us_per_call": {w: statistics.median(v) for w, v in back_to_back.items()},
            "behind_busy_gpu_us_per_call": {w: statistics.median(v) for w, v in behind.items()},
            "us_per_call_by_round": synchronized, "back_to_back_by_round": back_to_back,
            "behind_busy_gpu_by_round": behind,
            "env": dataclasses.asdict(environment.current())}


def main() -> None:
    args = bench_args(__doc__, "cpu_input_move", calls=300, rounds=7)
    records = [measure(shape, args.calls, args.rounds) for shape in [(), (16,)]]
    append_records(args.out, "moves.jsonl", records, "shape")
    for r in records:
        print(r["shape"], "back to back", {w: round(v, 1) for w, v in r["back_to_back_us_per_call"].items()},
              "behind a busy GPU", {w: round(v, 1) for w, v in r["behind_busy_gpu_us_per_call"].items()})


if __name__ == "__main__":
    main()
