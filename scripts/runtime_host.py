"""What GraCE's runtime costs the host per partition call, apart from the partition's own work: a
workload's step on the CPU, Inductor partitioning it as CUDA code and the runtime capturing the
partitions with the CPU stand-in (tests.grace.fakes.cpu_partitions; the runtime variant: no PI, no
SCG). Per partition the whole call (`_call`), and per recording (its outputs and in-place inputs) the
held-output test and the replay's own part, input copies included, in microseconds a step.

    python scripts/runtime_host.py MTCG-T --hf vocab_size=1024   # mt5 at full depth, a small vocabulary

The host is this machine's, not a GPU host's: compare codes here, not with GPU records.
"""
import argparse
import collections
import contextlib
import dataclasses
import functools
import sys
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grace import recording, runtime  # noqa: E402
from scripts import gpu_gaps  # noqa: E402
from tests.grace import fakes  # noqa: E402

WARMUP = 6


class Clock:
    """Seconds spent in methods of the runtime, by (method, recording's outputs, in-place inputs)."""

    def __init__(self):
        self.spent: dict[tuple, float] = collections.defaultdict(float)
        self.calls: collections.Counter = collections.Counter()
        self.on = False

    def wrap(self, cls, name: str, mine: bool = True):
        """A patch that times cls.name; `mine`: a Recording's method, keyed by its recording's size."""
        f = getattr(cls, name)

        @functools.wraps(f)
        def timed(obj, *args, **kwargs):
            t0, graph0 = time.perf_counter(), self.spent[("graph",)]
            try:
                return f(obj, *args, **kwargs)
            finally:
                if self.on:  # the partitions' own work (the stand-in's replays) taken out
                    key = ((name, len(obj.tensors), len(obj.in_place)) if mine else
                           (name, f"graph {obj.stats.graph}{' backward' if obj.stats.backward else ''}",
                            f"partition {obj.stats.partition}"))
                    self.spent[key] += time.perf_counter() - t0 - (self.spent[("graph",)] - graph0)
                    self.calls[key] += 1
        return mock.patch.object(cls, name, timed)


def replay_timed(clock: Clock):
    """fake_capture whose replays (the partition's own work) are timed apart."""
    def capture(fn, graph_args):
        captured = fakes.fake_capture(fn, graph_args)
        inner = captured.replay

        def replay():
            t0 = time.perf_counter()
            inner()
            if clock.on:
                clock.spent[("graph",)] += time.perf_counter() - t0
        return dataclasses.replace(captured, replay=replay)
    return capture


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", help="a conf/workload name: MTCG-T")
    p.add_argument("--hf", nargs="*", default=[], metavar="KEY=INT",
                   help="a HuggingFace workload's config entries, over its full size")
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args(argv)
    clock = Clock()
    with contextlib.ExitStack() as stack:
        stack.enter_context(fakes.cpu_partitions())
        stack.enter_context(mock.patch.object(recording, "capture", replay_timed(clock)))
        for name in ("held_output", "replay"):
            stack.enter_context(clock.wrap(recording.Recording, name))
        # the whole call, the partition's work taken out
        stack.enter_context(clock.wrap(runtime.PartitionGraph, "_call", mine=False))
        task, fn = gpu_gaps.build(args.workload, "runtime", device="cpu", hf=dict(kv.split("=") for kv in args.hf))
        for _ in range(WARMUP):
            task.step(fn)
        clock.on = True
        for _ in range(args.steps):
            task.step(fn)
    per_step = {k: v / args.steps * 1e6 for k, v in clock.spent.items()}
    per_step.pop(("graph",), None)
    own = sum(v for k, v in per_step.items() if k[0] == "_call")
    print(f"{args.workload} on the CPU stand-in, torch {torch.__version__}: the runtime's calls cost {own:.0f} us "
          f"a step beyond the partitions' own work")
    print("\n| method | outputs, or graph | in-place inputs, or partition | calls a step | us a step |\n|---|---|---|---|---|")
    for key in sorted(per_step, key=lambda k: -per_step[k]):
        print(f"| {key[0]} | {key[1]} | {key[2]} | {clock.calls[key] / args.steps:.1f} | {per_step[key]:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
