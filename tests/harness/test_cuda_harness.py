"""On a CUDA GPU: stock CUDA graphs measured through the harness, and what the profiler sees of them."""

import pytest

pytestmark = pytest.mark.cuda

from tests.conftest import measured  # noqa: E402


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    # 3 workloads x 3 variants, measured once for the tests below
    return measured(tmp_path_factory.mktemp("results"), "workload=[mlp,EOS,kv_decode]", "variant=[inductor,pt2_cg,cgct]")


def test_every_variant_ok_and_right(records):
    assert len(records) == 9
    for (w, v), r in records.items():
        assert r.status == "ok", (w, v, r.reason)
        assert r.numerics.passed
        assert r.env["gpu"] and r.env["driver"] and r.env["cuda"]
        visible, host = (int(n) for n in r.env["gpus"].split(" of "))
        assert 1 <= visible <= host
        assert r.kernels.gpu_kernel_ms > 0 and r.kernels.kernels > 0
        assert r.median_ms > r.kernels.gpu_kernel_ms  # wall time sits above the GPU's own time
        assert all(c is not None and c > 0 for c in r.sm_clock_mhz)
        assert r.peak_mem_mb > 0 and r.held_mem_mb > 0  # the model at least, in each


def test_stock_graphs_replay_and_copy_their_inputs(records):
    mlp = records["mlp", "pt2_cg"].kernels
    assert mlp.graphs >= 1 and mlp.kernels_in_graphs_share > 0.5
    assert mlp.graph_input_copy_bytes == 8 * 32 * 2  # one bfloat16 input of 8 x 32, copied each replay
    eos = records["eos_chain", "pt2_cg"].kernels
    assert eos.graph_input_copy_bytes == 3 * 4096 * 4  # three float32 inputs


def test_no_graphs_without_cuda_graphs(records):
    for w in ("mlp", "eos_chain"):
        k = records[w, "inductor"].kernels
        assert k.graphs == 0 and k.kernels_in_graphs_share == 0 and k.graph_input_copy_bytes == 0


def test_stock_skips_a_function_that_mutates_its_input_and_says_why(records):
    r = records["kv_decode", "pt2_cg"]
    assert r.kernels.graphs == 0
    assert r.cudagraph_skips >= 1 and any("mutat" in reason for reason in r.cudagraph_skip_reasons), r.cudagraph_skip_reasons


def test_grace_replays_what_stock_skips_and_records_what_it_did(records):
    kv = records["kv_decode", "cgct"]
    assert kv.grace["partitions"] >= 1 and kv.grace["captured"] == kv.grace["partitions"], kv.grace
    assert kv.kernels.graphs >= 1 and kv.kernels.kernels_in_graphs_share > 0.9
    mlp = records["mlp", "cgct"]
    assert mlp.grace["replays_per_call"] >= 1 and mlp.grace["calls_without_graph"] == 0
    assert mlp.kernels.graph_input_copy_bytes == mlp.grace["bytes_copied_per_call"] == 8 * 32 * 2


def test_rel_err_on_the_gpu_is_the_hosts(monkeypatch):
    """The numerics check compares on the GPU where there is one, host tensors a chunk at a time."""
    import torch

    from experiments import numerics

    torch.manual_seed(0)
    a = [torch.randn(1000, 33), torch.randn(5).to(torch.bfloat16)]
    b = [t + 1e-3 * torch.randn_like(t) for t in a]
    monkeypatch.setattr(numerics, "CHUNK", 4096)
    on_gpu = numerics._rel_err(a, b)
    monkeypatch.setattr(numerics, "_device", lambda: torch.device("cpu"))
    assert on_gpu == pytest.approx(numerics._rel_err(a, b), rel=1e-12)


def test_records_say_whether_inductor_padded_a_misaligned_gemm(tmp_path):
    """Inductor pads a GEMM with a misaligned dim (here K = 4097, bfloat16) when a benchmark at compile time
    finds the padded one 1.1x faster; what it chose, and the unpadded time it measured, reach the records
    (Bench.diagnostics) from its local benchmark cache."""
    import torch
    from torch._inductor.utils import fresh_cache

    from experiments.instrument import shape_padding_choices

    # a cold cache, so the decision is made here: fresh_cache also forgets the cache's path, which Inductor
    # keeps from the process's first compile (else another compile's choices are read with this one's)
    with fresh_cache(dir=str(tmp_path)):
        torch._dynamo.reset()
        a = torch.randn(4096, 4097, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4097, 4096, device="cuda", dtype=torch.bfloat16)
        out = torch.compile(lambda x, y: x @ y)(a, b)
        torch.testing.assert_close(out, a @ b, rtol=2e-2, atol=1.0)
        choices = shape_padding_choices()
    assert len(choices) == 1, choices
    (key, choice), = choices.items()
    assert "4097" in key and isinstance(choice["pad"], bool), choices
    assert choice["unpadded_ms"] > 0, choices
