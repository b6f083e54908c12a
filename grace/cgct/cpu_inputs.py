"""CGCT pass: CPU tensor inputs that feed only GPU work are moved to the GPU once, at the graph's start.

A CPU tensor among a graph's inputs (a module attribute such as a noise schedule, a step counter, a
0-dim scale) that is indexed or computed on before it meets GPU tensors keeps that CPU work between
GPU kernels: stock Inductor ends a CUDA-graph partition before each CPU op and starts another after it,
and a partition that takes a CPU tensor cannot be replayed safely (its value is read at launch). One
host-to-device copy at the start leaves all of the work on the GPU, in one partition:

    before                                         after
    def forward(x, table):    # table: cpu          def forward(x, table):
        a = table[3]          # cpu                     table_1 = table.to('cuda:0')   # one copy
        s = a.sqrt()          # cpu                     a = table_1[3]                 # GPU from here on
        return x * s          # cuda                    s = a.sqrt()
                                                        return x * s

The copy runs on every call (the input's values may change), outside the graph: a device copy from
pageable memory cannot be captured. It is non-blocking: a blocking one waits for all the GPU work queued
before it, which takes from a host-bound program the lead its host had; from pageable memory the driver
stages the values before it returns, so the caller may change the tensor at once (PyTorch's
pin_memory/non_blocking guide). From pinned memory the copy reads the values only when the stream
reaches it, after the call may have returned: `PinnedCopied` hands such an input over as a pageable copy.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import fx

from grace.cgct.placement import feeds_only, on_cpu


MOVED = "grace_copied_to_gpu"  # a placeholder's meta key: this pass copies its values to the GPU


def run(gm: fx.GraphModule, device: torch.device) -> str | None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    movable = [n for n in placeholders if on_cpu(n) and feeds_only(n, device)]
    if not movable:
        return None
    with gm.graph.inserting_after(placeholders[-1]):
        for node in movable:
            moved = gm.graph.call_method("to", (node, device), {"non_blocking": True})
            node.replace_all_uses_with(moved, delete_user_cb=lambda user, m=moved: user is not m)
            node.meta[MOVED] = True
    return f"{len(movable)} CPU tensor inputs copied to {device} at the start"


def moved(gm: fx.GraphModule) -> list[int]:
    """The positions, among gm's inputs, of those this pass copies to the GPU."""
    return [i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder") if n.meta.get(MOVED)]


class PinnedCopied:
    """`compiled`, called with a pageable copy of each moved input that lies in pinned memory: the
    non-blocking copy would read pinned memory when the stream reaches it, and a caller that writes the
    tensor as soon as the call returns (a staging buffer) would change what the call computes with. An
    input whose copy would have other strides (an expanded one) is not copied; the call then waits for
    the stream, as eager's blocking copy does."""

    def __init__(self, compiled: Callable, positions: list[int], device: torch.device):
        self.compiled, self.positions, self.device = compiled, positions, device

    def __call__(self, *args):
        pinned = [i for i in self.positions if args[i].is_pinned()]
        if not pinned:
            return self.compiled(*args)
        args, wait = list(args), False
        for i in pinned:
            copy = args[i].clone()  # pageable: the driver stages it before the copy call returns
            if copy.stride() == args[i].stride():
                args[i] = copy
            else:
                wait = True
        out = self.compiled(*args)
        if wait:
            torch.cuda.current_stream(self.device).synchronize()
        return out
