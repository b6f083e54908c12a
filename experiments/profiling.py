"""Kernel-level statistics of a few iterations, from torch.profiler's trace.

- GPU time: the summed duration of kernels, memcpys and memsets: the floor that launch overhead sits on.
- Kernels inside CUDA graphs: CUPTI gives a kernel replayed from a graph the correlation id of the
  cudaGraphLaunch that replayed it; kernels launched one by one carry their own launch's id.
- Bytes copied into graph inputs: stock CUDA graph trees copy every non-static input into the graph's
  placeholder with one torch._foreach_copy_ per replay, and so does GraCE's runtime; during profiling
  that function is wrapped to add up the bytes it writes (grace.torch_adapter).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from experiments.records import KernelStats
from grace.torch_adapter import count_graph_input_copies
from experiments.timing import synchronize

_DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
_GRAPH_LAUNCHES = {"cudaGraphLaunch", "cuGraphLaunch", "cudaGraphLaunch_v10000"}


def kernel_stats(events: Iterable[dict], iters: int, copy_bytes: int, cuda: bool) -> KernelStats:
    """Per-iteration statistics from chrome-trace events of `iters` iterations."""
    if not cuda:
        return KernelStats(iters, None, None, None, None, copy_bytes / iters)
    graph_correlations = set()
    kernels = []
    device_us = 0.0
    for e in events:
        cat = e.get("cat")
        if cat in ("cuda_runtime", "cuda_driver") and e.get("name") in _GRAPH_LAUNCHES:
            graph_correlations.add(e["args"]["correlation"])
        elif cat in _DEVICE_CATEGORIES:
            device_us += e.get("dur", 0.0)
            if cat == "kernel":
                kernels.append(e["args"].get("correlation"))
    in_graphs = sum(c in graph_correlations for c in kernels)
    return KernelStats(
        iters=iters,
        gpu_kernel_ms=device_us / 1e3 / iters,
        kernels=len(kernels) / iters,
        kernels_in_graphs_share=in_graphs / len(kernels) if kernels else None,
        graphs=len(graph_correlations) / iters,
        graph_input_copy_bytes=copy_bytes / iters,
    )


def profile_iterations(step: Callable[[], object], iters: int, device: torch.device) -> KernelStats:
    cuda = device.type == "cuda"
    if not cuda:  # no kernels to trace: count the copies alone
        with count_graph_input_copies() as copied:
            for _ in range(iters):
                step()
        return kernel_stats([], iters, copied[0], cuda)
    with count_graph_input_copies() as copied, profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        synchronize(device)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    return kernel_stats(events, iters, copied[0], cuda)
