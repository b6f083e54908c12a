"""GraCE's runtime: capture and replay of each CUDA-graph partition that Inductor compiles.

Why partitions, through Inductor's partition-wrapper hook: Inductor already splits a graph where it
cannot be captured (CPU ops, device copies, ops tagged unsafe), for forward and backward graphs alike,
and hands each partition to a wrapper of our choosing (grace.torch_adapter.partitioned). Owning that
wrapper gives GraCE the capture and the replay path, which PI and SCG change, without graph trees.

A partition's life, per set of sizes (one, unless shapes are dynamic):
  call 1     runs as compiled (warm-up: lazy initialisation, autotuning), no graph;
  call 2     is recorded: inputs that must keep their address (parameters and buffers, inputs the
             partition mutates, outputs of another GraCE graph) are captured in place; every other
             tensor input gets a placeholder that receives a copy before each replay, as stock graph
             trees do; the graph is then replayed for this call's result;
  later      replays a recording whose in-place inputs sit where this call's are and whose outputs
             nobody still holds (a replay overwrites them). In `y = model(x)` loops the caller holds
             the previous output during the next call: a second recording (a twin, with its own
             memory) then takes turns with the first. A call whose static inputs (parameters and
             buffers; in a backward graph, saved activations) are other live tensors comes from another
             call site and gets a recording of its own, as stock graph trees record each call site: the
             layers that share one Dynamo graph (their weights are its inputs); up to KEEP per set of
             sizes, the least recently used dropped. At a call site recorded, an in-place input that
             lies elsewhere has moved (a static one: the tensor recorded was freed, or another view of
             its memory came instead, as activations that code outside graphs makes anew; any other:
             a KV cache made anew, outputs of a graph upstream that records again). One that moved
             MOVES_BEFORE_COPY times is copied from then on, and copied back after each replay if the
             partition writes it; recordings that read it in place are dropped.
Anything else is handled without a graph, the reason kept in the partition's Stats: capture fails
(a synchronising op), recordings that keep being made (more than MAX_RERECORDS at sizes already
recorded: moves, twins, and call sites beyond KEEP; the partition gives up its graphs),
the outputs of both twins still held (a caller collecting outputs in a list: that call runs without
the graph), more than MAX_SIZES sets of sizes (Mask R-CNN's
proposal counts: new ones run without a graph, those recorded keep theirs). The limits are those of
stock graph trees (inductor.config.triton.cudagraph_unexpected_rerecord_limit), or tighter.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import weakref
from typing import Any, Callable

import torch

from grace import calibrate, cuda_driver, pi, scg
from grace import torch_adapter as adapter
from grace.snapshot import Snapshot

log = logging.getLogger("grace")

MAX_SIZES = 64  # sets of sizes a partition records (dynamic shapes); further ones run without a graph
MAX_RERECORDS = 32  # recordings at sizes already recorded (moves, twins, call sites beyond KEEP), over its life
MOVES_BEFORE_COPY = 3  # an in-place input that moved this often at one set of sizes is copied from then on,
                       # at all sizes (in a backward graph, inputs made by code outside graphs are static yet
                       # move each call); moves at different sizes (twins upstream, per size) do not add up
KEEP = 64  # recordings kept per set of sizes: one per call site (each layer of those that share a graph:
           # BlenderbotSmall's 8 encoder layers call one), and twins
TWINS = 2  # recordings per set of sizes and in-place addresses: one may be replayed while the other's outputs are held
ALIGNMENT = 16  # bytes: Inductor's kernels assume inputs this aligned
LIBRARY_ALIGNMENT = 256  # bytes: the most alignment PyTorch tells cuBLAS its operands have (cuBLASLt
                         # picks a kernel that may rely on it), so PI reads an input in place only when it
                         # is as aligned as its placeholder was at capture, up to this
JITTER_FACTOR = 4  # PI's check: reading inputs in place may change an output by this many times the
                   # graph's own replay-to-replay difference (0 for a deterministic graph: bitwise equal)


@dataclasses.dataclass
class Stats:
    """What happened to one partition; grace.explain and the harness's records show these."""
    graph: int  # the Dynamo graph (one torch.compile frame) it belongs to
    backward: bool
    partition: int
    status: str = "warm-up"  # warm-up | captured | eager (not capturable) | declined (SCG chose no graph)
    reason: str | None = None  # why not captured (eager), or why a call ran without the graph
    recordings: int = 0
    recorded_for: dict[str, int] = dataclasses.field(default_factory=dict)  # recordings by why: the first at a
    # set of sizes, a new call site, a moved input, a twin (outputs held)
    kept: int = 0  # recordings kept now, at all sizes (each holds its graph's memory)
    replays: int = 0
    eager_calls: int = 0  # calls after warm-up that ran without the graph
    in_place_inputs: int = 0
    copied_inputs: int = 0
    copy_bytes_per_replay: int = 0
    nodes: dict[str, int] | None = None  # the latest recording's graph nodes by kind (kernel, memcpy, ...)
    scg: dict | None = None  # the latest SCG decision (grace.scg.Decision.as_dict), when SCG is on
    pi_inputs: int = 0  # copied inputs that PI reads in place instead (latest recording)
    pi_reasons: list[str] = dataclasses.field(default_factory=list)  # why PI left an input to the copy
    moving_inputs: int = 0  # in-place inputs copied (or read through PI) because they kept moving


# data_ptr -> output tensor of every live recording: an input found here is another graph's output and is
# read in place. Weak: a recording that is garbage-collected (a recompiled graph) leaves no stale address.
_OUTPUTS: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
_LIVE: weakref.WeakSet[PartitionGraph] = weakref.WeakSet()  # every partition wrapper alive in this process


@dataclasses.dataclass
class Captured:
    replay: Callable[[], None]
    outputs: Any  # what the partition returned while captured: the tensors every replay writes
    nodes: dict[str, int] | None  # graph nodes by kind
    graph: torch.cuda.CUDAGraph | None  # kept (keep_graph=True) for PI to read and patch its nodes


def cuda_capture(fn: Callable, graph_args: list) -> Captured:
    """Capture fn(graph_args) in a CUDA graph."""
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outputs = fn(graph_args)
    try:
        nodes = cuda_driver.node_counts(graph.raw_cuda_graph())
    except Exception as e:  # counting is for reports only
        log.warning("grace: could not read the graph's nodes: %s", e)
        nodes = None
    graph.instantiate()
    return Captured(graph.replay, outputs, nodes, graph)


def cuda_timer(candidate: str, run: Callable[[], object]) -> float:
    """SCG's timer: one untimed run (a fresh graph's first replay uploads it), then 5 back to back."""
    run()
    return calibrate.per_call_us(run, 5, torch.device("cuda", torch.cuda.current_device()))


capture = cuda_capture  # what records a partition; tests put a CPU stand-in here
timer = cuda_timer  # what SCG times candidates with; tests put a fake here
DEVICE_TYPE = "cuda"  # where partition inputs must live to be captured


def _poison(dtype: torch.dtype) -> float | bool:
    """What PI's check writes into served placeholders: unlike real data, yet harmless to read (an
    integer placeholder may hold indices: 0 is in range wherever any index is)."""
    return True if dtype == torch.bool else 7.0 if dtype.is_floating_point else 0


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def _current_device() -> torch.device:
    """Where a partition without tensor inputs (it only creates tensors, from sizes) runs."""
    return torch.device("cuda", torch.cuda.current_device()) if DEVICE_TYPE == "cuda" else torch.device(DEVICE_TYPE)


def _difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest elementwise |a - b|: 0 when bitwise equal (NaN equal to NaN: a workload may compute NaNs
    from random inputs), inf when they differ other than in floating-point values."""
    if torch.equal(a, b):
        return 0.0
    if not a.is_floating_point() or a.shape != b.shape or a.dtype != b.dtype:
        return math.inf
    both_nan = a.isnan() & b.isnan()
    d = (a.float() - b.float()).abs().masked_fill(both_nan, 0.0)
    return float(d.nan_to_num(math.inf).max()) if d.numel() else 0.0


def _expanded_dims(t: torch.Tensor) -> tuple[int, ...]:
    """Dims along which `t` repeats one element (stride 0), as expand() makes them."""
    return tuple(d for d in range(t.dim()) if t.stride(d) == 0 and t.size(d) > 1)


def _alignment(address: int) -> int:
    """The largest power of two, up to LIBRARY_ALIGNMENT, that divides `address`."""
    return min(address & -address, LIBRARY_ALIGNMENT) if address else LIBRARY_ALIGNMENT


def _placeholder(t: torch.Tensor) -> torch.Tensor:
    """Fresh memory laid out as `t` (its strides kept: expanded dims stay expanded)."""
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)


def _describe(t: torch.Tensor) -> str:
    """dtype and shape, for reasons: 'float32 [4]'."""
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The first and one past the last element of its storage that `t` reaches."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else -1
    return t.storage_offset(), t.storage_offset() + last + 1


def _passed_through(outputs, args: list, inputs: list[int]) -> list[tuple[int, int, tuple | None]]:
    """The outputs that are one of `inputs`, or a view of one (in its dtype, within its span): (output,
    input, None) or (output, input, (size, stride, offset from the input's)). A replay returns them made
    from that call's input, so that the recording keeps no reference to a caller's tensor: kept, an
    upstream graph's output passed through here (a forward returning an activation it saves for
    backward) would look held for ever, and the upstream partition would run without its graph."""
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


def _may_write(args: list, static: frozenset[int], mutated) -> list[torch.Tensor]:
    """The tensor inputs one run of a partition may write: those Inductor says it mutates, and any that is
    not a parameter or buffer (Inductor may compute in place into an intermediate another partition made).
    A partition run again for one call (PI's check, SCG's timings) starts from them as they were."""
    return [a for i, a in enumerate(args) if isinstance(a, torch.Tensor) and (i in mutated or i not in static)]


def _narrow(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """`t` with one element along each of `dims`: for an expanded tensor, the part that holds data."""
    if not dims:
        return t
    return t.as_strided([1 if d in dims else n for d, n in enumerate(t.shape)], t.stride(), t.storage_offset())


class _Recording:
    def __init__(self, fn: Callable, args: list, in_place: list[int], copied: list[int], mutated: list[int],
                 fresh_outputs: bool = False, static: frozenset[int] = frozenset()):
        self.in_place, self.copied, self.static = in_place, copied, static
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
        self.expanded = {i: dims for i in copied if (dims := _expanded_dims(args[i]))}
        self.placeholders = [_placeholder(args[i]) for i in copied]
        self.fills = [_narrow(p, self.expanded.get(i, ())) for i, p in zip(copied, self.placeholders)]
        self.alignments = [_alignment(p.data_ptr()) for p in self.placeholders]
        graph_args = list(args)
        for i, p in zip(copied, self.placeholders):
            graph_args[i] = p
        captured = capture(fn, graph_args)
        self._replay, self.outputs, self.nodes, self.graph = captured.replay, captured.outputs, captured.nodes, captured.graph
        self.mutated = mutated
        # A copied input the partition writes (one that kept moving) is copied back after each replay.
        self.written = [(i, p) for i, p in zip(copied, self.placeholders) if i in mutated]
        self.indirection: pi.Indirection | None = None
        # Outputs in memory the graph writes (its pool, or a placeholder) are protected from being replayed
        # over while held; an output that is an in-place input passed through (a parameter saved for
        # backward) is the caller's memory, and the caller's references to it come and go.
        callers = {args[i].untyped_storage().data_ptr() for i in in_place}
        outputs = self.outputs if isinstance(self.outputs, (list, tuple)) else ()
        # (not a static input's: a parameter's memory is never checked for being held, and a view of one
        # made anew on each replay would cost the host a few us per output)
        self.passed = _passed_through(outputs, args, [i for i in in_place if i not in static])
        if self.passed:
            outputs = list(outputs)
            for j, _, _ in self.passed:
                outputs[j] = None
            self.outputs = outputs if isinstance(self.outputs, list) else tuple(outputs)
        self.tensors = [t for t in outputs if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in callers]
        # fresh_outputs (a backward graph's): each replay returns new tensor objects over the graph's output
        # memory, not the ones kept here. Autograd takes a parameter's first gradient as it is only when
        # nobody else holds that tensor; else it clones it (a copy and a launch per parameter, each step).
        # A returned tensor still held shows in its storage's count (outputs_alive).
        owned = {id(t) for t in self.tensors}
        self.fresh = [isinstance(t, torch.Tensor) and id(t) in owned for t in outputs] if fresh_outputs and outputs else None
        self.storages = adapter.storage_handles(self.tensors)
        self.baseline = adapter.references(self.tensors, self.storages)
        _OUTPUTS.update({t.data_ptr(): t for t in self.tensors})
        self.use_pi = True  # False once SCG decided that copying beats re-pointing (with PI on)

    def _elsewhere(self, args: list, i: int) -> bool:
        """Whether in-place input i is another live tensor than the one recorded (not a move of it)."""
        return (args[i].data_ptr() != self.ptrs[i] and not self.weak[i].expired()
                and args[i].untyped_storage().data_ptr() != self.bases[i])

    def same_site(self, args: list, static: frozenset[int]) -> bool:
        """Whether this call comes from the call site recorded: its static inputs (parameters, buffers;
        in a backward graph, saved activations) are those recorded, or moves of them (the tensor recorded
        is gone, or they are another view of its memory). Another live weight is another site: the next
        of the layers that share one Dynamo graph."""
        return not any(self._elsewhere(args, i) for i in self.in_place if i in static)

    def moved(self, args: list) -> list[int]:
        """In-place inputs that lie elsewhere than when recorded, at the same call site: a static input
        whose tensor is gone or seen through another view (activations made anew each call), or any other
        input (a KV cache made anew, an output of a graph upstream that recorded again)."""
        return [i for i in self.in_place if args[i].data_ptr() != self.ptrs[i]]

    def accepts(self, args: list) -> bool:
        """Whether inputs expanded when recorded are expanded along the same dims now (the copy fills
        one element along them)."""
        return not self.expanded or all(args[i].stride(d) == 0 for i, dims in self.expanded.items() for d in dims)

    def _copy(self, args: list) -> None:
        """Every copied input into its placeholder, as stock graph trees do before each replay."""
        if self.expanded:
            torch._foreach_copy_(self.fills, [_narrow(args[i], self.expanded.get(i, ())) for i in self.copied])
        else:
            torch._foreach_copy_(self.placeholders, [args[i] for i in self.copied])

    def _point(self, args: list) -> None:
        """PI's replay path: the graph reads each served input where it lies; an input whose layout is
        not the recorded one (less aligned than its placeholder, other strides) and every unserved input
        is copied."""
        served, ptrs, dst, src = self.indirection.inputs, {}, [], []
        for i, p, fill, alignment in zip(self.copied, self.placeholders, self.fills, self.alignments):
            a = args[i]
            if i in served and a.data_ptr() % alignment == 0 and a.stride() == p.stride():
                ptrs[i] = a.data_ptr()
            else:
                dst.append(fill), src.append(_narrow(a, self.expanded.get(i, ())))
                if i in served:
                    ptrs[i] = p.data_ptr()
        self.indirection.point(ptrs)
        if dst:
            torch._foreach_copy_(dst, src)

    def _to_placeholders(self) -> None:
        """Point PI's nodes back at the placeholders, where copies land."""
        self.indirection.point({i: p.data_ptr() for i, p in zip(self.copied, self.placeholders)
                                if i in self.indirection.inputs})

    def set_pi(self, on: bool) -> None:
        """Replay with PI (served inputs read in place) or with copies into every placeholder."""
        if self.indirection is not None and self.use_pi and not on:
            self._to_placeholders()
        self.use_pi = on

    @property
    def served(self) -> set[int]:
        """Copied inputs that PI reads in place instead."""
        return self.indirection.inputs if self.indirection is not None and self.use_pi else set()

    @property
    def still_copied(self) -> list[torch.Tensor]:
        """What a copy fills on each replay (the placeholders PI does not serve)."""
        return [f for i, f in zip(self.copied, self.fills) if i not in self.served]

    @property
    def copy_bytes(self) -> int:
        return _nbytes(self.still_copied)

    @property
    def patched_nodes(self) -> int:
        return len(self.indirection.nodes) if self.indirection is not None else 0

    def drop(self) -> None:
        """Forget this recording (its memory goes back once no output is held)."""
        for t in self.tensors:
            if _OUTPUTS.get(t.data_ptr()) is t:
                del _OUTPUTS[t.data_ptr()]

    def _held(self) -> int | None:
        """The first output with more references than right after capture (fewer is fine: the count then
        included temporaries), or None."""
        now = adapter.references(self.tensors, self.storages)
        if now == self.baseline:
            return None
        return next((k for k in range(len(self.tensors)) if any(n[k] > b[k] for n, b in zip(now, self.baseline))),
                    None)

    def outputs_alive(self) -> bool:
        return self._held() is not None

    def held(self) -> str:
        """Which output is held (for reasons): its index among the graph's own outputs, dtype and shape."""
        k = self._held()
        return "none now" if k is None else f"output {k}: {_describe(self.tensors[k])}"

    def indirect(self, args: list) -> list[str]:
        """Turn PI on for this recording: find the kernel parameters that point into placeholders and
        check once, on this call's inputs, that the graph reading them in place computes what it computes
        on copies. Returns why inputs stay copied (all of them, if the check fails)."""
        if self.graph is None:
            return ["PI: no CUDA graph to patch"]
        # A placeholder the partition returns (an input saved for backward) must hold the input's data.
        returned = {t.untyped_storage().data_ptr() for t in self.tensors}
        reasons = [f"PI: input {i}: returned as an output (saved for backward), so copied"
                   for i, p in zip(self.copied, self.placeholders) if p.untyped_storage().data_ptr() in returned]
        written = {i for i, _ in self.written}
        reasons += [f"PI: input {i}: written by the partition, so copied in and back" for i in sorted(written)]
        ranges = {i: (p.data_ptr(), p.untyped_storage().nbytes()) for i, p in zip(self.copied, self.placeholders)
                  if p.untyped_storage().data_ptr() not in returned and i not in written}
        if not ranges:
            return reasons
        try:
            indirection = pi.Indirection(self.graph.raw_cuda_graph(), self.graph.raw_cuda_graph_exec(), ranges)
        except Exception as e:  # an unexpected node or driver answer: copies, as stock does
            return reasons + [f"PI: could not read the graph's kernel parameters ({type(e).__name__}: {e})"]
        reasons += [f"PI: input {i}: {why}" for i, why in indirection.reasons.items()]
        if not indirection.inputs:
            return reasons
        snapshot = Snapshot(_may_write(args, self.static, self.mutated))
        try:
            return reasons + self._check(args, indirection, snapshot)
        finally:
            snapshot.restore()

    def _check(self, args: list, indirection: pi.Indirection, snapshot: Snapshot) -> list[str]:
        """PI's check (see indirect); every replay starts from the inputs and placeholders as this call has them."""
        self._copy(args)
        self._replay()
        reference = [t.clone() for t in self.tensors]
        snapshot.restore()
        # A graph may differ from itself from replay to replay (atomic adds in backward kernels sum in
        # any order): a second replay on the same copies measures by how much.
        self._copy(args)
        self._replay()
        jitter = [_difference(t, r) for t, r in zip(self.tensors, reference)]
        snapshot.restore()
        for i, fill in zip(self.copied, self.fills):  # a node still reading a placeholder would show
            if i in indirection.inputs:
                fill.fill_(_poison(fill.dtype))
        self.indirection = indirection
        # The replay path itself: served inputs read in place, the rest copied. A served input less
        # aligned than its placeholder (a view at an offset) would be copied: the check reads a copy of
        # it from fresh memory instead, so that every served input is read in place once.
        check_args = list(args)
        for i, p, alignment in zip(self.copied, self.placeholders, self.alignments):
            if i in indirection.inputs and args[i].data_ptr() % alignment:
                dims = self.expanded.get(i, ())
                check_args[i] = _placeholder(p)
                _narrow(check_args[i], dims).copy_(_narrow(args[i], dims))
        self._point(check_args)
        self._replay()
        off = [_difference(t, r) for t, r in zip(self.tensors, reference)]
        # (an output that differs between the two replays other than in floating-point values, j = inf,
        # vouches for nothing: it must then come out bitwise equal)
        bad = [(o, j) for o, j in zip(off, jitter) if o > JITTER_FACTOR * j or (o and math.isinf(j))]
        if bad:
            self._to_placeholders()
            self.indirection = None
            o, j = max(bad)
            return [f"PI: the graph reading inputs in place disagreed with the graph on copies (an "
                    f"output off by {o:.3g}; two replays on copies differ by {j:.3g})"]
        if any(c is not a for c, a in zip(check_args, args)):
            self._point(args)  # off the check's copies, which are freed now, onto this call's inputs
        return []

    def replay(self, args: list) -> Any:
        if self.indirection is not None and self.use_pi:
            self._point(args)
        elif self.copied:
            self._copy(args)
        written = [args[i] for i, _ in self.written] if self.written else None
        passed = [(j, args[i], view) for j, i, view in self.passed] if self.passed else None  # before args.clear()
        args.clear()
        self._replay()
        if written:
            torch._foreach_copy_(written, [p for _, p in self.written])
        if self.fresh is None and not passed:
            return list(self.outputs) if isinstance(self.outputs, list) else self.outputs  # callers may empty a list
        outputs = list(self.outputs)
        if self.fresh is not None:
            outputs = [t.detach() if fresh else t for t, fresh in zip(outputs, self.fresh)]
        for j, a, view in passed or ():
            outputs[j] = a if view is None else a.as_strided(view[0], view[1], a.storage_offset() + view[2])
        return outputs if isinstance(self.outputs, list) else tuple(outputs)


class PartitionGraph:
    """Wraps one partition function (boxed calling convention: it takes a list and empties it)."""

    def __init__(self, fn: Callable, partition: adapter.Partition, stats: Stats, selective: bool = False,
                 indirect: bool = False, group=None):
        self.fn, self.partition, self.stats = fn, partition, stats
        self.selective, self.indirect = selective, indirect  # SCG, PI
        self.group = group  # the process group of the partition's collectives: SCG decides with its ranks
        self.recordings: dict[tuple, list[_Recording]] = {}  # by the values of its size arguments, oldest first
        self.rerecords = 0
        self.moves: dict[tuple, dict[int, int]] = {}  # per set of sizes: in-place input -> times it had moved when recorded again
        self.scalars: list[int] | None = None
        self.warmed: set[tuple] = set()  # sizes seen once (warm-up): the next call at them records
        self.declined: set[tuple] = set()  # sizes SCG runs without a graph (their recording freed)
        self.calls = 0
        _LIVE.add(self)

    def free(self) -> None:
        """Free every recording: its CUDA graph, its memory pool once no output is held. A later call at
        the same sizes warms up and records again."""
        for recordings in self.recordings.values():
            for recording in recordings:
                recording.drop()
        self.recordings.clear()
        self.warmed.clear()
        self.declined.clear()
        self.stats.kept = 0

    def _eager(self, args: list, reason: str | None = None, final: bool = False) -> Any:
        if reason is not None:
            if final:
                self.stats.status = "eager"
                self.free()
                log.info("grace: graph %d partition %d runs without a CUDA graph: %s",
                         self.stats.graph, self.stats.partition, reason)
            self.stats.reason = reason
        if self.calls > 1:
            self.stats.eager_calls += 1
        return self.fn(args)

    def _record(self, key: tuple, args: list, twin: bool) -> _Recording | str:
        """A new recording (a twin: of one whose outputs are still held), or why there can be none."""
        recordings = self.recordings[key]
        why = "first at these sizes"
        if recordings:
            # the most recently used recording of this call site, if any: a twin's inputs sit where a
            # recording's do; a new call site moves nothing
            site = None if twin else next((r for r in reversed(recordings)
                                           if r.same_site(args, self.partition.static)), None)
            moved = site.moved(args) if site is not None else []
            why = "twin" if twin else "moved input" if moved else "new call site"
            # a recording again: in-place inputs moved, a twin (the same places, outputs held), or one
            # more call site where KEEP are kept already (one is dropped for it)
            if moved or twin or len(recordings) >= KEEP:
                if self.rerecords >= MAX_RERECORDS:
                    ever = sorted({i for moves in self.moves.values() for i in moves})
                    return (f"more than {MAX_RERECORDS} recordings at sizes already recorded (recordings by "
                            f"why: {self.stats.recorded_for}; in-place inputs that moved: inputs {ever}, of "
                            f"which written by the partition: {[i for i in ever if i in self.partition.mutated]})")
                self.rerecords += 1
            for i in moved:
                moves = self.moves.setdefault(key, {})
                moves[i] = moves.get(i, 0) + 1
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        cpu = next((args[i] for i in tensors if args[i].device.type != DEVICE_TYPE), None)
        if cpu is not None:
            return (f"a partition input is a CPU tensor ({_describe(cpu)}: a graph would freeze its value); CGCT "
                    "moves only CPU graph inputs and factories that feed GPU work alone")
        # An input that kept moving is copied from then on, whatever kept it in place: otherwise every
        # move is a recording, and a chain of partitions multiplies them (each new recording upstream
        # moves the outputs that the next partition reads in place). One the partition writes is copied
        # back after each replay; unless expanded (stride 0: a copy back cannot write it).
        moving = {i for moves in self.moves.values() for i, n in moves.items() if n >= MOVES_BEFORE_COPY
                  and not (i in self.partition.mutated and _expanded_dims(args[i]))}
        for stale in [r for r in recordings if moving & set(r.in_place)]:  # read moving inputs in place:
            recordings.remove(stale)                                        # they will not match again
            stale.drop()
        in_place = [i for i in tensors if i not in moving and (
            i in self.partition.static or i in self.partition.mutated or args[i].data_ptr() in _OUTPUTS)]
        copied = [i for i in tensors if i not in in_place]
        if any(args[i].data_ptr() % ALIGNMENT for i in in_place if i in self.partition.mutated):
            return "an input mutated in place is not 16-byte aligned"
        if any(adapter.has_internal_overlap(_narrow(args[i], _expanded_dims(args[i]))) for i in copied):
            return "an input has overlapping memory other than expanded dims: it cannot get a placeholder"
        def record() -> _Recording:
            return _Recording(self.fn, args, in_place, copied, sorted(self.partition.mutated),
                              fresh_outputs=self.stats.backward, static=self.partition.static)

        try:
            recording = record()
        except Exception as e:  # capture failed (a synchronising op, say): never the user's problem
            return f"capture failed: {_error(e)}"
        s = self.stats
        s.status, s.recordings = "captured", s.recordings + 1
        s.recorded_for[why] = s.recorded_for.get(why, 0) + 1
        s.nodes = recording.nodes
        if self.indirect and copied:
            try:
                s.pi_reasons = recording.indirect(args)
            except Exception as e:  # PI's patching or check failed: the next safer setting, copies, from now on
                recording.drop()
                self.indirect = False
                log.warning("grace: graph %d partition %d: PI failed, its inputs are copied instead: %s",
                            s.graph, s.partition, _error(e))
                s.pi_reasons = [f"PI failed, inputs copied instead: {_error(e)}"]
                try:
                    recording = record()
                except Exception as e:
                    return f"capture failed: {_error(e)}"
        s.in_place_inputs, s.copied_inputs, s.pi_inputs = len(in_place), len(copied), len(recording.served)
        s.moving_inputs = len(moving & set(copied))
        s.copy_bytes_per_replay = recording.copy_bytes
        return recording

    def _costs(self, recording: _Recording, device: torch.device, args: list, snapshot: Snapshot) -> scg.Costs | None:
        if recording.nodes is None or device.type != "cuda":
            return None  # nothing to predict from: measure
        def before() -> None:  # each replay from this call's state (placeholders never garbage: indices read as such)
            snapshot.restore()
            if recording.copied:
                recording._copy(args)

        gpu_us = calibrate.device_us(recording._replay, before=before)  # the graph's kernels alone
        snapshot.restore()
        return scg.Costs(recording.nodes["kernel"], calibrate.launch_us(device), calibrate.replay_us(device),
                         _nbytes(recording.fills), calibrate.copy_bytes_per_us(device), len(recording.fills),
                         recording.patched_nodes, gpu_us, recording.copy_bytes, len(recording.still_copied))

    def _select(self, recording: _Recording, args: list) -> bool:
        """SCG: no graph, the graph with copies, or (PI on) the graph reading inputs in place, for this
        recording, decided on this call's inputs (grace.scg). Whether to keep the graph."""
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None) or _current_device()

        # Every run starts from this call's state: a run that wrote an input (an intermediate Inductor
        # computes into in place, a cache) must not hand the next one state the call never sees.
        snapshot = Snapshot(_may_write(args, self.partition.static, self.partition.mutated))

        def graph(pi: bool) -> Callable[[], object]:
            def run():
                snapshot.restore()
                recording.set_pi(pi)
                return recording.replay(list(args))
            return run

        def eager():
            snapshot.restore()
            return self.fn(list(args))

        runs = {"graph": graph(False), "eager": eager}
        if recording.indirection is not None:
            runs["graph_pi"] = graph(True)
        across = scg.slowest_rank(self.group) if self.group is not None else None
        s = self.stats
        try:
            decision = scg.decide(self._costs(recording, device, args, snapshot), runs, timer, snapshot, across)
        except Exception as e:  # SCG's costs or timings failed: the next safer setting, the graph on copies
            if across is not None:
                raise  # the ranks must take one step together: a rank that went its own way would hang them
            snapshot.restore()
            log.warning("grace: graph %d partition %d: SCG failed, the graph is kept: %s", s.graph, s.partition,
                        _error(e))
            decision = scg.Decision("graph", {}, error=f"SCG failed, graph kept: {_error(e)}")
        recording.set_pi(decision.choice == "graph_pi")
        s.scg = decision.as_dict()
        s.pi_inputs, s.copy_bytes_per_replay = len(recording.served), recording.copy_bytes
        if decision.choice == "eager":
            s.status, s.reason = "declined", "SCG: faster without a graph"
        elif recording.indirection is not None and decision.choice == "graph":
            s.pi_reasons = s.pi_reasons + ["SCG: faster copying the inputs than re-pointing the graph"]
        return decision.choice != "eager"

    @staticmethod
    def _here(recordings: list[_Recording], args: list) -> list[_Recording]:
        """The recordings whose in-place inputs sit where this call's do: the first in-place input's
        address compared in Python first (one data_ptr() per distinct first input, usually one), then all
        of them in one C++ call, for those that pass."""
        firsts: dict[int, int] = {}
        here = []
        for r in recordings:
            if r.first is not None:
                ptr = firsts.get(r.first)
                if ptr is None:
                    ptr = firsts[r.first] = args[r.first].data_ptr()
                if ptr != r.ptrs[r.first]:
                    continue
            if adapter.data_ptrs_equal(args, r.ptrs, r.in_place):
                here.append(r)
        return here

    def __call__(self, args: list) -> Any:
        try:
            return self._call(args)
        except Exception as e:
            if not args or self.stats.status == "eager":
                raise  # the partition itself raised, or its replay had begun: not GraCE's to hide
            # GraCE's own step failed (recording, PI, SCG): the next safer setting, the partition as compiled
            log.warning("grace: graph %d partition %d runs without a CUDA graph after an error in GraCE's runtime: %s",
                        self.stats.graph, self.stats.partition, _error(e))
            return self._eager(args, f"GraCE runtime error: {_error(e)}", final=True)

    def _call(self, args: list) -> Any:
        self.calls += 1
        if self.stats.status == "eager":
            return self._eager(args)
        if self.scalars is None:  # where the partition takes sizes (dynamic shapes): fixed by its signature
            self.scalars = [i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)]
        key = tuple(args[i] for i in self.scalars) if self.scalars else ()
        if key not in self.warmed:  # a first call at these sizes runs as compiled: lazy init, autotuning
            self.warmed.add(key)
            return self._eager(args)
        recordings = self.recordings.get(key)
        if recordings is None:
            if len(self.recordings) >= MAX_SIZES:
                return self._eager(args, f"more than {MAX_SIZES} sets of sizes: further ones run without a graph")
            recordings = self.recordings[key] = []
        if key in self.declined:
            return self._eager(args)  # SCG decided for these sizes
        here = self._here(recordings, args)
        recording = next((r for r in here if not r.outputs_alive()), None)
        if recording is None and len(here) >= TWINS:
            return self._eager(args, "outputs of the previous replays were still held by the caller "
                                     f"({here[-1].held()})")
        if recording is None:
            recording = self._record(key, args, twin=bool(here))
            if isinstance(recording, str):
                return self._eager(args, recording, final=True)
            if self.selective and not recordings:  # later recordings at these sizes keep the decision
                if not self._select(recording, args):  # no graph at these sizes: its memory goes back
                    recording.drop()
                    self.declined.add(key)
                    return self._eager(args)
            elif recordings:
                recording.set_pi(recordings[-1].use_pi)
            if len(recordings) >= KEEP:
                recordings.pop(0).drop()
            recordings.append(recording)
            self.stats.kept = sum(map(len, self.recordings.values()))  # counted when it changes, not per replay
        else:
            recordings.remove(recording)
            recordings.append(recording)  # most recently used last
        if not recording.accepts(args):
            return self._eager(args, "an input expanded when recorded is not expanded now")
        self.stats.replays += 1
        return recording.replay(args)


def free_all() -> None:
    """Free the recordings of every partition in this process (grace.reset)."""
    for part in list(_LIVE):
        part.free()
