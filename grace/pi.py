"""PI: parameter indirection. A replay reads the caller's input where it lies instead of a copy of it.

PI captures as stock does (with placeholders), then finds, in every kernel node of the captured graph,
the parameter words (plain pointers, pointers inside struct parameters or a packed `extra` buffer, and
the address field of TMA descriptors) that point into a placeholder. Before a replay each is rewritten
to the live input's address and the node's parameters are set on the executable graph: one driver call
per node that reads a moved input, no copy. Each recording is checked once (check) and an input PI
cannot vouch for stays copied, with the reason. docs/pi.md has the design and its measurements.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import math
from typing import Callable

import torch

from grace import cuda_driver
from grace.recording import Recording, may_write, narrow, passed_through, placeholder
from grace.snapshot import Snapshot

log = logging.getLogger("grace")

WORD = 8  # bytes of a device pointer
TENSOR_MAP = 128  # bytes of a TMA descriptor (CUtensorMap), 64-byte aligned among a kernel's parameters
ADDRESS_MASK = ((1 << 48) - 1) & ~0xF  # the bits of a 16-byte aligned device address
LIBRARY_ALIGNMENT = 256  # bytes: the most alignment PyTorch tells cuBLAS its operands have (cuBLASLt
                         # picks a kernel that may rely on it), so PI reads an input in place only when it
                         # is as aligned as its placeholder was at capture, up to this
JITTER_FACTOR = 4  # reading inputs in place may change an output by this many times the graph's own
                   # replay-to-replay difference (0 for a deterministic graph: bitwise equal)


@dataclasses.dataclass(frozen=True)
class Site:
    """A word, or a TMA descriptor (tensor_map), inside a kernel parameter that points into an input's
    placeholder."""
    param: int  # parameter index
    offset: int  # byte offset of the word or descriptor inside the parameter
    input: int  # which input (partition argument index)
    delta: int  # bytes past the placeholder's start
    tensor_map: bool = False


@dataclasses.dataclass(frozen=True)
class TensorMapCodec:
    """Where a TMA descriptor keeps its global address: address bit k at descriptor bit k + shift."""
    shift: int

    def decode(self, bits: int) -> int:
        return (bits >> self.shift if self.shift >= 0 else bits << -self.shift) & ADDRESS_MASK

    def encode(self, bits: int, address: int) -> int:
        """`bits` with the address field set to `address` and every other bit kept."""
        place = (lambda v: v << self.shift) if self.shift >= 0 else (lambda v: v >> -self.shift)
        return bits & ~place(ADDRESS_MASK) | place(address & ADDRESS_MASK)


def learn_codec(bits_at: Callable[[int], int], address: int) -> TensorMapCodec | None:
    """The codec that explains how a descriptor changes as its address moves one bit at a time
    (bits_at(a): the descriptor's bits with address a), or None if one bit of the address does not
    always move exactly one bit of the descriptor, by the same shift."""
    base, shifts = bits_at(address), set()
    for k in range(4, address.bit_length() - 1):  # addresses no larger than this one: valid-looking
        diff = base ^ bits_at(address ^ (1 << k))
        if diff == 0 or diff & (diff - 1):
            return None
        shifts.add(diff.bit_length() - 1 - k)
    return TensorMapCodec(shifts.pop()) if len(shifts) == 1 else None


_codec: list[TensorMapCodec | None] = []  # learned once per process


def tensor_map_codec(address: int) -> TensorMapCodec | None:
    """This driver's codec, learned with a device address (a placeholder's) the first time."""
    if not _codec:
        try:
            _codec.append(learn_codec(lambda a: cuda_driver.tensor_map_bits(address, a), address))
        except Exception as e:  # an older driver or GPU without TMA: descriptors stay unread
            log.info("grace: PI cannot read TMA descriptors here: %s", e)
            _codec.append(None)
    return _codec[0]


def find_sites(params: list[bytes], ranges: dict[int, tuple[int, int]]) -> list[Site]:
    """The 8-byte-aligned words of the parameters that hold an address inside one of `ranges`
    (input -> (base address, bytes))."""
    sites = []
    for p, data in enumerate(params):
        for offset in range(0, len(data) - WORD + 1, WORD):
            value = int.from_bytes(data[offset:offset + WORD], "little")
            for i, (base, size) in ranges.items():
                if base <= value < base + size:
                    sites.append(Site(p, offset, i, value - base))
    return sites


def find_tensor_map_sites(params: list[bytes], ranges: dict[int, tuple[int, int]], codec: TensorMapCodec,
                          words: list[Site]) -> list[Site]:
    """The TMA descriptors among the parameters whose address points into one of `ranges`, leaving out
    any that holds one of the plain `words` sites (an address kept as a plain word is patched as one)."""
    sites = []
    for p, data in enumerate(params):
        for offset in range(0, len(data) - TENSOR_MAP + 1, 64):
            if any(w.param == p and offset <= w.offset < offset + TENSOR_MAP for w in words):
                continue
            address = codec.decode(int.from_bytes(data[offset:offset + TENSOR_MAP], "little"))
            for i, (base, size) in ranges.items():
                if base <= address < base + size:
                    sites.append(Site(p, offset, i, address - base, tensor_map=True))
    return sites


class _KernelNode:
    """One kernel node that reads an input: its parameters copied into buffers of our own, which a
    patch rewrites in place before handing them to the executable graph."""

    def __init__(self, node, params, values: list[bytes], sites: list[Site], codec: TensorMapCodec | None):
        self.node, self.params, self.codec = node, params, codec
        self.buffers = [ctypes.create_string_buffer(v, len(v)) for v in values]
        self.keepalive = cuda_driver.point_params(params, self.buffers)
        self.keep(sites)

    def keep(self, sites: list[Site]) -> None:
        """Patch these sites only; each gets a view into its parameter buffer, made once: 8 bytes for a
        word, 128 for a TMA descriptor."""
        self.sites, self.inputs = sites, {s.input for s in sites}

        def view(site: Site, kind):
            return kind.from_buffer(self.buffers[site.param], site.offset)

        self.slots = [(view(s, ctypes.c_uint64), s.input, s.delta) for s in sites if not s.tensor_map]
        self.maps = [(view(s, ctypes.c_char * TENSOR_MAP), s.input, s.delta) for s in sites if s.tensor_map]

    def write(self, ptrs: dict[int, int]) -> None:
        for slot, i, delta in self.slots:
            slot.value = ptrs[i] + delta
        for descriptor, i, delta in self.maps:
            bits = self.codec.encode(int.from_bytes(descriptor.raw, "little"), ptrs[i] + delta)
            descriptor.raw = bits.to_bytes(TENSOR_MAP, "little")


class Indirection:
    """The kernel nodes of one captured graph that read inputs, and how to point them elsewhere."""

    def __init__(self, raw_graph: int, raw_exec: int, ranges: dict[int, tuple[int, int]]):
        self.exec = cuda_driver.exec_handle(raw_exec)
        self.nodes: list[_KernelNode] = []
        untouchable: set[int] = set()
        codec = tensor_map_codec(min(base for base, _ in ranges.values()))
        for node, kind in cuda_driver.nodes(raw_graph):
            if kind == "kernel":
                params, values = cuda_driver.kernel_params(node)
                sites = find_sites(values, ranges)
                if codec is not None:
                    sites += find_tensor_map_sites(values, ranges, codec, sites)
                if sites:
                    self.nodes.append(_KernelNode(node, params, values, sites, codec))
            elif kind in ("memcpy", "memset"):
                untouchable |= {i for i, (base, size) in ranges.items()
                                if any(base <= a < base + size for a in cuda_driver.copy_addresses(node, kind))}
        found = {i for n in self.nodes for i in n.inputs}
        self.untouchable = untouchable
        self.inputs = found - untouchable  # inputs PI serves: every use of them is a patchable site
        self.reasons = {i: "a memcpy or memset node reads it" for i in untouchable} | {
            i: "no kernel parameter points into it" for i in ranges if i not in found and i not in untouchable}
        for n in self.nodes:  # sites of inputs PI does not serve keep pointing at their placeholders
            n.keep([s for s in n.sites if s.input in self.inputs])
        self.nodes = [n for n in self.nodes if n.sites]
        self.current = {i: ranges[i][0] for i in self.inputs}  # where the graph reads each input now

    def point(self, ptrs: dict[int, int]) -> int:
        """Make the graph read input i at ptrs[i]; returns the number of nodes updated."""
        moved = {i for i in self.inputs if ptrs[i] != self.current[i]}
        if not moved:
            return 0
        self.current.update({i: ptrs[i] for i in moved})
        updated = 0
        for n in self.nodes:
            if n.inputs & moved:
                n.write(self.current)
                cuda_driver.set_kernel_params(self.exec, n.node, n.params)
                updated += 1
        return updated

    @property
    def patched_nodes(self) -> int:
        return len(self.nodes)


def alignment(address: int) -> int:
    """The largest power of two, up to LIBRARY_ALIGNMENT, that divides `address`."""
    return min(address & -address, LIBRARY_ALIGNMENT) if address else LIBRARY_ALIGNMENT


def poison(dtype: torch.dtype) -> float | bool:
    """What the check writes into served placeholders: unlike real data, yet harmless to read (an
    integer placeholder may hold indices: 0 is in range wherever any index is)."""
    return True if dtype == torch.bool else 7.0 if dtype.is_floating_point else 0


def difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest elementwise |a - b|: 0 when bitwise equal (NaN equal to NaN: a workload may compute NaNs
    from random inputs), inf when they differ other than in floating-point values."""
    if torch.equal(a, b):
        return 0.0
    if not a.is_floating_point() or a.shape != b.shape or a.dtype != b.dtype:
        return math.inf
    both_nan = a.isnan() & b.isnan()
    d = (a.float() - b.float()).abs().masked_fill(both_nan, 0.0)
    return float(d.nan_to_num(math.inf).max()) if d.numel() else 0.0


class Pointing:
    """PI on one recording: which of its copied inputs the graph reads in place, and the replay path.
    `passed`: the served inputs that the partition returns (saved for backward), as (output, input,
    view of it or None): a replay that reads such an input in place returns it, not its placeholder;
    `free` of those, the ones no node reads (nothing to point)."""

    def __init__(self, recording: Recording, indirection: Indirection,
                 passed: list[tuple[int, int, tuple | None]] = (), free: frozenset[int] = frozenset()):
        self.recording, self.indirection, self.passed, self.free = recording, indirection, list(passed), free
        self.alignments = [alignment(p.data_ptr()) for p in recording.placeholders]
        self.inputs = indirection.inputs | free  # served: read in place where the layout allows

    @property
    def patched_nodes(self) -> int:
        return self.indirection.patched_nodes

    def point(self, args: list) -> dict[int, int]:
        """Before a replay: the graph reads each served input where it lies; an input whose layout is not
        the recorded one (less aligned than its placeholder, other strides) and every unserved input is
        copied. Returns where each served input is read (its own address, or its placeholder's)."""
        r, served, ptrs, dst, src = self.recording, self.inputs, {}, [], []
        for i, p, fill, align in zip(r.copied, r.placeholders, r.fills, self.alignments):
            a = args[i]
            if i in served and a.data_ptr() % align == 0 and a.stride() == p.stride():
                ptrs[i] = a.data_ptr()
            else:
                dst.append(fill), src.append(narrow(a, r.expanded.get(i, ())))
                if i in served:
                    ptrs[i] = p.data_ptr()
        self.indirection.point(ptrs)
        if dst:
            torch._foreach_copy_(dst, src)
        return ptrs

    def to_placeholders(self) -> None:
        """Point the nodes back at the placeholders, where copies land."""
        r = self.recording
        self.indirection.point({i: p.data_ptr() for i, p in zip(r.copied, r.placeholders) if i in self.inputs})


def placeholder_storage(r: Recording, i: int) -> int:
    return r.placeholders[r.copied.index(i)].untyped_storage().data_ptr()


def check(recording: Recording, args: list) -> tuple[Pointing | None, list[str]]:
    """PI for a recording: find the kernel parameters that point into its placeholders and check once, on
    this call's inputs, that the graph reading them in place computes what it computes on copies. Returns
    the pointing (None: every input stays copied) and why inputs stay copied."""
    r = recording
    if r.graph is None:
        return None, ["PI: no CUDA graph to patch"]
    # An input the partition returns (saved for backward, or a view of it): read in place, the replay
    # returns the input itself where it would return the placeholder. Not an expanded one (its
    # placeholder holds one element along the expanded dims).
    placeholders = [None] * len(r.ptrs)
    for i, p in zip(r.copied, r.placeholders):
        placeholders[i] = p
    returning = passed_through(r.outputs, placeholders, r.copied)
    # An output in a placeholder's memory that is not such a view (another dtype, beyond the input's
    # span) can only be what the graph computes there: that input stays copied
    storage = {p.untyped_storage().data_ptr(): i for i, p in zip(r.copied, r.placeholders)}
    rebuilt = {j for j, _, _ in returning}
    other = {storage[o.untyped_storage().data_ptr()] for j, o in enumerate(r.outputs or ())
             if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in storage and j not in rebuilt}
    expanded = {i for _, i, _ in returning if i in r.expanded}
    reasons = [f"PI: input {i}: returned as an output (saved for backward) and expanded, so copied"
               for i in sorted(expanded - other)]
    reasons += [f"PI: input {i}: returned as an output in another dtype or shape, so copied" for i in sorted(other)]
    returning = [(j, i, view) for j, i, view in returning if i not in other]
    written = {i for i, _ in r.written}
    reasons += [f"PI: input {i}: written by the partition, so copied in and back" for i in sorted(written)]
    ranges = {i: (p.data_ptr(), p.untyped_storage().nbytes()) for i, p in zip(r.copied, r.placeholders)
              if i not in written and i not in expanded and i not in other}
    if not ranges:
        return None, reasons
    try:
        indirection = Indirection(r.graph.raw_cuda_graph(), r.graph.raw_cuda_graph_exec(), ranges)
    except Exception as e:  # an unexpected node or driver answer: copies, as stock does
        return None, reasons + [f"PI: could not read the graph's kernel parameters ({type(e).__name__}: {e})"]
    # a returned input that no node reads needs no pointing: the replay returns it, and nothing copies it
    free = frozenset(i for _, i, _ in returning if i in ranges and i not in indirection.inputs
                     and i not in indirection.untouchable)
    reasons += [f"PI: input {i}: {why}" for i, why in indirection.reasons.items() if i not in free]
    if not indirection.inputs and not free:
        return None, reasons
    passed = [(j, i, view) for j, i, view in returning if i in indirection.inputs or i in free]
    snapshot = Snapshot(may_write(args, r.writable))
    try:
        pointing, why = _check(r, args, Pointing(r, indirection, passed, free), snapshot)
        return pointing, reasons + why
    finally:
        snapshot.restore()


def _check(r: Recording, args: list, pointing: Pointing, snapshot: Snapshot) -> tuple[Pointing | None, list[str]]:
    """Every replay starts from the inputs and placeholders as this call has them."""
    # Outputs that are served inputs passed through are not compared: a replay reading those inputs in
    # place returns the inputs themselves (their placeholders hold the check's poison then)
    through = {placeholder_storage(r, i) for _, i, _ in pointing.passed}
    compared = [t for t in r.tensors if t.untyped_storage().data_ptr() not in through]
    r.copy_inputs(args)
    r.replay_graph()
    reference = [t.clone() for t in compared]
    snapshot.restore()
    # A graph may differ from itself from replay to replay (atomic adds in backward kernels sum in
    # any order): a second replay on the same copies measures by how much.
    r.copy_inputs(args)
    r.replay_graph()
    jitter = [difference(t, ref) for t, ref in zip(compared, reference)]
    snapshot.restore()
    for i, fill in zip(r.copied, r.fills):  # a node still reading a placeholder would show
        if i in pointing.inputs:
            fill.fill_(poison(fill.dtype))
    # The replay path itself: served inputs read in place, the rest copied. A served input less
    # aligned than its placeholder (a view at an offset) would be copied: the check reads a copy of
    # it from fresh memory instead, so that every served input is read in place once.
    check_args = list(args)
    for i, p, align in zip(r.copied, r.placeholders, pointing.alignments):
        if i in pointing.inputs and args[i].data_ptr() % align:
            dims = r.expanded.get(i, ())
            check_args[i] = placeholder(p)
            narrow(check_args[i], dims).copy_(narrow(args[i], dims))
    pointing.point(check_args)
    r.replay_graph()
    off = [difference(t, ref) for t, ref in zip(compared, reference)]
    # (an output that differs between the two replays other than in floating-point values, j = inf,
    # vouches for nothing: it must then come out bitwise equal)
    bad = [(o, j) for o, j in zip(off, jitter) if o > JITTER_FACTOR * j or (o and math.isinf(j))]
    if bad:
        pointing.to_placeholders()
        o, j = max(bad)
        return None, [f"PI: the graph reading inputs in place disagreed with the graph on copies (an "
                      f"output off by {o:.3g}; two replays on copies differ by {j:.3g})"]
    if any(c is not a for c, a in zip(check_args, args)):
        pointing.point(args)  # off the check's copies, which are freed now, onto this call's inputs
    return pointing, []
