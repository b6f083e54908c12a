"""An equation-of-state style elementwise chain over three large inputs (salinity, temperature,
pressure), after pyhpc's equation_of_state: a few fused kernels over big tensors, where stock CUDA graphs
lose because every replay copies the three inputs into the graph's buffers (docs/pi.md)."""

import torch
from torch import nn

from experiments.workloads import Workload


class _Chain(nn.Module):
    def forward(self, s, t, p):
        # A polynomial in (s, t, p) of the kind pyhpc's density kernel evaluates, then its ratio form.
        sq = torch.sqrt(s.abs() + 1.0)
        num = 999.8 + t * (0.0679 + t * (-0.0091 + t * 1.0e-4)) + s * (0.8245 - 4.09e-3 * t) + sq * s * 5.7e-4
        den = 1.0 + p * (4.6e-3 + t * 1.2e-5) + p * p * 1.1e-7 + s * sq * 2.1e-5  # > 0: well conditioned
        rho = num / den
        return rho - 1000.0 * torch.tanh(p * 1.0e-3)


class Model(Workload):
    name = "eos_chain"
    acronyms = {"eval": "EOS"}
    batch_sizes = {"eval": 1_048_576}  # elements per input; there are no weights to train
    eval_dtype = torch.float32  # ocean-model kernels are run in float32 or float64, never in bfloat16
    origin = "in-house, after pyhpc-benchmarks' equation_of_state (TorchBench's pyhpc_equation_of_state)"

    def build(self):
        n = 4096 if self.tiny else self.batch
        s = torch.rand(n) * 40.0
        t = torch.rand(n) * 30.0 - 2.0
        p = torch.rand(n) * 5000.0
        return _Chain().to(self.device), tuple(x.to(self.device) for x in (s, t, p))
