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
pin_memory/non_blocking guide).
"""

from __future__ import annotations

import torch
from torch import fx

from grace.cgct.placement import feeds_only, on_cpu


def run(gm: fx.GraphModule, device: torch.device) -> str | None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    movable = [n for n in placeholders if on_cpu(n) and feeds_only(n, device)]
    if not movable:
        return None
    with gm.graph.inserting_after(placeholders[-1]):
        for node in movable:
            moved = gm.graph.call_method("to", (node, device), {"non_blocking": True})
            node.replace_all_uses_with(moved, delete_user_cb=lambda user, m=moved: user is not m)
    return f"{len(movable)} CPU tensor inputs copied to {device} at the start"
