"""The arithmetic of results: medians, spread, per-round ratios, speedup, geometric mean.

speedup = median(baseline) / median(variant), baseline = `inductor` (torch.compile without CUDA graphs),
as in the paper and in PyTorch's benchmarks/dynamo; speedups across workloads are aggregated by geomean.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


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
