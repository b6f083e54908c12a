"""Time of one all-reduce between the machine's GPUs, by size, launched one by one and replayed from a CUDA
graph: what a tensor-parallel iteration pays per sum (Fig 11).

    python scripts/allreduce_latency.py [--out results/allreduce_latency] [--calls 50] [--rounds 5]

One process per GPU (NCCL), bfloat16 sums of 8 KiB to 16 MiB, in place. Per size and round, rank 0 times
`calls` back-to-back all-reduces between two synchronizations (`launched`), then one replay of a CUDA
graph that holds `calls` of them (`graph`), and the ranks meet at a barrier between the two. Writes one
JSON record per size (median per call over rounds, every round's value, the environment).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments

from experiments import environment  # noqa: E402
from grace.calibrate import per_call_us  # noqa: E402
from scripts.replay_overhead import append_records  # noqa: E402

SIZES = [8 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]  # bytes


def measure(rank: int, world: int, init: str, sizes: list[int], calls: int, rounds: int, results) -> None:
    """One rank. On the CPU (gloo) only the launched all-reduces are timed: there is no graph to replay."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=world)
    try:
        for nbytes in sizes:
            times = _time_size(torch.zeros(nbytes // 2, dtype=torch.bfloat16, device=device), calls, rounds)
            if rank == 0:
                results[nbytes] = times
    finally:
        # Only once each size's graph is freed (on _time_size's return): NCCL counts the CUDA graphs that
        # captured its collectives, and destroying a communicator waits until none is left (pytorch#115388).
        dist.destroy_process_group()


def _time_size(x: torch.Tensor, calls: int, rounds: int) -> dict[str, list[float]]:
    """Per round, the time per all-reduce of `x`: launched, and replayed from a graph (CUDA only)."""

    def launched():
        dist.all_reduce(x)

    launched()  # warm: the communicator's buffers for this size
    times: dict[str, list[float]] = {"launched": []}
    graph = None
    if x.is_cuda:
        graph, times["graph"] = torch.cuda.CUDAGraph(), []
        with torch.cuda.graph(graph):
            for _ in range(calls):
                launched()
        graph.replay()
    for _ in range(rounds):
        dist.barrier()
        times["launched"].append(per_call_us(launched, calls, x.device))
        if graph is not None:
            dist.barrier()
            times["graph"].append(per_call_us(graph.replay, 1, x.device) / calls)
    return times


def run(world: int, calls: int, rounds: int, sizes: list[int] = SIZES) -> list[dict]:
    """The records, one per size (median per call over rounds, and every round's)."""
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(measure, args=(world, f"file://{tmp}/init", sizes, calls, rounds, results), nprocs=world)
        results = dict(results)
    env = dataclasses.asdict(environment.current())
    return [{"bytes": nbytes, "ranks": world, "calls": calls, "rounds": rounds,
             "median_us_per_call": {way: statistics.median(v) for way, v in results[nbytes].items()},
             "us_per_call_by_round": results[nbytes], "env": env} for nbytes in sizes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/allreduce_latency")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("error: allreduce_latency needs two CUDA GPUs (the nvidia-h200-x2 kind)")
    append_records(args.out, "allreduce.jsonl", run(2, args.calls, args.rounds), "bytes")

if __name__ == "__main__":
    main()
