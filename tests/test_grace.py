"""The grace backend on the CPU: registration, options, fallback with reasons, explain, and CGCT's
passes on FX graphs (the GPU side is in test_grace_cuda.py)."""

import operator
import subprocess
import sys

import pytest
import torch
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


def test_backend_found_through_entry_point_without_import():
    code = ("import sys, torch; m = torch.nn.Linear(2, 2); "
            "torch.compile(m, backend='grace')(torch.randn(1, 2)); print('grace' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO / "tests")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("True")


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


# --- the runtime's decisions, with a partition function that records what it was given -------------

def test_partition_with_cpu_inputs_runs_without_graph_and_says_why():
    calls = []

    def fn(args):
        calls.append(len(args))
        out = args[0] * 2
        args.clear()
        return (out,)

    stats = runtime.Stats(graph=0, backward=False, partition=0)
    part = runtime.PartitionGraph(fn, Partition(0, frozenset(), frozenset()), stats)
    x = torch.ones(4)
    for _ in range(3):
        assert torch.equal(part([x])[0], x * 2)
    assert calls == [1, 1, 1]  # every call ran the partition itself, once
    assert stats.status == "eager" and "CPU tensor" in stats.reason
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
