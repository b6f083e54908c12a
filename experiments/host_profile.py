"""Where the host's time goes in an iteration: cProfile over a few iterations, by part of the stack.

A variant whose wall time exceeds its GPU time by more than another's spends it in Python somewhere; the
kernel table (experiments/profiling.py) cannot say where. Each function's own time goes to the GROUP of
its file; a C function's (torch ops, guards, synchronization) to the group of the Python that called
it. Times are per iteration and inflated by cProfile itself: compare variants with one another, not
with timed medians.
"""

from __future__ import annotations

import cProfile
import pstats
from collections import Counter
from typing import Callable

from experiments.records import HostStats
from experiments.instrument import inductor_cache_dir

TOP = 12  # functions kept per record, the most own time first
GENERATED = "inductor generated code"  # files under Inductor's cache folder (the worker's own, in a sweep)
GROUPS = [  # (group, substrings of a file's path), first match wins, after GENERATED
    ("grace", ("/grace/",)),
    ("inductor runtime", ("torch/_inductor/",)),
    ("dynamo and aot autograd", ("torch/_dynamo/", "torch/_functorch/", "torch/_guards", "torch/_subclasses/")),
    ("autograd and optimizer", ("torch/autograd/", "torch/optim/", "torch/_tensor.py")),
    ("torch, other", ("torch/",)),
    ("harness", ("/experiments/",)),
]
OTHER = "model and other"  # the workload's own Python (transformers, timm, ...), the standard library
BUILTIN = "~"  # cProfile's file for C functions


def group(path: str, generated: str) -> str:
    """`generated`: Inductor's cache folder, where the code it generates lies."""
    if path.startswith(generated):
        return GENERATED
    return next((name for name, parts in GROUPS if any(p in path for p in parts)), OTHER)


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
