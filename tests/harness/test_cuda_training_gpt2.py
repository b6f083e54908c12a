"""On a CUDA GPU: GraCE trains DistilGPT2 right (a file of its own: a worker of its own, test_cuda_training)."""

import pytest

pytestmark = pytest.mark.cuda

from tests.harness.test_cuda_training import trains_right  # noqa: E402


def test_grace_trains_distilgpt2_right(tmp_path):
    trains_right(tmp_path, "DGPT2")
