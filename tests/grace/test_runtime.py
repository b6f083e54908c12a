"""The runtime's state machine with a CPU stand-in for CUDA graph capture (grace.runtime, grace.recording)."""

import dataclasses
import weakref

import pytest
import torch

import grace
from grace import recording, runtime
from grace.backend import GraphReport
from grace.explain import Explanation
from grace.torch_adapter import Partition
from tests.grace.fakes import (_add_one_then_scale, _capture_on_the_arguments, _each_somewhere_new, _first_n_doubled,
                               _mlp, _part, _partition_fn, fake_capture)


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


@pytest.mark.parametrize("produced, source", [(None, "not a parameter or buffer"), ((), "a graph input"),
                                              ((0,), "made between partitions of its graph outside any graph")])
def test_the_largest_copied_inputs_are_named_with_where_they_come_from(cpu_graphs, produced, source):
    part, stats = _part(_partition_fn([]), static={1}, produced=produced)
    w = torch.full((4,), 2.0)
    for _ in range(3):
        part([torch.randn(4), w])
    assert stats.largest_copies == [(16, f"input 0: float32 [4], {source}")]
    report = GraphReport(0, grace.Options(), partitions=[stats])
    e = Explanation([report], {}, {})
    assert e.summary()["largest_copies"] == [f"graph 0 forward partition 0 input 0: float32 [4], {source}: 16 bytes"]


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


def test_a_caller_that_keeps_every_output_is_looked_at_only_now_and_then_and_replays_once_it_lets_go(
        cpu_graphs, monkeypatch):
    """An eval loop that collects every output: after HELD_LOOKS calls in a row with every recording's
    outputs held, the held test runs only every HELD_LOOKS-th call; once the caller lets go, a replay
    comes within that many calls, and no kept output is ever written over."""
    looks = []
    held_output = recording.Recording.held_output
    monkeypatch.setattr(recording.Recording, "held_output", lambda self: looks.append(1) or held_output(self))
    part, stats = _part(_partition_fn([]), static={1})
    w, kept = torch.ones(4), []
    n = runtime.HELD_LOOKS * 4
    for i in range(n):
        x = torch.randn(4)
        (y,) = part([x, w])
        kept.append((x, y))
        del y
    for x, y in kept:  # none written over
        torch.testing.assert_close(y, x * w + 1)
    held_calls = n - 3  # after the warm-up, the recording and its twin (each replayed once)
    assert stats.replays == 2 and stats.eager_calls == held_calls
    # the twin's call looked at the first recording; then each twin on every held call of the first
    # HELD_LOOKS, and from then on on one call in HELD_LOOKS
    assert len(looks) == 1 + 2 * (runtime.HELD_LOOKS + (held_calls - 1) // runtime.HELD_LOOKS), len(looks)
    kept.clear()
    for i in range(runtime.HELD_LOOKS):
        x = torch.randn(4)
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert stats.replays > 2 and stats.recordings == 2
    # held again: counted from nothing, each call looks
    looks.clear()
    kept = [part([torch.randn(4), w]) for _ in range(4)]
    assert len(looks) == 1 + 1 + 2 + 2, len(looks)  # a free twin, the other, then both on each held call


@pytest.mark.parametrize("keep", [lambda y: y.untyped_storage(), lambda y: y[1:], lambda y: y.detach()])
def test_an_output_held_by_its_storage_or_a_view_alone_is_not_replayed_over(cpu_graphs, keep):
    """Torch keeps a storage's Python object, and a use of the storage with it, once anyone asked for
    it: a caller that keeps `y.untyped_storage()` alone adds no use, only Python references to it."""
    part, stats = _part(_partition_fn([]), static={1})
    w = torch.ones(4)
    for _ in range(3):  # warm-up, recorded, replayed
        part([torch.randn(4), w])
    x = torch.randn(4)
    (y,) = part([x, w])
    kept = keep(y)
    del y
    part([torch.randn(4), w])
    storage = kept if isinstance(kept, torch.UntypedStorage) else kept.untyped_storage()
    torch.testing.assert_close(torch.empty(0).set_(storage), x * w + 1)


def test_a_loop_that_holds_the_previous_output_replays_every_call(cpu_graphs):
    part, stats = _part(_partition_fn([]), static={1})
    w, y = torch.ones(4), None
    for _ in range(10):
        x = torch.randn(4)
        (y,) = part([x, w])  # y of the previous call is alive during this one
        torch.testing.assert_close(y, x * w + 1)
    assert stats.replays == 9 and stats.recordings == 2 and stats.eager_calls == 0


def test_a_state_fed_back_and_kept_records_one_twin_not_one_per_call(cpu_graphs):
    """Each output is the next call's input and every one stays held (an RNN cell run in grad mode:
    the autograd graph keeps them). The twin copies the state as the first recording does; read in
    place from the first's output, it would match no later call, and each call would record a twin."""
    part, stats = _part(_partition_fn([]), static={1})
    w, states = torch.full((4,), 0.5), [torch.zeros(4)]
    for _ in range(12):
        (y,) = part([states[-1], w])
        torch.testing.assert_close(y, states[-1] * w + 1)
        states.append(y)
    assert stats.recorded_for == {"first at these sizes": 1, "twin": 1} and part.rerecords == 1
    assert "still held" in stats.reason


def _chain_step(part, w, links):
    """One step of a loop that feeds each output to the next call and keeps them all: every value
    checked once the step is over, so that a replay over a kept output shows."""
    ys = [torch.randn(4)]
    for _ in range(links):
        (y,) = part([ys[-1], w])
        ys.append(y)
    for x, y in zip(ys, ys[1:]):
        torch.testing.assert_close(y, x * w + 1)
    return ys


def test_a_chain_of_outputs_fed_forward_and_kept_replays_every_call_once_it_repeats(cpu_graphs):
    """Each call takes the previous call's output and the step keeps them all (the corpus's
    outputs_fed_forward_and_kept): once the chain has repeated, each place in it has a recording that
    reads its predecessor's output in place, as graph trees' chain of recordings does, and every call
    replays."""
    part, stats = _part(_partition_fn([]), static={1})
    w = torch.full((4,), 0.5)
    for _ in range(4):
        _chain_step(part, w, 4)
    before = stats.replays
    _chain_step(part, w, 4)
    assert stats.replays - before == 4 and stats.eager_calls == 2  # the last call of steps 1 and 2
    assert stats.recorded_for == {"first at these sizes": 1, "twin": 1, "output fed forward": 2}


def test_a_chain_longer_than_its_limit_keeps_its_graphs_for_its_first_links(cpu_graphs):
    """A chain longer than CHAIN links records that many and runs the rest of each step without a graph,
    never giving the partition's graphs up (MAX_RERECORDS)."""
    part, stats = _part(_partition_fn([]), static={1})
    w = torch.full((4,), 0.5)
    n = runtime.CHAIN + 6
    for _ in range(n):
        _chain_step(part, w, n)
    before, eager = stats.replays, stats.eager_calls
    _chain_step(part, w, n)
    assert stats.status == "captured" and part.links[()] == runtime.CHAIN
    assert stats.replays - before == runtime.CHAIN + 2 and stats.eager_calls - eager == n - runtime.CHAIN - 2


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


def test_saved_activations_the_caller_keeps_are_moves_and_parameters_call_sites(cpu_graphs):
    """A backward graph's static inputs are the saved tensors. An activation made anew each step that the
    caller still holds (logits kept over steps) is a move, copied once it kept moving, not one more call
    site recorded every step; the parameters of two layers that share the graph are two call sites."""
    part, stats = _part(_partition_fn([]), static={0, 1})
    stats.backward = True
    layers = [torch.nn.Parameter(torch.full((4,), 2.0)), torch.nn.Parameter(torch.full((4,), 3.0))]
    kept = []
    for step in range(8):
        for w in layers:
            kept.append(torch.full((4,), float(step)))
            (y,) = part([kept[-1], w])
            torch.testing.assert_close(y, kept[-1] * w + 1)
            del y
    # every call recorded without the parameters telling sites apart; here the second site once more, after
    # the activation's recordings that read it in place were let go
    assert stats.recorded_for == {"first at these sizes": 1, "new call site": 2, "moved input": runtime.MOVES_BEFORE_COPY}
    assert stats.replays == 15 and stats.moving_inputs == 1 and stats.status == "captured"


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


def _doubled_in_place_returned(args):
    """A partition that writes its input and returns it (`x.mul_(2)` returned): Inductor's convention."""
    (x,) = args
    args.clear()
    return (x.mul_(2), x[1:])


def test_a_written_input_that_the_partition_returns_is_the_callers_tensor_once_copied(cpu_graphs):
    """Once the input kept moving it is copied in and back; what the partition returns of it is then the
    caller's tensor again (eager's `x.mul_(2)` is x), not the placeholder the next call overwrites."""
    part, stats = _part(_doubled_in_place_returned, mutated={0})
    for i, x in enumerate(torch.randn(4) for _ in range(8)):
        before = x.clone()
        y, tail = part([x])
        assert y is x and tail.untyped_storage().data_ptr() == x.untyped_storage().data_ptr(), i
        torch.testing.assert_close(x, before * 2)
        torch.testing.assert_close(tail, x[1:])
    assert stats.moving_inputs == 1 and stats.replays == 7


def test_an_upstream_graphs_output_that_keeps_moving_is_copied(cpu_graphs, monkeypatch):
    """Another graph's output is read in place; when it keeps moving (each recording upstream has its
    own outputs, and a chain of partitions multiplied the recordings) it is copied from then on."""
    monkeypatch.setattr(recording, "OUTPUTS", weakref.WeakValueDictionary())
    part, stats = _part(_partition_fn([]))
    w = torch.full((4,), 2.0)
    for x in _each_somewhere_new(torch.randn(4) for _ in range(12)):
        recording.OUTPUTS[x.data_ptr()] = x  # as if a graph upstream had made it
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert stats.status == "captured" and stats.recordings == 1 + runtime.MOVES_BEFORE_COPY and stats.replays == 11


@pytest.mark.parametrize("view", [False, True])
def test_a_downstream_graph_that_returns_its_input_leaves_the_upstream_graph_replaying(cpu_graphs, monkeypatch, view):
    """A forward partition returning an activation it read (saved for backward), or a view of it: its
    recording kept that tensor, so the upstream partition's outputs looked held for ever and it ran
    without its graph on every call (DGPT2's forward). The output is now made from each
    call's own input."""
    monkeypatch.setattr(recording, "capture", _capture_on_the_arguments)
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
    monkeypatch.setattr(recording, "OUTPUTS", weakref.WeakValueDictionary())
    part, stats = _part(_first_n_doubled)
    upstream = {n: [torch.randn(8), torch.randn(8)] for n in (2, 4, 6, 8)}  # two outputs per size
    for step in range(4):
        for n, outs in upstream.items():
            x = outs[step % 2]
            recording.OUTPUTS[x.data_ptr()] = x
            (y,) = part([n, x])
            torch.testing.assert_close(y, x[:n] * 2)
            del y
    assert stats.moving_inputs == 0 and stats.copied_inputs == 0 and stats.recordings == 8
    for x in _each_somewhere_new(torch.randn(8) for _ in range(8)):  # at one size, somewhere new every call
        recording.OUTPUTS[x.data_ptr()] = x
        (y,) = part([2, x])
        torch.testing.assert_close(y, x[:2] * 2)
        del y
    assert stats.moving_inputs == 1 and stats.copied_inputs == 1
    recordings = stats.recordings
    for x in _each_somewhere_new(torch.randn(8) for _ in range(3)):  # at another size, new places:
        recording.OUTPUTS[x.data_ptr()] = x  # recorded once more, copying it, then replayed
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

    monkeypatch.setattr(recording, "capture", capture)
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


def test_threads_that_call_one_partition_together_each_get_their_own_result(cpu_graphs):
    """Serving threads share one compiled model: each call must pick, copy into and replay a recording
    while no other call does, or two pick the recording nobody holds and one's replay writes over the
    other's result."""
    import sys
    import threading

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns between any two bytecodes
    part, stats = _part(_partition_fn([]), static={1})
    w = torch.full((64,), 2.0)
    wrong = []

    def serve(seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(1000):
            x = torch.randn(64, generator=g)
            (y,) = part([x, w])
            wrong.append(not torch.equal(y, x * w + 1))

    threads = [threading.Thread(target=serve, args=(seed,)) for seed in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(previous)
    assert len(wrong) == 4000 and not any(wrong) and stats.replays > 0


def _runtime_compiler(made: list, backward: bool = False, static=lambda example_inputs: frozenset(),
                      returned: frozenset[int] = frozenset()):
    """An AOTAutograd compiler that runs the graph it is given as one partition through the runtime,
    its Stats appended to `made`; `static` picks the static inputs from the example inputs, `returned`
    are the outputs that reach the caller."""
    from functorch.compile import make_boxed_func

    def compile(gm, example_inputs):
        stats = runtime.Stats(graph=0, backward=backward, partition=0)
        made.append(stats)
        part = runtime.PartitionGraph(make_boxed_func(gm.forward),
                                      Partition(0, static(example_inputs), frozenset(), returned=returned), stats)
        part._boxed_call = True
        return part

    return compile


def _train_beside_eager(fw_compiler, bw_compiler, steps: int, set_to_none: bool = True, micro: int = 1):
    """`steps` SGD steps of an MLP compiled with these AOTAutograd compilers and of its eager twin, on the
    same inputs, each summing the gradients of `micro` micro-batches; parameters and gradients compared
    after each. Returns the compiled model's module."""
    from torch._dynamo.backends.common import aot_autograd

    torch.compiler.reset()  # static shapes: earlier tests compiled the same module type
    model, twin = _mlp(), _mlp()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler))
    opt, opt_twin = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))
    for _ in range(steps):
        x = torch.randn(3 * micro, 8)
        for m, o in ((compiled, opt), (twin, opt_twin)):
            o.zero_grad(set_to_none=set_to_none)
            for batch in x.chunk(micro):
                m(batch).square().mean().backward()
            o.step()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p, q)
            torch.testing.assert_close(p.grad, q.grad)
    return model


@pytest.mark.parametrize("returned", [frozenset(), frozenset({0})])
def test_runtime_keeps_replaying_a_training_forward_and_matches_eager(cpu_graphs, returned):
    """AOTAutograd's forward returns tensors saved for backward, parameters among them; the runtime
    must not take the caller's own references to those for outputs still in use. The model's output
    returned as a new object each replay (as the backend asks of a training forward) trains alike."""
    from functorch.compile import make_boxed_func

    def params(example_inputs):  # all but x
        return frozenset(i for i, t in enumerate(example_inputs) if isinstance(t, torch.Tensor) and tuple(t.shape) != (3, 8))

    forwards = []
    _train_beside_eager(_runtime_compiler(forwards, static=params, returned=returned),
                        lambda gm, _: make_boxed_func(gm.forward), 5)
    (stats,) = forwards
    assert stats.status == "captured" and stats.recordings == 1 and stats.replays == 4 and stats.eager_calls == 0


@pytest.mark.parametrize("returned", [frozenset({0}), None])
def test_a_training_forward_whose_result_the_caller_drops_replays_every_call(cpu_graphs, returned):
    """Inference in grad mode: autograd sets grad_fn on the very tensor object AOTAutograd's function
    returns, and that call's autograd graph holds the activations it saved, outputs of the same graph.
    A recording that returned its own output objects kept both alive after the caller dropped the
    result, and every call ran without the graph ("outputs ... still held")."""
    from torch._dynamo.backends.common import aot_autograd

    torch.compiler.reset()
    forwards = []
    model = _mlp()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=_runtime_compiler(forwards, returned=returned),
                                                         bw_compiler=_runtime_compiler([], backward=True)))
    x = torch.randn(3, 8)
    for _ in range(6):
        torch.testing.assert_close(compiled(x).detach(), model(x))
    (stats,) = forwards
    assert stats.eager_calls == 0 and stats.replays == 5, stats.reason


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_backward_graphs_gradients_are_taken_by_autograd_not_cloned(cpu_graphs, set_to_none):
    """A parameter's first gradient is taken as it is (no copy) when nobody else holds it; a backward
    graph that kept hold of its outputs had every gradient cloned (a copy and a launch per parameter,
    each step). Gradients held across steps (zero_grad without
    set_to_none) accumulate as in eager, the graph recording a twin for the memory they keep."""
    backwards = []
    model = _train_beside_eager(_runtime_compiler([]), _runtime_compiler(backwards, backward=True), 6, set_to_none)
    (stats,) = backwards
    assert stats.status == "captured" and stats.replays == 5  # every call but the first (warm-up)
    graph_memory = {t.data_ptr() for t in recording.OUTPUTS.values()}
    taken = [p.grad.data_ptr() in graph_memory for p in model.parameters()]
    assert all(taken) if set_to_none else not any(taken)  # accumulated into the first step's gradients


def test_a_call_inside_the_callers_own_capture_runs_the_partition_and_leaves_the_recordings_alone(cpu_graphs,
                                                                                                   monkeypatch):
    """A program that captures a CUDA graph of its own around a compiled call (as serving frameworks do):
    a replay or a recording there would break the caller's capture (a recording synchronizes) or leave
    in the caller's graph one that PI re-points later. The partition runs into the caller's graph, and
    outside it the partition warms up, records and replays as if that call had not been."""
    capturing = [True]
    monkeypatch.setattr(recording, "caller_capturing", lambda: capturing[0])
    part, stats = _part(_partition_fn([]), static={1})
    w = torch.full((4,), 2.0)

    def call():
        x = torch.randn(4)
        torch.testing.assert_close(part([x, w])[0], x * w + 1)

    call()  # the first call of all, inside the capture: not the warm-up
    capturing[0] = False
    call()
    assert stats.status == "warm-up" and stats.recordings == 0
    call(), call()
    assert stats.status == "captured" and (stats.recordings, stats.replays) == (1, 2)
    capturing[0] = True
    call(), call()
    assert (stats.recordings, stats.replays, stats.reason) == (1, 2, runtime.CALLER_CAPTURE)
    capturing[0] = False
    call()
    assert stats.status == "captured" and (stats.recordings, stats.replays) == (1, 3)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradients_summed_over_micro_batches_match_eager(cpu_graphs, set_to_none):
    """Gradient accumulation: the first micro-batch's gradients are the backward graph's output memory,
    taken by autograd as they are, and the second backward adds into them: its replay must not be the
    one whose outputs those gradients are."""
    backwards = []
    _train_beside_eager(_runtime_compiler([]), _runtime_compiler(backwards, backward=True), 5, set_to_none, micro=2)
    (stats,) = backwards
    # set to None, the first micro-batch's gradients are a recording's outputs, held: the second takes a
    # twin; zeroed in place, they are the first step's own tensors, and one recording serves throughout
    assert stats.status == "captured" and stats.replays >= 8 and stats.recordings == (2 if set_to_none else 1), stats


def test_partition_with_cpu_inputs_runs_without_graph_and_says_why():
    calls = []
    part, stats = _part(_partition_fn(calls))
    x, w = torch.ones(4), torch.ones(4)
    for _ in range(3):
        assert torch.equal(part([x, w])[0], x * w + 1)
    assert calls == [2, 2, 2]  # every call ran the partition itself, once
    assert stats.status == "eager" and "CPU tensor (float32 [4]" in stats.reason
    assert stats.recordings == 0 and stats.replays == 0 and stats.eager_calls == 2  # call 1 is warm-up


def test_a_recording_that_is_gone_leaves_no_address_behind(cpu_graphs):
    part, _ = _part(_partition_fn([]), static={1})
    w = torch.ones(4)
    part([torch.randn(4), w])
    part([torch.randn(4), w])  # recorded: its output's address is registered as a graph output
    (out,) = part.recordings[()][0].outputs
    address = out.data_ptr()
    assert address in recording.OUTPUTS
    del part, out
    import gc

    gc.collect()
    assert address not in recording.OUTPUTS  # a new tensor there is an ordinary input again


def test_runtime_keeps_one_recording_per_symbolic_size(cpu_graphs):
    """With dynamic shapes a partition also takes the sizes as ints: one recording per distinct size."""

    part, stats = _part(_first_n_doubled)
    x = torch.randn(8)
    for n in (2, 4, 2, 6, 4, 2, 6):  # a size's first call warms up (autotuning), its second records
        (y,) = part([n, x])
        torch.testing.assert_close(y, x[:n] * 2)
        del y
    assert stats.recordings == 3 and stats.replays == 4 and stats.eager_calls == 2 and stats.status == "captured"


def test_a_partition_whose_sizes_change_every_call_says_so_in_warm_up(cpu_graphs):
    part, stats = _part(_first_n_doubled)
    x = torch.randn(8)
    for n in (1, 2, 3):
        part([n, x])
    assert stats.status == "warm-up"
    assert stats.reason == "warm-up: called at 3 sets of sizes, none twice yet (the latest: (3,))"
    part([3, x])  # the second call at these sizes records: the warm-up's reason goes
    assert stats.status == "captured" and stats.reason is None


def _after_a_cond(args):
    """As Inductor's partition after a torch.cond: it takes the cond's output, a list, as one input."""
    (first, second), w = args
    args.clear()
    return (first * w + second,)


def test_a_partition_taking_a_list_of_tensors_records_and_replays_their_values(cpu_graphs):
    part, stats = _part(_after_a_cond, static={1}, produced={0})
    w = torch.full((4,), 2.0)
    gone = []
    for i in range(5):
        pair = [torch.randn(4), torch.randn(4)]  # new tensors every call: copied into placeholders
        gone.append(weakref.ref(pair[0]))
        args = [pair, w]
        (y,) = part(args)
        torch.testing.assert_close(y, pair[0] * w + pair[1])
        assert args == []  # the caller's list is emptied, as Inductor's convention has it
        del y, pair
    assert stats.status == "captured" and stats.recordings == 1 and stats.replays == 4
    assert (stats.in_place_inputs, stats.copied_inputs) == (1, 2)
    assert all(ref() is None for ref in gone)  # no call's input kept (a key of them kept every one)


def test_inputs_nested_otherwise_than_at_first_run_as_compiled_and_say_why(cpu_graphs):
    part, stats = _part(lambda args: (sum(args.pop(0)),), produced={0})
    for _ in range(3):
        torch.testing.assert_close(part([[torch.ones(2), torch.ones(2)]])[0], torch.full((2,), 2.0))
    assert stats.status == "captured"
    torch.testing.assert_close(part([(torch.ones(2), torch.ones(2), torch.ones(2))])[0], torch.full((2,), 3.0))
    assert stats.status == "eager" and stats.reason == "its inputs came nested otherwise than at the first call"
    torch.testing.assert_close(part([[torch.ones(2), torch.ones(2)]])[0], torch.full((2,), 2.0))


def test_an_input_neither_a_tensor_nor_a_size_runs_as_compiled_and_is_not_kept(cpu_graphs):
    class Opaque:
        pass

    part, stats = _part(lambda args: (args.pop(1) * 2,))
    for _ in range(3):
        thing = Opaque()
        ref = weakref.ref(thing)
        part([thing, torch.ones(2)])
        del thing
        assert ref() is None
    assert stats.status == "eager" and stats.reason == "a partition input is a Opaque, neither a tensor nor a size"


def test_sizes_called_once_each_are_remembered_up_to_a_limit(cpu_graphs):
    part, stats = _part(_first_n_doubled)
    x = torch.randn(8)
    for n in range(runtime.WARMED + 5):  # sizes that change every call (a growing sequence, say)
        part([n, x])
    assert len(part.warmed) == runtime.WARMED and stats.status == "warm-up"
    assert stats.reason.startswith(f"warm-up: called at {runtime.WARMED + 5} sets of sizes, none twice yet")
    part([runtime.WARMED + 4, x])  # the newest are remembered: its second call records
    assert stats.status == "captured"


def _scratch_first(args):
    """x * w, after a scratch buffer the size of w (a graph's first kernel writes memory of its own)."""
    x, w = args
    args.clear()
    scratch = torch.full_like(w, 99.0)
    return (x * w + scratch - 99.0,)


def test_a_replay_reads_an_input_that_only_the_call_held(cpu_graphs):
    """AOTAutograd hands a backward its saved activations and lets them go: the partition's list holds
    the last reference, and the replay must still read them (they are freed once it is launched)."""
    part, stats = _part(_scratch_first, static={1})
    for i in range(5):
        x = torch.randn(1024)
        args = [x, torch.full((1024,), float(i + 1))]  # at the address of the last call's: the same site
        (y,) = part(args)
        torch.testing.assert_close(y, x * (i + 1))
        del y
    assert stats.status == "captured" and stats.replays >= 3


def test_the_held_test_remembers_counts_found_free_and_still_sees_an_output_held(cpu_graphs, monkeypatch):
    """A training forward's saved activations count fewer references on every call than at capture (its
    temporaries are gone); counts found free are remembered, and an output held later is still seen."""
    temporaries = []

    def eight(args):
        (x,) = args
        args.clear()
        outputs = tuple(x * k for k in range(1, 9))
        temporaries.append(outputs[:7])  # held while the capture counts, gone afterwards
        return outputs

    part, stats = _part(eight)
    for _ in range(2):  # warm-up, recorded
        part([torch.randn(4)])
    (rec,) = part.recordings[next(iter(part.recordings))]
    replays = stats.replays
    temporaries.clear()
    looked = []
    grown = recording.gt
    monkeypatch.setattr(recording, "gt", lambda a, b: looked.append(1) or grown(a, b))
    assert rec.held_output() is None and rec.free != rec.baseline and looked  # fewer than at capture
    looked.clear()
    for _ in range(3):
        part([torch.randn(4)])
    assert stats.replays == replays + 3 and not looked  # the same counts: remembered, not compared again
    x = torch.randn(4)
    kept = part([x])[7]
    assert rec.held_output() == 7  # the last output alone, held
    part([torch.randn(4)])
    torch.testing.assert_close(kept, x * 8)  # not written over
    assert stats.recorded_for == {"first at these sizes": 1, "twin": 1}  # the held recording left alone
