"""PI: the check of each recording, and finding and rewriting the parameter words that point into placeholders."""

import ctypes
import math

import pytest
import torch

from grace import pi
from tests.grace.fakes import _repointable_part, _returns_its_input_bits, _returns_its_inputs


@pytest.mark.parametrize("noise, repoints, served", [(0.0, True, True),    # deterministic
                                                     (1e-3, True, True),   # differs from itself a little
                                                     (1e-3, False, False)])  # a reader still on the placeholder
def test_pi_check_allows_a_graphs_own_noise_and_catches_a_reader_left_on_the_placeholder(
        cpu_graphs, monkeypatch, noise, repoints, served):
    part, stats, live = _repointable_part(monkeypatch, noise, repoints)
    w = torch.full((4,), 2.0)
    for _ in range(4):
        x = live(torch.randn(4) * 100)
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1, rtol=0, atol=1e-2)
        del y
    assert stats.status == "captured" and stats.pi_inputs == (1 if served else 0), stats.pi_reasons
    assert stats.copy_bytes_per_replay == (0 if served else 16)
    if not served:
        assert stats.pi_reasons[-1].startswith("PI: the graph reading inputs in place disagreed with the graph on copies")


def test_pi_serves_inputs_the_partition_returns_and_the_replay_returns_the_inputs_themselves(cpu_graphs,
                                                                                               monkeypatch):
    """A training forward returns the inputs it saves for backward (DR-T's batch): PI
    reads them in place, one its kernel reads (x) and one that no kernel reads (z, returned as a view),
    and the replay hands back the caller's tensors, not their placeholders. A call whose input is less
    aligned than its placeholder copies it, and gets the placeholder back."""
    part, stats, live = _repointable_part(monkeypatch, fn=_returns_its_inputs)
    w = torch.full((4,), 2.0)
    for _ in range(4):
        x, z = live(torch.randn(4)), torch.randn(3)
        y, saved, rest = part([x, w, z])
        torch.testing.assert_close(y, x * w + 1)
        assert saved is x and rest._base is z and torch.equal(rest, z[1:])
        del y, saved, rest
    assert stats.pi_inputs == 2 and stats.copy_bytes_per_replay == 0, stats.pi_reasons
    (recording,) = part.recordings[()]
    x = live(torch.randn(8)[4:])
    assert pi.alignment(x.data_ptr()) < pi.alignment(recording.placeholders[0].data_ptr())
    y, saved, rest = part([x, w, torch.randn(3)])
    torch.testing.assert_close(y, x * w + 1)
    assert saved is recording.outputs[1] and torch.equal(saved, x)


def test_an_input_returned_in_another_dtype_stays_copied(cpu_graphs, monkeypatch):
    """Only the graph's copy can be what such an output holds: PI leaves the input to the copy."""
    part, stats, live = _repointable_part(monkeypatch, fn=_returns_its_input_bits)
    w = torch.full((4,), 2.0)
    for _ in range(4):
        x = live(torch.randn(4))
        y, bits = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        assert torch.equal(bits, x.view(torch.int32))
        del y, bits
    assert stats.pi_inputs == 0 and stats.copy_bytes_per_replay == 16
    assert stats.pi_reasons == ["PI: input 0: returned as an output in another dtype or shape, so copied"]


def test_pi_copies_an_input_less_aligned_than_its_placeholder(cpu_graphs, monkeypatch):
    """Library kernels are picked for the operands' alignment at capture (cuBLASLt is told up to 256
    bytes): an input less aligned than its placeholder was is copied for that call, not read in place."""
    part, stats, live = _repointable_part(monkeypatch)
    w = torch.full((4,), 2.0)
    for _ in range(3):
        (y,) = part([live(torch.randn(4)), w])
        del y
    (recording,) = part.recordings[()]
    placeholder = recording.placeholders[0]
    x = live(torch.randn(8)[4:])  # 16 bytes past an allocation's start: enough for Inductor, not for all
    assert pi.alignment(x.data_ptr()) == 16 < pi.alignment(placeholder.data_ptr())
    (y,) = part([x, w])
    torch.testing.assert_close(y, x * w + 1)
    assert recording.pi.indirection.graph.reads[0] is placeholder  # the copy was read
    del y
    x = live(torch.randn(4))
    (y,) = part([x, w])
    assert recording.pi.indirection.graph.reads[0] is x and stats.pi_inputs == 1
    assert pi.alignment(0x1000) == pi.LIBRARY_ALIGNMENT and pi.alignment(0x1010) == 16


def test_difference_is_zero_only_for_bitwise_equal_and_infinite_for_other_structure():
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert pi.difference(a, a.clone()) == 0.0
    assert pi.difference(a + torch.tensor([0.0, 0.0, 0.5]), a) == 0.5
    assert pi.difference(torch.tensor([1.0, 2.0, 3.0]), a) == math.inf  # a NaN where there was none
    assert pi.difference(torch.tensor([1, 2]), torch.tensor([1, 3])) == math.inf
    assert pi.difference(torch.zeros(2), torch.zeros(3)) == math.inf




def _words(*values: int) -> bytes:
    return b"".join(v.to_bytes(8, "little") for v in values)


def test_pi_finds_pointers_in_plain_and_struct_parameters():
    ranges = {0: (0x1000, 64), 1: (0x2000, 128)}
    params = [_words(0x1010),                        # a Triton pointer argument, 16 bytes into input 0
              (7).to_bytes(4, "little"),             # an int32
              _words(42, 0x2000, 0x2000 + 128),      # a cuBLAS-style struct: a pointer, and one just past
              _words(0x1000 - 8)]                    # just before input 0: not a site
    assert pi.find_sites(params, ranges) == [pi.Site(0, 0, 0, 16), pi.Site(2, 8, 1, 0)]


class FakeParams:
    kernelParams = 0
    extra = 0


def test_pi_points_only_nodes_that_read_a_moved_input_and_never_a_memcpy_input(monkeypatch):
    ranges = {0: (0x1000, 64), 1: (0x2000, 64)}
    kernels = {"k0": [_words(0x1000), _words(0x2000)], "k1": [_words(0x1008)], "k2": [(1).to_bytes(4, "little")]}
    graph = [("k0", "kernel"), ("k1", "kernel"), ("k2", "kernel"), ("m", "memcpy")]
    updates = []

    def set_kernel_params(exec_, node, params):  # read back what the graph would now get
        array = (ctypes.c_void_p * 2).from_address(params.kernelParams)
        updates.append((node, ctypes.c_uint64.from_address(array[0]).value))

    monkeypatch.setattr(pi.cuda_driver, "nodes", lambda raw: graph)
    monkeypatch.setattr(pi.cuda_driver, "kernel_params", lambda node: (FakeParams(), kernels[node]))
    monkeypatch.setattr(pi.cuda_driver, "copy_addresses", lambda node, kind: [0x2010, 0x9000])
    monkeypatch.setattr(pi.cuda_driver, "set_kernel_params", set_kernel_params)
    monkeypatch.setattr(pi.cuda_driver, "exec_handle", lambda raw: raw)
    ind = pi.Indirection(raw_graph=1, raw_exec=2, ranges=ranges)
    assert ind.inputs == {0} and ind.reasons == {1: "a memcpy or memset node reads it"}
    assert [n.node for n in ind.nodes] == ["k0", "k1"]
    assert ind.point({0: 0x1000}) == 0  # not moved: no driver call
    assert ind.point({0: 0x5000}) == 2 and updates == [("k0", 0x5000), ("k1", 0x5008)]
    assert ind.point({0: 0x5000}) == 0 and len(updates) == 2


def _descriptor(address: int, shift: int = 16) -> int:
    """A stand-in TMA descriptor: other fields around the address, which sits at bit 4 + shift - 4."""
    return (0xABC << 900) | ((address >> 4) << (shift + 4)) | 0x5


def test_the_tensor_map_codec_is_learned_from_how_the_descriptor_moves():
    address = 0x7F00_1234_5600
    codec = pi.learn_codec(_descriptor, address)
    assert codec == pi.TensorMapCodec(16)
    bits = _descriptor(address)
    assert codec.decode(bits) == address
    assert codec.encode(bits, 0x7F00_0000_0010) == _descriptor(0x7F00_0000_0010)  # other fields kept
    assert pi.learn_codec(lambda a: a >> 4, address) == pi.TensorMapCodec(-4)
    assert pi.learn_codec(lambda a: a | a << 200, address) is None  # kept twice: not one field
    assert pi.learn_codec(lambda a: 7, address) is None  # does not follow the address


def test_pi_patches_a_tma_descriptor_inside_a_struct_parameter(monkeypatch):
    base = 0x7F00_0000_1000
    ranges = {0: (base, 4096)}
    struct = _words(3, 5) + bytes(48) + _descriptor(base + 256).to_bytes(128, "little") + _words(9)
    kernels = {"gemm": [struct], "elementwise": [_words(base)]}
    updates = {}

    def set_kernel_params(exec_, node, params):
        array = (ctypes.c_void_p * 1).from_address(params.kernelParams)
        updates[node] = ctypes.string_at(array[0], len(kernels[node][0]))

    monkeypatch.setattr(pi, "tensor_map_codec", lambda address: pi.TensorMapCodec(16))
    monkeypatch.setattr(pi.cuda_driver, "nodes", lambda raw: [(k, "kernel") for k in kernels])
    monkeypatch.setattr(pi.cuda_driver, "kernel_params", lambda node: (FakeParams(), kernels[node]))
    monkeypatch.setattr(pi.cuda_driver, "set_kernel_params", set_kernel_params)
    monkeypatch.setattr(pi.cuda_driver, "exec_handle", lambda raw: raw)
    ind = pi.Indirection(raw_graph=1, raw_exec=2, ranges=ranges)
    assert ind.inputs == {0}
    assert [s for n in ind.nodes for s in n.sites] == [pi.Site(0, 64, 0, 256, tensor_map=True), pi.Site(0, 0, 0, 0)]
    assert ind.point({0: 0x7F00_0020_0000}) == 2
    assert updates["gemm"] == _words(3, 5) + bytes(48) + _descriptor(0x7F00_0020_0100).to_bytes(128, "little") + _words(9)
    assert updates["elementwise"] == _words(0x7F00_0020_0000)


def test_a_kernel_launched_with_one_packed_buffer_is_read_and_repointed():
    """cuLaunchKernel's `extra`: {BUFFER_POINTER, buffer, BUFFER_SIZE, &size, END}."""
    from grace import cuda_driver

    packed = ctypes.create_string_buffer(_words(7, 0x2000), 16)
    size = ctypes.c_size_t(16)
    launched = (ctypes.c_void_p * 5)(1, ctypes.addressof(packed), 2, ctypes.addressof(size), 0)
    assert cuda_driver.extra_buffer(ctypes.addressof(launched)) == _words(7, 0x2000)

    class Packed:
        kernelParams = 0
        extra = ctypes.addressof(launched)

    params = Packed()
    mine = ctypes.create_string_buffer(_words(7, 0x5000), 16)
    keep = cuda_driver.point_params(params, [mine])
    assert params.kernelParams == 0 and params.extra != ctypes.addressof(launched) and keep
    assert cuda_driver.extra_buffer(params.extra) == _words(7, 0x5000)
