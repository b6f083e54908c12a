"""Tensor parallelism on the CPU: two processes over gloo compute what one process computes alone."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from experiments import tp, workloads
from experiments.task import Task


def _rank(rank: int, world: int, init: str, name: str, results):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        task = Task(workloads.get(name)("eval", size="tiny"), seed=0)
        model = task.model.double()
        inputs = torch.utils._pytree.tree_map(  # float64: only the order of TP's sums differs
            lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, task.input_sets[0])
        with torch.inference_mode():
            whole = _floats(_call(model, inputs))
            sizes_before = _sizes(model)
            split = tp.parallelize(name, model, rank, world, dist.group.WORLD)
            parts = _floats(_call(split, inputs))
        results[rank] = (whole, parts, sizes_before, _sizes(split))
    finally:
        dist.destroy_process_group()


def _call(model, inputs):
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def _floats(out):
    """The floating outputs (logits, boxes, scores, masks), as float64 on the CPU."""
    if hasattr(out, "logits"):
        out = out.logits
    return [t.double() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _sizes(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["xlnet", "speech_transformer", "dalle2", "maskrcnn"])
def test_two_ranks_compute_what_one_does(tmp_path, name):
    world = 2
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(world, f"file://{tmp_path / 'init'}", name, results), nprocs=world)
        results = dict(results)
    for rank in range(world):
        whole, parts, before, after = results[rank]
        assert after < before  # the rank holds slices, not the whole model
        assert len(parts) == len(whole) and all(p.shape == w.shape for p, w in zip(parts, whole))
        for p, w in zip(parts, whole):
            torch.testing.assert_close(p, w, rtol=1e-9, atol=1e-9)


def test_unknown_model_says_which_exist():
    with pytest.raises(NotImplementedError, match="have: xlnet, speech_transformer, dalle2, maskrcnn"):
        tp.parallelize("alexnet", torch.nn.Linear(2, 2), 0, 2, None)


def test_sweep_measures_a_tensor_parallel_workload_against_tp1(make_cfg):
    """XLNet split over two CPU processes (gloo) through the harness: the record says tp=2, and numerics
    compared rank 0's output with the whole model's."""
    from experiments.sweep import Sweep

    sweep = Sweep(make_cfg("workload=[XLNET-I]", "size=tiny", "tp=2", "variant=[inductor]"))
    sweep.run()
    (r,) = sweep.store.load()
    assert (r.workload, r.tp, r.status) == ("xlnet", 2, "ok"), r.reason
    assert r.numerics.passed and r.median_ms > 0 and r.key[-1] == 2
