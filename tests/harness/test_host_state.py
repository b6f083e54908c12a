import dataclasses
import math
import random

import pytest

from scripts import host_state
from tests.harness.test_figures import rec


def _pair(slow_a, slow_b, aa_factor=1.0, rounds=60, seed=0):
    """An A/A session: both workers take 1 ms plus 50 us per us of launch cost; worker A spends the rounds of
    `slow_a` in a slow host state (launch 10 us, else 7), worker B those of `slow_b`; B's code is
    `aa_factor` times as slow."""
    rng = random.Random(seed)
    made = []
    for variant, slow, factor in (("inductor", slow_a, 1.0), ("inductor_aa", slow_b, aa_factor)):
        launch = [(10.0 if i in slow else 7.0) + rng.gauss(0, 0.1) for i in range(rounds)]
        iters = [[factor * (1.0 + 0.05 * us) * (1 + rng.gauss(0, 0.002)) for _ in range(5)] for us in launch]
        made.append(dataclasses.replace(rec("a", variant, 1.0), session="s1", iter_ms=iters, launch_us=launch))
    return made


def test_a_host_state_that_one_worker_met_more_often_is_taken_out_and_a_real_difference_kept():
    slow_a, slow_b = set(range(0, 60, 2)), set(range(0, 60, 10))  # A slow in half its rounds, B in a tenth
    table = host_state.aa_rows(_pair(slow_a, slow_b))
    assert table.loc["a eval b1", "A/A"] < 0.96  # B looks faster: it met the slow state less often
    assert table.loc["a eval b1", "A/A at a common launch cost"] == pytest.approx(1.0, abs=0.01)
    real = host_state.aa_rows(_pair(slow_a, slow_b, aa_factor=1.1))
    assert real.loc["a eval b1", "A/A at a common launch cost"] == pytest.approx(1.1, abs=0.015)


def test_the_spread_is_the_rms_of_the_logs():
    import pandas as pd
    assert math.isclose(host_state.spread(pd.Series([1.1, 1 / 1.1])), math.log(1.1))


def test_a_lean_of_the_aa_controls_is_told_apart_by_which_worker_compiled_longer_and_was_set_up_first():
    made = []
    for i, (speedup, cold, aa_first) in enumerate([(1.04, True, False), (1.06, True, False), (1.02, True, False),
                                                   (0.99, False, False), (1.01, False, False), (0.97, False, True)]):
        base = dataclasses.replace(rec("a", "inductor", 1.0), session=f"s{i}", compile_s=30.0 if cold else 5.0,
                                   setup_position=None if cold else 1 if aa_first else 0)
        made += [base, dataclasses.replace(rec("a", "inductor_aa", 1.0), session=f"s{i}", compile_s=5.0, speedup=speedup,
                                           setup_position=None if cold else 0 if aa_first else 1)]
    made.append(dataclasses.replace(rec("a", "inductor_aa", 1.0), session="s9", compile_s=5.0, speedup=2.0))  # no baseline
    table = host_state.offsets(made)
    cold, warm = table.loc["compiled cold, set up first"], table.loc["set up first"]
    assert cold["sessions"] == 3 and cold["mean log(A/A) %"] == pytest.approx(100 * math.log(1.04 * 1.06 * 1.02) / 3)
    assert cold["above 1"] == 1.0 and warm["above 1"] == 0.5 and warm["sessions"] == 2
    after = table.loc["set up after its A/A control"]
    assert after["sessions"] == 1 and after["mean log(A/A) %"] == pytest.approx(100 * math.log(0.97))
    assert host_state.offsets(made, code="other").empty
