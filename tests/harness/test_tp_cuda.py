"""On two or more GPUs: tensor-parallel XLNet through the harness, stock CUDA graphs and GraCE, NCCL."""

import logging

import pytest
import torch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (the nvidia-h200-x2 kind)")]


def test_xlnet_on_two_gpus_matches_the_whole_model(make_cfg, caplog):
    """Also: each variant's ranks finish on their own when closed. NCCL's destroy waits until every CUDA
    graph that captured one of its collectives is freed, so a rank that still holds its graphs hangs there until killed."""
    from experiments.sweep import Sweep

    sweep = Sweep(make_cfg("workload=[XLNET-I]", "size=tiny", "tp=2", "variant=[pt2_cg,grace]"))
    with caplog.at_level(logging.WARNING, logger="experiments.worker"):
        sweep.run()
    assert not [r.message for r in caplog.records if r.name == "experiments.worker"]
    records = {r.variant: r for r in sweep.store.load()}
    for variant in ("pt2_cg", "grace"):
        r = records[variant]
        assert (r.tp, r.status) == (2, "ok"), r.reason
        assert r.numerics.passed and r.kernels.graphs >= 1
