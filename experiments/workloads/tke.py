"""In-house turbulent kinetic energy step after pyhpc-benchmarks' turbulent_kinetic_energy (from the
Veros ocean model): vertical mixing solved by a tridiagonal (Thomas) sweep along depth, one small
kernel per level, then horizontal advection by finite differences with masks. Many short kernels over
a 3-D grid: launch-bound at the paper's size of 2**20 points."""

import torch
from torch import nn

from experiments.workloads import Workload


def _solve_tridiagonal(a, b, c, d):
    """Thomas algorithm along the last axis, level by level, as pyhpc's PyTorch version does."""
    n = d.shape[-1]
    cp, dp = [c[..., 0] / b[..., 0]], [d[..., 0] / b[..., 0]]
    for k in range(1, n):
        denom = b[..., k] - a[..., k] * cp[-1]
        cp.append(c[..., k] / denom)
        dp.append((d[..., k] - a[..., k] * dp[-1]) / denom)
    x = [dp[-1]]
    for k in range(n - 2, -1, -1):
        x.append(dp[k] - cp[k] * x[-1])
    return torch.stack(x[::-1], dim=-1)


class _TKE(nn.Module):
    def __init__(self, dt: float = 3600.0, c_eps: float = 0.7, alpha: float = 30.0):
        super().__init__()
        self.dt, self.c_eps, self.alpha = dt, c_eps, alpha

    def forward(self, tke, u, v, kappa, mxl, forc, dzt, mask):
        dt, dz = self.dt, dzt[None, None, :]
        # implicit vertical diffusion of TKE with dissipation: a tridiagonal system per water column
        k_face = 0.5 * (kappa[..., 1:] + kappa[..., :-1]) * self.alpha
        zero = torch.zeros_like(kappa[..., :1])
        lower = torch.cat([zero, -dt * k_face], dim=-1) / dz
        upper = torch.cat([-dt * k_face, zero], dim=-1) / dz
        diag = 1.0 - lower - upper + dt * self.c_eps / mxl * torch.sqrt(tke.clamp_min(0.0))
        rhs = tke + dt * forc
        new = _solve_tridiagonal(lower, diag, upper, rhs) * mask
        # horizontal advection, upwind fluxes on the interior
        flux_x = torch.where(u[1:] > 0, u[1:] * new[:-1], u[1:] * new[1:])
        flux_y = torch.where(v[:, 1:] > 0, v[:, 1:] * new[:, :-1], v[:, 1:] * new[:, 1:])
        adv = torch.zeros_like(new)
        adv[1:-1] = flux_x[:-1] - flux_x[1:]
        adv[:, 1:-1] += flux_y[:, :-1] - flux_y[:, 1:]
        return (new + dt * 1e-4 * adv * mask).clamp_min(0.0)


class Model(Workload):
    name = "tke"
    acronyms = {"eval": "TKE"}
    batch_sizes = {"eval": 1_048_576}  # grid points
    eval_dtype = torch.float32  # an ocean-model kernel: float32 or float64, never bfloat16
    origin = "in-house, after pyhpc-benchmarks' turbulent_kinetic_energy (Veros)"

    def build(self):
        nz = 4 if self.tiny else 32
        nx = ny = int(round(((64 if self.tiny else self.batch) / nz) ** 0.5))
        shape = (nx, ny, nz)
        tke = torch.rand(shape) * 1e-3
        u, v = torch.randn(shape) * 0.1, torch.randn(shape) * 0.1
        kappa = torch.rand(shape) * 1e-2
        mxl = torch.rand(shape) + 0.5
        forc = torch.rand(shape) * 1e-7
        dzt = torch.rand(nz) * 10.0 + 5.0
        mask = (torch.rand(shape) > 0.1).float()
        inputs = tuple(x.to(self.device) for x in (tke, u, v, kappa, mxl, forc, dzt, mask))
        return _TKE().to(self.device), inputs
