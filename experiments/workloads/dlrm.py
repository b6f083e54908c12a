"""In-house DLRM after TorchBench's dlrm (facebookresearch/dlrm; torchrec and fbgemm_gpu are not on the
GPU machine): bottom MLP 512-512-64 on 512 dense features, 8 embedding tables of 1M x 64 looked up
with bags of 100 indices, pairwise dot interaction, top MLP 1024-1024-1024-1."""

import torch
from torch import nn

from experiments.workloads import Workload


def _mlp(sizes, last_sigmoid=False):
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(a, b), nn.Sigmoid() if last_sigmoid and i == len(sizes) - 2 else nn.ReLU()]
    return nn.Sequential(*layers)


class _DLRM(nn.Module):
    def __init__(self, dense: int, bottom, tables: int, rows: int, top):
        super().__init__()
        self.bottom = _mlp([dense, *bottom])
        dim = bottom[-1]
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        pairs = (tables + 1) * tables // 2
        self.top = _mlp([dim + pairs, *top], last_sigmoid=True)
        self.register_buffer("tri", torch.tril_indices(tables + 1, tables + 1, offset=-1), persistent=False)

    def forward(self, dense, indices, offsets):
        x = self.bottom(dense)
        feats = [x] + [emb(indices[i], offsets[i]) for i, emb in enumerate(self.embeddings)]
        t = torch.stack(feats, dim=1)
        z = torch.bmm(t, t.transpose(1, 2))[:, self.tri[0], self.tri[1]]
        return self.top(torch.cat([x, z], dim=1))


class Model(Workload):
    name = "dlrm"
    acronyms = {"eval": "DLRM"}
    batch_sizes = {"eval": 2048}
    origin = "in-house, after facebookresearch/dlrm as configured by TorchBench's dlrm"

    def build(self):
        # dense features, bottom MLP, tables, rows per table, top MLP, indices per bag
        dense, bottom, tables, rows, top, per_bag = ((16, [16, 8], 3, 100, [16, 1], 4) if self.tiny else
                                                     (512, [512, 512, 64], 8, 1_000_000, [1024, 1024, 1024, 1], 100))
        model = _DLRM(dense, bottom, tables, rows, top)
        indices = torch.randint(0, rows, (tables, self.batch * per_bag))
        offsets = (torch.arange(self.batch) * per_bag).expand(tables, -1).contiguous()
        x = torch.randn(self.batch, dense)
        return model.to(self.device), (x.to(self.device), indices.to(self.device), offsets.to(self.device))
