"""In-house DeepRecommender after NVIDIA's DeepRecommender as TorchBench runs it: a SELU autoencoder
over user rating vectors of the Netflix Prize's 17768 items, layers 512-512-1024, masked MSE loss.
The original drops out the 1024-wide code in training (p = 0.8); it is left out here so that a compiled
train step can be checked against eager's (compiled and eager dropout draw different masks)."""

import torch
from torch import nn

from experiments.workloads import Workload


class _AutoEncoder(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        enc = [m for a, b in zip(sizes[:-1], sizes[1:]) for m in (nn.Linear(a, b), nn.SELU())]
        rev = sizes[::-1]
        dec = [m for a, b in zip(rev[:-1], rev[1:]) for m in (nn.Linear(a, b), nn.SELU())]
        self.net = nn.Sequential(*enc, *dec[:-1])  # linear output layer

    def forward(self, ratings):
        return self.net(ratings), ratings


class Model(Workload):
    name = "deeprecommender"
    acronyms = {"eval": "DR-I", "train": "DR-T"}
    batch_sizes = {"eval": 8192, "train": 256}
    origin = "in-house, after NVIDIA/DeepRecommender as configured by TorchBench (no dropout: see docstring)"

    def build(self):
        sizes = [64, 16, 16, 32] if self.tiny else [17768, 512, 512, 1024]
        seen = torch.rand(self.batch, sizes[0]) < 0.02  # about 2% of items rated per user
        ratings = torch.randint(1, 6, (self.batch, sizes[0])).float() * seen
        return _AutoEncoder(sizes).to(self.device), (ratings.to(self.device),)

    def loss(self, output):
        pred, ratings = output
        mask = ratings != 0
        return ((pred.float() - ratings) ** 2 * mask).sum() / mask.sum().clamp_min(1)
