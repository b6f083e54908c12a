"""A variant is how the model is run: eager, or torch.compile with some backend, mode and options, and
Dynamo settings of its own (each variant runs in a process of its own).

Each lives in conf/variant/<name>.yaml as data; this module only turns that data into a callable.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch

from experiments.instrument import check_dynamo_config, set_dynamo_config


@dataclass(frozen=True)
class Variant:
    name: str
    compile: Mapping[str, Any] | None = None  # torch.compile's keyword arguments; None runs eager
    requires_cuda: bool = False
    description: str = ""
    dynamo: Mapping[str, Any] | None = None  # torch._dynamo.config settings, e.g. {capture_scalar_outputs: true}

    def __post_init__(self):
        check_dynamo_config(dict(self.dynamo or {}))

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

    def unavailable_reason(self, device: str) -> str | None:
        if self.requires_cuda and device != "cuda":
            return f"variant {self.name!r} needs CUDA, and this machine has none"
        return None

    def apply(self, model: torch.nn.Module | Callable) -> Callable:
        """`model` (a module, or a function such as an optimizer's step) as this variant runs it."""
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
