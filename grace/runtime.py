"""GraCE's runtime: the state machine that decides, per call of a CUDA-graph partition, which recording
replays it, when to record, and when to run it without a graph.

Inductor splits each graph where it cannot be captured and hands each partition to a wrapper of our
choosing (grace.torch_adapter.partitioned): a PartitionGraph. Per set of sizes, its first call runs as
compiled (warm-up), its second is recorded (grace.recording) and replayed, and later calls replay a
recording whose in-place inputs sit where this call's do and whose outputs nobody still holds: a twin
(a second recording) when the caller holds the previous outputs, one recording per call site where layers
share one Dynamo graph, a new one when an in-place input moved (copied from then on once it moved
MOVES_BEFORE_COPY times). Whatever cannot be replayed runs without a graph, the reason kept in Stats.
PI (grace.pi) and SCG (grace.scg) act on each new recording. docs/runtime.md has the invariants.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import weakref
from typing import Any, Callable

import torch

from grace import pi, scg
from grace import recording as rec
from grace import torch_adapter as adapter
from grace.recording import Recording, describe, expanded_dims, narrow

log = logging.getLogger("grace")

MAX_SIZES = 64  # sets of sizes a partition records (dynamic shapes); further ones run without a graph
WARMED = 4 * MAX_SIZES  # sets of sizes remembered as called once; beyond, the oldest is forgotten
SIZES = (int, float, bool, type(None))  # what a partition takes besides tensors: sizes, scalars (by value)
MAX_RERECORDS = 32  # recordings at sizes already recorded (moves, twins, call sites beyond KEEP), over its life
MOVES_BEFORE_COPY = 3  # an in-place input that moved this often at one set of sizes is copied from then on,
                       # at all sizes; moves at different sizes (twins upstream, per size) do not add up
KEEP = 64  # recordings kept per set of sizes: one per call site (each layer of those that share a graph), and twins
TWINS = 2  # recordings per set of sizes and in-place addresses: one may be replayed while the other's outputs are held
CHAIN = 8  # recordings per set of sizes that read a held output of another in place (a chain fed forward)
HELD_LOOKS = 16  # calls in a row whose recordings' outputs were all held; from then on, only every such call
                 # looks again (a caller that keeps every output, as an eval loop collecting them does,
                 # would pay the held test of each twin on every call that runs without a graph anyway)
ALIGNMENT = 16  # bytes: Inductor's kernels assume inputs this aligned
CALLER_CAPTURE = "called inside the caller's own CUDA-graph capture: ran as compiled, into the caller's graph"


class Status(enum.StrEnum):
    WARM_UP = "warm-up"  # not yet called twice at the same sizes
    CAPTURED = "captured"
    EAGER = "eager"  # not capturable: every call runs as compiled
    DECLINED = "declined"  # SCG chose no graph


@dataclasses.dataclass
class Stats:
    """What happened to one partition; grace.explain and the harness's records show these."""
    graph: int  # the Dynamo graph (one torch.compile frame) it belongs to
    backward: bool
    partition: int
    status: Status = Status.WARM_UP
    reason: str | None = None  # why not captured (eager), or why a call ran without the graph
    calls: int = 0
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
    largest_copies: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (bytes, what) of the
    # latest recording's largest copied inputs, and where they come from


_LIVE: weakref.WeakSet[PartitionGraph] = weakref.WeakSet()  # every partition wrapper alive in this process


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


class PartitionGraph:
    """Wraps one partition function (boxed calling convention: it takes a list and empties it)."""

    def __init__(self, fn: Callable, partition: adapter.Partition, stats: Stats, scg: bool = False,
                 pi: bool = False, group=None):
        self.fn, self.partition, self.stats = fn, partition, stats
        self.scg, self.pi = scg, pi
        self.group = group  # the process group of the partition's collectives: SCG decides with its ranks
        self.recordings: dict[tuple, list[Recording]] = {}  # by the values of its size arguments, oldest first
        self.rerecords = 0
        self.moves: dict[tuple, dict[int, int]] = {}  # per set of sizes: in-place input -> times it had moved when recorded again
        self.scalars: list[int] | None = None
        self.warmed: dict[tuple, None] = {}  # sizes seen once (warm-up), oldest first: the next call at them records
        self.sizes = 0  # sets of sizes called at, over its life
        self.declined: set[tuple] = set()  # sizes SCG runs without a graph (their recording freed)
        self.held: dict[tuple, int] = {}  # per set of sizes: calls in a row with every output held (HELD_LOOKS)
        self.links: dict[tuple, int] = {}  # per set of sizes: links recorded for chains of outputs fed forward
        self.seen: list | None = None  # while grace.lean watches a call: each call's arguments and result
        # inputs in lists or tuples: per input, the spec of its nesting or None (adapter.tree_flatten);
        # False: none; None: not called yet. With them, the runtime works on the leaves (_unnest)
        self.nesting: list | bool | None = None
        self.nested = (fn, partition)  # the partition as it takes its inputs
        # One call at a time: threads that call one compiled model together would otherwise both pick the
        # recording whose outputs nobody holds yet, and one's replay write over the other's result
        self.lock = threading.RLock()
        _LIVE.add(self)

    def free(self) -> None:
        """Free every recording: its CUDA graph, its memory pool once no output is held. A later call at
        the same sizes warms up and records again."""
        with self.lock:  # grace.reset() may come from another thread
            for recordings in self.recordings.values():
                for recording in recordings:
                    recording.drop()
            self.recordings.clear()
            self.warmed.clear()
            self.declined.clear()
            self.held.clear()
            self.links.clear()
            self.stats.kept = 0

    def _eager(self, args: list, reason: str | None = None, final: bool = False) -> Any:
        if reason is not None:
            if final:
                self.stats.status = Status.EAGER
                self.free()
                log.info("grace: graph %d partition %d runs without a CUDA graph: %s",
                         self.stats.graph, self.stats.partition, reason)
            self.stats.reason = reason
        if self.stats.calls > 1:
            self.stats.eager_calls += 1
        return self.fn(args)

    def _sites(self, args: list) -> frozenset[int]:
        """The static inputs whose tensors tell call sites apart: parameters and buffers; in a backward
        graph, whose static inputs are the saved tensors, the parameters alone. A saved activation is
        made anew each step; one the caller still holds (logits kept over steps) is a move, not a site."""
        static = self.partition.static
        if not self.stats.backward:
            return static
        return frozenset(i for i in static if isinstance(args[i], torch.nn.Parameter))

    def _record(self, key: tuple, args: list, twin: Recording | None, fed: Recording | None = None) -> Recording | str:
        """A new recording (a twin of `twin`, whose outputs are still held; with `fed`, a link that reads
        the held output of `fed` that this call takes in place), or why there can be none."""
        recordings = self.recordings[key]
        why = "first at these sizes"
        if recordings:
            # the most recently used recording of this call site, if any: a twin's inputs sit where a
            # recording's do; a new call site moves nothing
            sites = self._sites(args)
            site = None if twin is not None else next(
                (r for r in reversed(recordings) if r.same_site(args, sites)), None)
            moved = site.moved(args) if site is not None else []
            why = ("output fed forward" if fed is not None else "twin" if twin is not None
                   else "moved input" if moved else "new call site")
            # a recording again: in-place inputs moved, a twin (the same places, outputs held), or one
            # more call site where KEEP are kept already (one is dropped for it); links of a chain have
            # a limit of their own (CHAIN)
            if moved or (twin is not None and fed is None) or len(recordings) >= KEEP:
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
        cpu = next((args[i] for i in tensors if args[i].device.type != rec.DEVICE_TYPE), None)
        if cpu is not None:
            return (f"a partition input is a CPU tensor ({describe(cpu)}: a graph would freeze its value); CGCT "
                    "moves only CPU graph inputs and factories that feed GPU work alone")
        # An input that kept moving is copied from then on, whatever kept it in place: otherwise every
        # move is a recording, and a chain of partitions multiplies them (each new recording upstream
        # moves the outputs that the next partition reads in place). One the partition writes is copied
        # back after each replay; unless expanded (stride 0: a copy back cannot write it).
        moving = {i for moves in self.moves.values() for i, n in moves.items() if n >= MOVES_BEFORE_COPY
                  and not (i in self.partition.mutated and expanded_dims(args[i]))}
        for stale in [r for r in recordings if moving & set(r.in_place)]:  # read moving inputs in place:
            recordings.remove(stale)                                        # they will not match again
            stale.drop()
        in_place = [i for i in tensors if i not in moving and (
            i in self.partition.static or i in self.partition.mutated or args[i].data_ptr() in rec.OUTPUTS)]
        # A twin copies what its twin copies: an input the twin copied (a state fed back, now an output of
        # the twin's last replay) read in place would match no later call, and each call would record one.
        # A link of a chain that repeats reads its predecessor's output in place, as graph trees do.
        if twin is not None:
            outputs = {t.data_ptr() for t in fed.tensors} if fed is not None else set()
            in_place = [i for i in in_place if i in twin.in_place or args[i].data_ptr() in outputs]
        copied = [i for i in tensors if i not in in_place]
        if any(args[i].data_ptr() % ALIGNMENT for i in in_place if i in self.partition.mutated):
            return "an input mutated in place is not 16-byte aligned"
        if any(adapter.has_internal_overlap(narrow(args[i], expanded_dims(args[i]))) for i in copied):
            return "an input has overlapping memory other than expanded dims: it cannot get a placeholder"
        returned = self.partition.returned
        fresh = True if self.stats.backward or returned is None else returned  # grace.recording says why

        def record() -> Recording:
            return Recording(self.fn, args, in_place, copied, sorted(self.partition.mutated), fresh_outputs=fresh,
                             static=self.partition.static, writable=self.partition.writable(len(args)))

        try:
            recording = record()
        except Exception as e:  # capture failed (a synchronising op, say): never the user's problem
            return f"capture failed: {_error(e)}"
        s = self.stats
        if s.status == Status.WARM_UP:
            s.reason = None  # the warm-up's: it is over
        s.status, s.recordings = Status.CAPTURED, s.recordings + 1
        s.recorded_for[why] = s.recorded_for.get(why, 0) + 1
        s.nodes = recording.nodes
        if self.pi and copied:
            try:
                recording.pi, s.pi_reasons = pi.check(recording, args)
            except Exception as e:  # PI's patching or check failed: the next safer setting, copies, from now on
                recording.drop()
                self.pi = False
                log.warning("grace: graph %d partition %d: PI failed, its inputs are copied instead: %s",
                            s.graph, s.partition, _error(e))
                s.pi_reasons = [f"PI failed, inputs copied instead: {_error(e)}"]
                try:
                    recording = record()
                except Exception as e:
                    return f"capture failed: {_error(e)}"
        s.in_place_inputs, s.copied_inputs, s.pi_inputs = len(in_place), len(copied), len(recording.pi_inputs)
        s.moving_inputs = len(moving & set(copied))
        s.copy_bytes_per_replay = recording.copy_bytes
        s.largest_copies = self._largest_copies(recording, args, moving)
        return recording

    def _largest_copies(self, recording: Recording, args: list, moving: set[int], most: int = 3) -> list[tuple[int, str]]:
        """The copied inputs that PI does not read in place, largest first: which, and where each comes
        from (a copy a stock graph tree would make too, or one GraCE makes of an input it would read in
        place had it not kept moving)."""
        produced = self.partition.produced

        def source(i: int) -> str:
            if i in moving:
                return "kept moving"
            if produced is None:
                return "not a parameter or buffer"
            return "made between partitions of its graph outside any graph" if i in produced else "a graph input"

        sizes = sorted(((f.numel() * f.element_size(), i) for i, f in zip(recording.copied, recording.fills)
                        if i not in recording.pi_inputs), reverse=True)[:most]
        return [(n, f"input {i}: {describe(args[i])}, {source(i)}") for n, i in sizes]

    def _select(self, recording: Recording, args: list) -> bool:
        """SCG for this recording, decided on this call's inputs (grace.scg). Whether to keep the graph."""
        s = self.stats
        try:
            decision = scg.select(recording, self.fn, args, self.group)
        except Exception as e:  # SCG's costs or timings failed: the next safer setting, the graph on copies
            if self.group is not None:
                raise  # the ranks must take one step together: a rank that went its own way would hang them
            log.warning("grace: graph %d partition %d: SCG failed, the graph is kept: %s", s.graph, s.partition,
                        _error(e))
            recording.set_pi(False)
            decision = scg.Decision(scg.Choice.GRAPH, {}, error=f"SCG failed, graph kept: {_error(e)}")
        s.scg = decision.as_dict()
        s.pi_inputs, s.copy_bytes_per_replay = len(recording.pi_inputs), recording.copy_bytes
        if decision.choice == scg.Choice.EAGER:
            s.status, s.reason = Status.DECLINED, "SCG: faster without a graph"
        elif recording.pi is not None and decision.choice == scg.Choice.GRAPH:
            s.pi_reasons = s.pi_reasons + ["SCG: faster copying the inputs than re-pointing the graph"]
        return decision.choice != scg.Choice.EAGER

    @staticmethod
    def _here(recordings: list[Recording], args: list) -> list[Recording]:
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

    def _unnest(self, args: list) -> list | None:
        """The inputs as the runtime takes them where some are lists or tuples (the output of a torch.cond,
        handed on to the next partition): their leaves in their place, which self.fn nests back. None where
        they are nested otherwise than at the first call."""
        leaves, nesting = [], []
        for a in args:
            if isinstance(a, (list, tuple)):
                items, spec = adapter.tree_flatten(a)
                leaves += items
                nesting.append(spec)
            else:
                leaves.append(a)
                nesting.append(None)
        if self.nesting is None:
            if all(n is None for n in nesting):
                self.nesting = False
                return args
            self.nesting = nesting
            self.fn = _nesting(self.fn, nesting)
            self.partition = self.partition.spread([None if n is None else n.num_leaves for n in nesting])
        elif nesting != self.nesting:
            return None
        args.clear()  # the caller's list is the partition's to empty
        return leaves

    def __call__(self, args: list) -> Any:
        with self.lock:
            if self.nesting is not False:
                flat = self._unnest(args)
                if flat is None:  # from now on as compiled, nested as given
                    self.free()
                    (self.fn, self.partition), self.nesting = self.nested, False
                    self.stats.calls += 1
                    return self._eager(args, "its inputs came nested otherwise than at the first call", final=True)
                args = flat
            if self.seen is not None:
                self.seen.append(list(args))
                result = self._call_safely(args)
                self.seen.append(result)
                return result
            return self._call_safely(args)

    def _call_safely(self, args: list) -> Any:
        try:
            return self._call(args)
        except Exception as e:
            if not args or self.stats.status == Status.EAGER:
                raise  # the partition itself raised, or its replay had begun: not GraCE's to hide
            # GraCE's own step failed (recording, PI, SCG): the next safer setting, the partition as compiled
            log.warning("grace: graph %d partition %d runs without a CUDA graph after an error in GraCE's runtime: %s",
                        self.stats.graph, self.stats.partition, _error(e))
            return self._eager(args, f"GraCE runtime error: {_error(e)}", final=True)

    def _call(self, args: list) -> Any:
        self.stats.calls += 1
        if self.stats.status == Status.EAGER:
            return self._eager(args)
        if rec.caller_capturing():
            # A replay, a recording (it synchronizes) or SCG's timing would break the caller's capture or
            # leave in it a graph that PI re-points later: the kernels go into the caller's graph instead
            return self._eager(args, CALLER_CAPTURE)
        if self.scalars is None:  # where the partition takes sizes (dynamic shapes): fixed by its signature
            self.scalars = [i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)]
            odd = next((args[i] for i in self.scalars if not isinstance(args[i], SIZES)), None)
            if odd is not None:  # its identity would key the recordings: a new one every call
                return self._eager(args, f"a partition input is a {type(odd).__name__}, neither a tensor nor a "
                                         "size", final=True)
        key = tuple(args[i] for i in self.scalars) if self.scalars else ()
        if key not in self.warmed:  # a first call at these sizes runs as compiled: lazy init, autotuning
            self.warmed[key] = None
            if len(self.warmed) > WARMED:
                del self.warmed[next(iter(self.warmed))]
            self.sizes += 1
            if self.stats.status == Status.WARM_UP and self.sizes > 1:  # sizes that change every call
                self.stats.reason = (f"warm-up: called at {self.sizes} sets of sizes, none twice yet "
                                     f"(the latest: {key!r:.100})")
            return self._eager(args)
        recordings = self.recordings.get(key)
        if recordings is None:
            if len(self.recordings) >= MAX_SIZES:
                return self._eager(args, f"more than {MAX_SIZES} sets of sizes: further ones run without a graph")
            recordings = self.recordings[key] = []
        if key in self.declined:
            return self._eager(args)  # SCG decided for these sizes
        kept = self.held.get(key, 0)
        if kept >= HELD_LOOKS and kept % HELD_LOOKS:  # the caller keeps every output: look again later
            self.held[key] = kept + 1
            return self._eager(args)
        here = self._here(recordings, args)
        recording, held = None, None
        for r in here:  # the first whose outputs the caller no longer holds
            held = r.held_output()
            if held is None:
                recording = r
                break
        fed = None
        if recording is None and len(here) >= TWINS:
            fed = self._fed_forward(key, args)
            if fed is None:
                self.held[key] = kept + 1
                return self._eager(args, "outputs of the previous replays were still held by the caller "
                                         f"({here[-1].describe_output(held)})")
            self.links[key] = self.links.get(key, 0) + 1
        if kept:
            del self.held[key]
        if recording is None:
            with rec.on_device_of(args):  # capture, PI's check and SCG's timings on the partition's device
                recording = self._record(key, args, twin=fed or (here[-1] if here else None), fed=fed)
                # SCG decides at the first recording of these sizes; later ones keep its decision
                declined = (not isinstance(recording, str) and self.scg and not recordings
                            and not self._select(recording, args))
            if isinstance(recording, str):
                return self._eager(args, recording, final=True)
            if declined:  # no graph at these sizes: its memory goes back
                recording.drop()
                self.declined.add(key)
                return self._eager(args)
            if recordings:
                recording.set_pi(recordings[-1].pi_on)
                s = self.stats  # _record counted this recording's copies with PI on
                s.pi_inputs, s.copy_bytes_per_replay = len(recording.pi_inputs), recording.copy_bytes
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
        recording.replays += 1
        return recording.replay(args)

    def _fed_forward(self, key: tuple, args: list) -> Recording | None:
        """Where every recording here has its outputs held: the recording whose held output this call
        takes, if it was replayed more than once (a loop that feeds each output to the next call and
        keeps them all, run again each step: a link reading that output in place will match again) and
        the chain at these sizes is shorter than CHAIN. A state fed back for ever (an RNN cell in grad
        mode) never replays a recording twice, and records no link."""
        if self.links.get(key, 0) >= CHAIN:
            return None
        ptrs = {a.data_ptr() for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in self.partition.static}
        return next((r for r in self.recordings[key] if r.replays > 1 and any(t.data_ptr() in ptrs for t in r.tensors)),
                    None)


def _nesting(fn: Callable, nesting: list) -> Callable:
    """`fn`, taking the leaves of inputs nested as `nesting` says (PartitionGraph._unnest), in its
    boxed calling convention."""
    widths = [1 if spec is None else spec.num_leaves for spec in nesting]

    def nested(leaves: list) -> Any:
        args, k = [], 0
        for spec, n in zip(nesting, widths):
            args.append(leaves[k] if spec is None else adapter.tree_unflatten(leaves[k:k + n], spec))
            k += n
        leaves.clear()
        return fn(args)

    return nested


def free_all() -> None:
    """Free the recordings of every partition in this process (grace.reset)."""
    for part in list(_LIVE):
        part.free()
