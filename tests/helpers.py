"""Backends that misbehave on purpose, named in variant configs as "tests.helpers:<name>"."""

import os

import torch

from experiments.instrument import pytree


def offset_backend(gm, example_inputs):
    """Compiles to the graph plus 0.5 on every floating output: wrong numbers, nothing else."""

    def run(*args):
        out = gm(*args)
        return pytree.tree_map(lambda t: t + 0.5 if hasattr(t, "is_floating_point") and t.is_floating_point() else t, out)

    return run


def dying_backend(gm, example_inputs):
    """The process dies while compiling, as a segfault in a compiler would."""
    os._exit(3)


def frozen_weights_backend(gm, example_inputs):
    """Reads each parameter as it was on the first call, as a replay that kept a weight's old storage would."""
    first: dict[int, torch.Tensor] = {}

    def run(*args):
        for i, a in enumerate(args):
            if isinstance(a, torch.nn.Parameter):
                first.setdefault(i, a.detach().clone())
        return gm(*[first.get(i, a) for i, a in enumerate(args)])

    return run


def frozen_rng_backend(gm, example_inputs):
    """Draws the same random numbers on every call, as a replay that never advances the generator would."""
    first = []

    def run(*args):
        if not first:
            first.append(torch.get_rng_state())
        torch.set_rng_state(first[0])
        return gm(*args)

    return run


def own_rng_backend(gm, example_inputs):
    """Draws from a generator state of its own that only it advances, as a replay blind to the caller's
    torch.manual_seed would."""
    own = []

    def run(*args):
        caller = torch.get_rng_state()
        torch.set_rng_state(own[0] if own else caller)
        try:
            return gm(*args)
        finally:
            own[:] = [torch.get_rng_state()]
            torch.set_rng_state(caller)

    return run


def redrawn_backward_backend(gm, example_inputs):
    """Returns one draw's values with another draw's gradient, as a backward that read the random mask of
    a later forward would."""

    def run(*args):
        with torch.no_grad():
            shown = gm(*args)
        drawn = gm(*args)
        return pytree.tree_map(lambda s, d: s + (d - d.detach()) if isinstance(d, torch.Tensor) else s, shown, drawn)

    return run


def stale_backend(gm, example_inputs):
    """Returns its first call's outputs on every call, as a replay that reads a stale input would."""
    first = []

    def run(*args):
        if not first:
            first.append(gm(*args))
        return first[0]

    return run


def overwriting_backend(gm, example_inputs):
    """Writes each call's outputs into the first call's output tensors and returns those, as a replay
    that took no notice of the outputs the caller still holds would."""
    first = []

    def run(*args):
        out = gm(*args)
        if not first:
            first.append(out)
            return out
        with torch.no_grad():
            for kept, new in zip(first[0], out):
                kept.copy_(new)
        return first[0]

    return run
