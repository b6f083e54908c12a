"""What launching a CUDA graph costs after PI re-points one of its kernel nodes, by the graph's size: is
the cost of PI's update one driver call, or does a launch after it pay for the whole graph, once or on
every later launch?

    python scripts/pi_launch.py [--out results/pi_launch] [--calls 100] [--rounds 5]

A graph of `kernels` small kernels (4096 float32 elements each) whose first, last or every kernel reads
the input (every: PI has as many nodes to point as the graph has kernels, as in a training step whose
weights are the graph's inputs), run seven ways, interleaved round by round, each on a graph of its own:
`bare` replays it on its placeholder (never re-pointed); `copy` copies a new input into that placeholder
and replays (stock's way); `moving` re-points its kernels at a new input before every replay (one
cuGraphExecKernelNodeSetParams a node through grace.pi.Indirection), as PI does when a program's input
moves every call; `still` replays a graph re-pointed once, before the timing (an input that stays where
it is, as in MTCG-T's forward, whose inputs are the same tensors every step); `back` one re-pointed there
and back to its placeholder (as SCG leaves a graph it chose copies for, after timing PI); `uploaded`
one re-pointed once and then uploaded explicitly (cuGraphUpload); `raw` re-points as `moving` does, but
calls the driver through ctypes with prepared arguments instead of cuda-bindings (what PI's cost per node
would be with a leaner binding). Each way is timed as the median of `calls` synchronized calls (the
latency a caller waits: `median_us_per_call`) and of the host time of the replay() call alone, from an
idle GPU (`launch_us`). Writes one JSON line per graph (<out>/<device>/launch.jsonl).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments and grace

from experiments import environment  # noqa: E402
from grace import cuda_driver  # noqa: E402
from grace.pi import Indirection  # noqa: E402
from replay_overhead import append_records, bench_args  # noqa: E402

KERNELS = [1, 16, 64, 256, 1024]
ELEMENTS = 4096
INPUTS = 3  # new inputs cycled through: each call's is another


def capture(kernels: int, reads: str, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A graph of `kernels` kernels, the first (reads="first"), the last ("last", kernels >= 2) or
    each ("every") of which reads x."""
    def body():
        y = w * 2 if reads == "last" else x * 2
        for _ in range(kernels - 1 - (reads == "last")):
            if reads == "every":
                y.add_(x, alpha=1e-4)
            else:
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


@functools.cache
def set_params():
    """The driver's cuGraphExecKernelNodeSetParams through ctypes (cuda.h maps the name to this symbol,
    whose struct is cuda-bindings' CUDA_KERNEL_NODE_PARAMS), taking raw handles."""
    f = ctypes.CDLL("libcuda.so.1").cuGraphExecKernelNodeSetParams_v2
    f.argtypes, f.restype = [ctypes.c_void_p] * 3, ctypes.c_int
    return f


class Pointed:
    """A captured graph whose kernel that reads its input PI can re-point (grace.pi.Indirection)."""

    def __init__(self, kernels: int, reads: str, w: torch.Tensor):
        self.placeholder = torch.randn(ELEMENTS, device="cuda")
        self.graph, self.out = capture(kernels, reads, self.placeholder, w)
        self.indirection = Indirection(self.graph.raw_cuda_graph(), self.graph.raw_cuda_graph_exec(),
                                       {0: (self.placeholder.data_ptr(), self.placeholder.untyped_storage().nbytes())})
        self.exec, self.set_params = self.graph.raw_cuda_graph_exec(), set_params()

    def point(self, t: torch.Tensor) -> None:
        self.indirection.point({0: t.data_ptr()})

    def point_raw(self, t: torch.Tensor) -> None:
        """What point does, each node's update through ctypes: its slots written, one driver call."""
        ptrs = {0: t.data_ptr()}
        for n in self.indirection.nodes:
            n.write(ptrs)
            if self.set_params(self.exec, int(n.node), n.params.getPtr()):
                raise RuntimeError("cuGraphExecKernelNodeSetParams failed")

    def upload(self) -> None:
        """Upload the executable graph as it is now, ahead of its next launch."""
        cuda_driver.upload(self.indirection.exec, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()


def measure(kernels: int, reads: str, calls: int, rounds: int) -> dict:
    """Each way's time per call. The graphs of `still`, `back` and `uploaded` are each re-pointed once,
    before any timing, and never again: at an input (still), there and back to their placeholder
    (back), at an input and then uploaded explicitly (uploaded)."""
    w = torch.randn(ELEMENTS, device="cuda")
    inputs = [torch.randn(ELEMENTS, device="cuda") for _ in range(INPUTS)]
    bare, moving, still, back, uploaded, raw = (Pointed(kernels, reads, w) for _ in range(6))
    still.point(inputs[0])
    back.point(inputs[0])
    back.point(back.placeholder)
    uploaded.point(inputs[0])
    uploaded.upload()
    new_input = itertools.cycle(inputs)
    ways = {
        "bare": lambda launch: launch(bare.graph.replay),
        "copy": lambda launch: (bare.placeholder.copy_(next(new_input)), launch(bare.graph.replay)),
        "moving": lambda launch: (moving.point(next(new_input)), launch(moving.graph.replay)),
        "still": lambda launch: launch(still.graph.replay),
        "back": lambda launch: launch(back.graph.replay),
        "uploaded": lambda launch: launch(uploaded.graph.replay),
        "raw": lambda launch: (raw.point_raw(next(new_input)), launch(raw.graph.replay)),
    }
    sync_us, launch_us = {way: [] for way in ways}, {way: [] for way in ways}
    for r in range(rounds):
        for way in list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]:
            s, la = timed(ways[way], calls)
            sync_us[way].append(s)
            launch_us[way].append(la)
    # a re-pointed graph computes on the input it reads what the bare one computes on a copy of it
    moving.point(inputs[1])
    raw.point_raw(inputs[1])
    bare.placeholder.copy_(inputs[1])
    for g in (moving, raw, bare):
        g.graph.replay()
    torch.testing.assert_close(moving.out, bare.out)
    torch.testing.assert_close(raw.out, bare.out)
    return {"kernels": kernels, "reads": reads, "elements": ELEMENTS, "calls": calls, "rounds": rounds,
            "patched_nodes": moving.indirection.patched_nodes,
            "median_us_per_call": {way: statistics.median(v) for way, v in sync_us.items()},
            "launch_us": {way: statistics.median(v) for way, v in launch_us.items()},
            "sync_us_by_round": sync_us, "launch_us_by_round": launch_us,
            "env": dataclasses.asdict(environment.current())}


def main() -> None:
    args = bench_args(__doc__, "pi_launch", calls=100, rounds=5)
    with torch.no_grad():
        for kernels, reads in ([(k, "first") for k in KERNELS] + [(k, "last") for k in KERNELS if k > 1]
                               + [(k, "every") for k in KERNELS if k > 1]):
            r = measure(kernels, reads, args.calls, args.rounds)
            print(kernels, reads, "launch", {w: round(v, 1) for w, v in r["launch_us"].items()}, flush=True)
            append_records(args.out, "launch.jsonl", [r], "kernels")  # each as it comes: a later failure loses none


if __name__ == "__main__":
    main()
