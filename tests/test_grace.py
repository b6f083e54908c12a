"""The grace backend on the CPU: registration, options, fallback with reasons, explain, and CGCT's
passes on FX graphs (the GPU side is in test_grace_cuda.py)."""

import dataclasses
import gc
import math
import operator
import subprocess
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import fx

import grace
from grace import cgct, runtime
from grace.torch_adapter import Partition, fake_propagate
from tests.conftest import REPO


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_backend_by_name_matches_eager_in_inference_and_training():
    model, x = _mlp(), torch.randn(3, 8)
    twin = _mlp()
    compiled = torch.compile(model, backend="grace")
    torch.testing.assert_close(compiled(x), twin(x), rtol=1e-5, atol=1e-6)
    compiled(x).square().sum().backward()
    twin(x).square().sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert p.grad is not None and p.grad.abs().sum() > 0
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend, donated", [("inductor", True), ("grace", False)])
def test_backward_graphs_compiled_by_grace_do_not_write_over_saved_activations(monkeypatch, backend, donated):
    """Inductor may reuse a saved activation's memory inside the backward graph (a donated buffer), so that
    a second run on the same inputs is wrong; GraCE runs partitions more than once per call (PI's check,
    SCG's timings), so it compiles without donated buffers. Stock Inductor donates here: the test can fail."""
    import torch._inductor.graph as inductor_graph

    seen = []
    get = inductor_graph.get_donated_idxs
    monkeypatch.setattr(inductor_graph, "get_donated_idxs", lambda: seen.append(get()) or seen[-1])
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    no_caches = torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False)
    with no_caches[0], no_caches[1]:
        torch.compile(model, backend=backend)(torch.randn(3, 8)).square().sum().backward()
    assert any(seen) == donated, seen


def test_backend_found_through_entry_point_without_import():
    code = ("import sys, torch; m = torch.nn.Linear(2, 2); "
            "torch.compile(m, backend='grace')(torch.randn(1, 2)); print('grace' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO / "tests")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("True")


def test_a_graph_with_nothing_to_compile_runs_as_is():
    """Inductor hands back a plain function for a graph of views alone (as in Mask R-CNN): no crash."""
    torch.compiler.reset()
    start = len(grace.REPORTS)
    x = torch.randn(4, 2)
    out = torch.compile(lambda t: t.detach(), backend="grace")(x)
    assert torch.equal(out, x)
    assert grace.REPORTS[start].notes == ["forward: nothing for Inductor to compile; runs as is"]


def test_unknown_option_is_one_clear_error():
    with pytest.raises(Exception, match=r"unknown grace option\(s\) \['pii'\]"):
        torch.compile(_mlp(), backend="grace", options={"pii": True})(torch.randn(1, 8))


def test_explain_on_cpu_says_why_nothing_is_captured():
    e = grace.explain(_mlp(), torch.randn(2, 8))
    s = e.summary()
    assert s["graphs"] == 1 and s["partitions"] == 0 and s["replays_per_call"] == 0
    assert s["notes"] == ["forward: no CUDA-graph partition (devices: cpu); runs as compiled"]
    assert "no GPU tensor" in s["cgct"][0]
    assert "graph" in str(e)


def test_explain_says_why_calls_of_captured_partitions_ran_without_their_graphs():
    from grace.backend import GraphReport, Options
    from grace.explain import Explanation

    held = runtime.Stats(0, False, 0, status="captured", reason="outputs of the previous replays were still held",
                         recorded_for={"first at these sizes": 1, "twin": 1}, kept=2)
    warm = runtime.Stats(0, False, 1, status="captured", recorded_for={"first at these sizes": 1}, kept=1)
    replayed = runtime.Stats(0, True, 2, status="captured", reason="an old reason")
    new_sizes = runtime.Stats(0, True, 3)  # called once at each of its sizes: still warming up, no reason kept
    e = Explanation([GraphReport(0, Options(), partitions=[held, warm, replayed, new_sizes])],
                    replays_last_call={(0, True, 2): 1},
                    eager_last_call={(0, False, 0): 2, (0, False, 1): 1, (0, True, 3): 1})
    s = e.summary()
    assert s["not_captured"] == ["warm-up: not yet called twice at the same sizes"]  # was [""]
    assert s["calls_without_graph"] == 4 and s["replays_per_call"] == 1
    assert s["without_graph"] == ["a first call at new sizes, or SCG's choice at these sizes",
                                  "outputs of the previous replays were still held"]
    assert s["recorded_for"] == {"first at these sizes": 2, "twin": 1} and s["recordings_kept"] == 3


# --- the runtime's decisions, with a CPU stand-in for CUDA graph capture ----------------------------

def _partition_fn(calls):
    """A partition in Inductor's boxed convention: y = x * w + 1, and w += 1 when asked to mutate."""

    def fn(args):
        calls.append(len(args))
        x, w = args
        args.clear()
        return (x * w + 1,)

    return fn


def _unowned(t):
    """`t`'s memory seen by address, without keeping it alive (as a CUDA graph reads its inputs)."""
    storage = t.untyped_storage()
    memory = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    return torch.empty(0, dtype=t.dtype).set_(memory, t.storage_offset(), t.size(), t.stride())


def fake_capture(fn, graph_args):
    """Like a CUDA graph: capturing has no effect (here fn runs on copies, the RNG state put back);
    each replay runs on the memory of the arguments it was recorded with (by address: it keeps no
    tensor alive) and writes the same output tensors."""
    recorded = [_unowned(a) if isinstance(a, torch.Tensor) else a for a in graph_args]
    rng = torch.get_rng_state()
    outputs = fn([a.clone() if isinstance(a, torch.Tensor) else a for a in graph_args])
    torch.set_rng_state(rng)

    def replay():
        for out, fresh in zip(outputs, fn(list(recorded))):
            if isinstance(out, torch.Tensor):
                out.copy_(fresh)

    return runtime.Captured(replay, outputs, {"kernel": 1}, None)


@pytest.fixture
def cpu_graphs(monkeypatch):
    monkeypatch.setattr(runtime, "capture", fake_capture)
    monkeypatch.setattr(runtime, "DEVICE_TYPE", "cpu")
    monkeypatch.setattr(runtime, "LIBRARY_ALIGNMENT", 64)  # what every CPU allocation has


def _part(fn, static=(), mutated=()):
    stats = runtime.Stats(graph=0, backward=False, partition=0)
    return runtime.PartitionGraph(fn, Partition(0, frozenset(static), frozenset(mutated)), stats), stats


def _each_somewhere_new(tensors):
    """Each tensor in turn, every one at an address of its own, the one before freed by then (as
    activations that code outside graphs makes anew each call)."""
    tensors = list(tensors)
    for i in range(len(tensors)):
        t, tensors[i] = tensors[i], None
        yield t


def test_runtime_records_then_replays_copying_only_non_static_inputs(cpu_graphs):
    calls = []
    part, stats = _part(_partition_fn(calls), static={1})
    w = torch.full((4,), 2.0)
    for i in range(5):
        x = torch.randn(4)  # a new tensor each call: copied into the placeholder
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert stats.status == "captured" and stats.recordings == 1 and stats.replays == 4 and stats.eager_calls == 0
    assert (stats.in_place_inputs, stats.copied_inputs, stats.copy_bytes_per_replay) == (1, 1, 16)


def test_runtime_copies_an_expanded_input_into_an_expanded_placeholder(cpu_graphs):
    """Training graphs take expanded inputs (stride 0: the gradient of a sum, say); the copy fills the
    one element along the expanded dims, as graph trees do. An input that is no longer expanded at the
    same dims runs that call without the graph."""
    part, stats = _part(_partition_fn([]), static={1})
    w = torch.full((4, 3), 2.0)
    for i in range(4):
        x = torch.randn(1, 3).expand(4, 3)
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert stats.status == "captured" and stats.replays == 3 and stats.copy_bytes_per_replay == 3 * 4
    x = torch.randn(4, 3)  # the same shape, every element its own
    (y,) = part([x, w])
    torch.testing.assert_close(y, x * w + 1)
    assert stats.eager_calls == 1 and stats.reason == "an input expanded when recorded is not expanded now"


def test_a_strided_view_gets_a_placeholder_and_an_overlapping_one_does_not(cpu_graphs):
    """torch cannot tell whether a view that is not dense (a slice) overlaps itself; the runtime works it
    out from the strides, so a slice is copied into a placeholder of its layout, while a view whose
    windows overlap runs without a graph."""
    from grace.torch_adapter import has_internal_overlap
    base = torch.randn(8, 6)
    assert not has_internal_overlap(base[:, :-1]) and not has_internal_overlap(base.t()[1:, ::2])
    assert has_internal_overlap(torch.randn(1, 3).expand(4, 3))
    assert has_internal_overlap(torch.randn(10).as_strided((4, 3), (2, 1)))  # windows 0-2, 2-4, ...
    part, stats = _part(_partition_fn([]), static={1})
    w = torch.full((4, 3), 2.0)
    for i in range(4):
        x = torch.randn(4, 5)[:, 1:4]
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert stats.status == "captured" and stats.replays == 3 and stats.copy_bytes_per_replay == 4 * 3 * 4
    part, stats = _part(_partition_fn([]), static={1})
    for i in range(3):
        x = torch.randn(10).as_strided((4, 3), (2, 1))
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert stats.replays == 0 and "overlapping" in stats.reason


class _Repointable:
    """A CUDA-graph stand-in that PI can re-point: each replay runs the partition on what `reads` holds
    (the placeholders, as recorded), adding `noise` to the outputs as atomic adds would."""

    def __init__(self, fn, graph_args, noise):
        self.fn, self.reads, self.noise = fn, list(graph_args), noise
        self.outputs = fn([a.clone() for a in graph_args])
        self.order = torch.Generator().manual_seed(0)  # not the RNG state that SCG and PI put back

    def replay(self):
        for out, fresh in zip(self.outputs, self.fn(list(self.reads))):
            out.copy_(fresh + self.noise * torch.randn(fresh.shape, generator=self.order))

    def raw_cuda_graph(self):
        return 0

    raw_cuda_graph_exec = raw_cuda_graph


def _repointable_part(monkeypatch, noise=0.0, repoints=True):
    """A partition (y = x * w + 1, w static) with PI on, captured in _Repointable stand-ins whose PI
    serves x: point() makes the stand-in read the live tensor at that address (unless `repoints` is
    off: a reader left on its placeholder). Returns the partition, its stats and live(x), which
    registers a caller's tensor by address."""
    graphs, live = [], {}

    def capture(fn, graph_args):
        graph = _Repointable(fn, graph_args, noise)
        graphs.append(graph)
        return runtime.Captured(graph.replay, graph.outputs, {"kernel": 1}, graph)

    class Indirection:
        def __init__(self, raw_graph, raw_exec, ranges):
            self.graph, self.inputs, self.reasons, self.nodes = graphs[-1], {0}, {}, ["node"]
            self.placeholder = self.graph.reads[0]

        def point(self, ptrs):
            if repoints:
                self.graph.reads[0] = live.get(ptrs[0], self.placeholder)

    monkeypatch.setattr(runtime, "capture", capture)
    monkeypatch.setattr(runtime.pi, "Indirection", Indirection)
    part, stats = _part(_partition_fn([]), static={1})
    part.indirect = True
    return part, stats, lambda x: live.setdefault(x.data_ptr(), x)


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
    assert runtime._alignment(x.data_ptr()) == 16 < runtime._alignment(placeholder.data_ptr())
    (y,) = part([x, w])
    torch.testing.assert_close(y, x * w + 1)
    assert recording.indirection.graph.reads[0] is placeholder  # the copy was read
    del y
    x = live(torch.randn(4))
    (y,) = part([x, w])
    assert recording.indirection.graph.reads[0] is x and stats.pi_inputs == 1
    assert runtime._alignment(0x1000) == runtime.LIBRARY_ALIGNMENT and runtime._alignment(0x1010) == 16


@pytest.mark.parametrize("fastest", ["graph", "graph_pi", "eager"])
def test_scg_chooses_among_no_graph_copies_and_pi(cpu_graphs, monkeypatch, fastest):
    monkeypatch.setattr(runtime, "timer", lambda name, run: (run(), 1.0 if name == fastest else 2.0)[1])
    alive = weakref.WeakSet()  # every recording made, while something holds it (its graph, its memory)

    class Tracked(runtime._Recording):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            alive.add(self)

    monkeypatch.setattr(runtime, "_Recording", Tracked)
    part, stats, live = _repointable_part(monkeypatch)
    part.selective = True
    w = torch.full((4,), 2.0)
    for _ in range(5):
        x = live(torch.randn(4))
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert stats.scg["choice"] == fastest and set(stats.scg["measured_us"]) == {"graph", "graph_pi", "eager"}
    assert (stats.pi_inputs, stats.copy_bytes_per_replay) == ((1, 0) if fastest == "graph_pi" else (0, 16))
    assert stats.status == ("declined" if fastest == "eager" else "captured")
    assert stats.replays == (0 if fastest == "eager" else 4)
    gc.collect()
    assert len(alive) == len(part.recordings[()]) == (0 if fastest == "eager" else 1)  # declined: freed
    if fastest == "graph":
        assert stats.pi_reasons == ["SCG: faster copying the inputs than re-pointing the graph"]


def test_difference_is_zero_only_for_bitwise_equal_and_infinite_for_other_structure():
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert runtime._difference(a, a.clone()) == 0.0
    assert runtime._difference(a + torch.tensor([0.0, 0.0, 0.5]), a) == 0.5
    assert runtime._difference(torch.tensor([1.0, 2.0, 3.0]), a) == math.inf  # a NaN where there was none
    assert runtime._difference(torch.tensor([1, 2]), torch.tensor([1, 3])) == math.inf
    assert runtime._difference(torch.zeros(2), torch.zeros(3)) == math.inf


def test_runtime_records_again_when_a_static_input_moves(cpu_graphs):
    part, stats = _part(_partition_fn([]), static={1})
    x = torch.randn(4)
    for w in (torch.ones(4), torch.ones(4), torch.full((4,), 3.0), torch.full((4,), 3.0)):
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert stats.recordings >= 2 and stats.status == "captured"


def test_a_static_input_that_keeps_moving_is_copied_instead_of_recorded_again(cpu_graphs):
    """In a backward graph every input but the gradients counts as static, including activations that
    code outside graphs makes anew each call: after MOVES_BEFORE_COPY moves such an input gets a placeholder."""
    part, stats = _part(_partition_fn([]), static={1})
    x = torch.randn(4)
    for i, w in enumerate(_each_somewhere_new(torch.full((4,), float(i)) for i in range(12))):
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert stats.status == "captured" and stats.moving_inputs == 1
    assert stats.recordings == 1 + runtime.MOVES_BEFORE_COPY and stats.replays == 11
    assert len(part.recordings[()]) == 1  # those that read it in place are let go


def test_layers_that_share_a_graph_get_a_recording_each(cpu_graphs, monkeypatch):
    """With weights as graph inputs, the layers of a stack call one Dynamo graph (BlenderbotSmall's 8
    encoder layers): each layer's weights are other live tensors, not a move; every layer gets its
    recording, as stock graph trees record each call site, and nothing is copied but the activation."""
    part, stats = _part(_partition_fn([]), static={1})
    weights = [torch.full((4,), float(i)) for i in range(8)]
    checks, data_ptrs_equal = [], runtime.adapter.data_ptrs_equal  # the replay path's C++ address checks:
    monkeypatch.setattr(runtime.adapter, "data_ptrs_equal", lambda *a: checks.append(1) or data_ptrs_equal(*a))
    for step in range(3):
        x = torch.randn(4)
        for w in weights:
            (x,) = part([x, w])
    assert len(checks) == 15  # one per replay after the first step (whose layer 1 records), not one per layer
    assert (stats.recordings, stats.replays, stats.eager_calls, stats.moving_inputs) == (8, 23, 0, 0)
    assert stats.recorded_for == {"first at these sizes": 1, "new call site": 7} and stats.kept == 8
    assert stats.copy_bytes_per_replay == 16 and part.rerecords == 0
    expected = torch.randn(4)
    y = expected.clone()
    for w in weights:
        (y,) = part([y, w])
        expected = expected * w + 1
    torch.testing.assert_close(y, expected)


def test_another_view_of_the_memory_recorded_is_a_move(cpu_graphs):
    """A slice of one buffer at a new offset each call (a cache written position by position) moves,
    though the buffer lives on: after MOVES_BEFORE_COPY moves it is copied."""
    part, stats = _part(_partition_fn([]), static={1})
    buffer, x = torch.arange(48.0), torch.randn(4)
    for i in range(12):
        w = buffer[4 * i:4 * i + 4]
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert stats.moving_inputs == 1 and stats.recordings == 1 + runtime.MOVES_BEFORE_COPY


def test_runtime_replays_a_twin_while_outputs_are_held_and_never_overwrites_them(cpu_graphs):
    part, stats = _part(_partition_fn([]), static={1})
    w = torch.ones(4)
    part([torch.randn(4), w])  # warm-up
    xs = [torch.randn(4) for _ in range(4)]
    (y1,) = part([xs[0], w])  # recorded: y1 is the graph's output buffer
    (y2,) = part([xs[1], w])  # y1 held: a twin is recorded, with its own output buffer
    (y3,) = part([xs[2], w])  # both held: runs without a graph
    assert stats.recordings == 2 and stats.replays == 2 and stats.eager_calls == 1
    assert "still held by the caller (output 0: float32 [4])" in stats.reason
    assert stats.recorded_for == {"first at these sizes": 1, "twin": 1}
    del y1, y3
    (y4,) = part([xs[3], w])  # the first recording's output is free again: replayed over
    assert stats.replays == 3 and stats.recordings == 2 and stats.status == "captured"
    torch.testing.assert_close(y2, xs[1] * w + 1)
    torch.testing.assert_close(y4, xs[3] * w + 1)


def test_a_loop_that_holds_the_previous_output_replays_every_call(cpu_graphs):
    part, stats = _part(_partition_fn([]), static={1})
    w, y = torch.ones(4), None
    for _ in range(10):
        x = torch.randn(4)
        (y,) = part([x, w])  # y of the previous call is alive during this one
        torch.testing.assert_close(y, x * w + 1)
    assert stats.replays == 9 and stats.recordings == 2 and stats.eager_calls == 0


@pytest.mark.parametrize("kind", ["static", "mutated"])
def test_in_place_inputs_that_alternate_keep_a_recording_each(cpu_graphs, kind):
    """Two buffers in turn: two call sites (static), or one input that moved once (a KV cache the
    partition writes, of two): either way a recording each, both replayed from then on."""
    part, stats = _part(_partition_fn([]), **{kind: {1}})
    x, caches = torch.randn(4), [torch.full((4,), 2.0), torch.full((4,), 3.0)]
    for i in range(8):
        (y,) = part([x, caches[i % 2]])
        torch.testing.assert_close(y, x * caches[i % 2] + 1)
        del y
    assert stats.recordings == 2 and stats.replays == 7 and stats.status == "captured"
    assert stats.recorded_for == {"first at these sizes": 1, "new call site" if kind == "static" else "moved input": 1}


def _add_one_then_scale(args):
    """A partition that writes its second input: w += 1, then x * w."""
    x, w = args
    args.clear()
    w.add_(1)
    return (x * w,)


@pytest.mark.parametrize("kept", [False, True])
def test_a_written_input_that_keeps_moving_is_copied_in_and_back(cpu_graphs, kept):
    """An input the partition writes is read in place, so it is recorded again where it moved; once it
    kept moving, it gets a placeholder instead, and each replay's writes are copied back into it. A new
    cache each call moves whether the old ones are freed or kept: no static input marks a new call site."""
    part, stats = _part(_add_one_then_scale, mutated={1})
    x = torch.randn(4)
    caches = (torch.full((4,), float(i)) for i in range(12))
    for i, w in enumerate(list(caches) if kept else _each_somewhere_new(caches)):
        (y,) = part([x, w])
        torch.testing.assert_close(w, torch.full((4,), i + 1.0))  # written, as eager would
        torch.testing.assert_close(y, x * (i + 1))
        del y
    assert stats.status == "captured" and stats.moving_inputs == 1
    assert stats.recordings == 1 + runtime.MOVES_BEFORE_COPY and stats.replays == 11
    assert stats.recorded_for == {"first at these sizes": 1, "moved input": runtime.MOVES_BEFORE_COPY}
    assert stats.kept == 1  # those that read it in place are let go


def test_an_upstream_graphs_output_that_keeps_moving_is_copied(cpu_graphs, monkeypatch):
    """Another graph's output is read in place; when it keeps moving (each recording upstream has its
    own outputs, and a chain of partitions multiplied the recordings) it is copied from then on."""
    monkeypatch.setattr(runtime, "_OUTPUTS", weakref.WeakValueDictionary())
    part, stats = _part(_partition_fn([]))
    w = torch.full((4,), 2.0)
    for x in _each_somewhere_new(torch.randn(4) for _ in range(12)):
        runtime._OUTPUTS[x.data_ptr()] = x  # as if a graph upstream had made it
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert stats.status == "captured" and stats.recordings == 1 + runtime.MOVES_BEFORE_COPY and stats.replays == 11


def _capture_on_the_arguments(fn, graph_args):
    """As a CUDA graph captures: fn runs on the very arguments (the partitions here are pure), so an output
    may be an argument or a view of one; the graph itself keeps no Python tensor, and each replay writes
    the outputs in its own memory again."""
    outputs = fn(list(graph_args))
    own = [o if all(o.untyped_storage().data_ptr() != a.untyped_storage().data_ptr() for a in graph_args) else None
           for o in outputs]
    recorded = [_unowned(a) for a in graph_args]

    def replay():
        for out, fresh in zip(own, fn(list(recorded))):
            if out is not None:
                out.copy_(fresh)

    return runtime.Captured(replay, outputs, {"kernel": 1}, None)


@pytest.mark.parametrize("view", [False, True])
def test_a_downstream_graph_that_returns_its_input_leaves_the_upstream_graph_replaying(cpu_graphs, monkeypatch, view):
    """A forward partition returning an activation it read (saved for backward), or a view of it: its
    recording kept that tensor, so the upstream partition's outputs looked held for ever and it ran
    without its graph on every call (DGPT2's forward on the H200). The output is now made from each
    call's own input."""
    monkeypatch.setattr(runtime, "capture", _capture_on_the_arguments)
    up, up_stats = _part(_partition_fn([]), static={1})

    def down_fn(args):
        (y,) = args
        args.clear()
        return (y.view(2, 2) if view else y, y * 2)

    down, down_stats = _part(down_fn)
    w = torch.full((4,), 2.0)
    for _ in range(8):
        x = torch.randn(4)
        (y,) = up([x, w])
        passed, z = down([y])
        assert (passed._base is y) if view else (passed is y)
        torch.testing.assert_close(z, (x * w + 1) * 2)
        torch.testing.assert_close(passed.reshape(4), x * w + 1)
        del y, passed, z
    assert (up_stats.recordings, up_stats.replays, up_stats.eager_calls) == (1, 7, 0), up_stats.reason
    assert (down_stats.recordings, down_stats.replays, down_stats.eager_calls) == (1, 7, 0)


def test_moves_at_different_sizes_do_not_add_up(cpu_graphs, monkeypatch):
    """Dynamic shapes: an upstream graph's output moves once per set of sizes (a twin at each): read in
    place at every size, never copied; one that keeps moving at one size is copied at all of them."""
    monkeypatch.setattr(runtime, "_OUTPUTS", weakref.WeakValueDictionary())
    part, stats = _part(_first_n_doubled)
    upstream = {n: [torch.randn(8), torch.randn(8)] for n in (2, 4, 6, 8)}  # two outputs per size
    for step in range(4):
        for n, outs in upstream.items():
            x = outs[step % 2]
            runtime._OUTPUTS[x.data_ptr()] = x
            (y,) = part([n, x])
            torch.testing.assert_close(y, x[:n] * 2)
            del y
    assert stats.moving_inputs == 0 and stats.copied_inputs == 0 and stats.recordings == 8
    for x in _each_somewhere_new(torch.randn(8) for _ in range(8)):  # at one size, somewhere new every call
        runtime._OUTPUTS[x.data_ptr()] = x
        (y,) = part([2, x])
        torch.testing.assert_close(y, x[:2] * 2)
        del y
    assert stats.moving_inputs == 1 and stats.copied_inputs == 1
    recordings = stats.recordings
    for x in _each_somewhere_new(torch.randn(8) for _ in range(3)):  # at another size, new places:
        runtime._OUTPUTS[x.data_ptr()] = x  # recorded once more, copying it, then replayed
        (y,) = part([4, x])
        torch.testing.assert_close(y, x[:4] * 2)
        del y
    assert stats.recordings == recordings + 1 and stats.copied_inputs == 1


def test_runtime_gives_up_when_recordings_keep_being_made(cpu_graphs, monkeypatch):
    monkeypatch.setattr(runtime, "MOVES_BEFORE_COPY", 10**6)  # in-place inputs never copied instead
    part, stats = _part(_add_one_then_scale, mutated={1})
    x = torch.randn(4)
    ws = (torch.full((4,), float(i)) for i in range(runtime.MAX_RERECORDS + 4))
    for i, w in enumerate(_each_somewhere_new(ws)):
        (y,) = part([x, w])  # it moves every call
        torch.testing.assert_close(y, x * (i + 1))
        del y
    assert stats.status == "eager" and f"more than {runtime.MAX_RERECORDS} recordings" in stats.reason
    assert "inputs [1], of which written by the partition: [1]" in stats.reason
    assert stats.recordings == runtime.MAX_RERECORDS + 1 and not part.recordings  # every graph let go


def _first_n_doubled(args):
    """A partition with dynamic shapes takes the sizes as ints too."""
    n, x = args
    args.clear()
    return (x[:n] * 2,)


def test_sizes_beyond_the_limit_run_without_a_graph_and_the_others_keep_theirs(cpu_graphs, monkeypatch):
    monkeypatch.setattr(runtime, "MAX_SIZES", 2)

    part, stats = _part(_first_n_doubled)
    x = torch.randn(8)
    for n in (2, 2, 4, 4, 6, 6, 2, 4, 6):
        (y,) = part([n, x])
        torch.testing.assert_close(y, x[:n] * 2)
        del y
    assert stats.recordings == 2 and stats.replays == 4 and stats.status == "captured"
    assert "more than 2 sets of sizes" in stats.reason


def test_reset_frees_every_recording_and_later_calls_record_again(cpu_graphs, monkeypatch):
    """grace.reset frees each partition's graphs even while its wrapper lives on (Inductor's module cache
    keeps it past Dynamo's reset), as a TP rank needs before NCCL's destroy; the wrapper still works."""
    class Graph:  # stands in for the CUDA graph a recording keeps
        pass

    graphs = []

    def capture(fn, graph_args):
        graphs.append(Graph())
        return dataclasses.replace(fake_capture(fn, graph_args), graph=graphs[-1])

    monkeypatch.setattr(runtime, "capture", capture)
    part, stats = _part(_partition_fn([]), static={1})
    w = torch.full((4,), 2.0)

    def call():
        x = torch.randn(4)
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)

    for _ in range(3):
        call()
    assert (stats.recordings, stats.kept, stats.replays) == (1, 1, 2)
    freed = weakref.ref(graphs[0])
    graphs.clear()
    grace.reset()
    assert freed() is None and part.recordings == {} and stats.kept == 0
    for _ in range(3):  # warms up again, records, replays
        call()
    assert (stats.recordings, stats.kept, stats.replays, stats.status) == (2, 1, 4, "captured")


def _runtime_compiler(made: list, backward: bool = False, static=lambda example_inputs: frozenset()):
    """An AOTAutograd compiler that runs the graph it is given as one partition through the runtime,
    its Stats appended to `made`; `static` picks the static inputs from the example inputs."""
    from functorch.compile import make_boxed_func

    def compile(gm, example_inputs):
        stats = runtime.Stats(graph=0, backward=backward, partition=0)
        made.append(stats)
        part = runtime.PartitionGraph(make_boxed_func(gm.forward), Partition(0, static(example_inputs), frozenset()),
                                      stats)
        part._boxed_call = True
        return part

    return compile


def _train_beside_eager(fw_compiler, bw_compiler, steps: int, set_to_none: bool = True):
    """`steps` SGD steps of an MLP compiled with these AOTAutograd compilers and of its eager twin, on the
    same inputs; parameters and gradients compared after each. Returns the compiled model's module."""
    from torch._dynamo.backends.common import aot_autograd

    torch.compiler.reset()  # static shapes: earlier tests compiled the same module type
    model, twin = _mlp(), _mlp()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler))
    opt, opt_twin = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))
    for _ in range(steps):
        x = torch.randn(3, 8)
        for m, o in ((compiled, opt), (twin, opt_twin)):
            o.zero_grad(set_to_none=set_to_none)
            m(x).square().mean().backward()
            o.step()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p, q)
            torch.testing.assert_close(p.grad, q.grad)
    return model


def test_runtime_keeps_replaying_a_training_forward_and_matches_eager(cpu_graphs):
    """AOTAutograd's forward returns tensors saved for backward, parameters among them; the runtime
    must not take the caller's own references to those for outputs still in use."""
    from functorch.compile import make_boxed_func

    def params(example_inputs):  # all but x
        return frozenset(i for i, t in enumerate(example_inputs) if isinstance(t, torch.Tensor) and tuple(t.shape) != (3, 8))

    forwards = []
    _train_beside_eager(_runtime_compiler(forwards, static=params), lambda gm, _: make_boxed_func(gm.forward), 5)
    (stats,) = forwards
    assert stats.status == "captured" and stats.recordings == 1 and stats.replays == 4 and stats.eager_calls == 0


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_backward_graphs_gradients_are_taken_by_autograd_not_cloned(cpu_graphs, set_to_none):
    """A parameter's first gradient is taken as it is (no copy) when nobody else holds it; a backward
    graph that kept hold of its outputs had every gradient cloned (on the H200: 1 ms of memcpy per
    XLNET-T step, and a launch per parameter). Gradients held across steps (zero_grad without
    set_to_none) accumulate as in eager, the graph recording a twin for the memory they keep."""
    backwards = []
    model = _train_beside_eager(_runtime_compiler([]), _runtime_compiler(backwards, backward=True), 6, set_to_none)
    (stats,) = backwards
    assert stats.status == "captured" and stats.replays == 5  # every call but the first (warm-up)
    graph_memory = {t.data_ptr() for t in runtime._OUTPUTS.values()}
    taken = [p.grad.data_ptr() in graph_memory for p in model.parameters()]
    assert all(taken) if set_to_none else not any(taken)  # accumulated into the first step's gradients


def test_partition_with_cpu_inputs_runs_without_graph_and_says_why():
    calls = []
    part, stats = _part(_partition_fn(calls))
    x, w = torch.ones(4), torch.ones(4)
    for _ in range(3):
        assert torch.equal(part([x, w])[0], x * w + 1)
    assert calls == [2, 2, 2]  # every call ran the partition itself, once
    assert stats.status == "eager" and "CPU tensor (float32 [4]" in stats.reason
    assert stats.recordings == 0 and stats.replays == 0 and stats.eager_calls == 2  # call 1 is warm-up


# --- CGCT on FX graphs with fake CUDA inputs, the rewired graph then checked on the CPU --------------

GPU = torch.device("cuda:0")


def _fake_gpu(*shape):
    from torch._subclasses import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        return torch.empty(*shape, device=GPU)


def _schedule_graph() -> fx.GraphModule:
    """What Dynamo hands the backend for a diffusion-style step (checked against Dynamo's own output):

        def step(x, table):                # x on the GPU, table a CPU module attribute
            a = table[3]
            b = torch.tensor(2.0)
            return x * a.sqrt() + b
    """
    g = fx.Graph()
    x, table = g.placeholder("x"), g.placeholder("table")
    a = g.call_function(operator.getitem, (table, 3))
    b = g.call_function(torch.tensor, (2.0,))
    out = g.call_function(operator.add, (g.call_function(operator.mul, (x, g.call_method("sqrt", (a,)))), b))
    g.output((out,))
    return fx.GraphModule(torch.nn.Module(), g)


def _retarget(gm, device):
    """The same graph with every device argument the passes wrote replaced by `device`."""
    swap = lambda a: device if isinstance(a, torch.device) and a.type == "cuda" else a  # noqa: E731
    for node in gm.graph.nodes:
        node.args, node.kwargs = fx.node.map_aggregate(node.args, swap), fx.node.map_aggregate(node.kwargs, swap)
    gm.recompile()
    return gm


def test_cgct_moves_cpu_factories_and_inputs_that_feed_gpu_work():
    table = torch.linspace(0.1, 1.0, 10)
    gm = _schedule_graph()
    notes = cgct.apply(gm, [_fake_gpu(4), table])
    assert notes == ["cpu_factories: 1 CPU tensor factories now create on cuda:0",
                     "cpu_inputs: 1 CPU tensor inputs copied to cuda:0 at the start"], notes
    code = gm.code
    assert "torch.tensor(2.0, device = device(type='cuda', index=0))" in code
    assert "table.to(device(type='cuda', index=0))" in code
    assert all(n.meta["val"].device == GPU for n in gm.graph.nodes if n.op == "call_function")
    # the rewired graph computes what the original does (devices put back to the CPU to run it here)
    x = torch.randn(4)
    expected = _schedule_graph()(x, table)
    torch.testing.assert_close(_retarget(gm, torch.device("cpu"))(x, table), expected)


def leaks_to_output(x, table):
    return x * table[3], table * 2  # table's CPU result is an output: moving it would change it


def reads_on_host(x, table):
    return x * table.sum().item()  # .item() needs the value on the host


def counts_steps(x, step):
    step.add_(1)  # the caller's CPU counter must advance
    return x * step


@pytest.mark.parametrize("fn", [leaks_to_output, reads_on_host, counts_steps])
def test_cgct_leaves_values_that_leave_the_gpu_work(fn):
    gm = fx.symbolic_trace(fn)
    before = gm.code
    notes = cgct.apply(gm, [_fake_gpu(4), torch.zeros(() if fn is counts_steps else 10)])
    if fn is reads_on_host:
        assert notes == ["not run: the graph cannot be propagated with fake tensors (DataDependentOutputException)"]
    else:
        assert notes == [], notes
    assert gm.code == before


def test_cgct_undoes_a_pass_that_breaks_an_output(monkeypatch):
    def wrong(gm, device):  # moves the output itself to another device
        out = next(n for n in gm.graph.nodes if n.op == "output")
        with gm.graph.inserting_before(out):
            moved = gm.graph.call_method("to", (out.args[0][0], torch.device("cpu")))
        out.args = ((moved,),)
        return "moved the output"

    monkeypatch.setattr(cgct, "PASSES", {"wrong": wrong})
    gm = _schedule_graph()
    before = gm.code
    notes = cgct.apply(gm, [_fake_gpu(4), torch.zeros(10)])
    assert notes[0].startswith("wrong: undone (ValueError: an output would change device"), notes
    assert gm.code == before


def test_fake_propagation_follows_symbolic_sizes_through_composite_ops():
    """VM's mask pasting: F.interpolate to a size computed from a dynamic dim. Dynamo traces it under the
    Python dispatcher; propagated without it, the composite op asked for concrete sizes, and CGCT was not
    run on 3 of VM's graphs ("the graph cannot be propagated with fake tensors")."""
    shapes = []

    def backend(gm, example_inputs):
        fake_propagate(gm, example_inputs)  # raising here fails the compile, and the test
        shapes.append(next(n for n in gm.graph.nodes if n.op == "output").args[0][0].meta["val"].shape)
        return gm.forward

    def paste(mask, boxes):
        return F.interpolate(mask[None, None], size=(max(boxes.shape[0], 2), 1), mode="bilinear", align_corners=False)

    out = torch.compile(paste, backend=backend, dynamic=True)(torch.randn(30, 30), torch.randn(5, 4))
    assert out.shape == (1, 1, 5, 1) and len(shapes) == 1
    assert not isinstance(shapes[0][2], int)  # the size stays symbolic: max(s, 2)


# --- SCG: the cost model, and decisions taken on a call's own inputs with a fake timer ---------------

from grace import scg  # noqa: E402
from grace.snapshot import Snapshot  # noqa: E402


def _costs(kernels, copy_bytes=0, copies=0, gpu_us=0.0):
    return scg.Costs(kernels=kernels, launch_us=10.0, replay_us=15.0, copy_bytes=copy_bytes,
                     copy_bytes_per_us=2000.0, copies=copies, gpu_us=gpu_us)


def test_cost_model_is_clear_where_one_side_wins_by_far_and_measures_otherwise():
    assert scg.clear(scg.predict(_costs(50))) == "graph"  # 500 us of launches against one 15 us replay
    assert scg.clear(scg.predict(_costs(1, copy_bytes=12_582_912, copies=3))) == "eager"  # EOS: copies cost more
    assert scg.predict(_costs(2)) == {"graph": 15.0, "eager": 2 * 10.0 * scg.EAGER_LAUNCH_FACTOR}
    assert scg.predict(_costs(2, gpu_us=50.0)) == {"graph": 50.0, "eager": 54.0}
    assert scg.clear(scg.predict(_costs(2, gpu_us=50.0))) is None  # 7 % apart: too close to call without timing
    # GPU-bound (DR-I: 11 kernels, 560 us of GPU work): launches hide behind the GPU either way, and a
    # graph adds its 291 MB input copy to the GPU's time
    assert scg.predict(_costs(11, gpu_us=560.0)) == {"graph": 560.0, "eager": 560.0}
    assert scg.predict(_costs(11, copy_bytes=291_110_912, copies=1, gpu_us=560.0)) == pytest.approx(
        {"graph": 560.0 + 291_110_912 / 2000.0, "eager": 560.0})
    # with PI: a third candidate, without the copy but with a driver call per re-pointed node
    with_pi = dataclasses.replace(_costs(2, copy_bytes=4096, copies=1), patched_nodes=2)
    assert scg.predict(with_pi) == pytest.approx({"graph": 25.0, "eager": 54.0, "graph_pi": 19.0})
    assert scg.clear(scg.predict(with_pi)) is None  # 19 against 25
    assert scg.clear(scg.predict(dataclasses.replace(with_pi, kernels=40, copy_bytes=200_000))) == "graph_pi"


def test_decision_measures_when_unclear_and_says_whether_the_model_agreed():
    timed = []
    fake = {"graph": iter([90.0, 30.0, 35.0]), "eager": iter([10.0, 50.0, 12.0])}  # a cold first graph round
    d = scg.decide(_costs(2, gpu_us=50.0), {"graph": lambda: None, "eager": lambda: None},
                   lambda name, run: timed.append(name) or next(fake[name]), Snapshot([]))
    assert timed == ["graph", "eager", "eager", "graph", "graph", "eager"]  # in turn, the order rotating
    assert d.choice == "eager" and d.measured_us == {"graph": 30.0, "eager": 10.0}
    assert d.rounds_us == {"graph": [90.0, 30.0, 35.0], "eager": [10.0, 50.0, 12.0]}
    assert d.predicted_choice == "graph" and d.agreed is False
    # a machine that drifts across rounds: each round slower, the candidates compared within each
    drift = {"graph": iter([6830.0, 9888.0, 12631.0]), "graph_pi": iter([8510.0, 8817.0, 11623.0]),
             "eager": iter([13096.0, 14257.0, 15032.0])}
    with_pi = dataclasses.replace(_costs(751, copy_bytes=2**30, copies=3, gpu_us=5824.0), launch_us=3.0,
                                  patched_nodes=2)  # a fast host: eager's launches about the GPU's time
    d = scg.decide(with_pi, dict.fromkeys(drift, lambda: None), lambda name, run: next(drift[name]), Snapshot([]))
    assert d.choice == "graph_pi" and d.measured_us["graph"] < d.measured_us["graph_pi"] and d.agreed is True
    # rounds split one each: the timing cannot tell, and the model's favourite is taken
    split = {"graph": iter([1.0, 3.0, 3.0]), "graph_pi": iter([3.0, 1.0, 3.0]), "eager": iter([3.0, 3.0, 1.0])}
    d = scg.decide(with_pi, dict.fromkeys(split, lambda: None), lambda name, run: next(split[name]), Snapshot([]))
    assert d.tied and d.choice == d.predicted_choice == "graph_pi" and d.agreed is None
    clear = scg.decide(_costs(50), {}, None, Snapshot([]))
    assert clear.choice == "graph" and clear.measured_us is None and clear.agreed is None


def _noisy_counter(args):
    """A partition that mutates an input (w += 1) and draws random numbers."""
    x, w = args
    args.clear()
    w.add_(1)
    return (x * w + torch.rand(4),)


@pytest.mark.parametrize("faster", ["eager", "graph"])
def test_scg_measures_safely_and_the_caller_sees_one_execution(cpu_graphs, monkeypatch, faster):
    def fake_timer(name, run):  # runs each candidate twice, as a real timer would run it many times
        run(), run()
        return 1.0 if name == faster else 2.0

    monkeypatch.setattr(runtime, "timer", fake_timer)
    part, stats = _part(_noisy_counter, mutated={1})
    part.selective = True
    x, w = torch.randn(4), torch.zeros(4)
    torch.manual_seed(0)
    part([x, w])  # warm-up: w = 1
    (y,) = part([x, w])  # recorded, decided (timing ran the partition 12 more times), then run once: w = 2
    torch.manual_seed(0)
    torch.rand(4)
    expected = x * 2 + torch.rand(4)  # exactly one more execution's draw
    torch.testing.assert_close(w, torch.full((4,), 2.0))
    torch.testing.assert_close(y, expected)
    assert stats.scg["choice"] == faster and stats.scg["measured_us"] == {faster: 1.0, ({"graph", "eager"} - {faster}).pop(): 2.0}
    assert stats.status == ("declined" if faster == "eager" else "captured")
    del y
    (z,) = part([x, w])  # later calls follow the decision
    torch.testing.assert_close(w, torch.full((4,), 3.0))
    assert (stats.replays, stats.eager_calls) == ((0, 2) if faster == "eager" else (2, 0))


def test_scg_decides_for_a_partition_without_tensor_inputs(cpu_graphs, monkeypatch):
    """A partition that only creates tensors from a size (seen in training graphs: BSCG, STCLM) has no
    input to tell its device; SCG once failed on it with StopIteration."""
    def fake_timer(name, run):
        run()
        return 1.0 if name == "graph" else 2.0

    monkeypatch.setattr(runtime, "timer", fake_timer)
    part, stats = _part(lambda args: (torch.arange(args[0]) * 2.0,))
    part.selective = True
    for _ in range(3):
        (y,) = part([5])
        torch.testing.assert_close(y, torch.arange(5) * 2.0)
        del y
    assert stats.scg["choice"] == "graph" and stats.status == "captured" and stats.replays == 2


# --- PI: finding and rewriting the parameter words that point into placeholders ----------------------

import ctypes  # noqa: E402

from grace import pi  # noqa: E402


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


def test_a_recording_that_is_gone_leaves_no_address_behind(cpu_graphs):
    part, _ = _part(_partition_fn([]), static={1})
    w = torch.ones(4)
    part([torch.randn(4), w])
    part([torch.randn(4), w])  # recorded: its output's address is registered as a graph output
    (out,) = part.recordings[()][0].outputs
    address = out.data_ptr()
    assert address in runtime._OUTPUTS
    del part, out
    import gc

    gc.collect()
    assert address not in runtime._OUTPUTS  # a new tensor there is an ordinary input again


def test_runtime_keeps_one_recording_per_symbolic_size(cpu_graphs):
    """With dynamic shapes a partition also takes the sizes as ints: one recording per distinct size."""

    part, stats = _part(_first_n_doubled)
    x = torch.randn(8)
    for n in (2, 4, 2, 6, 4, 2, 6):  # a size's first call warms up (autotuning), its second records
        (y,) = part([n, x])
        torch.testing.assert_close(y, x[:n] * 2)
        del y
    assert stats.recordings == 3 and stats.replays == 4 and stats.eager_calls == 2 and stats.status == "captured"
