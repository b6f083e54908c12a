"""On a CUDA GPU: the floor, measured by the harness (a file of its own, so that pytest-xdist's
--dist loadfile runs it beside the module-wide measurement of test_cuda_harness.py)."""

import pytest

pytestmark = pytest.mark.cuda

from tests.conftest import measured  # noqa: E402


def test_the_floor_replays_the_step_whole_and_every_variant_is_timed_over_it(tmp_path):
    records = measured(tmp_path, "workload=[mlp]", "variant=[inductor,grace]", "floor=true", "measure.rounds=6")
    floor = records["mlp", "floor"]
    assert floor.status == "ok" and floor.numerics.passed and floor.floor_method == "replay", floor.reason
    assert floor.kernels.graphs == 1 and floor.kernels.kernels_in_graphs_share == 1
    assert floor.median_ms < records["mlp", "inductor"].median_ms  # launch-bound at tiny size
    for v in ("inductor", "grace"):
        r = records["mlp", v]
        lo, hi = r.over_floor_ci
        assert lo <= r.over_floor <= hi and r.over_floor == r.median_ms / floor.median_ms
    assert floor.over_floor is None


def test_a_step_that_cannot_be_one_graph_has_gpu_time_and_a_synchronize_for_floor(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from experiments import bench
    from experiments.mutation import MEASURE
    from experiments.variants import Variant

    def synchronizes(step, device):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(bench, "capture_whole", synchronizes)
    m = OmegaConf.load(MEASURE)
    spec = bench.Spec("mlp", "eval", None, "tiny", Variant("floor", {"backend": "inductor"}, floor=True), "cuda",
                      0, 2, OmegaConf.to_container(m.tolerance.floor), m.tolerance.multiplier)
    b = bench.Bench(spec)
    reference = str(tmp_path / "reference.pt")
    b.reference(reference)
    setup = b.setup(reference)
    assert setup.floor_method == ("GPU time + empty synchronize (the step is not one CUDA graph: "
                                  "RuntimeError: operation not permitted when stream is capturing)")
    assert b.profile(3).graphs == 0  # the step itself, as it runs
    times = b.time_round(5, 10).times_ms
    assert b._added_ms > 0 and all(t > b._added_ms for t in times)
    b.close()
