"""Where the host's time goes in an iteration: cProfile over a few iterations, by part of the stack.

A variant whose wall time exceeds its GPU time by more than another's spends it in Python somewhere; the
kernel table (experiments/profiling.py) cannot say where. Each function's own time goes to the GROUP of
its file; a C function's (torch ops, guards, synchronization) to the group of the Python that called
it. Times are per iteration and inflated by cProfile itself: compare variants with one another, not
with timed medians.
"""

from __future__ import annotations

import cProfile
import os
import pstats
from collections import Counter
from pathlib import Path
from typing import Callable

import torch

import experiments
import grace
from experiments.records import HostStats
from experiments.instrument import inductor_cache_dir

TOP = 12  # functions kept per record, the most own time first
GENERATED = "inductor generated code"  # files under Inductor's cache folder (the worker's own, in a sweep)
# Files are grouped by the package folder they lie in, not by words in their path: the H200's venv lies
# in /opt/torch/, and matching "torch/" put transformers and torchvision in "torch, other".
PACKAGES = [("grace", Path(grace.__file__).parent), ("harness", Path(experiments.__file__).parent)]
MODELS = Path(experiments.__file__).parent / "workloads"  # the in-house workloads' models lie inside the harness
TORCH = Path(torch.__file__).parent
TORCH_GROUPS = [  # (group, beginnings of a path inside torch/), first match wins
    ("inductor runtime", ("_inductor/",)),
    ("dynamo and aot autograd", ("_dynamo/", "_functorch/", "_guards", "_subclasses/")),
    ("autograd and optimizer", ("autograd/", "optim/", "_tensor.py")),
    ("CUDA graph launch", ("cuda/graphs.py",)),
]
TORCH_OTHER = "torch, other"
OTHER = "model and other"  # the workload's own Python (transformers, timm, ...), the standard library
BUILTIN = "~"  # cProfile's file for C functions


def _inside(path: str, folder: Path) -> str | None:
    root = f"{folder}{os.sep}"
    return path[len(root):] if path.startswith(root) else None


def group(path: str, generated: str) -> str:
    """`generated`: Inductor's cache folder, where the code it generates lies."""
    if path.startswith(generated):
        return GENERATED
    if _inside(path, MODELS) is not None:
        return OTHER
    if (name := next((n for n, folder in PACKAGES if _inside(path, folder) is not None), None)):
        return name
    if (inside := _inside(path, TORCH)) is None:
        return OTHER
    return next((name for name, starts in TORCH_GROUPS if inside.startswith(starts)), TORCH_OTHER)


def host_stats(stats: pstats.Stats, iters: int) -> HostStats:
    """Per group and per function, own time in microseconds per iteration (C functions charged to the
    group of each caller, in proportion to what each caller spent in them)."""
    groups: Counter[str] = Counter()
    rows = []
    generated = inductor_cache_dir()
    for (path, line, name), (_, calls, own, _, callers) in stats.stats.items():
        if path == BUILTIN:
            for (caller_path, _, _), caller in callers.items():
                groups[group(caller_path, generated)] += caller[2]
            where, kind = name, "C, charged to its callers"
        else:
            kind = group(path, generated)
            groups[kind] += own
            where = f"{name} ({path.rsplit('/', 1)[-1]}:{line})"
        rows.append({"function": where, "group": kind, "calls": calls / iters, "us": round(own / iters * 1e6, 2)})
    rows.sort(key=lambda r: -r["us"])
    return HostStats(iters, {g: round(t / iters * 1e6, 2) for g, t in groups.most_common()}, rows[:TOP])


def profile_host(step: Callable[[], object], iters: int, synchronize: Callable[[], None]) -> HostStats:
    """cProfile over `iters` calls of `step` and one synchronization at the end (time the host waited
    for the device shows under `synchronize`'s caller)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(iters):
        step()
    synchronize()
    profiler.disable()
    return host_stats(pstats.Stats(profiler), iters)
