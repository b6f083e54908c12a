"""A variant is how the model is run: eager, or torch.compile with some backend, mode and options, and
Dynamo settings of its own (each variant runs in a process of its own).

Each lives in conf/variant/<name>.yaml as data; this module only turns that data into a callable.
A variant may carry a deliberate error (`mutation`): the numerics check is proven by catching each one.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch

from experiments.instrument import check_dynamo_config, pytree, set_dynamo_config

MUTATIONS = {  # deliberate errors, each of a kind a CUDA-graph runtime can make
    "perturb": "one floating output 1 % too large",
    "stale_input": "every call reads the first call's inputs (a replay reading a stale input buffer)",
    "skip_update": "the optimizer step does nothing (an update lost to a replay)",
}


def _perturbed(fn: Callable) -> Callable:
    def run(*args, **kwargs):
        leaves, spec = pytree.tree_flatten(fn(*args, **kwargs))
        at = next(i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.is_floating_point())
        leaves[at] = leaves[at] * 1.01
        return pytree.tree_unflatten(leaves, spec)
    return run


def _stale(fn: Callable) -> Callable:
    first = []

    def run(*args, **kwargs):
        if not first:
            first.append(pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (args, kwargs)))
        args, kwargs = first[0]
        return fn(*args, **kwargs)
    return run


@dataclass(frozen=True)
class Variant:
    name: str
    compile: Mapping[str, Any] | None = None  # torch.compile's keyword arguments; None runs eager
    requires_cuda: bool = False
    description: str = ""
    dynamo: Mapping[str, Any] | None = None  # torch._dynamo.config settings, e.g. {capture_scalar_outputs: true}
    mutation: str | None = None  # a deliberate error (MUTATIONS), for proving the numerics check
    floor: bool = False  # timed as the floor: its step captured whole into one CUDA graph and replayed (bench.py)

    def __post_init__(self):
        check_dynamo_config(dict(self.dynamo or {}))
        if self.mutation is not None and self.mutation not in MUTATIONS:
            raise ValueError(f"variant {self.name!r}: unknown mutation {self.mutation!r} (one of {', '.join(MUTATIONS)})")

    @classmethod
    def from_config(cls, name: str, cfg: Mapping[str, Any]) -> Variant:
        return cls(name=name, **cfg)

    @property
    def uses_grace(self) -> bool:
        return (self.compile or {}).get("backend") == "grace"

    @property
    def uses_scg(self) -> bool:
        """Whether it times candidates while it sets up (GraCE's SCG), which other work on the GPU skews."""
        return self.uses_grace and bool(((self.compile or {}).get("options") or {}).get("scg"))

    def unavailable_reason(self, device: str, mode: str) -> str | None:
        if self.requires_cuda and device != "cuda":
            return f"variant {self.name!r} needs CUDA, and this machine has none"
        if self.mutation == "skip_update" and mode != "train":
            return f"variant {self.name!r} skips the optimizer step, and {mode} has none"
        return None

    def apply(self, model: torch.nn.Module | Callable) -> Callable:
        """`model` as this variant runs it, with its mutation."""
        fn = self.compiled(model)
        return {"perturb": _perturbed, "stale_input": _stale}.get(self.mutation, lambda f: f)(fn)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, compile: bool) -> Callable[[], object]:
        """The optimizer's step as this variant takes it: eager, or compiled with `compile`."""
        if self.mutation == "skip_update":
            return lambda: None
        return self.compiled(optimizer.step) if compile else optimizer.step

    def compiled(self, model: torch.nn.Module | Callable) -> Callable:
        """`model` (a module, or a function such as an optimizer's step) compiled as this variant says."""
        if self.compile is None:
            return model
        if self.dynamo:
            set_dynamo_config(dict(self.dynamo))
        kwargs = dict(self.compile)
        backend = kwargs.get("backend")
        if isinstance(backend, str) and ":" in backend:  # "package.module:function", a backend of one's own
            module, attr = backend.split(":")
            kwargs["backend"] = getattr(importlib.import_module(module), attr)
        return torch.compile(model, **kwargs)
