from pathlib import Path

import pytest
import torch
import yaml

from experiments import workloads
from experiments.task import Task
from experiments.instrument import pytree

CONF = Path(__file__).resolve().parents[2] / "conf" / "workload"
CASES = [(name, mode) for name in workloads.names() for mode in workloads.get(name).batch_sizes]


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", CASES)
def test_builds_and_runs_eager_at_tiny_size(name, mode):
    task = Task(workloads.get(name)(mode, size="tiny"), seed=0)
    task.keep_initial()
    out = task.step(task.target)
    task.rewind()  # as the numerics check does (BERT's expanded input once made it fail)
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    assert leaves and all(torch.isfinite(t.float()).all() for t in leaves)
    if mode == "eval":
        assert all(p.dtype == task.compute_dtype for p in task.model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, m in CASES if m == "train"])
def test_train_step_updates_the_weights_and_draws_no_random_numbers(name):
    """Most weights move (HuggingFace heads carry some the loss does not reach, e.g. unused poolers or
    cross-attention without an encoder); the loss is finite, and the same whatever the random generator's
    state (no dropout: a compiled step's masks would differ from eager's, so numerics could not check it)."""
    task = Task(workloads.get(name)("train", size="tiny"), seed=0)
    twin = task.twin()
    before = [p.detach().clone() for p in task.model.parameters()]
    torch.manual_seed(1)
    loss = task.step(task.target)
    torch.manual_seed(2)
    assert torch.equal(twin.step(twin.target), loss)
    changed = [not torch.equal(b, p) for b, p in zip(before, task.model.parameters())]
    assert torch.isfinite(loss) and sum(changed) >= 0.6 * len(changed), f"{changed.count(False)} of {len(changed)} did not move"


def test_same_seed_same_weights_and_inputs():
    a, b = (Task(workloads.get("mlp")("eval", size="tiny"), seed=1) for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    assert torch.equal(a.input_sets[0][0], b.input_sets[0][0])


def test_unsupported_mode_fails_at_construction():
    with pytest.raises(NotImplementedError, match="eos_chain.*no train mode"):
        workloads.get("eos_chain")("train")


def test_unknown_workload():
    with pytest.raises(workloads.UnknownWorkload, match="unknown workload 'nope'"):
        workloads.get("nope")


def test_default_batch_comes_from_the_workload():
    assert workloads.get("resnet18")("eval").batch == 1
    assert workloads.get("resnet18")("eval", batch=4).batch == 4


def test_cpu_scalar_input_stays_on_the_cpu():
    task = Task(workloads.get("cpu_scalar")("eval", size="tiny"), seed=0)
    assert task.input_sets[0][1].device.type == "cpu" and task.input_sets[0][1].dim() == 0


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_workload_config_names_a_workload_and_a_supported_mode(path):
    ((label, cfg),) = yaml.safe_load(path.read_text()).items()
    assert label == path.stem
    workloads.get(cfg["name"])(cfg["mode"], cfg["batch"], cfg["size"])


def test_the_workloads_page_lists_every_workload():
    page = (CONF.parents[1] / "docs" / "workloads.md").read_text()
    assert [n for n in workloads.names() if f"| `{n}` |" not in page] == []


def test_the_optimizers_state_made_up_front_changes_no_step():
    """Task makes SGD's momentum buffers before the first step (a compiled step would make them in a
    graph pool): its weights after two steps are bit for bit those of SGD making them in its first step."""
    task, plain = (Task(workloads.get("mlp")("train", size="tiny"), seed=0) for _ in range(2))
    assert all("momentum_buffer" in task.optimizer.state[p] for p in task.model.parameters())
    plain.optimizer.state.clear()
    for _ in range(2):
        task.step(task.target)
        plain.step(plain.target)
    assert plain.optimizer.state  # made again, by its first step
    for p, q in zip(plain.model.parameters(), task.model.parameters()):
        assert torch.equal(p, q)


def test_a_training_step_compiles_the_loss_with_the_forward():
    """The paper's harness compiles the whole iteration: a variant compiles the target, which in train
    returns the loss, so that the loss's kernels run in the compiled graph rather than eagerly after it."""
    task = Task(workloads.get("mlp")("train", size="tiny"), seed=0)
    outputs = []

    def backend(gm, example_inputs):
        outputs.append([n.meta["example_value"] for n in gm.graph.find_nodes(op="output")[0].args[0]])
        return gm.forward

    torch._dynamo.reset()
    loss = task.step(torch.compile(task.target, backend=backend))
    assert loss.dim() == 0 and len(outputs) == 1 and [v.dim() for v in outputs[0]] == [0]
    evaluated = Task(workloads.get("mlp")("eval", size="tiny"), seed=0)
    assert evaluated.target is evaluated.model
