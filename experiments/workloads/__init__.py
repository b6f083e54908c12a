"""Workloads, TorchBench style: one module per workload id in this package, each defining `Model`, a
subclass of `Workload` that declares its default batch size per mode as data and builds
`(module, example_inputs)`.

The harness owns what a mode means (see experiments/task.py): `eval` is one forward pass in the
workload's eval dtype (bfloat16 unless the workload says why not) under inference mode; `train` is one
full step (forward, backward, optimizer step) under bfloat16 autocast (unless the workload says why not).
"""

from __future__ import annotations

import abc
import importlib
import pkgutil
from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from experiments.instrument import pytree

MODES = ("eval", "train")
SIZES = ("full", "tiny")  # tiny: the same code path with small dims, for CPU tests


class UnknownWorkload(ValueError):
    pass


class Workload(abc.ABC):
    name: ClassVar[str]
    batch_sizes: ClassVar[dict[str, int]]  # default batch per supported mode; a mode not here is unsupported
    eval_dtype: ClassVar[torch.dtype] = torch.bfloat16
    train_dtype: ClassVar[torch.dtype] = torch.bfloat16  # autocast dtype of train steps; float32: no autocast
    origin: ClassVar[str]  # what the model is and where its code comes from (a substitute says why)
    acronyms: ClassVar[dict[str, str]] = {}  # mode -> the paper's name for this workload in that mode
    varying_inputs: ClassVar[bool] = False  # build() returns a list of input sets, taken in turn
    revised: ClassVar[str] = ""  # UTC date of the last change to what the workload runs: records made before
                                 # it measured another program (sweeps measure it again, figures leave them out)

    def __init__(self, mode: str, batch: int | None = None, size: str = "full", device: str = "cpu"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode not in self.batch_sizes:
            raise NotImplementedError(f"workload {self.name!r} has no {mode} mode (it supports: {', '.join(self.batch_sizes)})")
        if size not in SIZES:
            raise ValueError(f"size must be one of {SIZES}, got {size!r}")
        self.mode = mode
        self.batch = self.batch_sizes[mode] if batch is None else int(batch)
        self.size = size
        self.device = torch.device(device)

    @property
    def tiny(self) -> bool:
        return self.size == "tiny"

    @abc.abstractmethod
    def build(self) -> tuple[nn.Module, Any]:
        """The module and example inputs (a tuple of positional or a dict of keyword arguments; a list
        of them with varying_inputs), on self.device, in float32 (the harness casts for eval)."""

    def loss(self, output: Any) -> torch.Tensor:
        """Scalar to train on: by default the mean of every floating tensor in the output."""
        leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        return sum(t.float().mean() for t in leaves)


def names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def revisions(of: Iterable[str]) -> dict[str, str]:
    """Workload name -> the date of its last revision, for the known and revised workloads among `of`."""
    dates = {n: get(n).revised for n in set(of) & set(names())}
    return {n: d for n, d in dates.items() if d}


def get(name: str) -> type[Workload]:
    if name not in names():
        raise UnknownWorkload(f"unknown workload {name!r} (known: {', '.join(names())})")
    return importlib.import_module(f"{__name__}.{name}").Model
