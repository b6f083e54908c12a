"""In-house DALL-E 2 style diffusion decoder (dalle2_pytorch is not on the GPU machine): a
time-conditioned U-Net denoiser sampled with deterministic DDIM steps and classifier-free guidance on
an image embedding. As in dalle2_pytorch, the noise schedule is a buffer (on the GPU with the model)
indexed by a Python step.

An earlier version kept the schedule as a plain CPU tensor attribute; stock Inductor then fused the CPU
constant's indexing into a CUDA kernel whose launch failed under both inductor and reduce-overhead. That
version lives on as the extra workload dalle2_cpu, a case for CGCT."""

import torch
from torch import nn
from torch.nn import functional as F

from experiments.workloads import Workload


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, emb: int):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(cin, cout, 3, padding=1), nn.Conv2d(cout, cout, 3, padding=1)
        self.norm1, self.norm2 = nn.GroupNorm(8, cout), nn.GroupNorm(8, cout)
        self.emb = nn.Linear(emb, cout)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, e):
        h = F.silu(self.norm1(self.conv1(x))) + self.emb(e)[:, :, None, None]
        return F.silu(self.norm2(self.conv2(h))) + self.skip(x)


class _UNet(nn.Module):
    def __init__(self, ch: int, emb: int):
        super().__init__()
        self.ch = ch
        self.time = nn.Sequential(nn.Linear(ch, emb), nn.SiLU(), nn.Linear(emb, emb))
        self.cond = nn.Linear(emb, emb)
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.down = nn.ModuleList([_Block(ch, ch, emb), _Block(ch, 2 * ch, emb), _Block(2 * ch, 4 * ch, emb)])
        self.mid = _Block(4 * ch, 4 * ch, emb)
        self.up = nn.ModuleList([_Block(8 * ch, 2 * ch, emb), _Block(4 * ch, ch, emb), _Block(2 * ch, ch, emb)])
        self.out = nn.Conv2d(ch, 3, 3, padding=1)

    def forward(self, x, t, image_embed):
        half = self.ch // 2
        # at least float32 (a bfloat16 timestep is off by up to 4), else the model's: a float32 embedding
        # in the float64 check kept stock Inductor 1e-6 from eager, at the check's floor
        dtype = torch.promote_types(x.dtype, torch.float32)
        freqs = torch.exp(-torch.arange(half, device=x.device, dtype=dtype) * (9.2 / half))
        arg = t.to(dtype)[:, None] * freqs[None]
        e = self.time(torch.cat([arg.sin(), arg.cos()], dim=-1).to(x.dtype)) + self.cond(image_embed)
        h, skips = self.inp(x), []
        for i, block in enumerate(self.down):
            h = block(h, e)
            skips.append(h)
            if i < len(self.down) - 1:
                h = F.avg_pool2d(h, 2)
        h = self.mid(h, e)
        for i, block in enumerate(self.up):
            h = block(torch.cat([h, skips.pop()], dim=1), e)
            if i < len(self.up) - 1:
                h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        return self.out(h)


class _Decoder(nn.Module):
    def __init__(self, ch: int, emb: int, steps: int, timesteps: int = 1000, guidance: float = 3.0,
                 cpu_schedule: bool = False):
        super().__init__()
        self.unet, self.guidance, self.emb = _UNet(ch, emb), guidance, emb
        betas = torch.linspace(1e-4, 0.02, timesteps, dtype=torch.float64)
        alphas_cumprod = torch.cumprod(1 - betas, 0).float()
        if cpu_schedule:  # a plain attribute: stays on the CPU when the model moves (dalle2_cpu)
            self.alphas_cumprod = alphas_cumprod
        else:
            self.register_buffer("alphas_cumprod", alphas_cumprod, persistent=False)
        self.schedule = list(range(timesteps - 1, -1, -timesteps // steps))

    def forward(self, noise, image_embed):
        x, b = noise, noise.shape[0]
        null = torch.zeros_like(image_embed)
        for i, t in enumerate(self.schedule):
            a_t = self.alphas_cumprod[t]
            a_prev = self.alphas_cumprod[self.schedule[i + 1]] if i + 1 < len(self.schedule) else 1.0
            tt = torch.full((2 * b,), t, device=x.device, dtype=torch.long)
            eps_c, eps_u = self.unet(torch.cat([x, x]), tt, torch.cat([image_embed, null])).chunk(2)
            eps = eps_u + self.guidance * (eps_c - eps_u)
            x0 = ((x - (1 - a_t).sqrt() * eps) / a_t.sqrt()).clamp(-1, 1)
            x = a_prev ** 0.5 * x0 + (1 - a_prev) ** 0.5 * eps  # deterministic DDIM (eta = 0)
        return x


class Model(Workload):
    name = "dalle2"
    acronyms = {"eval": "DALLE2"}
    batch_sizes = {"eval": 1}
    origin = "in-house DALL-E 2 style decoder (U-Net, DDIM, classifier-free guidance); dalle2_pytorch absent"
    cpu_schedule = False

    def build(self):
        # 10 DDIM steps: Dynamo unrolls the sampling loop into one graph, so each step adds compile time
        ch, emb, steps, side = (16, 32, 2, 16) if self.tiny else (64, 512, 10, 64)
        model = _Decoder(ch, emb, steps, cpu_schedule=self.cpu_schedule)
        noise = torch.randn(self.batch, 3, side, side, device=self.device)
        image_embed = torch.randn(self.batch, emb, device=self.device)
        return model.to(self.device), (noise, image_embed)
