"""In-house EfficientDet-D0 style detector (effdet is not on the GPU machine), after TorchBench's
timm_efficientdet: timm's EfficientNet-B0 backbone (levels P3-P5), a BiFPN of 3 repeats with fast
normalized fusion at 64 channels, shared class and box heads over 9 anchors; trained on a dense focal
loss and a smooth-L1 box loss against fixed random targets (no anchor matching)."""

import torch
from torch import nn
from torch.nn import functional as F

from experiments.workloads import Workload


class _Fuse(nn.Module):
    """Fast normalized fusion of same-shaped maps, then a separable conv."""

    def __init__(self, n: int, ch: int):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))
        self.conv = nn.Sequential(nn.Conv2d(ch, ch, 3, padding=1, groups=ch), nn.Conv2d(ch, ch, 1),
                                  nn.BatchNorm2d(ch), nn.SiLU())

    def forward(self, *xs):
        w = F.relu(self.w)
        return self.conv(sum(wi * x for wi, x in zip(w, xs)) / (w.sum() + 1e-4))


class _BiFPN(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.td = nn.ModuleList([_Fuse(2, ch), _Fuse(2, ch)])
        self.bu = nn.ModuleList([_Fuse(3, ch), _Fuse(2, ch)])

    def forward(self, p3, p4, p5):
        p4_td = self.td[0](p4, F.interpolate(p5, size=p4.shape[-2:]))
        p3_out = self.td[1](p3, F.interpolate(p4_td, size=p3.shape[-2:]))
        p4_out = self.bu[0](p4, p4_td, F.max_pool2d(p3_out, 2))
        p5_out = self.bu[1](p5, F.max_pool2d(p4_out, 2))
        return p3_out, p4_out, p5_out


class _Head(nn.Module):
    def __init__(self, ch: int, out: int):
        super().__init__()
        self.convs = nn.Sequential(*[m for _ in range(3) for m in (nn.Conv2d(ch, ch, 3, padding=1), nn.SiLU())])
        self.pred = nn.Conv2d(ch, out, 3, padding=1)

    def forward(self, feats):
        return [self.pred(self.convs(f)) for f in feats]


class _EfficientDet(nn.Module):
    def __init__(self, backbone: str, ch: int, repeats: int, classes: int, anchors: int = 9):
        super().__init__()
        import timm

        self.backbone = timm.create_model(backbone, features_only=True, out_indices=(2, 3, 4))
        self.lateral = nn.ModuleList(nn.Conv2d(c, ch, 1) for c in self.backbone.feature_info.channels())
        self.bifpn = nn.ModuleList(_BiFPN(ch) for _ in range(repeats))
        self.cls, self.box = _Head(ch, anchors * classes), _Head(ch, anchors * 4)

    def forward(self, images):
        feats = [lat(f) for lat, f in zip(self.lateral, self.backbone(images))]
        for layer in self.bifpn:
            feats = layer(*feats)
        return self.cls(feats), self.box(feats)


class Model(Workload):
    name = "efficientdet"
    acronyms = {"train": "TEFD"}
    batch_sizes = {"train": 1}
    origin = "in-house EfficientDet-D0 style (timm efficientnet_b0 + BiFPN); effdet absent"

    def build(self):
        backbone, ch, repeats, self.classes, side = (("efficientnet_b0", 16, 1, 3, 64) if self.tiny else
                                                     ("efficientnet_b0", 64, 3, 90, 512))
        model = _EfficientDet(backbone, ch, repeats, self.classes)
        images = torch.randn(self.batch, 3, side, side)
        return model.to(self.device), (images.to(self.device),)

    def loss(self, output):
        cls_out, box_out = output
        gen = torch.Generator().manual_seed(0)  # fixed targets: the same on every call and every variant
        loss = 0.0
        for c, b in zip(cls_out, box_out):
            target = (torch.rand(c.shape, generator=gen) < 0.01).to(c.device, torch.float32)
            p = torch.sigmoid(c.float())
            ce = F.binary_cross_entropy_with_logits(c.float(), target, reduction="none")
            focal = ce * ((1 - p) * target + p * (1 - target)) ** 2
            box_target = torch.randn(b.shape, generator=gen).to(b.device)
            loss = loss + focal.mean() + F.smooth_l1_loss(b.float(), box_target)
        return loss
