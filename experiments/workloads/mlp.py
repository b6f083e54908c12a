"""A deep stack of small layers: each kernel is tiny, so launching them dominates (launch-bound)."""

import torch
from torch import nn

from experiments.workloads import Workload


class Model(Workload):
    name = "mlp"
    batch_sizes = {"eval": 8, "train": 8}
    origin = "in-house: 24 blocks of Linear(256, 256) + LayerNorm + GELU"

    def build(self):
        depth, width = (4, 32) if self.tiny else (24, 256)
        blocks = [nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()) for _ in range(depth)]
        model = nn.Sequential(*blocks, nn.Linear(width, 1))
        x = torch.randn(self.batch, width)
        return model.to(self.device), (x.to(self.device),)
