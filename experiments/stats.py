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
    back to back, so a slow moment of the host hits both sides of it."""
    if len(variant_rounds) != len(baseline_rounds):
        raise ValueError(f"{len(variant_rounds)} rounds against {len(baseline_rounds)} baseline rounds")
    return [median(v) / median(b) for v, b in zip(variant_rounds, baseline_rounds)]


def speedup(baseline_ms, variant_ms):
    """Works on numbers and, elementwise, on pandas Series."""
    return baseline_ms / variant_ms


def geomean(xs: Sequence[float]) -> float:
    if not xs or any(x <= 0 for x in xs):
        raise ValueError(f"geomean needs positive values, got {list(xs)}")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def speedup_interval(baseline_rounds: Sequence[Sequence[float]], variant_rounds: Sequence[Sequence[float]],
                     seed: int = 0) -> tuple[float, list[float]]:
    """median(baseline) / median(variant) over all timed iterations, and its 95 % interval from a paired
    bootstrap over the rounds (a round of each ran back to back, so a round is resampled whole, both
    sides together, keeping what the host's drift did to both)."""
    if len(baseline_rounds) != len(variant_rounds):
        raise ValueError(f"{len(variant_rounds)} rounds against {len(baseline_rounds)} baseline rounds")
    b, v = (np.asarray(r, dtype=float) for r in (baseline_rounds, variant_rounds))  # rounds x iterations
    picks = np.random.default_rng(seed).integers(0, len(b), size=(BOOTSTRAP, len(b)))
    ratios = np.median(b[picks].reshape(BOOTSTRAP, -1), axis=1) / np.median(v[picks].reshape(BOOTSTRAP, -1), axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    return float(np.median(b) / np.median(v)), [float(x) for x in np.percentile(ratios, [tail, 100 - tail])]


def verdict(interval: Sequence[float] | None) -> str:
    """win (the speedup's interval lies above 1), loss (below 1), or within noise."""
    if not interval:
        return "unknown"
    return "win" if interval[0] > 1 else "loss" if interval[1] < 1 else "within noise"
