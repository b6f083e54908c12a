import pytest

from grace import pi, recording
from tests.grace.fakes import fake_capture


@pytest.fixture
def cpu_graphs(monkeypatch):
    monkeypatch.setattr(recording, "capture", fake_capture)
    monkeypatch.setattr(recording, "DEVICE_TYPE", "cpu")
    monkeypatch.setattr(recording, "caller_capturing", lambda: False)
    monkeypatch.setattr(pi, "LIBRARY_ALIGNMENT", 64)  # what every CPU allocation has
