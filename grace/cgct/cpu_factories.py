"""CGCT pass: tensors created on the CPU inside the graph for GPU work are created on the GPU instead.

A factory call without a device (torch.tensor(2.0), torch.arange(n), torch.full(...)) makes a CPU
tensor; mixed into GPU work it splits the CUDA graph (stock Inductor keeps CPU ops and device copies
out of its partitions) or, as a CPU constant read by a GPU kernel, fails to launch. When every use of
the tensor ends in GPU work (grace.cgct.placement.feeds_only), the factory is given the GPU as device:

    before                                     after
    b = torch.tensor(2.0)             # cpu     b = torch.tensor(2.0, device='cuda:0')
    s = b.sqrt()                      # cpu     s = b.sqrt()                      # now on the GPU
    out = torch.mul(x, s)             # cuda    out = torch.mul(x, s)

A value known only at run time (a Python int or float argument, which Dynamo passes as a symbolic
scalar: `torch.tensor([float(t)])` of a diffusion step t) would be baked into a CUDA graph, which would
then be recorded once per value. Such a tensor is made on the CPU as before and copied to the GPU right
away (a few bytes, outside the graph), so that the work on it runs on the GPU inside one graph:

    emb = torch.tensor([float(t)])    # cpu     emb = torch.tensor([float(t)]).to('cuda:0')
    args = emb * freqs                # cpu     args = emb * freqs              # freqs made on the GPU too

Random factories (torch.rand...) are left alone: the CPU and GPU generators give different numbers.
"""

from __future__ import annotations

import torch
from torch import fx

from grace.cgct.placement import feeds_only, on_cpu, value
from grace.torch_adapter import TRACED_TENSOR

VALUE_FACTORIES = {torch.tensor, TRACED_TENSOR, torch.as_tensor, torch.scalar_tensor, torch.full}  # values, not sizes
FACTORIES = VALUE_FACTORIES | {torch.zeros, torch.ones, torch.empty, torch.arange, torch.linspace, torch.logspace,
                               torch.eye}


def _has_tensor_arg(node: fx.Node) -> bool:
    return any(isinstance(value(a), torch.Tensor) for a in node.all_input_nodes)


def run(gm: fx.GraphModule, device: torch.device) -> str | None:
    moved = copied = 0
    for node in list(gm.graph.nodes):
        if not (node.op == "call_function" and node.target in FACTORIES and on_cpu(node)
                and not _has_tensor_arg(node) and feeds_only(node, device)):
            continue
        if node.target in VALUE_FACTORIES and node.all_input_nodes:  # a value known only at run time
            with gm.graph.inserting_after(node):
                to = gm.graph.call_method("to", (node, device))
            node.replace_all_uses_with(to, delete_user_cb=lambda user, to=to: user is not to)
            copied += 1
        else:
            node.kwargs = {**node.kwargs, "device": device}
            moved += 1
    notes = [f"{moved} CPU tensor factories now create on {device}" if moved else "",
             f"{copied} CPU tensors of run-time values copied to {device} where made" if copied else ""]
    return "; ".join(filter(None, notes)) or None
