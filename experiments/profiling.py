"""Kernel-level statistics of a few iterations, from torch.profiler's trace.

- GPU time: the summed duration of kernels, memcpys and memsets: the floor that launch overhead sits on.
- Kernels inside CUDA graphs: counted by grace.profile (CUPTI correlation ids of graph launches).
- Bytes copied into graph inputs: stock CUDA graph trees copy every non-static input into the graph's
  placeholder with one torch._foreach_copy_ per replay, and so does GraCE's runtime; during profiling
  that function is wrapped to add up the bytes it writes (experiments.instrument).
- Where the time went: the TOP device activities by time per iteration, inside and outside graphs
  apart, kept in each record so that two variants' GPU time can be compared later, on any machine
  (scripts/kernel_diff.py).
"""

from __future__ import annotations

from typing import Callable

import torch

from experiments.records import KernelStats
from grace.profile import DEVICE_CATEGORIES, count, graph_correlations, trace
from experiments.instrument import count_graph_input_copies

TOP = 16  # device activities kept per record, the most time first
NAME_CHARS = 96  # of a kernel's (demangled, often templated) name


def kernel_stats(events: list[dict], iters: int, copy_bytes: int, cuda: bool) -> KernelStats:
    """Per-iteration statistics from chrome-trace events of `iters` iterations."""
    if not cuda:
        return KernelStats(iters, None, None, None, None, copy_bytes / iters)
    c = count(events)
    return KernelStats(
        iters=iters,
        gpu_kernel_ms=c.device_us / 1e3 / iters,
        kernels=c.kernels / iters,
        kernels_in_graphs_share=c.in_graphs / c.kernels if c.kernels else None,
        graphs=c.graph_launches / iters,
        graph_input_copy_bytes=copy_bytes / iters,
        top=kernel_table(events, iters)[:TOP],
    )


def kernel_table(events: list[dict], iters: int) -> list[dict]:
    """Per device activity (kernel name, memcpy or memset) and whether a CUDA graph replayed it: launches
    and device microseconds per iteration, the most time first: where two variants' GPU time differs."""
    graph_launches = graph_correlations(events)
    table: dict[tuple[str, bool], list[float]] = {}
    for e in events:
        if e.get("cat") in DEVICE_CATEGORIES:
            name = e["name"][:NAME_CHARS]
            row = table.setdefault((name, e["args"].get("correlation") in graph_launches), [0, 0.0])
            row[0] += 1
            row[1] += e.get("dur", 0.0)
    rows = [{"name": name, "in_graph": in_graph, "launches": n / iters, "us": round(us / iters, 2)}
            for (name, in_graph), (n, us) in table.items()]
    return sorted(rows, key=lambda r: -r["us"])


def _repeat(step: Callable[[], object], iters: int) -> None:
    """The steps, each output dropped before the next step, as in the timed loop."""
    for _ in range(iters):
        step()


def profile_iterations(step: Callable[[], object], iters: int, device: torch.device) -> KernelStats:
    cuda = device.type == "cuda"
    with count_graph_input_copies() as copied:
        if not cuda:  # no kernels to trace: count the copies alone
            _repeat(step, iters)
            return kernel_stats([], iters, copied[0], cuda)
        events = trace(lambda: _repeat(step, iters))
    return kernel_stats(events, iters, copied[0], cuda)
