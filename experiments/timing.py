"""Wall-clock timing of iterations, and the two readings that say how fast the host and GPU were then.

On the H200 machine the host's launch cost moves by up to 2x within seconds (DESIGN.md), so each timed
round carries a launch-cost calibration taken right after it, and the SM clock.
"""

from __future__ import annotations

import time
from typing import Callable

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def launch_cost_us(device: torch.device, launches: int) -> float:
    """Host time per launch of a tiny kernel (an in-place add on one element), launches back to back."""
    x = torch.zeros(1, device=device)
    with torch.no_grad():
        x.add_(1)  # first launch loads the kernel
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(launches):
            x.add_(1)
        synchronize(device)
    return (time.perf_counter() - t0) * 1e6 / launches


def sm_clock_mhz(device: torch.device) -> float | None:
    """Current SM clock through NVML (torch.cuda.clock_rate); None on CPU or without NVML."""
    if device.type != "cuda":
        return None
    try:
        return float(torch.cuda.clock_rate(device))
    except Exception:  # NVML missing or unsupported: the record says None rather than failing the run
        return None
