"""The recording mechanism: one partition captured in a CUDA graph, and how it is replayed.

A recording keeps in place the inputs that must keep their address (given by the runtime) and gives
every other tensor input a placeholder that receives a copy before each replay, as stock graph trees do.
It knows whether a call's inputs sit where it reads them, whether the caller still holds its outputs (a
replay would overwrite them), and how to replay. PI (grace.pi) may replace the copies by re-pointing
the graph; which recording a call gets is the runtime's decision (grace.runtime).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import threading
import warnings
import weakref
from itertools import compress, count, islice
from operator import gt
from typing import Any, Callable

import torch

from grace import cuda_driver
from grace import torch_adapter as adapter

log = logging.getLogger("grace")

DEVICE_TYPE = "cuda"  # where partition inputs must live to be captured; tests set "cpu"


@dataclasses.dataclass
class Captured:
    replay: Callable[[], None]
    outputs: Any  # what the partition returned while captured: the tensors every replay writes
    nodes: dict[str, int] | None  # graph nodes by kind
    graph: torch.cuda.CUDAGraph | None  # kept (keep_graph=True) for PI to read and patch its nodes


@functools.cache
def capture_stream(index: int) -> torch.cuda.Stream:
    """A side stream of device `index` to capture on (torch.cuda.graph's default is one stream for the
    process, on whichever device was current when it was first used)."""
    return torch.cuda.Stream(index)


def on_device_of(args: list) -> contextlib.AbstractContextManager:
    """The device of a partition's first CUDA tensor made current. Inductor sets the device inside a
    lone partition, not around it: captured, or timed, on another current device, its kernels would go
    to a stream that is not being captured (an empty graph) or timed."""
    t = next((a for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"), None)
    return torch.cuda.device(t.device) if t is not None else contextlib.nullcontext()


# One capture at a time in the process, and no replay during one: a capture puts its device's default
# generator in capture mode, and a replay from another thread meanwhile fails on it ("Offset increment
# outside graph capture"); two captures would share a capture stream.
CAPTURING = threading.Lock()


@contextlib.contextmanager
def no_collection():
    """Python's collector held off: a cycle it frees during a capture may hold another CUDA graph, whose
    destruction is not permitted while a stream captures and invalidates the capture (torch.cuda.graph
    no longer collects before capturing: pytorch/pytorch#161037)."""
    on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if on:
            gc.enable()


def cuda_capture(fn: Callable, graph_args: list) -> Captured:
    """Capture fn(graph_args) in a CUDA graph, on the current device (the runtime makes it the
    partition's: on_device_of); a replay runs on that device whatever is current then. A capture that
    fails leaves the caller's stream and generator as they were."""
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    caller = torch.cuda.current_stream()
    with CAPTURING:
        try:
            with no_collection(), torch.cuda.graph(graph, stream=capture_stream(caller.device.index),
                                                   capture_error_mode="thread_local"):
                outputs = fn(graph_args)
        except BaseException as e:
            failed = _unframed(e)  # its frames hold the failed graph: freed before the repair
        else:
            failed = None
        if failed is not None:
            del graph
            repair(caller)
            raise failed
    try:
        nodes = cuda_driver.node_counts(graph.raw_cuda_graph())
    except Exception as e:  # counting is for reports only
        log.warning("grace: could not read the graph's nodes: %s", e)
        nodes = None
    graph.instantiate()

    def replay() -> None:
        with CAPTURING:
            graph.replay()

    return Captured(replay, outputs, nodes, graph)


def _unframed(e: BaseException) -> BaseException:
    """`e` and the exceptions it was raised from without their tracebacks (which keep frames alive)."""
    seen = e
    while seen is not None:
        seen.__traceback__ = None
        seen = seen.__cause__ or seen.__context__
    return e


def repair(caller: torch.cuda.Stream) -> None:
    """What torch.cuda.graph leaves undone when the end of a capture raises (an op that synchronized,
    say): it leaves the capture stream current and the device's default generator in capture mode, so
    that every later random op outside a graph fails. An empty capture that succeeds resets both."""
    torch.cuda.set_stream(caller)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "The CUDA Graph is empty"
            with no_collection(), torch.cuda.graph(torch.cuda.CUDAGraph(), stream=capture_stream(caller.device.index)):
                pass
    except Exception as e:
        log.warning("grace: after a failed capture, the CUDA generator could not be reset: %s", e)
    finally:
        torch.cuda.set_stream(caller)


capture = cuda_capture  # what records a partition; tests put a CPU stand-in here


def cuda_caller_capturing() -> bool:
    """Whether this thread's stream is being captured into a CUDA graph of the caller's own (without CUDA
    initialized, nobody captures; asking would fail on a machine without a driver)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


caller_capturing = cuda_caller_capturing  # tests put a stand-in here

# data_ptr -> output tensor of every live recording: an input found here is another graph's output and is
# read in place. Weak: a recording that is garbage-collected (a recompiled graph) leaves no stale address.
OUTPUTS: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()


def current_device() -> torch.device:
    """Where a partition without tensor inputs (it only creates tensors, from sizes) runs."""
    return torch.device("cuda", torch.cuda.current_device()) if DEVICE_TYPE == "cuda" else torch.device(DEVICE_TYPE)


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def describe(t: torch.Tensor) -> str:
    """dtype and shape, for reasons: 'float32 [4]'."""
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def expanded_dims(t: torch.Tensor) -> tuple[int, ...]:
    """Dims along which `t` repeats one element (stride 0), as expand() makes them."""
    return tuple(d for d in range(t.dim()) if t.stride(d) == 0 and t.size(d) > 1)


def narrow(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """`t` with one element along each of `dims`: for an expanded tensor, the part that holds data."""
    if not dims:
        return t
    return t.as_strided([1 if d in dims else n for d, n in enumerate(t.shape)], t.stride(), t.storage_offset())


def placeholder(t: torch.Tensor) -> torch.Tensor:
    """Fresh memory laid out as `t` (its strides kept: expanded dims stay expanded)."""
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The first and one past the last element of its storage that `t` reaches."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else -1
    return t.storage_offset(), t.storage_offset() + last + 1


def passed_through(outputs, args: list, inputs: list[int]) -> list[tuple[int, int, tuple | None]]:
    """The outputs that are one of `inputs`, or a view of one (in its dtype, within its span): (output,
    input, None) or (output, input, (size, stride, offset from the input's)). A replay returns them made
    from that call's input: an in-place input's, so that the recording keeps no reference to a caller's
    tensor (kept, an upstream graph's output passed through here, a forward returning an activation it
    saves for backward, would look held for ever, and the upstream partition would run without its
    graph); an input PI reads in place (grace.pi), so that no copy is needed to return it."""
    where: dict[int, list[int]] = {}  # storage address -> those of `inputs` in it
    for i in inputs:
        where.setdefault(args[i].untyped_storage().data_ptr(), []).append(i)
    found = []
    for j, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            continue
        for i in where.get(out.untyped_storage().data_ptr(), ()):
            a = args[i]
            if out is a:
                found.append((j, i, None))
                break
            (start, end), (first, stop) = _span(out), _span(a)
            if out.dtype == a.dtype and first <= start and end <= stop:
                found.append((j, i, (out.size(), out.stride(), start - first)))
                break
    return found


def may_write(args: list, writable: frozenset[int]) -> list[torch.Tensor]:
    """The tensor inputs one run of a partition may write (adapter.Partition.writable): a partition run
    again for one call (PI's check, SCG's timings) starts from them as they were."""
    return [a for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i in writable]


class Recording:
    """One capture of a partition, with its placeholders; `pi` is set by grace.pi when PI serves it."""

    def __init__(self, fn: Callable, args: list, in_place: list[int], copied: list[int], mutated: list[int],
                 fresh_outputs: bool | frozenset[int] = False, static: frozenset[int] = frozenset(),
                 writable: frozenset[int] | None = None):
        self.in_place, self.copied, self.static, self.mutated = in_place, copied, static, mutated
        self.writable = writable if writable is not None else frozenset(range(len(args))) - static
        self.ptrs = [args[i].data_ptr() if i in in_place else None for i in range(len(args))]
        # the first in-place input's address: a cheap first test of which recording a call is for (the
        # layers that share a graph have a recording each; only one has this layer's first weight)
        self.first = in_place[0] if in_place else None
        # whose memory each in-place input lies in: the same tensor's memory freed or viewed elsewhere later
        # is a move; another live tensor in a static input's place is another call site (the next layer)
        self.bases = {i: args[i].untyped_storage().data_ptr() for i in in_place}
        self.weak = {i: adapter.storage_weak_ref(args[i]) for i in in_place}
        # An expanded input (stride 0 along some dims, as stock graph trees meet in training graphs) gets
        # an expanded placeholder; copies fill the one element along those dims, as graph trees do.
        self.expanded = {i: dims for i in copied if (dims := expanded_dims(args[i]))}
        self.placeholders = [placeholder(args[i]) for i in copied]
        self.fills = [narrow(p, self.expanded.get(i, ())) for i, p in zip(copied, self.placeholders)]
        graph_args = list(args)
        for i, p in zip(copied, self.placeholders):
            graph_args[i] = p
        # placeholders hold the call's values from the start: nothing, a capture or a stand-in for one,
        # ever reads garbage (an index read from one is out of bounds)
        if copied:
            self.copy_inputs(args)
        captured = capture(fn, list(graph_args))  # the partition's call empties the list it is given
        self.replay_graph, self.outputs, self.nodes, self.graph = (captured.replay, captured.outputs,
                                                                   captured.nodes, captured.graph)
        # A copied input the partition writes (one that kept moving) is copied back after each replay.
        self.written = [(i, p) for i, p in zip(copied, self.placeholders) if i in mutated]
        self.pi = None  # grace.pi.Pointing, when PI serves some of the copied inputs
        self.pi_on = True  # False once SCG decided that copying beats re-pointing
        self.replays = 0  # calls the runtime replayed it for (SCG's timings apart)
        # Outputs in memory the graph writes (its pool, or a placeholder) are protected from being replayed
        # over while held; an output that is an in-place input passed through (a parameter saved for
        # backward) is the caller's memory, and the caller's references to it come and go.
        callers = {args[i].untyped_storage().data_ptr() for i in in_place}
        outputs = self.outputs if isinstance(self.outputs, (list, tuple)) else ()
        # (not a static input's: a parameter's memory is never checked for being held, and a view of one
        # made anew on each replay would cost the host a few us per output)
        self.passed = passed_through(outputs, args, [i for i in in_place if i not in static])
        if self.passed:
            outputs = list(outputs)
            for j, _, _ in self.passed:
                outputs[j] = None
            self.outputs = outputs if isinstance(self.outputs, list) else tuple(outputs)
        self.tensors = [t for t in outputs if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in callers]
        # An output that is a written copied input or its view is returned as the call's own tensor too (the
        # copy back makes it hold what the placeholder does), as eager returns it: the placeholder is the
        # next call's, and writing into it would not write the caller's tensor. Its placeholder stays among
        # the outputs, for PI to see what the partition returns.
        self.passed += passed_through(outputs, graph_args, [i for i, _ in self.written])
        # fresh_outputs (True: all, as a backward graph's; or those at the positions given, a training
        # forward's outputs that reach the caller): each replay returns new tensor objects over the graph's
        # output memory, not the ones kept here. Autograd takes a parameter's first gradient as it is only
        # when nobody else holds that tensor; else it clones it (a copy and a launch per parameter, each
        # step). And it sets an autograd function's outputs' grad_fn on the tensor object itself: kept
        # here, that object would keep the call's autograd graph, and the activations it saved (outputs
        # of this graph too), alive after the caller dropped the result, so that they looked held for
        # ever (inference in grad mode). A returned tensor still held shows in its storage's count.
        owned = {id(t) for t in self.tensors}
        fresh = [j for j, t in enumerate(outputs) if isinstance(t, torch.Tensor) and id(t) in owned
                 and (fresh_outputs is True or j in fresh_outputs)] if fresh_outputs else []
        self.fresh = fresh or None  # positions: a training forward's few among its many saved activations
        self.storages = adapter.storage_handles(self.tensors)
        self.storage_objects = adapter.storage_objects(self.tensors)
        self.baseline = adapter.references(self.tensors, self.storages, self.storage_objects)
        self.free = self.baseline  # the last counts found to hold no output
        OUTPUTS.update({t.data_ptr(): t for t in self.tensors})

    def _elsewhere(self, args: list, i: int) -> bool:
        """Whether in-place input i is another live tensor than the one recorded (not a move of it)."""
        return (args[i].data_ptr() != self.ptrs[i] and not self.weak[i].expired()
                and args[i].untyped_storage().data_ptr() != self.bases[i])

    def same_site(self, args: list, sites: frozenset[int]) -> bool:
        """Whether this call comes from the call site recorded: its inputs `sites` (the static inputs that
        tell call sites apart: runtime.PartitionGraph._sites) are those recorded, or moves of them (the
        tensor recorded is gone, or they are another view of its memory). Another live weight is another
        site: the next of the layers that share one Dynamo graph."""
        return not any(self._elsewhere(args, i) for i in self.in_place if i in sites)

    def moved(self, args: list) -> list[int]:
        """In-place inputs that lie elsewhere than when recorded, at the same call site: a static input
        whose tensor is gone or seen through another view (activations made anew each call), or any other
        input (a KV cache made anew, an output of a graph upstream that recorded again)."""
        return [i for i in self.in_place if args[i].data_ptr() != self.ptrs[i]]

    def accepts(self, args: list) -> bool:
        """Whether inputs expanded when recorded are expanded along the same dims now (the copy fills
        one element along them)."""
        return not self.expanded or all(args[i].stride(d) == 0 for i, dims in self.expanded.items() for d in dims)

    def copy_inputs(self, args: list) -> None:
        """Every copied input into its placeholder, as stock graph trees do before each replay."""
        if self.expanded:
            torch._foreach_copy_(self.fills, [narrow(args[i], self.expanded.get(i, ())) for i in self.copied])
        else:
            torch._foreach_copy_(self.placeholders, [args[i] for i in self.copied])

    def set_pi(self, on: bool) -> None:
        """Replay with PI (served inputs read in place) or with copies into every placeholder."""
        if self.pi is not None and self.pi_on and not on:
            self.pi.to_placeholders()
        self.pi_on = on

    @property
    def pi_inputs(self) -> set[int]:
        """Copied inputs that PI reads in place instead."""
        return self.pi.inputs if self.pi is not None and self.pi_on else set()

    @property
    def still_copied(self) -> list[torch.Tensor]:
        """What a copy fills on each replay (the placeholders PI does not serve)."""
        served = self.pi_inputs
        return [f for i, f in zip(self.copied, self.fills) if i not in served]

    @property
    def copy_bytes(self) -> int:
        return nbytes(self.still_copied)

    @property
    def patched_nodes(self) -> int:
        return self.pi.patched_nodes if self.pi is not None else 0

    def drop(self) -> None:
        """Forget this recording (its memory goes back once no output is held)."""
        for t in self.tensors:
            if OUTPUTS.get(t.data_ptr()) is t:
                del OUTPUTS[t.data_ptr()]

    def held_output(self) -> int | None:
        """The first output with more references than right after capture (fewer is fine: the count then
        included temporaries), or None: a replay would overwrite an output the caller holds."""
        now = adapter.references(self.tensors, self.storages, self.storage_objects)
        if now == self.baseline or now == self.free:
            return None
        # in C: a training forward's hundreds of saved activations count fewer than at capture on every call
        first = min((k for n, b in zip(now, self.baseline) for k in islice(compress(count(), map(gt, n, b)), 1)),
                    default=None)
        if first is None:
            self.free = now  # the verdict depends on these counts and the fixed baseline alone
        return first

    def describe_output(self, k: int) -> str:
        """Output k (held_output) for reasons: its index among the graph's own outputs, dtype and shape."""
        return f"output {k}: {describe(self.tensors[k])}"

    def replay(self, args: list) -> Any:
        passed = [(j, args[i], view) for j, i, view in self.passed] if self.passed else None  # before args.clear()
        if self.pi is not None and self.pi_on:
            read = self.pi.point(args)
            if self.pi.passed:  # served inputs the partition returns, where read in place this time
                passed = (passed or []) + [(j, args[i], view) for j, i, view in self.pi.passed
                                           if read[i] == args[i].data_ptr()]
        elif self.copied:
            self.copy_inputs(args)
        written = [args[i] for i, _ in self.written] if self.written else None
        self.replay_graph()
        # emptied after the replay is launched: an input the caller no longer holds stays valid to it (on a
        # GPU the stream orders any reuse of its memory after the replay anyway; the CPU stand-in needs it)
        args.clear()
        if written:
            torch._foreach_copy_(written, [p for _, p in self.written])
        if self.fresh is None and not passed:
            # a new container, never the recording's own: callers may empty a list, and until the caller has
            # unpacked it, the tensors in it must count as held (another thread may call meanwhile)
            return list(self.outputs) if isinstance(self.outputs, list) else (*self.outputs,)
        outputs = list(self.outputs)
        for j in self.fresh or ():
            outputs[j] = outputs[j].detach()
        for j, a, view in passed or ():
            outputs[j] = a if view is None else a.as_strided(view[0], view[1], a.storage_offset() + view[2])
        return outputs if isinstance(self.outputs, list) else tuple(outputs)
