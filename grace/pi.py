"""PI: parameter indirection. A replay reads the caller's input where it lies instead of a copy of it.

Stock CUDA graphs bake each kernel's arguments into the graph, so a non-static input is copied into a
placeholder before every replay. PI captures as stock does (with placeholders), then finds, in every
kernel node of the captured graph, the parameter words that point into a placeholder: Triton kernels
take pointers as plain 8-byte parameters, cuBLAS and cuDNN kernels carry them inside a struct
parameter, and a kernel launched with one packed parameter buffer (cuLaunchKernel's `extra`) has them
in that buffer, which is read and patched the same way. Kernels that load through the Tensor Memory
Accelerator (cuBLAS's Hopper GEMMs) take a TMA descriptor instead, 128 opaque bytes that hold the
address in a field of their own: where that field lies is learned once per process from the driver
(TensorMapCodec), and a descriptor whose address points into a placeholder is a site too, patched by
rewriting that field. Before a replay, each such word is rewritten to the live input's address (plus the same
offset) and the node's parameters are set on the executable graph (cuGraphExecKernelNodeSetParams):
one driver call per node that reads a moved input, none when the input has not moved, and no copy.

Why host-side patching rather than the paper's indirect loads in Triton: it covers library kernels
(cuBLAS, cuDNN) as well as Triton's, needs no fork of Triton, and DESIGN.md measured one node update at
about 1.5 us on the H200 with cached parameter buffers, the fast path taken here (parameter buffers
and pointer arrays built once per recording; a replay writes 8 bytes per site and makes one call per
node).

Where PI cannot vouch for a placeholder it keeps copying it: a memcpy or memset node touches it (their
parameters are not patched here), or no kernel parameter was found to point into it. Each recording is
checked once: the graph replayed on the live inputs, its placeholders overwritten, must give the outputs
of the graph replayed on copies, bitwise, or within JITTER_FACTOR (grace.runtime) times the difference
between two replays on the same copies where the graph is not deterministic (atomic adds in training's
backward kernels); otherwise PI is off for that recording, with the reason.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from typing import Callable

from grace import cuda_driver

log = logging.getLogger("grace")

WORD = 8  # bytes of a device pointer
TENSOR_MAP = 128  # bytes of a TMA descriptor (CUtensorMap), 64-byte aligned among a kernel's parameters
ADDRESS_MASK = ((1 << 48) - 1) & ~0xF  # the bits of a 16-byte aligned device address


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
