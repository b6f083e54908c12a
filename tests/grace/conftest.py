import pytest
import torch

from grace import pi, recording
from tests.grace.fakes import fake_capture


@pytest.fixture
def cpu_graphs(monkeypatch):
    monkeypatch.setattr(recording, "capture", fake_capture)
    monkeypatch.setattr(recording, "DEVICE_TYPE", "cpu")
    monkeypatch.setattr(recording, "caller_capturing", lambda: False)
    monkeypatch.setattr(pi, "LIBRARY_ALIGNMENT", 64)  # what every CPU allocation has


@pytest.fixture
def cpu_partitions(cpu_graphs, monkeypatch):
    """Inductor partitions CPU code as it does CUDA code (every node counts as on a GPU), and GraCE's
    runtime captures the partitions with the CPU stand-in: the backend end to end, on a CPU. Caches off:
    code partitioned so must not be found by a compile without this."""
    from torch._inductor import scheduler

    monkeypatch.setattr(scheduler.BaseSchedulerNode, "is_gpu", lambda self: True)
    torch.compiler.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch.compiler.reset()
