"""GraCE never crashes a program Inductor runs: a failure in any stage falls back to the next safer
setting, and the reason shows in grace.explain. Each test injects a failure into one stage."""

import math

import pytest
import torch
from torch._guards import detect_fake_mode

import grace
from grace import backend, cgct, pi, recording, runtime, scg
from grace import torch_adapter as adapter
from grace.torch_adapter import Partition
from tests.grace.fakes import _part, _partition_fn


@pytest.fixture(autouse=True)
def fresh_compiles():
    torch.compiler.reset()  # a compiled frame of an earlier test would be reused, its backend never called
    yield
    torch.compiler.reset()


class Denoiser(torch.nn.Module):
    """A diffusion-style step: the timestep is a Python int, its embedding made on the CPU."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x, t):
        freqs = torch.exp(-math.log(10000) * torch.arange(8) / 8)
        args = torch.tensor([float(t)]) * freqs
        return self.lin(x + torch.cat([args.sin(), args.cos()]).to(x.device))


def _steps(compiled, model, steps=(3, 5, 7, 9)):
    x = torch.randn(2, 16)
    for t in steps:
        torch.testing.assert_close(compiled(x, t), model(x, t))


def _dynamo_graph():
    """Dynamo's graph of the denoiser once the timestep is symbolic, with GPU stand-ins (fake tensors) as inputs."""
    graphs = []
    model = Denoiser()
    compiled = torch.compile(model, backend=lambda gm, ex: graphs.append((gm, ex)) or gm.forward)
    for t in (3, 4, 5):
        compiled(torch.randn(2, 16), t)
    gm, example = graphs[-1]
    mode = detect_fake_mode([n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"])
    with mode:
        inputs = [e if not isinstance(e, torch.Tensor) else torch.empty(e.shape, device="cuda") for e in example]
    for node in gm.graph.nodes:  # x.device, as traced on a GPU
        if node.op == "call_method" and node.target == "to":
            node.args = (node.args[0], torch.device("cuda:0"))
    gm.recompile()
    return gm, inputs


def test_cgct_copies_a_run_time_value_to_the_gpu_where_it_is_made():
    gm, inputs = _dynamo_graph()
    assert isinstance(inputs[0], torch.SymInt)
    notes = cgct.apply(gm, inputs)
    assert notes == ["cpu_factories: 1 CPU tensor factories now create on cuda:0; "
                     "1 CPU tensors of run-time values copied to cuda:0 where made"], notes
    tensor = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target in cgct.cpu_factories.VALUE_FACTORIES)
    (to,) = tensor.users
    assert to.target == "to" and to.args[1] == torch.device("cuda:0")
    # every op after the copy computes on the GPU
    assert all(n.meta["val"].device.type == "cuda" for n in to.users)
    assert all(hasattr(n, "_dynamo_source") for n in gm.graph.nodes if n.op == "placeholder")


def _raises(*args, **kwargs):
    raise RuntimeError("injected")


def test_an_undone_cgct_pass_keeps_dynamos_node_attributes(monkeypatch):
    """The crash of a user's diffusion model: a pass undone lost each placeholder's _dynamo_source, and
    AOTAutograd asserted on it."""
    monkeypatch.setattr(cgct, "compute_device", lambda inputs: torch.device("cpu"))  # CGCT runs on the CPU
    monkeypatch.setattr(cgct, "PASSES", {"broken": _raises, **cgct.PASSES})
    model = Denoiser()
    start = len(grace.REPORTS)
    _steps(torch.compile(model, backend="grace"), model)
    reports = grace.REPORTS[start:]
    assert reports and all(r.cgct[0] == "broken: undone (RuntimeError: injected)" for r in reports)
    assert not any(r.fallbacks for r in reports)


@pytest.mark.parametrize("stage", ["cgct", "runtime"])
def test_a_failing_stage_falls_back_and_says_why(monkeypatch, stage):
    if stage == "cgct":
        monkeypatch.setattr(cgct, "apply", _raises)
        expected = "without CGCT (CGCT failed): RuntimeError: injected"
    else:
        monkeypatch.setattr(backend, "_inner_compile", _raises)
        expected = "Inductor without GraCE's runtime (compiling with it failed): RuntimeError: injected"
    model = Denoiser()
    start = len(grace.REPORTS)
    _steps(torch.compile(model, backend="grace"), model)
    assert {f for r in grace.REPORTS[start:] for f in r.fallbacks} == {expected}
    with torch.no_grad():
        summary = grace.explain(model, torch.randn(2, 16), 3).summary()
    assert all(expected in f for f in summary["fallbacks"]) and summary["fallbacks"]


def test_a_rewritten_graph_that_fails_to_compile_is_compiled_as_it_came(monkeypatch):
    def rewrites(gm, example_inputs):  # a harmless change, so that there is a rewritten graph to give up
        with gm.graph.inserting_before(next(n for n in gm.graph.nodes if n.op == "output")):
            gm.graph.call_function(torch.zeros, (1,))
        gm.recompile()
        return ["pretend: changed"]

    compiled_once = []

    def fails_once(gm, example_inputs, **kwargs):
        if not compiled_once:
            compiled_once.append(True)
            raise RuntimeError("injected")
        return real(gm, example_inputs, **kwargs)

    real = backend._inner_compile
    monkeypatch.setattr(cgct, "apply", rewrites)
    monkeypatch.setattr(backend, "_inner_compile", fails_once)
    model = Denoiser()
    start = len(grace.REPORTS)
    _steps(torch.compile(model, backend="grace"), model, steps=(3,))
    (report,) = grace.REPORTS[start:]
    assert report.fallbacks == ["without CGCT (compiling the rewritten graph failed): RuntimeError: injected"]
    assert report.cgct == []


def test_dynamos_request_to_trace_again_is_no_failure(monkeypatch):
    """Inductor's scalar pass asks Dynamo to trace again (a float to specialize): on the H200 GraCE took
    that for a failure, fell back twice and logged it; it must reach Dynamo, and leave no report."""
    asked = []

    def restarts_once(gm, example_inputs, **kwargs):
        if not asked:
            asked.append(True)
            raise adapter.DynamoRestart()
        return real(gm, example_inputs, **kwargs)

    real = backend._inner_compile
    monkeypatch.setattr(backend, "_inner_compile", restarts_once)
    model = Denoiser()
    start = len(grace.REPORTS)
    _steps(torch.compile(model, backend="grace"), model, steps=(3,))
    assert asked
    assert [r.fallbacks for r in grace.REPORTS[start:]] == [[]]


def _run_right(calls: int, **settings):
    """A partition (y = x * w + 1, w static) with `settings`, called `calls` times on new inputs, each
    call's result checked; its Stats."""
    part, stats = _part(_partition_fn([]), static={1})
    for name, value in settings.items():
        setattr(part, name, value)
    w = torch.full((4,), 2.0)
    for _ in range(calls):
        x = torch.randn(4)
        (y,) = part([x, w])
        torch.testing.assert_close(y, x * w + 1)
    return stats


def test_a_failing_pi_leaves_the_partition_on_copies_and_right(cpu_graphs, monkeypatch):
    monkeypatch.setattr(pi, "check", _raises)
    stats = _run_right(4, pi=True)
    assert stats.status == "captured" and stats.replays == 3 and stats.copied_inputs == 1
    assert stats.pi_reasons == ["PI failed, inputs copied instead: RuntimeError: injected"]


def test_a_failing_scg_keeps_the_graph_and_says_why(cpu_graphs, monkeypatch):
    monkeypatch.setattr(scg, "timer", _raises)
    stats = _run_right(3, scg=True)
    assert stats.status == "captured" and stats.replays == 2
    assert stats.scg["choice"] == "graph" and stats.scg["error"] == "SCG failed, graph kept: RuntimeError: injected"


def test_an_error_in_the_runtimes_own_logic_runs_the_partition_as_compiled(cpu_graphs, monkeypatch):
    monkeypatch.setattr(runtime.PartitionGraph, "_here", _raises)
    stats = _run_right(3)
    assert stats.status == "eager" and stats.reason == "GraCE runtime error: RuntimeError: injected"


def test_an_error_of_the_partition_itself_reaches_the_caller(cpu_graphs):
    def fails(args):
        args.clear()
        raise ValueError("the program's own error")

    part, _ = _part(fails)
    with pytest.raises(ValueError, match="the program's own error"):
        part([torch.randn(4)])


def _writes_its_input(seen):
    """A partition that computes into an intermediate it was handed (not a parameter, not a mutated graph
    input), as Inductor may do in place."""
    def fn(args):
        x, w = args
        args.clear()
        seen.append(float(x[0]))
        x.add_(1)
        return (x * w,)
    return fn


@pytest.mark.parametrize("produced", [None, {0}])  # x's origin unknown, or known to be an intermediate
@pytest.mark.parametrize("options", [{"scg": True}, {"pi": True}, {"scg": True, "pi": True}])
def test_extra_runs_for_pi_and_scg_start_from_the_calls_own_state(cpu_graphs, monkeypatch, options, produced):
    """SCG's timings and PI's check run a partition several times for one call: each run must see the
    inputs as the call has them (a static-cache generate hit an index out of bounds otherwise)."""
    def timer(name, run):
        run(), run()
        return 1.0 if name == "graph" else 2.0

    monkeypatch.setattr(scg, "timer", timer)
    placeholder = recording.placeholder  # zeroed: the stand-in capture runs the partition on it (CUDA's does not)
    monkeypatch.setattr(recording, "placeholder", lambda t: placeholder(t).zero_())
    seen = []
    part, stats = _part(_writes_its_input(seen), static={1}, produced=produced)
    for name, value in options.items():
        setattr(part, name, value)
    w = torch.full((4,), 2.0)
    for call in range(3):
        x = torch.zeros(4)
        seen.clear()
        (y,) = part([x, w])
        torch.testing.assert_close(y, torch.full((4,), 2.0))
        assert set(seen) <= {0.0}, (call, seen)  # every run, timed or not, saw the call's x
        del y


def test_what_a_run_may_write_is_what_it_mutates_and_the_intermediates():
    """Only those are put back before each extra run: a graph input Inductor does not report as mutated is
    never written, and restoring it (16 MiB inputs in EOS) would weigh on SCG's timings."""
    assert Partition(0, frozenset({1}), frozenset({2}), frozenset({3})).writable(5) == {2, 3}
    assert Partition(0, frozenset({1}), frozenset({2})).writable(4) == {0, 2, 3}  # intermediates unknown
