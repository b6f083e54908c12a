"""A variant is how the model is run: eager, or torch.compile with some backend, mode and options.

Each lives in conf/variant/<name>.yaml as data; this module only turns that data into a callable.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Variant:
    name: str
    compile: Mapping[str, Any] | None = None  # torch.compile's keyword arguments; None runs eager
    requires_cuda: bool = False
    description: str = ""

    @classmethod
    def from_config(cls, name: str, cfg: Mapping[str, Any]) -> Variant:
        return cls(name=name, **cfg)

    def unavailable_reason(self, device: str) -> str | None:
        if self.requires_cuda and device != "cuda":
            return f"variant {self.name!r} needs CUDA, and this machine has none"
        return None

    def apply(self, model: torch.nn.Module) -> Callable:
        if self.compile is None:
            return model
        kwargs = dict(self.compile)
        backend = kwargs.get("backend")
        if isinstance(backend, str) and ":" in backend:  # "package.module:function", a backend of one's own
            module, attr = backend.split(":")
            kwargs["backend"] = getattr(importlib.import_module(module), attr)
        return torch.compile(model, **kwargs)
