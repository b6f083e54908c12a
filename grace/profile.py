"""Which kernels a call launched, and which of them a CUDA graph replayed, from torch.profiler's trace.

CUPTI gives a kernel replayed from a graph the correlation id of the cudaGraphLaunch that replayed it;
kernels launched one by one carry their own launch's id.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
GRAPH_LAUNCHES = {"cudaGraphLaunch", "cuGraphLaunch", "cudaGraphLaunch_v10000"}


@dataclasses.dataclass(frozen=True)
class KernelCounts:
    kernels: int  # kernels launched
    in_graphs: int  # of which replayed from CUDA graphs
    graph_launches: int
    device_us: float  # device time of kernels, memcpys and memsets


def graph_correlations(events: list[dict]) -> set[int]:
    """Correlation ids of the graph launches: the device activities a graph replayed carry one of them."""
    return {e["args"]["correlation"] for e in events
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in GRAPH_LAUNCHES}


def count(events: list[dict]) -> KernelCounts:
    """From chrome-trace events."""
    graph_launches, kernels, device_us = graph_correlations(events), [], 0.0
    for e in events:
        cat = e.get("cat")
        if cat in DEVICE_CATEGORIES:
            device_us += e.get("dur", 0.0)
            if cat == "kernel":
                kernels.append(e["args"].get("correlation"))
    return KernelCounts(len(kernels), sum(c in graph_launches for c in kernels), len(graph_launches), device_us)


def trace(call: Callable[[], object]) -> list[dict]:
    """Chrome-trace events of `call` on the GPU (CPU and CUDA activity), synchronized at the end."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
