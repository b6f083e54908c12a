"""What the host and the device cost here, measured: the inputs of SCG's cost model and its timer.

The host's launch cost drifts within seconds (docs/scg.md), so the per-process calibrations are taken
once, when first needed, and kept in each decision's record.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import torch

from grace import torch_adapter as adapter
from grace.recording import capture_stream, no_collection


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_call_us(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    """Microseconds per call of `fn`, `calls` back to back between two synchronizations: the host's cost
    shows where it exceeds the device's."""
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) * 1e6 / calls


def launch_cost_us(device: torch.device, launches: int) -> float:
    """Host time per launch of a tiny kernel (an in-place add on one element), launches back to back."""
    x = torch.zeros(1, device=device)
    with torch.no_grad():
        x.add_(1)  # the first launch loads the kernel
        return per_call_us(lambda: x.add_(1), launches, device)


SPIN_CYCLES = 2_000_000  # a millisecond or so at a working GPU clock: the replays queue behind it


def device_us(fn: Callable[[], object], replays: int = 3, before: Callable[[], None] | None = None) -> float:
    """GPU time of one call of `fn` (a graph replay), each of `replays` calls between two CUDA events, all
    queued behind a spinning kernel, so that the GPU runs them at its working clock rather than waiting
    for the host's launches from idle (timed alone from idle, replays read many times their back-to-back
    time). `before` runs ahead of every call, untimed (it puts back what a call writes).
    After one untimed call (a fresh graph's first replay uploads it)."""
    if before is not None:
        before()
    fn()
    adapter.gpu_spin(SPIN_CYCLES)
    events = []
    for _ in range(replays):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    events[-1][1].synchronize()
    return sum(s.elapsed_time(e) for s, e in events) * 1e3 / replays


@functools.cache
def launch_us(device: torch.device) -> float:
    """launch_cost_us, once per process and device."""
    return launch_cost_us(device, 200)


@functools.cache
def copy_bytes_per_us(device: torch.device) -> float:
    """Device-to-device copy bandwidth, once per process: 64 MiB copied ten times."""
    src = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return src.numel() / per_call_us(lambda: dst.copy_(src), 10, device)


@functools.cache
def replay_us(device: torch.device) -> float:
    """Host time of one bare CUDA graph replay (of a one-kernel graph), once per process."""
    x = torch.zeros(1, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(x.device), no_collection(), torch.cuda.graph(graph, stream=capture_stream(x.device.index)):
        x.add_(1)
    graph.replay()
    return per_call_us(graph.replay, 200, device)


def forget() -> None:
    """Drop the per-process calibrations (grace.reset): what is compiled next is decided on the host as it
    is then, not as it was when something compiled before took them, perhaps beside other work."""
    for calibration in (launch_us, copy_bytes_per_us, replay_us):
        calibration.cache_clear()
