"""On two or more GPUs: tensor-parallel XLNet through the harness, stock CUDA graphs and GraCE, NCCL."""

import pytest
import torch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (the nvidia-h200-x2 kind)")]


def test_xlnet_on_two_gpus_matches_the_whole_model(make_cfg):
    from experiments.sweep import Sweep

    sweep = Sweep(make_cfg("workload=[XLNET-I]", "size=tiny", "tp=2", "variant=[pt2_cg,grace]"))
    sweep.run()
    records = {r.variant: r for r in sweep.store.load()}
    for variant in ("pt2_cg", "grace"):
        r = records[variant]
        assert (r.tp, r.status) == (2, "ok"), r.reason
        assert r.numerics.passed and r.kernels.graphs >= 1
