"""Wall-clock timing of iterations, and the two readings that say how fast the host and GPU were then.

The host's launch cost drifts within seconds (docs/harness.md), so each timed
round carries a launch-cost calibration taken right after it, and the SM clock.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from grace.calibrate import launch_cost_us, synchronize  # noqa: F401  (one definition, shared with SCG)


def time_iterations(step: Callable[[], object], n: int, device: torch.device) -> list[float]:
    """Milliseconds per call of `step`, each measured between two device synchronizations."""
    times = []
    for _ in range(n):
        synchronize(device)
        t0 = time.perf_counter()
        step()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def capture_whole(step: Callable[[], object], device: torch.device, warmup: int = 3) -> torch.cuda.CUDAGraph:
    """`step` captured whole into one CUDA graph (torch.cuda.graph), after `warmup` calls on a side stream,
    as PyTorch documents whole-network capture; raises where it cannot be captured (a synchronization,
    a CPU tensor copied in, ...)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    synchronize(device)
    return graph


def sm_clock_mhz(device: torch.device) -> float | None:
    """Current SM clock through NVML (torch.cuda.clock_rate); None on CPU or without NVML."""
    if device.type != "cuda":
        return None
    try:
        return float(torch.cuda.clock_rate(device))
    except Exception:  # NVML missing or unsupported: the record says None rather than failing the run
        return None
