"""CGCT on FX graphs with fake CUDA inputs, the rewired graph then checked on the CPU."""

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx

from grace import cgct
from grace.torch_adapter import fake_propagate


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
    assert "table.to(device(type='cuda', index=0), non_blocking = True)" in code
    assert all(n.meta["val"].device == GPU for n in gm.graph.nodes if n.op == "call_function")
    # the rewired graph computes what the original does (devices put back to the CPU to run it here)
    x = torch.randn(4)
    expected = _schedule_graph()(x, table)
    torch.testing.assert_close(_retarget(gm, torch.device("cpu"))(x, table), expected)


def test_the_inputs_cgct_copies_to_the_gpu_are_known_by_position():
    gm = _schedule_graph()
    assert cgct.cpu_inputs.moved(gm) == []
    cgct.apply(gm, [_fake_gpu(4), torch.linspace(0.1, 1.0, 10)])
    assert cgct.cpu_inputs.moved(gm) == [1]  # table, the second input


def test_a_moved_input_in_pinned_memory_is_handed_over_as_a_pageable_copy(monkeypatch):
    """A non-blocking copy from pinned memory reads it when the stream gets there, after the call may have
    returned; a copy of the input, made before the call, keeps the caller's later writes out of it. An
    expanded input, whose copy would have other strides, goes as it is and the call waits for the stream."""
    pinned = set()
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: id(t) in pinned)
    waited = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {
        "synchronize": lambda self: waited.append(device)})())
    seen = []
    call = cgct.cpu_inputs.PinnedCopied(lambda *args: seen.append(args) or "out", [1], GPU)
    x, table = torch.randn(4), torch.linspace(0.1, 1.0, 10)
    assert call(x, table) == "out" and seen[-1][1] is table and not waited  # pageable: as given
    pinned.add(id(table))
    assert call(x, table) == "out"
    assert seen[-1][0] is x and seen[-1][1] is not table and torch.equal(seen[-1][1], table) and not waited
    expanded = torch.ones(1).expand(10)
    pinned.add(id(expanded))
    call(x, expanded)
    assert seen[-1][1] is expanded and waited == [GPU]


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


@pytest.mark.parametrize("make", [lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                                  lambda ps: torch.optim.Adam(ps, lr=0.1)], ids=["sgd_momentum", "adam"])
def test_fake_propagation_follows_an_optimizer_steps_state(make):
    """A compiled optimizer step (the harness compiles it in training): Dynamo hands the backend the
    parameters and the optimizer's state as real tensors held by the graph module, not as fake inputs,
    and Dynamo's fake mode refused them; CGCT was not run on any training workload's optimizer graph
    ("the graph cannot be propagated with fake tensors (AssertionError)")."""
    propagated = []

    def propagating(gm, example_inputs):
        fake_propagate(gm, example_inputs)  # raising here fails the compile, and the test
        propagated.append(all("val" in n.meta for n in gm.graph.nodes if n.op == "call_function"))
        return gm.forward

    def two_steps(backend):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        step = torch.compile(make(model.parameters()).step, backend=backend)
        for _ in range(2):  # the first step makes the optimizer's state, the second reads it
            model(torch.randn(2, 4)).sum().backward()
            step()
        return list(model.parameters())

    after = two_steps(propagating)
    assert propagated and all(propagated)
    # propagation faked the module's real tensors, and updated none of them
    assert all(torch.equal(a, b) for a, b in zip(after, two_steps(lambda gm, _: gm.forward)))


def _grid_graph() -> fx.GraphModule:
    """What Dynamo hands the backend for RAFT's correlation lookup (torchvision): a grid of offsets made
    on the CPU through torch.meshgrid, whose parts Dynamo takes apart with getitem:

        def step(x):                       # x on the GPU
            d = torch.linspace(-1, 1, 3)
            grid = torch.stack(torch.meshgrid(d, d, indexing="ij"), dim=-1).to(x.device)
            return x + grid.sum()
    """
    g = fx.Graph()
    x = g.placeholder("x")
    d = g.call_function(torch.linspace, (-1, 1, 3))
    grid = g.call_function(torch.meshgrid, (d, d), {"indexing": "ij"})
    parts = [g.call_function(operator.getitem, (grid, i)) for i in range(2)]
    stacked = g.call_function(torch.stack, (parts,), {"dim": -1})
    moved = g.call_method("to", (stacked, GPU))
    g.output((g.call_function(operator.add, (x, g.call_method("sum", (moved,)))),))
    return fx.GraphModule(torch.nn.Module(), g)


def test_cgct_moves_a_factory_whose_tensor_is_split_before_it_feeds_gpu_work():
    gm = _grid_graph()
    notes = cgct.apply(gm, [_fake_gpu(4)])
    assert notes == ["cpu_factories: 1 CPU tensor factories now create on cuda:0"], notes
    assert all(n.meta["val"].device == GPU for n in gm.graph.nodes
               if n.op == "call_function" and isinstance(n.meta["val"], torch.Tensor))
    x = torch.randn(4)
    torch.testing.assert_close(_retarget(gm, torch.device("cpu"))(x), _retarget(_grid_graph(), torch.device("cpu"))(x))


def test_cgct_leaves_a_split_tensor_when_one_part_leaves_the_gpu_work():
    gm = _grid_graph()
    grid = next(n for n in gm.graph.nodes if n.target is torch.meshgrid)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        part = gm.graph.call_function(operator.getitem, (grid, 0))
    out.args = ((out.args[0][0], part),)  # one part of the CPU grid is an output: it must stay on the CPU
    gm.recompile()
    before = gm.code
    assert cgct.apply(gm, [_fake_gpu(4)]) == []
    assert gm.code == before
