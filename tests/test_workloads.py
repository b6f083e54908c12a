from pathlib import Path

import pytest
import torch
import yaml

from experiments import workloads
from experiments.task import Task

CONF = Path(__file__).resolve().parent.parent / "conf" / "workload"
CASES = [(name, mode) for name in workloads.names() for mode in workloads.get(name).batch_sizes]


@pytest.mark.parametrize("name,mode", CASES)
def test_builds_and_runs_eager_at_tiny_size(name, mode):
    task = Task(workloads.get(name)(mode, size="tiny"), seed=0)
    out = task.step(task.model)
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    assert leaves and all(torch.isfinite(t.float()).all() for t in leaves)
    if mode == "eval":
        assert all(p.dtype == task.compute_dtype for p in task.model.parameters())


@pytest.mark.parametrize("name", [n for n, m in CASES if m == "train"])
def test_train_step_updates_every_weight(name):
    task = Task(workloads.get(name)("train", size="tiny"), seed=0)
    before = [p.detach().clone() for p in task.model.parameters()]
    task.step(task.model)
    changed = [not torch.equal(b, p) for b, p in zip(before, task.model.parameters())]
    assert all(changed), f"{changed.count(False)} of {len(changed)} parameters did not move"


def test_same_seed_same_weights_and_inputs():
    a, b = (Task(workloads.get("mlp")("eval", size="tiny"), seed=1) for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    assert torch.equal(a.inputs[0], b.inputs[0])


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
    assert task.inputs[1].device.type == "cpu" and task.inputs[1].dim() == 0


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_workload_config_names_a_workload_and_a_supported_mode(path):
    ((label, cfg),) = yaml.safe_load(path.read_text()).items()
    assert label == path.stem
    workloads.get(cfg["name"])(cfg["mode"], cfg["batch"], cfg["size"])
