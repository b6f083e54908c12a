import math

import numpy as np
import pytest

from experiments import stats


def test_median_odd_even():
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_median_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        stats.median([])


def test_quartiles():
    assert stats.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)
    assert stats.quartiles([7.0]) == (7.0, 7.0)


def test_round_ratios_are_per_round_medians():
    variant = [[1.0, 2.0, 3.0], [10.0, 10.0, 40.0]]
    baseline = [[4.0, 4.0, 4.0], [5.0, 20.0, 20.0]]
    assert stats.round_ratios(variant, baseline) == [0.5, 0.5]
    with pytest.raises(ValueError):
        stats.round_ratios(variant, baseline[:1])


def test_speedup_is_baseline_over_variant():
    assert stats.speedup(baseline_ms=3.0, variant_ms=1.5) == 2.0


def test_geomean():
    assert math.isclose(stats.geomean([1.0, 4.0]), 2.0)
    assert math.isclose(stats.geomean([2.0, 8.0, 4.0]), 4.0)
    with pytest.raises(ValueError):
        stats.geomean([1.0, 0.0])


def test_flatten():
    assert stats.flatten([[1.0], [2.0, 3.0]]) == [1.0, 2.0, 3.0]


def test_speedup_intervals_contain_one_for_the_same_timings_and_exclude_it_for_a_clear_difference():
    rng = __import__("numpy").random.default_rng(1)
    noise = lambda: (1 + 0.05 * rng.standard_normal((20, 5))).tolist()  # noqa: E731
    same, (lo, hi) = stats.speedup_interval(noise(), noise())
    assert lo < 1 < hi and lo <= same <= hi and stats.verdict([lo, hi]) == "within noise"
    faster = [[t / 1.2 for t in r] for r in noise()]
    s, (lo, hi) = stats.speedup_interval(noise(), faster)
    assert 1 < lo <= s <= hi and stats.verdict([lo, hi]) == "win"
    assert stats.verdict([0.8, 0.9]) == "loss"


def test_a_speedup_from_several_processes_a_side_covers_their_own_speeds():
    """Two workers of the same code, each side's processes 4 % apart in speed: resampling the rounds
    alone gives an interval that excludes 1; resampling the processes too covers it."""
    import random

    rng = random.Random(0)

    def side(levels):  # 40 rounds: each process's 5 iterations in turn
        return [[lv * (1 + rng.gauss(0, 0.01)) for lv in levels for _ in range(5)] for _ in range(40)]

    baseline, twin = side([1.00, 1.04]), side([1.04, 1.04])
    _, rounds_only = stats.speedup_interval(baseline, twin)
    _, with_processes = stats.speedup_interval(baseline, twin, processes=(2, 2))
    assert not rounds_only[0] <= 1 <= rounds_only[1]
    assert with_processes[0] <= 1 <= with_processes[1]
    assert stats.speedup_interval(baseline, twin, processes=(1, 1)) == stats.speedup_interval(baseline, twin)
    with pytest.raises(ValueError, match="both one, or both several"):
        stats.speedup_interval(baseline, twin, processes=(1, 2))


@pytest.mark.parametrize("process_sd, iteration_sd", [(0.02, 0.03), (0.005, 0.05)])
def test_an_interval_over_several_processes_is_as_wide_as_the_ratio_varies(process_sd, iteration_sd):
    """Eight processes a side, each of a speed of its own, 40 rounds: the interval's half-width is about
    1.96 sd of the ratio across sessions. Resampling the rounds within the processes as well counts
    their noise twice, and came out 1.39 times too wide where the iterations are the noisier."""
    rng = np.random.default_rng(1)

    def session():  # 40 rounds x (8 processes x 5 iterations)
        levels = np.exp(rng.normal(0, process_sd, 8))
        return (levels[None, :, None] * np.exp(rng.normal(0, iteration_sd, (40, 8, 5)))).reshape(40, -1)

    sd = np.std([np.log(np.median(session()) / np.median(session())) for _ in range(400)])
    widths = []
    for _ in range(8):
        _, (lo, hi) = stats.speedup_interval(session(), session(), processes=(8, 8))
        widths.append((np.log(hi) - np.log(lo)) / 2)
    assert 0.75 < np.mean(widths) / (1.96 * sd) < 1.25
