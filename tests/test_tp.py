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
        model = task.model.float()
        inputs = task.input_sets[0]
        with torch.inference_mode():
            whole = model(**inputs).logits
            split = tp.parallelize(name, model, rank, world, dist.group.WORLD)
            parts = split(**inputs).logits
        heads = [layer.rel_attn.q.shape[1] for layer in split.transformer.layer]
        results[rank] = (whole, parts, heads, split.transformer.layer[0].rel_attn.q.detach().clone())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["xlnet"])
def test_two_ranks_compute_what_one_does(tmp_path, name):
    world = 2
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(world, f"file://{tmp_path / 'init'}", name, results), nprocs=world)
        results = dict(results)
    for rank in range(world):
        whole, parts, heads, _ = results[rank]
        assert heads == [1, 1]  # tiny XLNet: 2 heads, one per rank
        torch.testing.assert_close(parts, whole, rtol=1e-4, atol=1e-5)
    assert not torch.equal(results[0][3], results[1][3])  # each rank holds its own slice


def test_unknown_model_says_which_exist():
    with pytest.raises(NotImplementedError, match="have: xlnet"):
        tp.parallelize("alexnet", torch.nn.Linear(2, 2), 0, 2, None)
