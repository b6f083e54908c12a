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
from grace import pi, recording
from tests.grace.fakes import fake_capture

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
def cpu_graphs(monkeypatch):
    """GraCE's runtime on the CPU, with a stand-in for CUDA graph capture (tests.grace.fakes)."""
    monkeypatch.setattr(recording, "capture", fake_capture)
    monkeypatch.setattr(recording, "DEVICE_TYPE", "cpu")
    monkeypatch.setattr(recording, "caller_capturing", lambda: False)
    monkeypatch.setattr(pi, "LIBRARY_ALIGNMENT", 64)  # what every CPU allocation has


@pytest.fixture
def cpu_partitions(cpu_graphs, monkeypatch):
    """Inductor partitions CPU code as it does CUDA code (where it splits, every node counts as on a
    GPU; its code generation is the CPU's), and GraCE's runtime captures the partitions with the CPU
    stand-in: the backend end to end, on a CPU. Caches off: code partitioned so must not be found by a
    compile without this."""
    from torch._inductor import scheduler

    split, on_gpu = scheduler.Scheduler.should_partition, scheduler.BaseSchedulerNode.is_gpu

    def should_partition(self, node):
        scheduler.BaseSchedulerNode.is_gpu = lambda n: True
        try:
            return split(self, node)
        finally:
            scheduler.BaseSchedulerNode.is_gpu = on_gpu

    monkeypatch.setattr(scheduler.Scheduler, "should_partition", should_partition)
    torch.compiler.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch.compiler.reset()
