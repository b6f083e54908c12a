"""The grace backend on the CPU: registration, options, explain."""

import copy
import subprocess
import sys

import pytest
import torch

import grace
from grace import runtime
from tests.grace.fakes import _mlp, compiled_sgd_steps_match_eager


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


def test_backend_found_through_entry_point_without_import(tmp_path):
    code = ("import sys, torch; m = torch.nn.Linear(2, 2); "
            "torch.compile(m, backend='grace')(torch.randn(1, 2)); print('grace' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
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


def test_an_option_that_is_not_a_bool_is_one_clear_error():
    with pytest.raises(Exception, match=r"grace options are True or False, not \{'scg': 'false'\}"):
        torch.compile(_mlp(), backend="grace", options={"scg": "false"})(torch.randn(1, 8))


def test_options_that_are_not_a_mapping_are_one_clear_error():
    with pytest.raises(Exception, match=r"grace options are a mapping such as \{'pi': False\}, not 'pi'"):
        torch.compile(_mlp(), backend="grace", options="pi")(torch.randn(1, 8))


def test_explain_on_cpu_says_why_nothing_is_captured():
    e = grace.explain(_mlp(), torch.randn(2, 8))
    s = e.summary()
    assert s["graphs"] == 1 and s["partitions"] == 0 and s["replays_per_call"] == 0
    assert s["notes"] == ["forward: no CUDA-graph partition (devices: cpu); runs as compiled"]
    assert "no GPU tensor" in s["cgct"][0]
    assert "graph" in str(e)


def test_the_default_is_graces_three_optimizations_and_explain_says_which_ran():
    assert grace.Options() == grace.Options(cgct=True, pi=True, scg=True)
    s = grace.explain(_mlp(), torch.randn(2, 8), options={"scg": False}).summary()
    assert s["options"] == [{"cgct": True, "pi": True, "scg": False}]


def test_explain_says_why_calls_of_captured_partitions_ran_without_their_graphs():
    from grace.backend import GraphReport, Options
    from grace.explain import Explanation

    held = runtime.Stats(0, False, 0, status="captured", reason="outputs of the previous replays were still held",
                         recorded_for={"first at these sizes": 1, "twin": 1}, kept=2)
    warm = runtime.Stats(0, False, 1, status="captured", recorded_for={"first at these sizes": 1}, kept=1)
    replayed = runtime.Stats(0, True, 2, status="captured", reason="an old reason")
    new_sizes = runtime.Stats(0, True, 3, calls=1)  # called once: still warming up, no reason kept
    e = Explanation([GraphReport(0, Options(), partitions=[held, warm, replayed, new_sizes])],
                    replays_last_call={(0, True, 2): 1},
                    eager_last_call={(0, False, 0): 2, (0, False, 1): 1, (0, True, 3): 1})
    s = e.summary()
    assert s["not_captured"] == ["warm-up: called 1x, not yet twice at the same sizes"]  # was [""]
    assert s["calls_without_graph"] == 4 and s["replays_per_call"] == 1
    assert s["without_graph"] == ["a first call at new sizes, or SCG's choice at these sizes",
                                  "outputs of the previous replays were still held"]
    assert s["recorded_for"] == {"first at these sizes": 2, "twin": 1} and s["recordings_kept"] == 3


def test_importing_grace_pulls_no_pandas(tmp_path):
    code = "import sys, grace; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_a_training_forward_knows_which_partition_outputs_reach_the_caller():
    """A training forward's outputs that AOTAutograd's function returns (not the activations it saves)
    are returned as new tensor objects on each replay (grace.recording): Inductor marks them among the
    graph's outputs, and each partition's output map says which of its own outputs they are."""
    import types

    from grace import torch_adapter as adapter
    from torch._inductor.utils import GraphPartitionMap

    seen = []

    def inner(gm, example_inputs, **kwargs):
        if not kwargs.get("is_inference") and not kwargs.get("is_backward"):
            seen.append((adapter.user_visible_outputs(gm), adapter.graph_outputs(gm)))
        return adapter.compile_fx_inner(gm, example_inputs, **kwargs)

    torch.compiler.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    compiled = torch.compile(model, backend=lambda gm, ex: adapter.compile_fx(gm, ex, inner_compile=inner))
    with adapter.aot_config():  # AOTAutograd's cache would skip the inner compile
        compiled(torch.randn(3, 8)).sum().backward()
    ((visible, outputs),) = seen
    assert visible == {0} and outputs > 1  # the model's output, then what backward needs

    maps = [GraphPartitionMap(0, [0, 1], [[], [0], [3]], []), GraphPartitionMap(1, [None, 2], [[1, 2]], [])]
    fake = types.SimpleNamespace(partition_maps=maps, mutated_input_idxs=[], recursively_apply_fns=lambda fns: None)
    assert [p.returned for p in adapter.partitions(fake, [1], frozenset({0, 2}))] == [{1}, {0}]
    assert [p.returned for p in adapter.partitions(fake, [1], None)] == [None, None]  # not known: all of them
    # torch 2.11 maps each partition output to one graph output, or None (it failed there on the H200)
    maps = [GraphPartitionMap(0, [0, 1], [None, 0, 3], []), GraphPartitionMap(1, [None, 2], [2], [])]
    fake = types.SimpleNamespace(partition_maps=maps, mutated_input_idxs=[], recursively_apply_fns=lambda fns: None)
    assert [p.returned for p in adapter.partitions(fake, [1], frozenset({0, 2}))] == [{1}, {0}]


@pytest.mark.parametrize("options", [{"pi": False, "scg": False}, None])
def test_the_partition_after_a_torch_cond_takes_its_output_list_and_replays_on_either_branch(cpu_partitions, options):
    """Inductor hands the cond's output to the next partition as a list: its tensor, new every call, is
    the partition's input (a key made of it kept every one, and the partition never left warm-up)."""
    def step(x):
        return torch.cond(x.sum() > 0, lambda v: v * 2, lambda v: v - 1, (x,)).sin()

    compiled = torch.compile(step, backend="grace", options=options)
    with torch.no_grad():
        for sign in (1, 1, 1, -1, 1, -1, -1):
            x = sign * torch.rand(8)
            torch.testing.assert_close(compiled(x), step(x))
    parts = grace.REPORTS[-1].partitions
    assert len(parts) == 2 and all(p.status == "captured" and p.replays >= 5 for p in parts), parts


def test_states_collected_over_a_loop_replay_every_step_once_it_repeats(cpu_partitions):
    """An RNN cell in grad mode run over a sequence, every state kept until the step stacks them (the
    corpus's states_collected_over_a_loop): each state is the next call's input while the earlier ones
    are held, so each place in the loop gets a recording reading the state before in place."""
    torch.manual_seed(0)
    cell = torch.nn.GRUCell(8, 8)
    compiled = torch.compile(cell, backend="grace", options={"pi": False, "scg": False})

    def step(f, x):
        h, hs = torch.zeros(4, 8), []
        for t in range(len(x)):
            h = f(x[t], h)
            hs.append(h)
        return torch.stack(hs)

    x = torch.randn(5, 4, 8)
    for _ in range(6):
        torch.testing.assert_close(step(compiled, x), step(cell, x))
    before = {id(p): p.replays for g in grace.REPORTS for p in g.partitions}
    step(compiled, x)
    replayed = sum(p.replays - before[id(p)] for g in grace.REPORTS for p in g.partitions)
    assert replayed == 5, [p for g in grace.REPORTS for p in g.partitions]


def test_explain_passes_keyword_arguments_as_a_huggingface_model_takes_them(cpu_partitions):
    def forward(input_ids, attention_mask=None):
        return (input_ids * attention_mask).float().softmax(-1)

    ids, mask = torch.arange(6).view(2, 3), torch.ones(2, 3, dtype=torch.long)
    with torch.no_grad():
        s = grace.explain(forward, ids, attention_mask=mask, options={"pi": False, "scg": False}).summary()
    assert s["partitions"] == 1 and s["captured"] == 1 and s["replays_per_call"] == 1


def test_a_compiled_optimizer_step_takes_the_lean_path_with_its_parameters_and_state(cpu_partitions):
    """AOTAutograd passes a compiled optimizer step its parameters and momentum buffers ahead of Dynamo's
    arguments (the grads): the lean path passes the same tensors, updates them as eager does, and bumps
    their versions."""
    compiled_sgd_steps_match_eager(_mlp(), _mlp(), [torch.randn(3, 8) for _ in range(6)],
                                   {"pi": False, "scg": False})
    report = grace.REPORTS[-1]
    assert report.call_path == "lean" and report.partitions[0].replays >= 3, report


def _swap_storages(model, opt):  # the same Parameter objects over new memory
    for p in model.parameters():
        p.data = p.data.clone()


def _reload_state(model, opt):  # the optimizer's state tensors replaced by copies
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))


@pytest.mark.parametrize("make, between", [
    (lambda ps: torch.optim.Adam(ps, lr=0.01), None),
    (lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True), None),
    (lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5), None),
    (lambda ps: torch.optim.Adam(ps, lr=torch.tensor(0.01)),
     lambda model, opt: [g["lr"].mul_(0.5) for g in opt.param_groups]),  # a schedule of a tensor lr
    (lambda ps: torch.optim.Adam(ps, lr=0.01), _swap_storages),
    (lambda ps: torch.optim.Adam(ps, lr=0.01), _reload_state),
], ids=["adam", "adamw_amsgrad", "rmsprop", "tensor_lr_scheduled", "storages_swapped", "state_reloaded"])
def test_a_compiled_optimizer_step_on_the_lean_path_matches_eager_as_its_inputs_change(cpu_partitions, make, between):
    """The lean path reads the parameters and the optimizer's state from the objects AOTAutograd would
    pass, on each call: whatever the optimizer keeps, and whatever the user changes between steps (after
    the third), the step computes what eager does."""
    model, twin = _mlp(), _mlp()
    twin.load_state_dict(model.state_dict())
    opt, opt_twin = make(list(model.parameters())), make(list(twin.parameters()))
    step = torch.compile(opt.step, backend="grace", options={"pi": False, "scg": False})
    for i in range(7):
        x = torch.randn(3, 8)
        for m in (model, twin):
            m.zero_grad()
            m(x).square().mean().backward()
        step()
        opt_twin.step()
        if between is not None and i == 2:
            between(model, opt)
            between(twin, opt_twin)
        for p, q in zip(model.parameters(), twin.parameters()):  # Inductor's fused arithmetic rounds
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)  # otherwise (RMSprop's 1e-5 apart)
            for key, value in opt_twin.state[q].items():
                torch.testing.assert_close(opt.state[p][key], value, rtol=1e-4, atol=1e-5)
    assert grace.REPORTS[-1].call_path == "lean", grace.REPORTS[-1]
    assert sum(s.replays for r in grace.REPORTS for s in r.partitions) >= 3


def test_a_dynamic_shape_graph_takes_the_lean_path_with_its_sizes(cpu_partitions):
    """Dynamo passes a dynamic-shape graph its sizes as int arguments, which Inductor's call hands on to
    the partition: they go straight there too, and each call's sizes are its own."""
    def step(x, w):
        return (x @ w).relu() * x.shape[0] + x.shape[1]

    compiled = torch.compile(step, backend="grace", options={"pi": False, "scg": False}, dynamic=True)
    w = torch.randn(8, 8)
    with torch.no_grad():
        for n in (3, 5, 3, 5, 7, 3, 5):
            x = torch.randn(n, 8)
            torch.testing.assert_close(compiled(x, w), step(x, w))
    report = grace.REPORTS[-1]
    assert report.call_path == "lean" and report.partitions[0].replays >= 3, report


@pytest.mark.parametrize("step", [
    lambda x: (x, x[0], x * 2),  # the input itself and a view of it (the corpus's output_aliases_input)
    lambda x: (x * 2).t()[1:],  # a view of the graph's own result (output_is_a_view)
    lambda x: ((x * 2).view(-1), x.view(-1)[3:], x.sin().unsqueeze(0)),
])
def test_outputs_that_alias_an_input_or_a_result_take_the_lean_path_as_views_of_each_call(cpu_partitions, step):
    """AOTAutograd's wrappers make such outputs again on every call; the lean path does the same from
    the call's own tensors, so an output that views the input still writes through to it."""
    compiled = torch.compile(step, backend="grace", options={"pi": False, "scg": False})
    with torch.no_grad():
        for i in range(6):
            x = torch.randn(6, 4)[i % 2:i % 2 + 4]
            out, expected = compiled(x), step(x)
            torch.testing.assert_close(out, expected)
            for o, e in zip(out if isinstance(out, tuple) else [out], expected if isinstance(expected, tuple) else [expected]):
                assert (o.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()) == (
                    e.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
                assert (o is x) == (e is x)
    report = grace.REPORTS[-1]
    assert report.call_path == "lean" and report.partitions[0].replays >= 3, report


def test_the_sizes_a_partition_takes_are_read_from_the_call_inductor_generated():
    import types

    from grace import torch_adapter as adapter
    from torch._inductor.utils import GraphPartitionMap

    call = """class Runner:
    def call(self, args):
        arg0_1, arg1_1, arg2_1, arg3_1 = args
        args.clear()
        s77 = arg0_1
        s27 = arg2_1.size(0)
        partition0_args = [arg3_1, arg1_1, s77, s27]
        (buf1,) = self.partitions[0](partition0_args)
        return (buf1, )

runner = Runner(partitions=[partition_0,])
"""
    maps = [GraphPartitionMap(0, [3, 1], [[0]], [])]
    compiled = types.SimpleNamespace(partition_maps=maps, source_code=call)
    assert adapter.partition_inputs(compiled) == (3, 1, 0, None)  # s27 is made in the call
    assert adapter.partition_inputs(types.SimpleNamespace(partition_maps=maps, source_code="")) == (3, 1)
