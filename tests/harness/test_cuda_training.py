"""On a CUDA GPU: GraCE trains Hugging Face models right. The longest CUDA tests, a workload a file:
run with -n 4 --dist loadfile, each takes a worker beside the others (scripts/device_run.sh)."""

import pytest

pytestmark = pytest.mark.cuda

from tests.conftest import measured  # noqa: E402


def trains_right(tmp_path, workload):
    """Training graphs: the gradient of the loss arrives expanded, partitions may take no tensor input,
    backward kernels add atomically; PI and all of GraCE must still capture and train right."""
    records = measured(tmp_path, f"workload=[{workload}]", "variant=[pi,grace]")
    assert len(records) == 2
    for (w, v), r in records.items():
        assert r.status == "ok" and r.numerics.passed, (w, v, r.reason)
        assert r.grace["captured"] >= 2, (w, v, r.grace)
        assert not any("overlapping" in why for why in r.grace["not_captured"]), (w, v, r.grace)
        # layers that share a graph: a recording per layer, none given up for recording again and again
        assert not any("recordings at sizes already recorded" in why for why in r.grace["not_captured"]), (w, v, r.grace)


def test_grace_trains_blenderbot_small_right(tmp_path):
    trains_right(tmp_path, "BSCG")  # its layers share a graph
