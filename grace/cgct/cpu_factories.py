"""CGCT pass: tensors created on the CPU inside the graph for GPU work are created on the GPU instead.

A factory call without a device (torch.tensor(2.0), torch.arange(n), torch.full(...)) makes a CPU
tensor; mixed into GPU work it splits the CUDA graph (stock Inductor keeps CPU ops and device copies
out of its partitions) or, as a CPU constant read by a GPU kernel, fails to launch. When every use of
the tensor ends in GPU work (grace.cgct.placement.feeds_only), the factory is given the GPU as device:

    before                                     after
    b = torch.tensor(2.0)             # cpu     b = torch.tensor(2.0, device='cuda:0')
    s = b.sqrt()                      # cpu     s = b.sqrt()                      # now on the GPU
    out = torch.mul(x, s)             # cuda    out = torch.mul(x, s)

Random factories (torch.rand...) are left alone: the CPU and GPU generators give different numbers.
"""

from __future__ import annotations

import torch
from torch import fx

from grace.cgct.placement import feeds_only, on_cpu

FACTORIES = {torch.tensor, torch.as_tensor, torch.scalar_tensor, torch.zeros, torch.ones, torch.full,
             torch.empty, torch.arange, torch.linspace, torch.logspace, torch.eye}


def _has_tensor_arg(node: fx.Node) -> bool:
    return any(isinstance(a, fx.Node) for a in node.all_input_nodes)


def run(gm: fx.GraphModule, device: torch.device) -> str | None:
    moved = 0
    for node in gm.graph.nodes:
        if (node.op == "call_function" and node.target in FACTORIES and on_cpu(node)
                and not _has_tensor_arg(node) and feeds_only(node, device)):
            node.kwargs = {**node.kwargs, "device": device}
            moved += 1
    return f"{moved} CPU tensor factories now create on {device}" if moved else None
