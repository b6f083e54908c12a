"""ResNet-18 from torchvision, random weights: a short, launch-bound CNN."""

import torch
import torchvision

from experiments.workloads import Workload


class Model(Workload):
    name = "resnet18"
    batch_sizes = {"eval": 1, "train": 8}
    origin = "torchvision.models.resnet18(weights=None)"

    def build(self):
        side = 64 if self.tiny else 224
        model = torchvision.models.resnet18(weights=None, num_classes=10 if self.tiny else 1000)
        x = torch.randn(self.batch, 3, side, side)
        return model.to(self.device), (x.to(self.device),)
