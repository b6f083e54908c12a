"""A small model that takes a CPU scalar tensor (a temperature) beside its GPU input: the pattern that
makes stock CUDA graphs split or skip a graph, and the first target of CGCT."""

import torch
from torch import nn

from experiments.workloads import Workload


class _Scaled(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x, temperature):
        for layer in self.layers:
            x = torch.relu(layer(x)) / temperature
        return torch.softmax(x, dim=-1)


class Model(Workload):
    name = "cpu_scalar"
    batch_sizes = {"eval": 8, "train": 8}
    origin = "in-house: Linear stack whose activations are divided by a 0-dim CPU tensor"

    def build(self):
        width, depth = (16, 2) if self.tiny else (256, 8)
        x = torch.randn(self.batch, width, device=self.device)
        temperature = torch.tensor(1.5)  # stays on the CPU on purpose
        return _Scaled(width, depth).to(self.device), (x, temperature)

    def loss(self, output):
        return output[:, 0].mean()  # the default, a mean over softmax rows, is a constant
