"""CGCT: CUDA-Graph-aware code transformations, run on the graph Dynamo hands the backend, before
Inductor. Each makes more of a program capturable in one CUDA graph without changing its results; each
is a module here with a docstring that shows a graph before and after.

Every transformation is checked after it runs: the graph is propagated again with fake tensors, and
each output must keep its device, dtype and shape. A transformation that fails the check, or raises, is
undone and the reason kept (the graph then compiles as stock would).
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import fx

from grace.cgct import cpu_factories, cpu_inputs
from grace.torch_adapter import fake_propagate, tree_leaves

log = logging.getLogger("grace")

PASSES = {"cpu_factories": cpu_factories.run, "cpu_inputs": cpu_inputs.run}


def compute_device(example_inputs) -> torch.device | None:
    """The GPU the graph computes on: the device of its first CUDA tensor input, if any."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "cuda":
            return x.device
    return None


def _signature(gm: fx.GraphModule) -> list:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [(v.device, v.dtype, tuple(v.shape)) if isinstance(v, torch.Tensor) else type(v)
            for v in tree_leaves(fx.node.map_arg(out.args, lambda n: n.meta.get("val")))]


def copy_graph(gm: fx.GraphModule) -> fx.Graph:
    """A copy of gm's graph to go back to (restore_graph)."""
    return copy.deepcopy(gm.graph)


def restore_graph(gm: fx.GraphModule, saved: fx.Graph) -> None:
    """Put `saved` (copy_graph) back as gm's graph. Dynamo hangs attributes on its nodes that a copy
    lacks (a placeholder's `_dynamo_source`, which AOTAutograd asserts): each comes back from the node
    of the same name."""
    nodes = {n.name: n for n in gm.graph.nodes}
    gm.graph = copy.deepcopy(saved)
    for node in gm.graph.nodes:
        if (original := nodes.get(node.name)) is not None:
            for attribute, value in vars(original).items():
                if attribute not in vars(node):
                    setattr(node, attribute, value)
    gm.recompile()


def apply(gm: fx.GraphModule, example_inputs, device: torch.device | None = None) -> list[str]:
    """Run every pass on `gm` in place; the notes say what each changed, or why it was undone."""
    device = device or compute_device(example_inputs)
    if device is None:
        return ["no GPU tensor among the inputs: nothing to move"]
    try:
        fake_propagate(gm, example_inputs)
    except Exception as e:  # e.g. data-dependent ops (.item()) that fake tensors cannot follow
        return [f"not run: the graph cannot be propagated with fake tensors ({type(e).__name__})"]
    expected = _signature(gm)
    notes = []
    for name, transform in PASSES.items():
        saved = copy_graph(gm)
        try:
            changed = transform(gm, device)
            if not changed:
                continue
            gm.recompile()
            fake_propagate(gm, example_inputs)
            if _signature(gm) != expected:
                raise ValueError("an output would change device, dtype or shape")
            notes.append(f"{name}: {changed}")
        except Exception as e:  # undo: the graph compiles as it came
            restore_graph(gm, saved)
            notes.append(f"{name}: undone ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})")
            log.info("grace: CGCT pass %s undone: %s", name, e)
    return notes
