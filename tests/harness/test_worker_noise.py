import math
import random

import pytest

from scripts import worker_noise


def _sessions(offset_sd: float, n: int = 300, per: int = 3, rounds: int = 20, round_sd: float = 0.03,
              slower: dict[str, float] | None = None) -> list[dict]:
    """Sessions whose processes each run at a speed of their own (log-sd `offset_sd`), every round noisy,
    the processes of a way in `slower` by that much (log)."""
    rng = random.Random(1)
    return [{"processes": [{"way": way, "us_per_call_by_round": [100 * math.exp(level + rng.gauss(0, round_sd))
                                                                  for _ in range(rounds)]}
                           for way in worker_noise.WAYS
                           for level in [(slower or {}).get(way, 0.0) + rng.gauss(0, offset_sd) for _ in range(per)]]}
            for _ in range(n)]


@pytest.mark.parametrize("offset_sd", [0.0, 0.04])
def test_the_workers_noise_is_the_spread_of_two_processes_beyond_their_rounds(offset_sd):
    """Rounds' noise alone gives no workers' noise; per-process offsets of sd s give two processes' log-sd s*sqrt(2)."""
    tau = worker_noise.tau(_sessions(offset_sd), "fixed seed")
    assert tau == pytest.approx(offset_sd * math.sqrt(2), abs=0.006)


def test_a_way_that_runs_slower_leans_by_as_much_and_the_others_do_not():
    sessions = _sessions(0.01, n=60, slower={worker_noise.COLD: 0.02})
    of = worker_noise.summary(sessions, resamples=200)
    assert list(of)[0] == "random seed" and of["random seed"]["lean"][0] == 0.0
    value, lo, hi = of[worker_noise.COLD]["lean"]
    assert value == pytest.approx(0.02, abs=0.004) and lo < value < hi and lo > 0.01
    value, lo, hi = of["fixed seed"]["lean"]
    assert lo < 0 < hi
