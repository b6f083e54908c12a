import torch

from experiments.profiling import kernel_stats
from experiments.instrument import count_graph_input_copies


def _ev(cat, name, corr, dur=0.0):
    return {"cat": cat, "name": name, "dur": dur, "args": {"correlation": corr}}


def test_kernel_stats_from_a_trace():
    events = [
        # iteration 1: one graph replay of 3 kernels, one kernel launched alone, one input copy (memcpy)
        _ev("cuda_runtime", "cudaGraphLaunch", 1), *[_ev("kernel", "k", 1, 10.0) for _ in range(3)],
        _ev("cuda_runtime", "cudaLaunchKernel", 2), _ev("kernel", "k", 2, 20.0), _ev("gpu_memcpy", "copy", 3, 5.0),
        # iteration 2: the same
        _ev("cuda_runtime", "cudaGraphLaunch", 4), *[_ev("kernel", "k", 4, 10.0) for _ in range(3)],
        _ev("cuda_runtime", "cudaLaunchKernel", 5), _ev("kernel", "k", 5, 20.0), _ev("gpu_memcpy", "copy", 6, 5.0),
        _ev("cpu_op", "aten::add", None, 1000.0),
    ]
    s = kernel_stats(events, iters=2, copy_bytes=1024, cuda=True)
    assert s.kernels == 4.0
    assert s.graphs == 1.0
    assert s.kernels_in_graphs_share == 0.75
    assert s.gpu_kernel_ms == (3 * 10 + 20 + 5) / 1e3
    assert s.graph_input_copy_bytes == 512.0
    # where the time went, per iteration: the same kernel inside and outside graphs kept apart
    assert s.top == [{"name": "k", "in_graph": True, "launches": 3.0, "us": 30.0},
                     {"name": "k", "in_graph": False, "launches": 1.0, "us": 20.0},
                     {"name": "copy", "in_graph": False, "launches": 1.0, "us": 5.0}]


def test_kernel_stats_without_cuda():
    s = kernel_stats([], iters=4, copy_bytes=0, cuda=False)
    assert (s.kernels, s.graphs, s.gpu_kernel_ms, s.kernels_in_graphs_share) == (None, None, None, None)
    assert s.graph_input_copy_bytes == 0.0


def test_input_copies_are_counted_in_bytes_and_restored():
    original = torch._foreach_copy_
    dst = [torch.zeros(4, 4), torch.zeros(3, dtype=torch.bfloat16)]
    src = [torch.ones(4, 4), torch.ones(3, dtype=torch.bfloat16)]
    with count_graph_input_copies() as copied:
        torch._foreach_copy_(dst, src)
        torch._foreach_copy_(dst[:1], src[:1])
    assert copied[0] == 2 * 16 * 4 + 3 * 2
    assert torch.equal(dst[0], src[0]) and torch.equal(dst[1], src[1])
    assert torch._foreach_copy_ is original


def test_cudagraph_skip_reasons_are_collected():
    import torch._inductor.cudagraph_utils as cudagraph_utils  # only to fake a skip as Inductor logs one

    from experiments.instrument import collect_cudagraph_skip_reasons, cudagraph_skips

    reasons = collect_cudagraph_skip_reasons()
    before = cudagraph_skips()
    cudagraph_utils.log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to a test")
    assert reasons == ["skipping cudagraphs due to a test"]
    assert cudagraph_skips() == before + 1


def test_dynamo_stats_say_why_a_frame_runs_eager():
    from experiments.instrument import dynamo_stats

    def decode(x):
        scores = []
        for _ in range(3):
            x = x + 1
            scores.append(float(x.sum()))  # a host read inside a loop: Dynamo gives up on the whole frame
        return x, scores

    torch._dynamo.reset()
    torch.compile(decode, backend="eager")(torch.zeros(2))
    stats = dynamo_stats()
    assert any("item()" in r and r.endswith("frame skipped, runs eager") for r in stats["graph_break_reasons"]), stats


def test_host_profile_charges_time_to_the_part_of_the_stack_that_spent_it():
    """Eager spends no time in Inductor's generated code; a compiled step does, and Dynamo's guards run;
    C functions (the ops) count for the Python that called them, so groups add up to the profiled time."""
    from experiments import workloads
    from experiments.host_profile import profile_host
    from experiments.task import Task

    task = Task(workloads.get("mlp")("train", None, "tiny", "cpu"), 0)
    compiled = torch.compile(task.target)
    for _ in range(2):
        task.step(compiled)
    eager, inductor = (profile_host(lambda: task.step(fn), 3, lambda: None) for fn in (task.target, compiled))
    assert eager.iters == 3 and "inductor generated code" not in eager.groups
    assert inductor.groups["inductor generated code"] > 0 and inductor.groups["dynamo and aot autograd"] > 0
    assert eager.groups["autograd and optimizer"] > 0
    us = [row["us"] for row in inductor.top]
    assert us == sorted(us, reverse=True) and len(us) == 12
    assert any(row["group"] == "C, charged to its callers" for row in inductor.top)


def test_host_profile_groups_files_by_the_package_they_lie_in():
    """On the H200 the venv lies in /opt/torch/: a library there is the model's, not torch's."""
    from experiments.host_profile import MODELS, OTHER, PACKAGES, TORCH, group

    generated = "/tmp/torchinductor_x"
    assert group("/opt/torch/.venv/lib/python3.12/site-packages/transformers/modeling_utils.py", generated) == OTHER
    assert group(f"{TORCH}vision/models/alexnet.py", generated) == OTHER  # torchvision, beside torch/
    assert group(f"{TORCH}/_dynamo/eval_frame.py", generated) == "dynamo and aot autograd"
    assert group(f"{TORCH}/cuda/graphs.py", generated) == "CUDA graph launch"
    assert group(f"{TORCH}/nn/modules/module.py", generated) == "torch, other"
    assert group(f"{generated}/ab/cabc.py", generated) == "inductor generated code"
    assert group(torch.__file__.replace("torch/__init__.py", "grace_like/x.py"), generated) == OTHER
    assert group(f"{MODELS}/eos_chain.py", generated) == OTHER  # an in-house workload's model is the model's
    assert group(f"{dict(PACKAGES)['harness']}/timing.py", generated) == "harness"
