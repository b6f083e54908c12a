"""Tensor parallelism on the CPU: two processes over gloo compute what one process computes alone."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from experiments import tp, workloads
from experiments.task import Task
from grace import scg

pytestmark = pytest.mark.slow  # a process per rank


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
    assert r.numerics.passed and r.median_ms > 0 and r.key.tp == 2
    # each rank's own median is kept too; each iteration's slowest rank is never faster than any rank
    assert len(r.rank_median_ms) == 2 and r.median_ms >= max(r.rank_median_ms) > 0


def _decide_on_rank(rank: int, world: int, init: str, results):
    """SCG on one rank of two whose partition holds a collective: rank 0's own prediction is clear (a graph
    by far: 50 launches), rank 1's is not (GPU-bound), each rank's timings differ, and only rank 0 has PI's
    candidate."""
    import datetime

    import torch.distributed._functional_collectives as funcol
    from torch.fx.experimental.proxy_tensor import make_fx

    from grace import scg
    from grace.snapshot import Snapshot
    from grace.torch_adapter import collective_group

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))  # a rank left waiting fails, not hangs
    try:
        group = collective_group(make_fx(lambda t: funcol.all_reduce(t * 2, "sum", dist.group.WORLD))(torch.ones(2)))
        alone = collective_group(make_fx(lambda t: t * 2)(torch.ones(2)))
        costs = scg.Costs(kernels=50 if rank == 0 else 2, launch_us=10.0, replay_us=15.0, copy_bytes=0,
                          copy_bytes_per_us=2000.0, copies=0, gpu_us=0.0 if rank == 0 else 2000.0)
        # rank 0 also has PI's candidate, fastest there; rank 1 has not (its PI was off): no rank times it
        mine = {"graph": 1.0, "graph_pi": 0.5, "eager": 2.0} if rank == 0 else {"graph": 3.0, "eager": 2.0}
        timed = []

        def timer(name, run):  # each run of the partition joins its collective, as the real one would
            run()
            timed.append(name)
            return mine[name]

        d = scg.decide(costs, dict.fromkeys(mine, lambda: dist.all_reduce(torch.ones(1))), timer, Snapshot([]),
                       scg.slowest_rank(group))
        results[rank] = (group is not None and dist.get_world_size(group) == world, alone, d.choice,
                         d.predicted_us, d.rounds_us, len(timed))
    finally:
        dist.destroy_process_group()


def test_scg_ranks_of_a_partition_with_collectives_decide_together(tmp_path):
    """Decided apart, rank 0 would take its clear prediction at once while rank 1 timed its candidates,
    waiting in the first collective for a peer that never comes.
    Together, both time the candidates, each number the slower rank's, and both choose the same."""
    world = 2
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_decide_on_rank, args=(world, f"file://{tmp_path / 'init'}", results), nprocs=world)
        results = dict(results)
    assert results[0] == results[1]
    found, alone, choice, predicted, rounds, timed = results[0]
    assert found and alone is None  # the group is read from the graph's collectives; none: no group
    assert predicted == {"graph": 2000.0, "eager": 2000.0}  # each the slower rank's: rank 1's GPU-bound one
    assert rounds == {"graph": [3.0] * scg.ROUNDS, "eager": [2.0] * scg.ROUNDS} and timed == 2 * scg.ROUNDS
    assert choice == "eager"  # rank 1's timings: rank 0's own would have kept the graph


def test_allreduce_latency_records_a_time_per_size_for_two_ranks():
    """scripts/allreduce_latency.py on two CPU processes (gloo): one record per size, with the launched
    all-reduces timed in every round (a graph's replay needs CUDA)."""
    from scripts import allreduce_latency

    records = allreduce_latency.run(2, calls=3, rounds=2, sizes=[8 << 10, 64 << 10])
    assert [r["bytes"] for r in records] == [8 << 10, 64 << 10]
    for r in records:
        assert set(r["us_per_call_by_round"]) == {"launched"} and len(r["us_per_call_by_round"]["launched"]) == 2
        assert r["median_us_per_call"]["launched"] > 0 and r["ranks"] == 2 and r["env"]["torch"]
