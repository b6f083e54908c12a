"""The host cores that timed rounds run on: a group of their own per job and rank, so that no variant
gets a faster core or node, and compiling jobs beside them do not take the timing cores."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def timing_cores(requested: list[int], slot: int = 0, ranks: int = 1, setting: str = "measure.timing_cpus") -> list[int]:
    """The cores of `setting`, for each of `ranks` tensor-parallel ranks in turn (they time at once): a
    negative one counts from the end of the cores this process may run on, shifted by a group for each
    rank and each job of a host before it (`slot`), so that ranks and jobs side by side (one GPU each)
    time on cores of their own where there are enough. ValueError, in one line, for a core it cannot run on."""
    cores = sorted(os.sched_getaffinity(0))
    k = len(requested)
    absent = [c for c in requested if c >= 0 and c not in cores]
    if absent:
        raise ValueError(f"{setting}={requested}: no core {absent[0]} among this process's "
                         f"{len(cores)} ({cores[0]}-{cores[-1]})")
    picked = [c if c >= 0 else c - (slot * ranks + r) * k for r in range(ranks) for c in requested]
    if min(picked, default=0) < -len(cores):
        log.warning("%s=%s: %d core(s) for job %d's %d rank(s); they share cores", setting, requested, len(cores),
                    slot, ranks)
    return [c if c >= 0 else cores[c % len(cores)] for c in picked]


def pin_threads(cores: list[int] | tuple[int, ...]) -> None:
    """Every thread of this process onto `cores`, not only the caller: autograd runs a CUDA backward on a
    thread of its own, made at the first backward, which would otherwise stay where the OS put it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile, or not ours to move
            pass
