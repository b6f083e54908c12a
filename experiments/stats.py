"""The arithmetic of results: medians, spread, per-round ratios, speedup, geometric mean.

speedup = median(baseline) / median(variant), baseline = `inductor` (torch.compile without CUDA graphs),
as in the paper and in PyTorch's benchmarks/dynamo; speedups across workloads are aggregated by geomean.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP = 2000  # resamples of the rounds


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("median of no samples")
    return statistics.median(xs)


def quartiles(xs: Sequence[float]) -> tuple[float, float]:
    """25th and 75th percentile (inclusive method: a single sample is its own quartiles)."""
    if len(xs) == 1:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def flatten(rounds: Sequence[Sequence[float]]) -> list[float]:
    return [x for r in rounds for x in r]


def round_ratios(variant_rounds: Sequence[Sequence[float]], baseline_rounds: Sequence[Sequence[float]]) -> list[float]:
    """Per round, median(variant) / median(baseline): a ratio taken within one round, when both ran
    back to back, so a slow moment of the host hits both sides of it; to six decimals, as its rounds are
    to the nanosecond."""
    if len(variant_rounds) != len(baseline_rounds):
        raise ValueError(f"{len(variant_rounds)} rounds against {len(baseline_rounds)} baseline rounds")
    return [round(median(v) / median(b), 6) for v, b in zip(variant_rounds, baseline_rounds)]


def speedup(baseline_ms, variant_ms):
    """Works on numbers and, elementwise, on pandas Series."""
    return baseline_ms / variant_ms


def geomean(xs: Sequence[float]) -> float:
    if not xs or any(x <= 0 for x in xs):
        raise ValueError(f"geomean needs positive values, got {list(xs)}")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def speedup_interval(baseline_rounds: Sequence[Sequence[float]], variant_rounds: Sequence[Sequence[float]],
                     seed: int = 0, processes: tuple[int, int] = (1, 1)) -> tuple[float, list[float]]:
    """median(baseline) / median(variant) over all timed iterations, and its 95 % interval from a paired
    bootstrap over the rounds (a round of each ran back to back, so a round is resampled whole, both
    sides together, keeping what the host's drift did to both). With several worker processes a side
    (`processes`: each round holds each process's iterations in turn, as many each), each side's
    processes are resampled instead, each whole with all its rounds: a process has a speed of its own,
    which no resampling of rounds can see, and its rounds' noise is already in its spread from the others
    (resampling the rounds as well counts that twice). The cluster bootstrap (Davison and Hinkley 1997,
    section 3.8; Field and Welsh 2007) underestimates a spread from k draws by sqrt((k - 1) / k), which is
    put back."""
    if len(baseline_rounds) != len(variant_rounds):
        raise ValueError(f"{len(variant_rounds)} rounds against {len(baseline_rounds)} baseline rounds")
    if min(processes) == 1 < max(processes):
        raise ValueError(f"processes a side {processes}: both one, or both several")
    b, v = (np.asarray(r, dtype=float) for r in (baseline_rounds, variant_rounds))  # rounds x iterations
    rng = np.random.default_rng(seed)
    point = float(np.median(b) / np.median(v))
    if processes == (1, 1):
        picks = rng.integers(0, len(b), size=(BOOTSTRAP, len(b)))
        b, v = b[picks], v[picks]  # resamples x rounds x iterations
    else:
        b, v = (_resample_processes(x, k, rng) for x, k in ((b, processes[0]), (v, processes[1])))
    ratios = np.median(b.reshape(BOOTSTRAP, -1), axis=1) / np.median(v.reshape(BOOTSTRAP, -1), axis=1)
    if processes != (1, 1):
        k = min(processes)
        ratios = point * (ratios / point) ** math.sqrt(k / (k - 1))
    tail = (1 - CONFIDENCE) / 2 * 100
    return point, [float(x) for x in np.percentile(ratios, [tail, 100 - tail])]


def _resample_processes(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """BOOTSTRAP resamples of rounds x (k processes' iterations), each of k processes drawn with
    replacement, whole: resamples x rounds x k x iterations a process."""
    rounds, iters = x.shape
    by_process = x.reshape(rounds, k, iters // k)
    return by_process[:, rng.integers(0, k, size=(BOOTSTRAP, k)), :].transpose(1, 0, 2, 3)


def verdict(interval: Sequence[float] | None) -> str:
    """win (the speedup's interval lies above 1), loss (below 1), or within noise."""
    if not interval:
        return "unknown"
    return "win" if interval[0] > 1 else "loss" if interval[1] < 1 else "within noise"
