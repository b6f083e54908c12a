"""Running a partition more than once for one call, invisibly: what it may write and the RNG, put back."""

from __future__ import annotations

import torch

from grace.torch_adapter import has_internal_overlap


class Snapshot:
    """Tensors a partition may write and the RNG states, as they are now; restore() puts them back. An
    overlapping tensor (expanded, stride 0) cannot be written in place, so it is not kept."""

    def __init__(self, mutated: list[torch.Tensor]):
        self.mutated = [t for t in mutated if not has_internal_overlap(t)]
        self.saved = [t.clone() for t in self.mutated]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        for t, s in zip(self.mutated, self.saved):
            t.copy_(s)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
