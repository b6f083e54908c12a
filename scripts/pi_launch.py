"""What launching a CUDA graph costs after PI re-points one of its kernel nodes, by the graph's size: is
the cost of PI's update one driver call, or does the next launch pay for the whole graph?

    python scripts/pi_launch.py [--out results/pi_launch] [--calls 100] [--rounds 5]

A graph of `kernels` small kernels (4096 float32 elements each) whose first or last kernel reads the
input, run four ways, interleaved round by round: `bare` replays it on its placeholder (never updated),
`copy` copies a new input into the placeholder and replays (stock's way), `still` replays a copy of the
graph that PI re-pointed once (nothing moves after), `moving` re-points that copy at a new input (one
cuGraphExecKernelNodeSetParams, grace.pi.Indirection) before every replay, as PI does when a
program's input moves every call. Each way is timed as the median of `calls` synchronized calls (the
latency a caller waits: `sync_us`) and of the host time of the replay() call alone, from an idle GPU
(`launch_us`). Writes one JSON line per graph (results/pi_launch/<device>/launch.jsonl).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments and grace

from experiments import environment  # noqa: E402
from grace.pi import Indirection  # noqa: E402
from replay_overhead import append_records, bench_args  # noqa: E402

KERNELS = [1, 16, 64, 256, 1024]
ELEMENTS = 4096
INPUTS = 3  # new inputs cycled through: each call's is another


def capture(kernels: int, reads: str, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A graph of `kernels` kernels, the first (reads="first") or the last ("last", kernels >= 2) of
    which reads x."""
    def body():
        y = x * 2 if reads == "first" else w * 2
        for _ in range(kernels - 1 - (reads == "last")):
            y.mul_(1.0001)
        if reads == "last":
            y.add_(x)
        return y

    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        y = body()
    graph.instantiate()
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize()
    return graph, y


def timed(run, calls: int) -> tuple[float, float]:
    """Medians of `calls` synchronized calls of run(launch) and of the host time of the launch inside
    each (us); run prepares (copies or re-points), then calls launch with the replay."""
    sync, launch = [], []

    def launch_timed(replay):
        t = time.perf_counter()
        replay()
        launch.append(time.perf_counter() - t)

    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(launch_timed)
        torch.cuda.synchronize()
        sync.append(time.perf_counter() - t0)
    return statistics.median(sync) * 1e6, statistics.median(launch) * 1e6


def measure(kernels: int, reads: str, calls: int, rounds: int) -> dict:
    w, placeholder, pointed_placeholder = (torch.randn(ELEMENTS, device="cuda") for _ in range(3))
    inputs = [torch.randn(ELEMENTS, device="cuda") for _ in range(INPUTS)]
    bare, bare_out = capture(kernels, reads, placeholder, w)
    pointed, pointed_out = capture(kernels, reads, pointed_placeholder, w)
    indirection = Indirection(pointed.raw_cuda_graph(), pointed.raw_cuda_graph_exec(),
                              {0: (pointed_placeholder.data_ptr(), pointed_placeholder.untyped_storage().nbytes())})
    new_input = itertools.cycle(inputs)
    ways = {
        "bare": lambda launch: launch(bare.replay),
        "copy": lambda launch: (placeholder.copy_(next(new_input)), launch(bare.replay)),
        "still": lambda launch: launch(pointed.replay),
        "moving": lambda launch: (indirection.point({0: next(new_input).data_ptr()}), launch(pointed.replay)),
    }
    sync_us, launch_us = {way: [] for way in ways}, {way: [] for way in ways}
    for r in range(rounds):
        for way in list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]:
            if way == "still":  # re-pointed before, and not again while timed
                indirection.point({0: inputs[0].data_ptr()})
                pointed.replay()
            s, la = timed(ways[way], calls)
            sync_us[way].append(s)
            launch_us[way].append(la)
    # the re-pointed graph computes on the input it reads what the bare one computes on a copy of it
    indirection.point({0: inputs[1].data_ptr()})
    pointed.replay()
    placeholder.copy_(inputs[1])
    bare.replay()
    torch.testing.assert_close(pointed_out, bare_out)
    return {"kernels": kernels, "reads": reads, "elements": ELEMENTS, "calls": calls, "rounds": rounds,
            "patched_nodes": indirection.patched_nodes,
            "median_us_per_call": {w: statistics.median(v) for w, v in sync_us.items()},
            "launch_us": {w: statistics.median(v) for w, v in launch_us.items()},
            "sync_us_by_round": sync_us, "launch_us_by_round": launch_us,
            "env": dataclasses.asdict(environment.current())}


def main() -> None:
    args = bench_args(__doc__, "pi_launch", calls=100, rounds=5)
    records = []
    with torch.no_grad():
        for kernels, reads in [(k, "first") for k in KERNELS] + [(k, "last") for k in KERNELS if k > 1]:
            records.append(measure(kernels, reads, args.calls, args.rounds))
            r = records[-1]
            print(kernels, reads, "sync", {w: round(v, 1) for w, v in r["median_us_per_call"].items()},
                  "launch", {w: round(v, 1) for w, v in r["launch_us"].items()}, flush=True)
    append_records(args.out, "launch.jsonl", records, "kernels")


if __name__ == "__main__":
    main()
