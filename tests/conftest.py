import os
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    # xdist runs a worker per core; each computing on every core, they starved each other's threads:
    # one thread each, and in the processes they start
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    # The corpus's jobs meet through lock files in the temporary folder, and two xdist workers' tests
    # are not one corpus run's jobs (one's timed rounds held the other's calls for a minute): a folder
    # of their own, for the processes they start too. Inductor's caches stay where they were, shared.
    import tempfile

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    os.environ["TMPDIR"] = tempfile.mkdtemp(prefix=f"grace-tests-{os.environ['PYTEST_XDIST_WORKER']}-")
    tempfile.tempdir = None

from hydra import compose, initialize_config_dir

import experiments.config  # noqa: F401  (registers the config schema)
from tests.grace import fakes

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"

# Small enough for a 2-core CPU, large enough to exercise rounds, ratios and quartiles.
FAST = ["measure=smoke", "measure.rounds=2", "measure.iters=3", "measure.warmup=2", "measure.profile_iters=2",
        "measure.launch_calibration=10", "figure=false", "aa_control=false", "floor=false"]


def pytest_collection_modifyitems(config, items):
    for item in items:  # a test that composes a sweep's config runs one, in worker processes
        if "make_cfg" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def make_cfg(tmp_path):
    """Compose the real config, with results under tmp_path."""

    def _make(*overrides: str):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=[f"results_dir={tmp_path / 'results'}", *FAST, *overrides])

    return _make


def measured(out, *overrides):
    """Records of a sweep at tiny size, variants set up in parallel."""
    from experiments.sweep import Sweep

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"results_dir={out}", *FAST, "size=tiny", "measure.parallel_setup=true",
                                           *overrides])
    sweep = Sweep(cfg)
    sweep.run()
    return {(r.workload, r.variant): r for r in sweep.store.load()}


@pytest.fixture
def cpu_graphs():
    """GraCE's runtime on the CPU, with a stand-in for CUDA graph capture (tests.grace.fakes)."""
    with fakes.cpu_graphs():
        yield


@pytest.fixture
def cpu_partitions():
    """The backend end to end on a CPU: Inductor partitions CPU code as it does CUDA code, and the
    runtime captures the partitions with the stand-in (tests.grace.fakes.cpu_partitions)."""
    with fakes.cpu_partitions():
        yield
