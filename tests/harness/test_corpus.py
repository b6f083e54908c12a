"""The corpus's hazard programs on the CPU: grace never crashes where Inductor runs and never differs
from eager where Inductor agrees, and the comparison with eager catches wrong programs."""

import time

import pytest
import torch

from experiments import corpus
from experiments.corpus.hazards import HAZARDS
from tests.helpers import (frozen_rng_backend, frozen_weights_backend, offset_backend, overwriting_backend,
                           own_rng_backend, redrawn_backward_backend, stale_backend)

CPU = torch.device("cpu")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HAZARDS))  # the models of zoo.py run on the GPU: too slow here
def test_grace_runs_each_hazard_as_inductor_does(name):
    records = {r["variant"]: r for r in corpus.run_program(name, CPU, ["eager", "inductor", "grace"],
                                                          calls=3, rounds=1, iters=1)}
    assert records["eager"]["status"] == "ok", records["eager"]
    if records["inductor"]["status"] == "ok":
        assert records["grace"]["status"] == "ok", records["grace"]
    assert records["grace"]["status"] != "crash", records["grace"]
    assert records["grace"]["median_us"] > 0


def test_jobs_side_by_side_time_their_rounds_one_at_a_time():
    import threading

    done = []
    job = threading.Thread(target=lambda: done.append(corpus.run_program("python_int_argument", CPU, ["eager"],
                                                                         calls=1, rounds=1, iters=1)))
    with corpus._alone(CPU):  # another job's rounds
        job.start()
        job.join(timeout=2)
        assert job.is_alive() and not done
    job.join(timeout=60)
    assert done and done[0][0]["status"] == "ok"


def test_no_job_runs_its_calls_while_another_times_its_rounds_nor_starts_while_one_waits_to():
    import threading

    events = []

    def hold(lock, name, release):
        with lock(CPU):
            events.append(name)
            release.wait(timeout=30)
            events.append(f"{name} done")

    calls_end, rounds_end, later_end = threading.Event(), threading.Event(), threading.Event()
    calls = threading.Thread(target=hold, args=(corpus._sharing, "calls", calls_end))
    rounds = threading.Thread(target=hold, args=(corpus._alone, "rounds", rounds_end))
    later = threading.Thread(target=hold, args=(corpus._sharing, "later calls", later_end))
    calls.start()
    while not events:
        pass
    rounds.start()
    rounds.join(timeout=0.5)
    later.start()
    later.join(timeout=0.5)
    assert events == ["calls"]  # the rounds wait for the calls in flight; new calls wait behind the rounds
    calls_end.set()
    calls.join(timeout=10)
    waited = time.monotonic() + 30  # the rounds take the GPU as soon as the calls let go: soon, not at once
    while len(events) < 3 and time.monotonic() < waited:
        time.sleep(0.01)
    time.sleep(0.2)  # and the later calls stay behind the rounds
    assert events == ["calls", "calls done", "rounds"]
    rounds_end.set()
    later_end.set()
    for t in (rounds, later):
        t.join(timeout=10)
    assert events == ["calls", "calls done", "rounds", "rounds done", "later calls", "later calls done"]


def test_a_job_compiles_its_first_call_beside_another_jobs_rounds_and_waits_for_them_for_the_next(monkeypatch):
    import threading

    steps = []
    monkeypatch.setitem(corpus.PROGRAMS, "counted", lambda device, compile: corpus.Program(
        lambda x: steps.append(1) or x, lambda i: (torch.ones(2),)))
    job = threading.Thread(target=corpus.run_program, args=("counted", CPU, ["eager"]),
                           kwargs=dict(calls=3, rounds=1, iters=1))
    with corpus._alone(CPU):  # another job's rounds
        job.start()
        waited = time.monotonic() + 60  # the first call waits on nothing, but a loaded CI machine is slow
        while not steps and time.monotonic() < waited:
            time.sleep(0.05)
        time.sleep(0.5)  # and no second call comes while the other job's rounds hold the GPU
        assert steps == [1]
    job.join(timeout=30)
    assert len(steps) == 3 + 1 + 1  # its calls, then one untimed and one timed call a round


def test_grace_waits_for_the_gpu_alone_for_its_calls_after_the_first_where_scg_times_candidates(monkeypatch):
    import threading

    steps = []
    monkeypatch.setitem(corpus.PROGRAMS, "counted", lambda device, compile: corpus.Program(
        lambda x: steps.append(1) or x, lambda i: (torch.ones(2),)))
    job = threading.Thread(target=corpus.run_program, args=("counted", CPU, ["eager", "grace"]),
                           kwargs=dict(calls=3, rounds=1, iters=1))
    with corpus._sharing(CPU):  # another job's calls: eager's run beside them, grace's first too
        job.start()
        waited = time.monotonic() + 60  # grace's first call compiles: slow on a loaded CI machine
        while len(steps) < 3 + 1 and time.monotonic() < waited:
            time.sleep(0.05)
        time.sleep(0.5)  # and no later call of grace's comes while the other job holds the GPU
        assert len(steps) == 3 + 1
    job.join(timeout=30)
    assert len(steps) > 3 + 3


def test_a_rerun_passes_over_the_programs_recorded_with_this_code_and_this_corpus(tmp_path, monkeypatch):
    import json

    from experiments import environment

    steps = []
    monkeypatch.setitem(corpus.PROGRAMS, "counted", lambda device, compile: corpus.Program(
        lambda x: steps.append(1) or x, lambda i: (torch.ones(2),)))
    hashes = {"suite": "s1", "corpus": "c1"}
    monkeypatch.setattr(environment, "code_hash", lambda parts=environment.CODE, leave_out=():
                        hashes["corpus" if parts == environment.CORPUS else "suite"])
    runs = []
    try:
        for change in [None, None, "corpus", "suite"]:
            if change:
                hashes[change] += "'"
            environment.current.cache_clear()  # a process's environment is read once: this is a new process
            steps.clear()
            path = corpus.run(["counted"], ["eager"], tmp_path)
            runs.append(bool(steps))
    finally:
        environment.current.cache_clear()
    assert runs == [True, False, True, True]
    assert [json.loads(line)["env"]["corpus"] for line in path.read_text().splitlines()] == ["c1", "c1'", "c1'"]


def test_rounds_run_on_the_timing_cores_and_the_job_compiles_on_the_others(tmp_path):
    import json
    import os

    from experiments.cores import pin_threads

    every = sorted(os.sched_getaffinity(0))
    seen = []
    try:
        with corpus._alone(CPU, every[-1:]):
            seen.append(os.sched_getaffinity(0))
        seen.append(os.sched_getaffinity(0))
        path = corpus.run(["python_int_argument"], ["eager"], tmp_path, timing_cpus=every[-1:])
        seen.append(os.sched_getaffinity(0))
    finally:
        pin_threads(every)
    assert seen[0] == {every[-1]} and seen[1] == set(every)
    assert seen[2] == (set(every[:-1]) or set(every))
    assert [json.loads(line)["timing_cpus"] for line in path.read_text().splitlines()] == [[every[-1]]]


@pytest.mark.cuda
def test_a_stock_capture_that_fails_does_not_fail_the_variants_after_it():
    """custom_op_that_synchronizes: pt2_cg's capture fails and leaves the generator capturing (H100,
    torch 2.11); eager's, inductor's and grace's random ops after it ran into that until the corpus
    repaired it."""
    records = {r["variant"]: r for r in corpus.run_program("custom_op_that_synchronizes", torch.device("cuda"),
                                                          list(corpus.VARIANTS), calls=3, rounds=2, iters=1)}
    assert all(records[v]["status"] == "ok" for v in ("eager", "inductor", "grace")), records


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HAZARDS))
def test_grace_replays_each_hazard_right_where_inductor_partitions_it_as_on_a_gpu(cpu_partitions, monkeypatch, name):
    """The runtime capturing and replaying every partition Inductor makes (the CPU stand-in; PI and
    SCG need CUDA): each call's result as eager's."""
    monkeypatch.setitem(corpus.VARIANTS, "runtime", {"backend": "grace", "options": {"pi": False, "scg": False}})
    records = {r["variant"]: r for r in corpus.run_program(name, CPU, ["eager", "runtime"], calls=4, rounds=1, iters=1)}
    assert records["runtime"]["status"] == "ok", records["runtime"]


@pytest.mark.parametrize("backend, programs", [
    (offset_backend, ["python_float_argument", "training_step", "kv_cache_written_in_place",
                      "pinned_cpu_input_written_after_the_call", "shape_tuple_argument"]),  # off by 0.5
    (stale_backend, ["python_float_argument", "cpu_tensor_input", "shape_changes_every_call",
                     "output_expands_a_buffer", "forward_pre_hook_reads_a_setting"]),  # a stale result
    (frozen_weights_backend, ["weights_loaded_between_calls", "parameter_data_swapped",
                              "compiled_model_deep_copied", "embedding_renormed_in_forward"]),  # the old weights
    # the same random numbers every call; new ones where the caller set the seed again
    (frozen_rng_backend, ["rand_in_forward", "dropout_in_training", "seed_set_again_between_calls",
                          "tokens_sampled_with_a_seed", "dropout_masks_of_two_forwards_in_one_backward",
                          "attention_dropout_in_training"]),
    (own_rng_backend, ["seed_set_again_between_calls", "tokens_sampled_with_a_seed"]),
    (redrawn_backward_backend, ["dropout_masks_of_two_forwards_in_one_backward"]),  # another mask's gradient
    # a replay over outputs the caller still holds
    (overwriting_backend, ["outputs_kept_across_calls", "tensor_kept_on_the_module_in_forward",
                           "view_of_an_output_kept", "storage_of_an_output_kept"]),
])
def test_a_wrong_program_comes_out_mismatch(monkeypatch, backend, programs):
    monkeypatch.setitem(corpus.VARIANTS, "wrong", {"backend": backend})
    for name in programs:
        records = {r["variant"]: r for r in corpus.run_program(name, CPU, ["eager", "wrong"], calls=3, rounds=1, iters=1)}
        assert records["wrong"]["status"] == "mismatch", (name, records["wrong"])


def test_each_variant_keeps_dynamos_recompile_limit_to_itself(monkeypatch):
    """A Python int that changes compiles twice (static, then dynamic): with a limit of two for the
    process, grace, compiled after inductor, would have run eager."""
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    records = {r["variant"]: r for r in corpus.run_program("python_int_argument", CPU, ["eager", "inductor", "grace"],
                                                          calls=3, rounds=1, iters=1)}
    assert records["grace"]["status"] == "ok" and records["grace"]["grace"]["graphs"] >= 1, records["grace"]


def test_difference_compares_structure_dtype_and_values():
    t = torch.arange(4.0)
    assert corpus.difference([t], [t.clone()]) is None
    assert "off by up to 0.5" in corpus.difference([t + 0.5], [t])
    assert "elements differ" in corpus.difference([t.long() + 1], [t.long()])
    assert "structure" in corpus.difference((t, t), [t, t])
    assert corpus.difference([t + 9], [t], "random") is None  # drawn inside: shape and dtype only
    assert "not finite" in corpus.difference([t / 0], [t], "random")
    big = torch.randn(1000)
    assert corpus.difference([big * 1.001], [big], "norm") is None  # 0.1 % of the norm
    assert "of its norm" in corpus.difference([big * 1.02], [big], "norm")  # 2 %: beyond NORM
    noise = torch.randn(10) * 1e-9  # a gradient zero but for rounding (a key bias's, through softmax)
    assert corpus.difference([big, -noise], [big, noise], "norm") is None
    assert "output 1: off by" in corpus.difference([big, big[:10] * 0], [big, big[:10] * 0.01], "norm")
    assert corpus.difference([t + 9], [t], "none") is None


def test_draws_compares_which_calls_drew_the_same_numbers_as_the_one_before_with_eagers():
    a, b = torch.rand(4), torch.rand(4)
    assert corpus.draws([b + 1], [a + 1], [b], [a]) is None  # new draws, as eager's
    assert corpus.draws([a + 1], [a + 1], [a], [a]) is None  # the same seed again, as eager's
    assert "the same random numbers" in corpus.draws([a + 1], [a + 1], [b], [a])
    assert "new random numbers" in corpus.draws([b + 1], [a + 1], [a], [a])


def test_the_zoo_holds_every_torchvision_model_and_timm_families():
    import torchvision

    names = set(corpus.PROGRAMS)
    assert {f"torchvision/{n}" for n in torchvision.models.list_models(module=torchvision.models)} <= names  # not the quantized, CPU-only ones
    assert len([n for n in names if n.startswith("timm/")]) >= 30 and len(names) >= 150
    assert len([n for n in names if n.startswith("hf/") and "generate" not in n]) >= 40
    assert len([n for n in names if n.startswith("hf/generate-static/")]) >= 3
    assert len([n for n in names if n.startswith("hf/generate-dynamic/")]) >= 2
    assert len([n for n in names if "/train/" in n]) >= 10  # training steps beyond the hazards' small ones


@pytest.mark.parametrize("name", ["torchvision/squeezenet1_0", "hf/vit", "hf/generate-dynamic/gpt_neo"])
def test_a_zoo_model_builds_and_runs_as_grace(name):
    records = {r["variant"]: r for r in corpus.run_program(name, CPU, ["eager", "grace"], calls=2, rounds=1, iters=1)}
    assert records["grace"]["status"] == "ok", records["grace"]


def test_a_grace_variant_that_crashed_is_named_by_the_options_it_ran(monkeypatch):
    from experiments import report

    def compiler(kwargs):
        def compile(fn):
            if kwargs and kwargs["backend"] == "grace":
                raise RuntimeError("injected")
            return fn
        return compile

    monkeypatch.setattr(corpus, "_compiler", compiler)
    records = {r["variant"]: r for r in corpus.run_program("python_int_argument", CPU, ["eager", "grace"],
                                                          calls=1, rounds=1, iters=1)}
    assert records["grace"]["status"] == "crash" and report._grace_variant(records["grace"]) == "grace"


def test_a_grace_record_keeps_the_numbers_of_each_graph_scg_declined(cpu_partitions, monkeypatch):
    """Why a program ran without graphs must be readable from its record (fcos at c2f722a59d60 was not)."""
    from grace import scg

    monkeypatch.setattr(scg, "timer", lambda name, run: (run(), 1.0 if name == "eager" else 2.0)[1])
    monkeypatch.setitem(corpus.VARIANTS, "scg", {"backend": "grace", "options": {"pi": False, "scg": True}})
    records = {r["variant"]: r for r in corpus.run_program("python_float_argument", CPU, ["eager", "scg"],
                                                          calls=4, rounds=1, iters=1)}
    decided = records["scg"]["grace"]["scg"]
    assert decided["eager"] >= 1 and len(decided["declined"]) == decided["eager"], decided
    assert all(d["choice"] == "eager" and d["measured_us"]["graph"] == 2.0 for d in decided["declined"]), decided


def test_the_profile_script_turns_one_of_graces_options_off_by_name():
    from scripts import corpus_profile
    assert corpus_profile.variant("grace-no-pi") == {"backend": "grace", "options": {"pi": False}}
    assert corpus_profile.variant("inductor") == corpus.VARIANTS["inductor"]
    with pytest.raises(SystemExit, match="unknown variant 'grace-no-xx'"):
        corpus_profile.variant("grace-no-xx")
