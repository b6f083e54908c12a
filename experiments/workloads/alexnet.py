"""AlexNet from torchvision, random weights."""

import torch

from experiments.workloads import Workload


class Model(Workload):
    name = "alexnet"
    acronyms = {"eval": "ALNET"}
    batch_sizes = {"eval": 2}
    origin = "torchvision.models.alexnet(weights=None)"

    def build(self):
        import torchvision

        side = 64 if self.tiny else 224
        model = torchvision.models.alexnet(weights=None, num_classes=10 if self.tiny else 1000)
        return model.to(self.device), (torch.randn(self.batch, 3, side, side, device=self.device),)
