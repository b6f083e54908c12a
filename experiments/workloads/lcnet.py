"""LCNet-0.5 from timm, random weights."""

import torch

from experiments.workloads import Workload


class Model(Workload):
    name = "lcnet"
    acronyms = {"eval": "LCNET"}
    batch_sizes = {"eval": 256}
    origin = "timm.create_model('lcnet_050')"

    def build(self):
        import timm

        model = timm.create_model("lcnet_035" if self.tiny else "lcnet_050", num_classes=10 if self.tiny else 1000)
        side = 32 if self.tiny else 224
        return model.to(self.device), (torch.randn(self.batch, 3, side, side, device=self.device),)
