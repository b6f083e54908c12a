"""The lean call path: where a Dynamo graph's compiled code is one CUDA-graph partition end to end, its
calls go straight to the partition's runtime (grace.runtime.PartitionGraph), past AOTAutograd's and
Inductor's per-call wrappers, which then have nothing to do beyond what the partition does itself.

What it takes is checked twice. When compiled (grace.backend): an inference graph (no backward), one
partition, each of its inputs a graph input, no input mutated outside it (torch_adapter.
beyond_one_partition). When called: one call, watched, must show the partition taking Dynamo's own
argument tensors or those AOTAutograd passes ahead of them (the graph module's parameters and buffers:
a compiled optimizer step's parameters and state), and its sizes from Dynamo's int arguments in the
same places (a dynamic-shape graph's),
and Dynamo getting back as many tensors as the graph has outputs (AOTAutograd adds outputs for the
mutations it replays), each the partition's own output, an argument, or a view of either (of a graph
without sizes: its view's shape is then fixed). What the wrappers still did per call is done here:
grad mode off, the version counters of mutated inputs bumped, the views made again on the call's own
tensors (AOTAutograd's wrappers regenerate an aliased output so). Calls where they would do more
(autocast on, an input that must be realigned, another current device) take the wrappers' path.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import torch

from grace import torch_adapter as adapter
from grace.runtime import ALIGNMENT, PartitionGraph

log = logging.getLogger("grace")

WATCHED = 3  # calls watched for the route before it is given up (a realigned input's copy can hide it)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A compiled forward graph that may take the lean path."""
    part: PartitionGraph
    outputs: int  # the compiled graph's outputs
    check: frozenset[int]  # partition inputs that Inductor realigns when misaligned
    mutated: frozenset[int]  # partition inputs mutated in place
    graph_inputs: tuple[int | None, ...] = ()  # the compiled graph's input each partition input is (unknown: ())


@dataclasses.dataclass(frozen=True)
class Alias:
    """A graph output the partition did not make: a Dynamo argument itself, or a view of one or of a
    partition output, made again on each call from that call's tensor."""
    of_argument: bool  # else of a partition output
    index: int
    view: tuple[tuple[int, ...], tuple[int, ...], int] | None  # size, stride and storage offset from the
    # base's; None: the base itself

    def of(self, args: tuple, result: list) -> torch.Tensor:
        base = args[self.index] if self.of_argument else result[self.index]
        if self.view is None:
            return base
        size, stride, offset = self.view
        return base.as_strided(size, stride, base.storage_offset() + offset)


@dataclasses.dataclass(frozen=True)
class Route:
    # Indices below are into the call's arguments as the compiled graph takes them: LeanCall.lifted, then
    # Dynamo's own
    inputs: tuple[int, ...]  # the argument of each partition input
    outputs: tuple[int | Alias, ...]  # the partition output of each graph output, or how it is made
    check: tuple[int, ...]  # arguments to check for alignment
    mutated: tuple[int, ...]  # arguments whose versions to bump
    device: int | None  # the CUDA device the partition runs on
    as_tuple: bool


def route(candidate: Candidate, args: tuple, calls: list, returned: Any) -> Route | str:
    """The route that one watched call shows (`calls`: the partition's arguments and result, per call),
    or why there is none."""
    if len(calls) != 2:
        return f"the partition ran {len(calls) // 2} times in one call"
    part_args, result = calls
    if not isinstance(returned, (list, tuple)) or len(returned) != candidate.outputs:
        return "AOTAutograd changes the graph's outputs (mutations, aliases or tokens it handles)"
    where = {id(a): i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    inputs = []
    for i, a in enumerate(part_args):
        if isinstance(a, torch.Tensor) and id(a) in where:
            inputs.append(where[id(a)])
        elif type(a) is int and _passed_on(candidate, args, part_args, where, i):
            inputs.append(candidate.graph_inputs[i])
        else:
            return "a partition input is not one of the graph's arguments (a copy, or a size made in the call)"
    made = {id(t): j for j, t in enumerate(result) if isinstance(t, torch.Tensor)}
    sized = any(type(a) is int for a in part_args)
    outputs = []
    for t in returned:
        if id(t) in made:
            outputs.append(made[id(t)])
        elif not isinstance(t, torch.Tensor):
            return "a graph output is not a tensor"
        elif id(t) in where:
            outputs.append(Alias(True, where[id(t)], None))
        elif sized:
            return "a graph output is not one of the partition's outputs, in a graph with sizes"
        elif (alias := _view(t, args, result)) is not None:
            outputs.append(alias)
        else:
            return "a graph output is not one of the partition's outputs, nor a view of one or of an argument"
    cuda = next((a.device.index for a in part_args if isinstance(a, torch.Tensor) and a.device.type == "cuda"), None)
    return Route(tuple(inputs), tuple(outputs), tuple(sorted({inputs[i] for i in candidate.check})),
                 tuple(sorted({inputs[i] for i in candidate.mutated})), cuda, isinstance(returned, tuple))


def _view(t: torch.Tensor, args: tuple, result: list) -> Alias | None:
    """`t` as a view of a Dynamo argument or of a partition output: one with its storage, device and dtype
    (a view in another dtype is not a strided view of it). Arguments first: a partition output may view
    its input, which a replay reads from the recording's buffer, not from the argument. So `t` in an
    argument's memory is that argument's strided view or unknown: two arguments hold it (views of one
    tensor, which a later call may pass apart), or one holds it in another dtype (view_as_real)."""
    storage = t.untyped_storage().data_ptr()
    if not storage:  # no memory of its own to tell it by
        return None

    def sharing(tensors: Any, strided: bool = True) -> list[tuple[int, torch.Tensor]]:
        return [(i, b) for i, b in enumerate(tensors) if isinstance(b, torch.Tensor) and b.device == t.device
                and b.untyped_storage().data_ptr() == storage
                and (not strided or b.dtype == t.dtype and _within(t, b))]
    touching, arguments = sharing(args, strided=False), sharing(args)
    if len(touching) > 1 or len(arguments) != len(touching):
        return None
    of_argument = bool(arguments)
    bases = arguments or sharing(result)
    if not bases:
        return None
    i, base = bases[0]
    return Alias(of_argument, i, (tuple(t.shape), tuple(t.stride()), t.storage_offset() - base.storage_offset()))


def _within(t: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether every element of `t` lies in `base`'s span of its storage: made again from another call's
    base, it then reads that base's memory, never past its storage."""
    def span(x: torch.Tensor) -> tuple[int, int]:
        return x.storage_offset(), x.storage_offset() + sum((n - 1) * s for n, s in zip(x.shape, x.stride()))
    if t.numel() == 0 or base.numel() == 0:
        return False
    (lo, hi), (base_lo, base_hi) = span(t), span(base)
    return base_lo <= lo and hi <= base_hi


def _passed_on(candidate: Candidate, args: tuple, part_args: list, where: dict[int, int], i: int) -> bool:
    """Whether the int partition input `i` is the Dynamo argument in its graph input's place. Only where
    the compiled graph's inputs lie as Dynamo's arguments do, which every tensor partition input shows
    (the argument in its graph input's place is that very tensor), and that argument has the same value."""
    places = candidate.graph_inputs
    if len(places) != len(part_args) or places[i] is None or any(
            where.get(id(a)) != g for a, g in zip(part_args, places) if isinstance(a, torch.Tensor)):
        return False
    k = places[i]
    return k < len(args) and type(args[k]) is int and args[k] == part_args[i]


class LeanCall:
    """What Dynamo calls for one compiled graph: the wrappers' path (`compiled`) until a watched call
    shows the route, then the partition directly. `lifted`: what AOTAutograd passes the compiled graph
    ahead of Dynamo's arguments on every call (torch_adapter.lifted)."""

    def __init__(self, compiled: Callable, candidate: Candidate, explain: Callable[[str], None],
                 lifted: tuple[torch.Tensor, ...] = ()):
        self.compiled, self.candidate, self.explain, self.lifted = compiled, candidate, explain, lifted
        self.route: Route | None = None
        self.watch = WATCHED

    def __call__(self, *args):
        r = self.route
        if r is None:
            return self._watched(args) if self.watch else self.compiled(*args)
        full = (*self.lifted, *args) if self.lifted else args
        if ((r.check and any(full[i].data_ptr() % ALIGNMENT for i in r.check))
                or (r.device is not None and adapter.current_device() != r.device) or adapter.autocast_enabled()):
            return self.compiled(*args)
        part_args = [full[i] for i in r.inputs]
        if torch.is_grad_enabled():
            with torch.no_grad():
                result = self.candidate.part(part_args)
        else:
            result = self.candidate.part(part_args)
        if r.mutated:
            torch.autograd.graph.increment_version([full[i] for i in r.mutated])
        outputs = [result[j] if type(j) is int else j.of(full, result) for j in r.outputs]
        return tuple(outputs) if r.as_tuple else outputs

    def _watched(self, args: tuple):
        part = self.candidate.part
        # One watched call at a time, and no other call of the partition meanwhile: threads that share
        # the model would otherwise add their calls to it, or end its watch while it is read
        with part.lock:
            if self.route is not None or not self.watch:  # another thread's watch decided meanwhile
                return self(*args)
            self.watch -= 1
            part.seen = []
            try:
                returned = self.compiled(*args)
                try:
                    found = route(self.candidate, (*self.lifted, *args), part.seen, returned)
                except Exception as e:  # GraCE's own reading of the call: the wrappers' path stays
                    found = f"the call could not be read: {type(e).__name__}: {e}"
            finally:
                part.seen = None
            if isinstance(found, Route):
                self.route, self.watch = found, 0
                self.explain("lean")
            elif not self.watch:
                self.explain(f"not lean: {found}")
                log.info("grace: graph %d keeps AOTAutograd's and Inductor's call path: %s", part.stats.graph, found)
        return returned
