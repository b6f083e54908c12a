"""Kernel-level statistics of a few iterations, from torch.profiler's trace.

- GPU time: the summed duration of kernels, memcpys and memsets: the floor that launch overhead sits on.
- Kernels inside CUDA graphs: counted by grace.profile (CUPTI correlation ids of graph launches).
- Bytes copied into graph inputs: stock CUDA graph trees copy every non-static input into the graph's
  placeholder with one torch._foreach_copy_ per replay, and so does GraCE's runtime; during profiling
  that function is wrapped to add up the bytes it writes (grace.torch_adapter).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Callable

import torch

from experiments.records import KernelStats
from grace.profile import count, trace
from grace.torch_adapter import count_graph_input_copies

def kernel_stats(events: Iterable[dict], iters: int, copy_bytes: int, cuda: bool) -> KernelStats:
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
    )


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
