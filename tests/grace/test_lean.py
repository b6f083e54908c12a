"""The lean call path (grace.lean) with a CPU stand-in for the wrappers it goes past: `compiled` plays
AOTAutograd and Inductor around one partition, as the grace backend hands it to Dynamo."""

import pytest
import torch

from grace import lean
from tests.grace.fakes import _add_one_then_scale, _part, _partition_fn


def _wrapped(part, inputs=lambda args: [args[1], args[0]], outputs=list):
    """Dynamo calls f(w, x); the stand-in passes [x, w] to the partition and hands back `outputs` of
    its result. Counts its calls."""
    calls = []

    def compiled(*args):
        calls.append(1)
        return outputs(part(inputs(args)))
    return compiled, calls


def _lean(part, stats, compiled, outputs=1, mutated=(), check=(), graph_inputs=()):
    paths = []
    candidate = lean.Candidate(part, outputs, frozenset(check), frozenset(mutated), graph_inputs)
    return lean.LeanCall(compiled, candidate, paths.append), paths


def _scaled_rows(args):
    """A dynamic-shape partition: its tensors, then the size it takes: y = x[:n] * w."""
    x, w, n = args
    args.clear()
    return (x[:n] * w,)


def test_once_a_call_shows_the_route_calls_go_straight_to_the_partition(cpu_graphs):
    part, stats = _part(_partition_fn([]), static={1})
    compiled, through_wrappers = _wrapped(part)
    call, paths = _lean(part, stats, compiled)
    w = torch.full((4,), 2.0)
    for i in range(6):
        x = torch.randn(4)
        (y,) = call(w, x)
        torch.testing.assert_close(y, x * w + 1)
        del y
    assert paths == ["lean"] and len(through_wrappers) == 1
    assert stats.status == "captured" and stats.replays == 5


def test_outputs_that_are_arguments_or_views_are_made_again_from_each_calls_tensors(cpu_graphs):
    """AOTAutograd's wrappers hand back an argument itself, and views of an argument or of a partition
    output made again on each call; the lean path does the same, on that call's tensors."""
    part, stats = _part(_partition_fn([]), static={1})
    compiled, through_wrappers = _wrapped(part, outputs=lambda result: [result[0].view(2, 2)])

    def compiled_with_aliases(*args):  # Dynamo calls f(w, x)
        (y,) = compiled(*args)
        return [args[1], y.t()[1:], args[1][2:], y]
    call, paths = _lean(part, stats, compiled_with_aliases, outputs=4)
    w = torch.full((4,), 2.0)
    for i in range(5):
        x = torch.randn(8)[i % 3:i % 3 + 4]  # at another offset in its storage each call
        same, view, arg_view, y = call(w, x)
        expected = (x * w + 1).view(2, 2)
        assert same is x
        torch.testing.assert_close(view, expected.t()[1:])
        torch.testing.assert_close(arg_view, x[2:])
        torch.testing.assert_close(y, expected)
        # views of this call's tensors, as the wrappers' are
        assert view.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
        arg_view.add_(1)
        torch.testing.assert_close(x[2:], arg_view)
        del same, view, arg_view, y
    assert paths == ["lean"] and len(through_wrappers) == 1
    assert stats.status == "captured" and stats.replays == 4


@pytest.mark.parametrize("outputs, why", [
    (lambda result: [torch.ones(2)], "nor a view of one or of an argument"),  # a constant
    (lambda result: [result[0].view(torch.int32)], "nor a view of one or of an argument"),  # another dtype
    (lambda result: [result[0].clone()], "nor a view of one or of an argument"),  # a copy
])
def test_a_graph_output_that_is_no_view_of_the_calls_tensors_keeps_the_wrappers(cpu_graphs, outputs, why):
    part, stats = _part(_partition_fn([]), static={1})
    compiled, through_wrappers = _wrapped(part, outputs=outputs)
    call, paths = _lean(part, stats, compiled)
    w = torch.full((4,), 2.0)
    for i in range(5):
        x = torch.randn(4)
        torch.testing.assert_close(call(w, x)[0], outputs([x * w + 1])[0])
    assert len(through_wrappers) == 5
    assert paths == [f"not lean: a graph output is not one of the partition's outputs, {why}"]


def test_a_view_of_one_of_two_arguments_that_share_memory_keeps_the_wrappers(cpu_graphs):
    """Dynamo calls f(w, x, v) with x and v overlapping views of one tensor on the watched calls; a view
    of v within both cannot be told from one of x, and a later call may pass them apart."""
    part, stats = _part(_partition_fn([]), static={1})
    compiled, through_wrappers = _wrapped(part)

    def compiled_with_a_view(*args):
        (y,) = compiled(*args)
        return [y, args[2][:2]]
    call, paths = _lean(part, stats, compiled_with_a_view, outputs=2)
    w = torch.full((4,), 2.0)
    for i in range(lean.WATCHED + 2):
        base = torch.randn(8)
        x, v = base[:4], (base[2:6] if i < lean.WATCHED else torch.randn(4))
        torch.testing.assert_close(call(w, x, v)[1], v[:2])
    assert len(through_wrappers) == lean.WATCHED + 2
    assert paths == ["not lean: a graph output is not one of the partition's outputs, nor a view of one or of an argument"]


def test_an_output_in_an_arguments_memory_in_another_dtype_keeps_the_wrappers(cpu_graphs):
    """view_as_real of a copied complex input: the partition's output views its placeholder on a replay,
    and only the wrappers make it again from the call's argument, as eager returns it."""
    def as_real(args):
        (x,) = args
        args.clear()
        return (torch.view_as_real(x),)
    part, stats = _part(as_real)

    def compiled(*args):
        part([args[0]])
        return [torch.view_as_real(args[0])]  # AOTAutograd's wrappers regenerate an aliased output so
    call, paths = _lean(part, stats, compiled)
    for i in range(lean.WATCHED + 2):
        x = torch.randn(4, dtype=torch.complex64)
        (y,) = call(x)
        assert y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        torch.testing.assert_close(y, torch.view_as_real(x))
    assert paths == ["not lean: a graph output is not one of the partition's outputs, nor a view of one or of an argument"]


def test_a_view_past_its_bases_span_keeps_the_wrappers(cpu_graphs):
    """The argument x is half of a tensor, and the output reaches into the other half: made again from
    another call's x, it could read past that x's storage."""
    part, stats = _part(_partition_fn([]), static={1})
    compiled, through_wrappers = _wrapped(part)

    def compiled_past_x(*args):
        (y,) = compiled(*args)
        x = args[1]
        return [y, x.as_strided((6,), (1,), x.storage_offset())]
    call, paths = _lean(part, stats, compiled_past_x, outputs=2)
    w = torch.full((4,), 2.0)
    for i in range(lean.WATCHED + 1):
        base = torch.randn(8)
        torch.testing.assert_close(call(w, base[:4])[1], base[:6])
    assert len(through_wrappers) == lean.WATCHED + 1
    assert paths == ["not lean: a graph output is not one of the partition's outputs, nor a view of one or of an argument"]


def test_a_view_output_of_a_graph_with_sizes_keeps_the_wrappers(cpu_graphs):
    """Its shape may follow the sizes, so one seen on a watched call says nothing of the next."""
    part, stats = _part(_scaled_rows, static={1})
    compiled, through_wrappers = _wrapped(part, inputs=lambda args: [args[1], args[2], args[0]],
                                          outputs=lambda result: [result[0][1:]])
    call, paths = _lean(part, stats, compiled, graph_inputs=(1, 2, 0))
    w = torch.full((4,), 2.0)
    for n in (3, 5, 3, 5, 2, 3):
        x = torch.randn(6, 4)
        torch.testing.assert_close(call(n, x, w)[0], (x[:n] * w)[1:])
    assert len(through_wrappers) == 6
    assert paths == ["not lean: a graph output is not one of the partition's outputs, in a graph with sizes"]


def test_a_partition_input_the_wrappers_made_keeps_the_wrappers(cpu_graphs):
    """A realigned input (a copy) hides the route for a call; one that is made every call, for good."""
    part, stats = _part(_partition_fn([]), static={1})
    compiled, through_wrappers = _wrapped(part, inputs=lambda args: [args[1].clone(), args[0]])
    call, paths = _lean(part, stats, compiled)
    w = torch.full((4,), 2.0)
    for i in range(lean.WATCHED + 2):
        call(w, torch.randn(4))
    assert len(through_wrappers) == lean.WATCHED + 2
    assert paths == ["not lean: a partition input is not one of the graph's arguments (a copy, or a size made in the call)"]


def test_outputs_that_aotautograd_adds_keep_the_wrappers(cpu_graphs):
    """The compiled graph returns a mutated input's new value that AOTAutograd copies back: the graph has
    two outputs, Dynamo gets one."""
    part, stats = _part(_partition_fn([]), static={1})
    compiled, through_wrappers = _wrapped(part)
    call, paths = _lean(part, stats, compiled, outputs=2)
    for i in range(4):
        call(torch.ones(4), torch.randn(4))
    assert len(through_wrappers) == 4 and paths[-1].startswith("not lean: AOTAutograd changes the graph's outputs")


def test_the_lean_path_bumps_a_mutated_inputs_version_and_runs_without_grad(cpu_graphs):
    """As AOTAutograd's wrapper does: autograd must see the write, and nothing the call makes records a
    graph for backward."""
    part, stats = _part(_add_one_then_scale, mutated={1})
    compiled, through_wrappers = _wrapped(part, inputs=lambda args: [args[1], args[0]])
    call, paths = _lean(part, stats, compiled, mutated={1})
    w = torch.zeros(4)
    for i in range(4):
        x = torch.randn(4, requires_grad=True)
        before = w._version
        (y,) = call(w, x.detach())
        assert w._version > before and not y.requires_grad
        torch.testing.assert_close(y, x.detach() * (i + 1))
        del y
    assert paths == ["lean"] and len(through_wrappers) == 1


def test_calls_under_autocast_or_with_a_misaligned_input_take_the_wrappers(cpu_graphs):
    part, stats = _part(_partition_fn([]), static={1})
    compiled, through_wrappers = _wrapped(part)
    call, paths = _lean(part, stats, compiled, check={0})
    w = torch.full((4,), 2.0)
    call(w, torch.randn(4))
    assert paths == ["lean"]
    with torch.autocast("cpu"):
        call(w, torch.randn(4))
    x = torch.randn(5)[1:]  # 4 bytes past an aligned address
    torch.testing.assert_close(call(w, x)[0], x * w + 1)
    assert len(through_wrappers) == 3
    call(w, torch.randn(4))
    assert len(through_wrappers) == 3


def test_threads_whose_first_calls_come_together_each_get_their_own_result(cpu_graphs):
    """A server's threads call the model before any call was watched (the corpus's
    threads_sharing_a_model): one thread's watch must not take in another's call or end while read."""
    import threading
    import time

    part, stats = _part(_partition_fn([]), static={1})

    def compiled(*args):
        result = list(part([args[1], args[0]]))
        time.sleep(0.01)  # the wrappers' own work, where another thread's call comes in
        return result

    call, paths = _lean(part, stats, compiled)
    w = torch.full((4,), 2.0)
    start, errors, wrong = threading.Barrier(4), [], []

    def serve(seed):
        start.wait()
        try:
            for k in range(5):
                x = torch.full((4,), float(seed * 10 + k))
                (y,) = call(w, x)
                wrong.append(not torch.equal(y, x * w + 1))
                del y
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(wrong) == 20 and not any(wrong)
    assert paths == ["lean"]


def test_a_size_that_dynamo_passes_in_its_graph_inputs_place_goes_straight_to_the_partition(cpu_graphs):
    """Dynamo calls f(n, x, w) of a dynamic-shape graph; the compiled graph passes its int input 0 on
    to the partition after the tensors, as Inductor's generated call does (`s77 = arg0_1`)."""
    part, stats = _part(_scaled_rows, static={1})
    compiled, through_wrappers = _wrapped(part, inputs=lambda args: [args[1], args[2], args[0]])
    call, paths = _lean(part, stats, compiled, graph_inputs=(1, 2, 0))
    w = torch.full((4,), 2.0)
    for n in (3, 5, 3, 5, 2, 3):
        x = torch.randn(6, 4)
        (y,) = call(n, x, w)
        torch.testing.assert_close(y, x[:n] * w)
        del y
    assert paths == ["lean"] and len(through_wrappers) == 1


@pytest.mark.parametrize("size, places", [
    (lambda args: args[0] - 1, (1, 2, 0)),  # made in the call from the int: not the argument's value
    (lambda args: args[0], (1, 2, None)),  # bound otherwise in the generated call
    (lambda args: args[0], (2, 1, 0)),  # the graph's inputs lie otherwise than Dynamo's arguments
    (lambda args: args[0], ()),  # not known
])
def test_a_size_not_shown_to_be_the_argument_in_its_place_keeps_the_wrappers(cpu_graphs, size, places):
    part, stats = _part(_scaled_rows, static={1})
    compiled, through_wrappers = _wrapped(part, inputs=lambda args: [args[1], args[2], size(args)])
    call, paths = _lean(part, stats, compiled, graph_inputs=places)
    w = torch.full((4,), 2.0)
    for n in range(2, lean.WATCHED + 4):
        x = torch.randn(8, 4)
        torch.testing.assert_close(call(n, x, w)[0], x[:size((n,))] * w)
    assert len(through_wrappers) == lean.WATCHED + 2
    assert paths == ["not lean: a partition input is not one of the graph's arguments (a copy, or a size made in the call)"]
