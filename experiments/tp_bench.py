"""A tensor-parallel workload measured by the sweep: the worker process is rank 0 and starts ranks
1..tp-1; every Bench method rank 0 runs, each other rank runs too, in lockstep (the sums inside the model
need all ranks). Each rank builds the same model from the same seed and keeps its slice
(experiments/tp.py); numerics compare rank 0's output with the whole model's (TP1) in eager; an
iteration's time is the slowest rank's.

Commands and results go between the ranks over a gloo group, on the host; the model's sums use NCCL.
A rank waiting for its next command in an NCCL broadcast keeps a kernel spinning on its GPU, and the
sweep keeps every variant's worker alive while it times one: an idle variant's rank would hold such a
kernel on the GPU the timed variant runs on, and slow every all-reduce of the timed one (docs/harness.md).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import tempfile

import torch.distributed as dist

from experiments.bench import Bench, Spec


# A rank waits for its next command while the sweep sets up and times other variants (minutes, for the
# largest); rank 0's exit ends the wait sooner (gloo's connection closes).
COMMAND_WAIT = datetime.timedelta(hours=6)


def _join(rank: int, spec: Spec, init: str) -> dist.ProcessGroup:
    """Join the ranks; returns the host-side group that carries commands and results."""
    dist.init_process_group("nccl" if spec.device == "cuda" else "gloo", init_method=init, rank=rank,
                            world_size=spec.tp)
    return dist.new_group(backend="gloo", timeout=COMMAND_WAIT)


def _rank(rank: int, spec: Spec, init: str) -> None:
    """Ranks 1..tp-1: run what rank 0 broadcasts until it says close."""
    control = _join(rank, spec, init)
    bench = Bench(spec, rank, control)
    try:
        while True:
            command = [None, None]
            dist.broadcast_object_list(command, src=0, group=control)
            method, args = command
            if method == "close":
                bench.close()  # its graphs freed first: see Bench.close
                return
            getattr(bench, method)(*args)
    finally:
        dist.destroy_process_group()


class TPBench(Bench):
    def __init__(self, spec: Spec):
        fd, path = tempfile.mkstemp(prefix="grace-tp-")
        os.close(fd)
        os.unlink(path)  # the file store creates it
        init = f"file://{path}"
        ctx = mp.get_context("spawn")
        self.helpers = [ctx.Process(target=_rank, args=(r, spec, init), name=f"tp-rank-{r}") for r in range(1, spec.tp)]
        for p in self.helpers:
            p.start()
        super().__init__(spec, 0, _join(0, spec, init))

    def _everywhere(self, method: str, *args):
        dist.broadcast_object_list([method, args], src=0, group=self.control)
        return getattr(super(), method)(*args)

    def ready(self) -> float:
        return self._everywhere("ready")

    def setup(self, reference: str, float64=None):  # no float64 check: the reference is the whole model
        return self._everywhere("setup", reference)

    def time_round(self, iters: int, launches: int):
        return self._everywhere("time_round", iters, launches)

    def profile(self, iters: int):
        return self._everywhere("profile", iters)

    def profile_host(self, iters: int):
        return self._everywhere("profile_host", iters)

    def diagnostics(self):
        return self._everywhere("diagnostics")

    def close(self) -> None:
        self._everywhere("close")  # the graphs freed first: see Bench.close
        # Under NCCL destroying is collective (ncclCommDestroy returns once every rank has called it): rank 0
        # destroys beside the others, then joins them.
        dist.destroy_process_group()
        for p in self.helpers:
            p.join(60)
