"""DenseNet-121 from torchvision, random weights."""

import torch

from experiments.workloads import Workload


class Model(Workload):
    name = "densenet121"
    acronyms = {"eval": "DNET"}
    batch_sizes = {"eval": 64}
    origin = "torchvision.models.densenet121(weights=None)"

    def build(self):
        import torchvision

        if self.tiny:
            model = torchvision.models.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, num_classes=10)
        else:
            model = torchvision.models.densenet121(weights=None)
        side = 32 if self.tiny else 224
        return model.to(self.device), (torch.randn(self.batch, 3, side, side, device=self.device),)
