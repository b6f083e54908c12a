"""Which CPU values can move to the GPU without anything outside the graph noticing."""

from __future__ import annotations

import operator
from operator import setitem

import torch
from torch import fx


def value(node: fx.Node):
    return node.meta.get("val", node.meta.get("example_value"))


def on_cpu(node: fx.Node) -> bool:
    v = value(node)
    return isinstance(v, torch.Tensor) and v.device.type == "cpu"


_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                      operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, setitem}


def mutates(node: fx.Node) -> bool:
    """Whether the op writes into its first argument (x.add_(...), x += 1, x[i] = v)."""
    if node.target in _INPLACE_OPERATORS:
        return True
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


def _splits(node: fx.Node, v) -> bool:
    """Whether `node` is CPU work that returns several CPU tensors (a tuple or list of them)."""
    return (node.op == "call_function" and isinstance(v, (tuple, list)) and bool(v) and bool(node.users)
            and all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in v)
            and "device" not in node.kwargs and not mutates(node))


def feeds_only(node: fx.Node, device: torch.device) -> bool:
    """True if every use of `node`'s CPU tensor ends in GPU work: each user either already computes on
    `device` (it mixes the CPU value with GPU tensors), or is itself CPU tensor work whose every use
    does (an op that returns several tensors, as torch.meshgrid does, through each of them). Nothing
    reaches the graph's outputs or leaves tensors (.item(), .tolist(), a Python branch), and nothing
    writes into it (a moved copy would take the write instead of the caller's tensor)."""
    for user in node.users:
        v = value(user)
        if _splits(user, v):  # torch.meshgrid, unbind, split: each part taken by getitem must feed GPU work
            if all(part.target is operator.getitem and feeds_only(part, device) for part in user.users):
                continue
            return False
        if user.op == "output" or not isinstance(v, torch.Tensor) or mutates(user):
            return False
        if v.device == device:
            continue
        if v.device.type != "cpu" or "device" in user.kwargs or not feeds_only(user, device):
            return False
    return bool(node.users)
