import math

import pytest
import torch

from experiments.numerics import check, compare
from experiments.task import Task
from experiments.workloads import get
from experiments.instrument import pytree

FLOORS = {"bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-6}


def _three(workload: str, mode: str):
    task = Task(get(workload)(mode, size="tiny"), seed=0)
    eager, ref = task.twin(), task.twin(torch.float64)
    return task, eager.observe(eager.target), ref.observe(ref.target)


@pytest.mark.parametrize("workload,mode", [("mlp", "eval"), ("mlp", "train"), ("eos_chain", "eval")])
def test_eager_passes_against_float64(workload, mode):
    task, eager, ref = _three(workload, mode)
    n = check(task.observe(task.target), eager, ref, task.compute_dtype, FLOORS, 3.0)
    assert n.passed, n
    assert 0 < n.rel_err == n.eager_rel_err < n.tolerance
    assert n.part in (("outputs",) if mode == "eval" else ("loss", "gradients", "update"))


def test_wrong_output_is_flagged():
    task, eager, ref = _three("mlp", "eval")
    wrong = {"outputs": task.observe(task.target)["outputs"] * 1.1}
    n = check(wrong, eager, ref, task.compute_dtype, FLOORS, 3.0)
    assert not n.passed and n.rel_err > n.tolerance and n.part == "outputs"


def test_wrong_gradient_is_flagged():
    task, eager, ref = _three("mlp", "train")
    observed = task.observe(task.target)
    observed["gradients"][0] += observed["gradients"][0].abs().max()
    n = check(observed, eager, ref, task.compute_dtype, FLOORS, 3.0)
    assert not n.passed and n.part == "gradients" and "failed: gradients" in n.detail


def test_a_wrong_loss_is_flagged_even_where_gradients_are_noisy():
    """Tiny ResNet-18's bf16 gradients are far from float64 even in eager (a loose yardstick for the
    gradients); the loss is held to its own, tight one."""
    task, eager, ref = _three("resnet18", "train")
    observed = task.observe(task.target)
    assert check(observed, eager, ref, task.compute_dtype, FLOORS, 3.0).passed
    observed["loss"] = observed["loss"] * 1.5
    n = check(observed, eager, ref, task.compute_dtype, FLOORS, 3.0)
    assert not n.passed and n.part == "loss"
    # lumped together with the gradients, the same wrong loss would have passed
    lumped = compare(list(observed.values()), list(eager.values()), list(ref.values()), task.compute_dtype, FLOORS, 3.0)
    assert lumped.passed


def test_nan_never_passes():
    out = torch.tensor([1.0, float("nan")])
    n = compare(out, torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0], dtype=torch.float64), torch.float32, FLOORS, 3.0)
    assert not n.passed and math.isnan(n.rel_err) and math.isnan(n.max_abs_err)


def test_shape_or_structure_mismatch_fails():
    ref = torch.ones(4, dtype=torch.float64)
    assert not compare(torch.ones(5), torch.ones(4), ref, torch.float32, FLOORS, 3.0).passed
    assert not compare((torch.ones(4),), torch.ones(4), ref, torch.float32, FLOORS, 3.0).passed


def test_integer_outputs_equal_float64_wherever_eager_does():
    ref = (torch.ones(2, dtype=torch.float64), torch.tensor([1, 2]))
    ok = compare((torch.ones(2), torch.tensor([1, 2])), (torch.ones(2), torch.tensor([1, 2])), ref, torch.float32, FLOORS, 3.0)
    bad = compare((torch.ones(2), torch.tensor([1, 3])), (torch.ones(2), torch.tensor([1, 2])), ref, torch.float32, FLOORS, 3.0)
    assert ok.passed and not bad.passed and bad.detail


def test_integer_outputs_judged_by_eager_share_where_eager_itself_flips():
    # a detector's labels: eager already differs from float64 in 1 of 10 places (near-tie in NMS/top-k)
    ref = (torch.ones(2, dtype=torch.float64), torch.arange(10))
    eager = (torch.ones(2), torch.arange(10).index_put((torch.tensor([0]),), torch.tensor(9)))
    flips = lambda k: (torch.ones(2), torch.arange(10).index_put((torch.arange(k),), torch.full((k,), 9)))
    assert compare(flips(3), eager, ref, torch.float32, FLOORS, 3.0).passed  # 30 % <= 3 x 10 %
    bad = compare(flips(4), eager, ref, torch.float32, FLOORS, 3.0)
    assert not bad.passed and "40.0% differ" in bad.detail


@pytest.mark.parametrize("workload,mode", [("mlp", "train"), ("kv_decode", "eval")])
def test_a_rewound_task_takes_the_first_step_again(workload, mode):
    """The check's step starts where the reference's did: weights, optimizer state and inputs (a KV cache
    the model writes) back as built, in the same tensors."""
    task = Task(get(workload)(mode, size="tiny"), seed=0)
    task.keep_initial()
    first = task.observe(task.target)
    tensors = task._changeable()
    for _ in range(3):
        task.step(task.target)
    with torch.no_grad():  # whatever a step may change (this KV cache step writes the same slot again)
        for t in tensors:
            if t.is_floating_point():
                t.add_(1)
    task.rewind()
    assert all(a is b for a, b in zip(task._changeable(), tensors))
    again = task.observe(task.target)
    for part in first:
        for a, b in zip(pytree.tree_leaves(first[part]), pytree.tree_leaves(again[part])):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_rel_err_a_chunk_at_a_time_is_the_whole_computation(monkeypatch):
    from experiments import numerics

    torch.manual_seed(0)
    a = [torch.randn(7, 5), torch.randn(3), torch.randn(())]
    b = [t + 1e-3 * torch.randn_like(t) for t in a]
    whole = numerics._rel_err(a, b)
    monkeypatch.setattr(numerics, "CHUNK", 4)  # 9 chunks for the first tensor, the last one short
    assert numerics._rel_err(a, b) == pytest.approx(whole, rel=1e-12)
    a[0][6, 4] = float("nan")  # in the last chunk
    assert math.isnan(numerics._rel_err(a, b)[1])


@pytest.mark.parametrize("workload, once", [("mlp", True), ("kv_decode", False)])
def test_the_reference_keeps_a_repeated_first_step_once(tmp_path, workload, once):
    """An eval step on one input set that leaves its inputs as they were is computed again by the second
    step: the reference keeps it once (XLNet's logits at batch 128 take 17 GB in float64). A KV-cache step
    writes its cache: its second step is taken."""
    from experiments.bench import Bench, Spec
    from experiments.variants import Variant

    spec = Spec(workload, "eval", None, "tiny", Variant("eager"), "cpu", 0, 1, FLOORS, 3.0)
    path = tmp_path / "reference.pt"
    Bench(spec).reference(str(path))
    saved = torch.load(path, weights_only=False)
    for steps in (saved["eager"], saved["float64"]):
        assert list(steps) == ["first", "second", "fresh"] and (steps["second"] is steps["first"]) == once
