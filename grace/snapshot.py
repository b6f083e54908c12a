"""Running a partition more than once for one call, invisibly: what it mutates and the RNG, put back."""

from __future__ import annotations

import torch


class Snapshot:
    """The inputs a partition mutates and the RNG states, as they are now; restore() puts them back."""

    def __init__(self, mutated: list[torch.Tensor]):
        self.mutated = mutated
        self.saved = [t.clone() for t in mutated]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        for t, s in zip(self.mutated, self.saved):
            t.copy_(s)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
