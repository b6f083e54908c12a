"""In-house DCGAN after TorchBench's dcgan (the PyTorch examples' DCGAN: 64x64 images, 100-dim noise,
feature maps 64). One train step updates generator and discriminator together on the sum of the
discriminator's loss and the generator's non-saturating loss, a single optimizer over both."""

import torch
from torch import nn
from torch.nn import functional as F

from experiments.workloads import Workload


def _generator(nz: int, f: int, tiny: bool):
    chans = [f * 8, f * 4, f * 2, f] if not tiny else [f * 2, f]
    layers = [nn.ConvTranspose2d(nz, chans[0], 4, 1, 0, bias=False), nn.BatchNorm2d(chans[0]), nn.ReLU(True)]
    for a, b in zip(chans[:-1], chans[1:]):
        layers += [nn.ConvTranspose2d(a, b, 4, 2, 1, bias=False), nn.BatchNorm2d(b), nn.ReLU(True)]
    return nn.Sequential(*layers, nn.ConvTranspose2d(chans[-1], 3, 4, 2, 1, bias=False), nn.Tanh())


def _discriminator(f: int, tiny: bool):
    chans = [f, f * 2, f * 4, f * 8] if not tiny else [f, f * 2]
    layers = [nn.Conv2d(3, chans[0], 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True)]
    for a, b in zip(chans[:-1], chans[1:]):
        layers += [nn.Conv2d(a, b, 4, 2, 1, bias=False), nn.BatchNorm2d(b), nn.LeakyReLU(0.2, True)]
    return nn.Sequential(*layers, nn.Conv2d(chans[-1], 1, 4, 1, 0, bias=False), nn.Flatten())


class _GAN(nn.Module):
    def __init__(self, nz: int, f: int, tiny: bool):
        super().__init__()
        self.g, self.d = _generator(nz, f, tiny), _discriminator(f, tiny)

    def forward(self, noise, real):
        fake = self.g(noise)
        return self.d(real), self.d(fake.detach()), self.d(fake)


class Model(Workload):
    name = "dcgan"
    acronyms = {"train": "DCGAN"}
    batch_sizes = {"train": 32}
    origin = "in-house, after TorchBench's dcgan (pytorch/examples DCGAN), one joint G+D step"

    def build(self):
        nz, f, side = (16, 8, 16) if self.tiny else (100, 64, 64)
        noise = torch.randn(self.batch, nz, 1, 1)
        real = torch.rand(self.batch, 3, side, side) * 2 - 1
        return _GAN(nz, f, self.tiny).to(self.device), (noise.to(self.device), real.to(self.device))

    def loss(self, output):
        d_real, d_fake, g_fake = (o.float() for o in output)
        bce = F.binary_cross_entropy_with_logits
        return (bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
                + bce(g_fake, torch.ones_like(g_fake)))
