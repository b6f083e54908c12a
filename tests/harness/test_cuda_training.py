"""On a CUDA GPU: GraCE trains Hugging Face models right (in a file of its own, the longest CUDA test: run
with -n 2 --dist loadfile, it takes one worker while the other runs the rest)."""

import pytest

pytestmark = pytest.mark.cuda

from tests.conftest import measured  # noqa: E402


def test_grace_trains_huggingface_models_right(tmp_path):
    """Training graphs: the gradient of the loss arrives expanded, partitions may take no tensor input,
    backward kernels add atomically; PI and all of GraCE must still capture and train right."""
    records = measured(tmp_path, "workload=[DGPT2,BSCG]", "variant=[pi,grace]")
    assert len(records) == 4
    for (w, v), r in records.items():
        assert r.status == "ok" and r.numerics.passed, (w, v, r.reason)
        assert r.grace["captured"] >= 2, (w, v, r.grace)
        assert not any("overlapping" in why for why in r.grace["not_captured"]), (w, v, r.grace)
        # BSCG's layers share a graph: a recording per layer, none given up for recording again and again
        assert not any("recordings at sizes already recorded" in why for why in r.grace["not_captured"]), (w, v, r.grace)
