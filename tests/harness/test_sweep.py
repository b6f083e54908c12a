"""End to end through the real Hydra config, on whatever machine runs the tests (tiny sizes)."""

import dataclasses
import os
import types

import pytest
import torch

from experiments import host_profile, stats
from experiments import cores as cores_module
from experiments import sweep as sweep_module
from experiments.records import out_of_memory, padded_apart
from experiments.sweep import ConfigError, Sweep
from experiments.worker import WorkerError
from tests.conftest import CONF

CUDA = torch.cuda.is_available()


def _sweep(make_cfg, *overrides):
    sweep = Sweep(make_cfg(*overrides))
    sweep.run()
    return sweep


def _by_variant(store):
    return {r.variant: r for r in store.load()}


def test_records_for_each_variant_with_stats_and_skips(make_cfg):
    sweep = _sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor,pt2_cg]")
    recs = _by_variant(sweep.store)
    assert set(recs) == {"eager", "inductor", "pt2_cg"}
    for name in (["eager", "inductor", "pt2_cg"] if CUDA else ["eager", "inductor"]):
        r = recs[name]
        assert r.status == "ok", r.reason
        assert r.numerics.passed
        assert [len(x) for x in r.iter_ms] == [3, 3]
        assert r.median_ms == stats.median(stats.flatten(r.iter_ms))
        assert r.p25_ms <= r.median_ms <= r.p75_ms
        assert len(r.launch_us) == 2 and all(x > 0 for x in r.launch_us)
        # to the nanosecond, no further: the digits past it were most of a record's bytes
        assert all(t == round(t, 6) for t in stats.flatten(r.iter_ms)) and all(x == round(x, 3) for x in r.launch_us)
        assert r.compile_s > 0 and r.kernels.iters == 2 and r.set_up_beside == 0
        assert (r.held_mem_mb > 0) if CUDA else (r.peak_mem_mb is r.held_mem_mb is None)
        # its setup's parts, each measured in the worker, add up to at most what the sweep saw; the worker's
        # start is apart, before it
        assert 0 < r.build_s and 0 < r.check_s and r.start_s >= 0  # forked from a warm server: near 0
        assert r.setup_s >= round(r.build_s + r.compile_s + r.warmup_s + r.check_s, 1) - 0.1
        assert r.host.iters == 2 and (host_profile.GENERATED in r.host.groups) == (name != "eager")
        assert r.env["torch"] == torch.__version__ and r.env["git_commit"]
        assert r.env["cpu"].endswith(f", {os.cpu_count()} cores") and r.env["load"] >= 0
        assert r.batch == 8 and r.size == "tiny"
        assert r.graph_breaks == 0 and r.unique_graphs == (0 if name == "eager" else 1)
        assert r.shape_padding == {}  # its GEMMs are aligned: nothing for Inductor to pad
    eager, inductor = recs["eager"], recs["inductor"]
    assert eager.baseline == "inductor"
    assert eager.round_ratios == stats.round_ratios(eager.iter_ms, inductor.iter_ms)
    assert all(x == round(x, 6) for x in eager.round_ratios)
    assert inductor.baseline is None and inductor.round_ratios is None
    assert eager.session == inductor.session
    if not CUDA:
        assert recs["pt2_cg"].status == "skipped" and "needs CUDA" in recs["pt2_cg"].reason


def test_resume_skips_final_records_and_retries_the_rest(make_cfg):
    overrides = ["workload=[mlp,EOS]", "workload.mlp.size=tiny", "workload.EOS.size=tiny",
                 "variant=[eager]"]
    store = _sweep(make_cfg, *overrides).store
    first = store.load()
    assert [(r.workload, r.status) for r in first] == [("mlp", "ok"), ("eos_chain", "ok")]
    _sweep(make_cfg, *overrides)  # nothing to do
    assert store.load() == first
    # An interrupted run left mlp failed: a resume measures mlp again, and only mlp.
    failed = dataclasses.replace(first[0], status="failed", reason="interrupted")
    store.append(failed)
    _sweep(make_cfg, *overrides)
    after = store.load()
    assert after[:3] == first + [failed]
    assert [(r.workload, r.status) for r in after[3:]] == [("mlp", "ok")]
    assert {r.status for r in store.latest().values()} == {"ok"}
    _sweep(make_cfg, *overrides, "force=true")  # force measures everything again
    assert len(store.load()) == 6


def test_a_rerun_appends_no_more_records_for_variants_this_machine_cannot_run(make_cfg):
    overrides = ["workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,pt2_cg]"]
    store = _sweep(make_cfg, *overrides).store
    first = store.load()
    _sweep(make_cfg, *overrides)
    assert store.load() == first


def test_the_aa_control_measures_the_baseline_twice_and_every_speedup_has_its_interval(make_cfg):
    sweep = _sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]",
                   "aa_control=true", "floor=true", "measure.rounds=4")
    recs = _by_variant(sweep.store)
    assert set(recs) == {"eager", "inductor", "inductor_aa", "floor"} and len({r.session for r in recs.values()}) == 1
    floor = recs.pop("floor")  # a CUDA graph: on this CPU, skipped with the reason (on a GPU: test_cuda_harness)
    assert floor.status == "skipped" and floor.reason == "variant 'floor' needs CUDA, and this machine has none"
    for name in ("eager", "inductor_aa"):
        r = recs[name]
        assert r.baseline == "inductor" and r.speedup == recs["inductor"].median_ms / r.median_ms
        lo, hi = r.speedup_ci
        assert lo <= r.speedup <= hi
    assert recs["inductor"].speedup is None
    assert sorted(r.setup_position for r in recs.values()) == [0, 1, 2]


def test_the_baseline_and_its_aa_control_trade_set_up_places_in_half_the_sessions(make_cfg):
    sweep = Sweep(make_cfg("workload=[mlp]", "variant=[eager,inductor,pt2_cg]", "aa_control=true", "floor=true"))
    orders = []
    for n in range(200):
        sweep.session = f"{n:012x}"
        orders.append(tuple(v.name for v in sweep._setup_order(sweep.variants)))
    as_selected = ("eager", "inductor", "pt2_cg", "inductor_aa", "floor")
    traded = ("eager", "inductor_aa", "pt2_cg", "inductor", "floor")
    assert set(orders) == {as_selected, traded}
    assert 70 < orders.count(traded) < 130
    sweep.session = "0" * 12
    assert sweep._setup_order(sweep.variants) == sweep._setup_order(sweep.variants)  # the session decides


def test_a_workload_revised_since_its_records_is_measured_again(make_cfg, monkeypatch):
    """A change to what a workload runs makes its records stale: the next sweep measures it again, unforced,
    and leaves the other workloads' records be."""
    from experiments.workloads import eos_chain

    overrides = ["workload=[mlp,EOS]", "workload.mlp.size=tiny", "workload.EOS.size=tiny", "variant=[eager]"]
    store = _sweep(make_cfg, *overrides).store
    assert len(store.load()) == 2
    monkeypatch.setattr(eos_chain.Model, "revised", "2000-01-01")  # before the records: they stand
    _sweep(make_cfg, *overrides)
    assert len(store.load()) == 2
    monkeypatch.setattr(eos_chain.Model, "revised", "2999-01-01")  # after them
    _sweep(make_cfg, *overrides)
    assert [r.workload for r in store.load()[2:]] == ["eos_chain"]


@pytest.mark.parametrize("timing_s,rounds", [(0, 2), (60, 5)])
def test_rounds_go_on_past_the_minimum_until_timing_s_up_to_max_rounds(make_cfg, timing_s, rounds):
    sweep = _sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]",
                   "measure.rounds=2", f"measure.timing_s={timing_s}", "measure.max_rounds=5")
    assert {len(r.iter_ms) for r in sweep.store.load()} == {rounds}


def test_wrong_numbers_are_recorded_as_mismatch(make_cfg):
    sweep = _sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager]",
                   "+variant.wrong.compile.backend=tests.helpers:offset_backend")
    recs = _by_variant(sweep.store)
    assert recs["eager"].status == "ok"
    wrong = recs["wrong"]
    assert wrong.status == "mismatch" and not wrong.numerics.passed
    assert wrong.numerics.rel_err > wrong.numerics.tolerance and "rel_err" in wrong.reason
    assert wrong.median_ms is not None  # measured all the same


def test_a_dying_variant_is_a_failed_record_and_the_others_go_on(make_cfg):
    sweep = _sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager]",
                   "+variant.dies.compile.backend=tests.helpers:dying_backend")
    recs = _by_variant(sweep.store)
    assert recs["dies"].status == "failed" and "exit code 3" in recs["dies"].reason
    assert recs["eager"].status == "ok"


def test_several_processes_a_variant_are_timed_in_each_round_and_recorded_as_one(make_cfg):
    sweep = _sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]",
                   "measure.processes=2", "measure.rounds=3", "measure.iters=2")
    recs = _by_variant(sweep.store)
    assert set(recs) == {"eager", "inductor"}  # no record of a process of its own
    for r in recs.values():
        assert r.status == "ok" and r.processes == 2
        assert len(r.iter_ms) == 3 and all(len(it) == 4 for it in r.iter_ms)  # each round: 2 processes x 2
    assert recs["eager"].speedup_ci[0] <= recs["eager"].speedup <= recs["eager"].speedup_ci[1]


def test_a_variant_whose_second_process_dies_is_one_failed_record(make_cfg):
    sweep = _sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager]", "measure.processes=2",
                   "+variant.dies.compile.backend=tests.helpers:dying_backend")
    records = sweep.store.load()
    dies = [r for r in records if r.variant.startswith("dies")]
    assert [r.variant for r in dies] == ["dies"] and dies[0].status == "failed", [(r.variant, r.reason) for r in dies]
    assert _by_variant(sweep.store)["eager"].status == "ok"


@pytest.mark.parametrize("processes,tp", [(0, 1), (2, 2)])
def test_processes_below_one_or_with_tensor_parallelism_are_a_config_error(make_cfg, processes, tp):
    with pytest.raises(ConfigError, match="measure.processes"):
        Sweep(make_cfg("workload=[mlp]", f"measure.processes={processes}", f"tp={tp}"))


@pytest.mark.parametrize("requested,slot,ranks,cores", [
    ([-2, -1], 0, 1, [14, 15]),
    ([-2, -1], 1, 1, [12, 13]),  # the job holding GPU 1 times on the two cores before job 0's
    ([-1], 1, 2, [13, 12]),  # job 1's ranks, after job 0's two
    ([4, 5], 3, 2, [4, 5, 4, 5]),  # cores named: as named, by every rank
])
def test_timing_cores_count_from_the_last_core_one_group_per_job_and_rank(monkeypatch, requested, slot, ranks, cores):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert cores_module.timing_cores(requested, slot, ranks) == cores


def test_timing_cores_that_this_process_cannot_run_on_are_a_config_error(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(ValueError, match="no core 5"):
        cores_module.timing_cores([5])
    assert cores_module.timing_cores([-2, -1], slot=1) == [0, 1]  # too few cores: shared, with a warning


def test_timed_rounds_pin_every_thread_of_the_worker_not_only_the_caller():
    import threading

    from experiments.cores import pin_threads

    every = sorted(os.sched_getaffinity(0))
    started, done = threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (started.set(), done.wait()))
    other.start()
    started.wait()
    try:
        pin_threads(every[-1:])
        assert os.sched_getaffinity(other.native_id) == {every[-1]} == os.sched_getaffinity(0)
    finally:
        done.set()
        other.join()
        pin_threads(every)


def test_unsupported_mode_is_a_config_error(make_cfg):
    with pytest.raises(ConfigError, match="no train mode"):
        Sweep(make_cfg("workload=[EOS]", "workload.EOS.mode=train"))


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_composes_and_names_valid_workloads(make_cfg, experiment):
    sweep = Sweep(make_cfg(f"experiment={experiment}"))
    assert sweep.entries and sweep.variants
    assert {e.size for e in Sweep(make_cfg(f"experiment={experiment}", "size=tiny")).entries} == {"tiny"}


def test_a_sweep_that_sets_up_alone_measures_again_what_was_set_up_beside_others(make_cfg):
    overrides = ["workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]"]
    store = _sweep(make_cfg, *overrides, "measure.parallel_setup=true").store
    assert [r.set_up_beside for r in store.load()] == [1, 1]
    _sweep(make_cfg, *overrides, "measure.parallel_setup=true")  # the same way: nothing to do
    assert len(store.load()) == 2
    _sweep(make_cfg, *overrides)  # one at a time: both again
    assert [r.set_up_beside for r in store.load()] == [1, 1, 0, 0]
    _sweep(make_cfg, *overrides)  # and then nothing
    assert len(store.load()) == 4


def test_a_workloads_variants_are_measured_together_in_one_session(make_cfg):
    """Variants are compared in one session only: records from different sessions, or one to measure
    again, and the sweep measures them all again together."""
    overrides = ["workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]"]
    store = _sweep(make_cfg, *overrides).store
    first = store.load()
    store.append(dataclasses.replace(first[0], session="another machine"))
    _sweep(make_cfg, *overrides)
    again = store.load()[3:]
    assert [r.variant for r in again] == ["eager", "inductor"] and len({r.session for r in again}) == 1
    store.append(dataclasses.replace(again[1], status="failed", reason="CUDA error: unspecified launch failure"))
    _sweep(make_cfg, *overrides)  # one failed: both again
    assert [r.variant for r in store.load()[6:]] == ["eager", "inductor"]
    _sweep(make_cfg, *overrides)  # all final, from one session: nothing to do
    assert len(store.load()) == 8


@pytest.mark.parametrize("mode", ["eval", "train"])  # train: the workers take turns with their twins
def test_parallel_setup_measures_the_same_variants(make_cfg, mode):
    sweep = _sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", f"workload.mlp.mode={mode}",
                   "variant=[eager,inductor]", "measure.parallel_setup=true")
    recs = _by_variant(sweep.store)
    assert {v: r.status for v, r in recs.items()} == {"eager": "ok", "inductor": "ok"}
    assert recs["eager"].mode == mode
    assert recs["eager"].measure["parallel_setup"] is True
    assert recs["eager"].set_up_beside == recs["inductor"].set_up_beside == 1
    assert recs["eager"].round_ratios == stats.round_ratios(recs["eager"].iter_ms, recs["inductor"].iter_ms)


def _on_setup(monkeypatch, change) -> list[str]:
    """Workers whose setup replies go through change(variant, nth setup of it, reply), which may raise;
    returns the list of setups, in order, as they happen."""
    setups = []

    class Changed(sweep_module.Worker):
        def __init__(self, spec, timeout_s):
            super().__init__(spec, timeout_s)
            self.variant = spec.variant.name

        def reply(self):
            value = super().reply()
            if self._method == "setup":
                setups.append(self.variant)
                value = change(self.variant, setups.count(self.variant), value)
            return value

    monkeypatch.setattr(sweep_module, "Worker", Changed)
    return setups


def _crowded(monkeypatch, variant: str, failures: int, error: str) -> list[str]:
    """Workers whose first `failures` setups of `variant` fail with `error`, as beside seven others on a GPU."""

    def change(name, nth, value):
        if name == variant and nth <= failures:
            raise WorkerError(error)
        return value

    return _on_setup(monkeypatch, change)


@pytest.mark.parametrize("error, retried", [("setup: OutOfMemoryError: CUDA out of memory. Tried to allocate 250 MiB", True),
                                            ("setup: ValueError: no such layer", False)])
def test_a_variant_out_of_memory_beside_others_is_set_up_again_alone(make_cfg, monkeypatch, error, retried):
    setups = _crowded(monkeypatch, "eager", 1, error)
    recs = _by_variant(_sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]",
                              "measure.parallel_setup=true").store)
    if retried:
        assert setups == ["eager", "inductor", "eager"]
        assert {v: r.status for v, r in recs.items()} == {"eager": "ok", "inductor": "ok"}
        assert (recs["eager"].set_up_beside, recs["inductor"].set_up_beside) == (0, 1)
    else:  # any other failure is recorded at once
        assert setups == ["eager", "inductor"]
        assert (recs["eager"].status, recs["eager"].reason) == ("failed", error)


def test_a_variant_out_of_memory_even_alone_is_measured_in_a_group_of_its_own(make_cfg, monkeypatch):
    """Out of memory beside the others, then alone beside their workers (a large training workload's
    variants on one GPU): measured after them, beside the stock variants again, in one interleaved run."""
    setups = _crowded(monkeypatch, "inductor", 2, "setup: OutOfMemoryError: CUDA out of memory. Tried to allocate 1.54 GiB")
    store = _sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]",
                   "measure.parallel_setup=true").store
    # beside eager, alone beside eager's worker (deferred), then in a second group beside eager again
    assert setups == ["eager", "inductor", "inductor", "eager", "inductor"]
    records = store.load()
    assert [(r.variant, r.status) for r in records] == [("eager", "ok"), ("eager", "ok"), ("inductor", "ok")]
    # the second group's eager is compared with its own inductor rounds
    assert records[1].round_ratios == stats.round_ratios(records[1].iter_ms, records[2].iter_ms)
    assert records[0].round_ratios is None  # no baseline in the first group


GEMM = "((torch.Size([50257, 8192]), (1, 50257), torch.bfloat16), ...)"


def _padded(pad):
    return {GEMM: {"pad": pad, "unpadded_ms": 4.5}}


def test_a_gemm_padded_otherwise_beside_others_is_found_against_the_variants_set_up_alone():
    """DGPT2's floor, set up beside eight others, left the LM head's GEMM unpadded where every other
    variant padded it, and its kernels took 15.3 ms against 12.0."""
    beside = {"inductor": 7, "pt2_cg": 7, "floor": 7, "grace": 0, "scg": 0}
    padding = {name: _padded(name != "floor") for name in beside}
    assert padded_apart(padding, beside) == ["floor"]
    # those set up alone decide against a majority beside others; on a tie, all beside others are redone
    assert padded_apart({**padding, "inductor": _padded(False), "pt2_cg": _padded(False)},
                                     beside) == ["inductor", "pt2_cg", "floor"]
    tie = {"inductor": 1, "pt2_cg": 1}
    assert padded_apart({"inductor": _padded(True), "pt2_cg": _padded(False)}, tie) == ["inductor", "pt2_cg"]
    # agreeing, alone already, or the only variant that compiled the GEMM: nothing to redo
    assert padded_apart({n: _padded(True) for n in beside}, beside) == []
    assert padded_apart({"inductor": _padded(True), "grace": _padded(False)}, {"inductor": 0, "grace": 0}) == []
    assert padded_apart({"inductor": _padded(False), "grace": {}}, {"inductor": 3, "grace": 3}) == []


def test_a_variant_that_padded_otherwise_beside_others_is_set_up_again_alone(make_cfg, monkeypatch):
    """Its first setup's worker is closed and the variant set up again with the GPU to itself; the
    record is of that setup."""
    setups = _on_setup(monkeypatch, lambda name, nth, value:  # eager's first, beside inductor's, chose not to pad
                       dataclasses.replace(value, shape_padding=_padded(not (name == "eager" and nth == 1))))
    recs = _by_variant(_sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]",
                              "aa_control=true", "measure.parallel_setup=true").store)
    # the baseline and its A/A control trade setup places in half the sessions (Sweep._setup_order)
    assert setups[0] == setups[-1] == "eager" and sorted(setups[1:-1]) == ["inductor", "inductor_aa"]
    assert {v: r.status for v, r in recs.items()} == {"eager": "ok", "inductor": "ok", "inductor_aa": "ok"}
    assert [recs[v].set_up_beside for v in ("eager", "inductor", "inductor_aa")] == [0, 2, 2]


def test_variants_that_time_themselves_are_set_up_alone_after_the_others(make_cfg, monkeypatch):
    """SCG times its candidates while it sets up: never beside another worker's setup on the GPU."""
    events = []

    class Idle(sweep_module.Worker):  # no process: logs when each setup starts and ends
        def __init__(self, spec, timeout_s):
            self.variant = spec.variant.name

        def ready(self):
            return 0.0

        def request(self, method, *args):
            events.append(("start", self.variant))

        def reply(self):
            events.append(("end", self.variant))
            return types.SimpleNamespace(shape_padding={})  # as a Setup with no GEMM to pad

    monkeypatch.setattr(sweep_module, "Worker", Idle)
    sweep = Sweep(make_cfg("workload=[mlp]", "variant=[inductor,pt2_cg,scg,grace]", "measure.parallel_setup=true"))
    assert [v.uses_scg for v in sweep.variants] == [False, False, True, True]
    workers = {}
    assert sweep._set_up(sweep.entries[0], 0, sweep.variants, workers, "ref.pt", defer=True, started=[],
                         prestarted={}) == []
    assert list(workers) == ["inductor", "pt2_cg", "scg", "grace"]
    assert {v: beside for v, (beside, _, _, _) in sweep._setups.items()} == {"inductor": 1, "pt2_cg": 1, "scg": 0, "grace": 0}
    assert {v: place for v, (_, _, _, place) in sweep._setups.items()} == {"inductor": 0, "pt2_cg": 1, "scg": 2, "grace": 3}
    assert events == [("start", "inductor"), ("start", "pt2_cg"), ("end", "inductor"), ("end", "pt2_cg"),
                      ("start", "scg"), ("end", "scg"), ("start", "grace"), ("end", "grace")]


def test_every_variant_is_checked_in_float64_apart_and_at_once_before_the_first_setup(make_cfg, monkeypatch):
    """The float64 checks run in processes of their own, all at once (they time nothing kept), and end
    before the setups one at a time, which take their results; one that ran out of memory beside the
    others is checked again alone, and one that failed there is checked in its setup."""
    asked = []

    class Logged(sweep_module.Worker):
        def __init__(self, spec, timeout_s):
            super().__init__(spec, timeout_s)
            self.variant = spec.variant.name

        def request(self, method, *args):
            asked.append((method, self.variant, args[1:] if method == "setup" else ()))
            super().request(method, *args)

        def reply(self):
            value = super().reply()
            if self._method == "check_float64":
                nth = sum(m == "check_float64" and v == self.variant for m, v, _ in asked)
                if self.variant == "eager" and nth == 1:  # beside the others: out of memory
                    return None
                if self.variant == "eager":  # and then, alone, its process died
                    raise WorkerError("check_float64: worker process died (exit code -9)")
            return value

    monkeypatch.setattr(sweep_module, "Worker", Logged)
    recs = _by_variant(_sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]",
                              "aa_control=true").store)
    checks = [(m, v) for m, v, _ in asked if m in ("check_float64", "fill_caches", "setup")]
    # one check for inductor and its A/A control, which run the same code; its checker then sets inductor
    # up once, so that neither measured worker compiles cold
    assert checks[:5] == [("check_float64", "eager"), ("check_float64", "inductor"), ("check_float64", "eager"),
                          ("fill_caches", "inductor"), ("setup", "eager")], checks
    assert sorted(checks[5:]) == [("setup", "inductor"), ("setup", "inductor_aa")], checks  # either first
    handed = {v: args[0] for m, v, args in asked if m == "setup"}
    assert handed["eager"] is None  # its setup checks it
    assert handed["inductor"].seconds > 0 and handed["inductor_aa"] == handed["inductor"]
    assert {v: r.status for v, r in recs.items()} == {"eager": "ok", "inductor": "ok", "inductor_aa": "ok"}
    assert all(r.float64_check_s > 0 for r in recs.values())


@pytest.mark.parametrize("options, filled", [((), True), (("measure.cold_caches=true",), False),
                                              (("baseline=eager",), False)])
def test_the_baselines_checker_fills_the_shared_caches_unless_each_worker_has_its_own(make_cfg, monkeypatch,
                                                                                       options, filled):
    """A fill that fails leaves the session as it was: the baseline's own setup compiles first."""
    asked = []

    class Logged(sweep_module.Worker):
        def request(self, method, *args):
            asked.append((method, self.variant))
            if method == "fill_caches":
                args = ("no such reference.pt", *args[1:])
            super().request(method, *args)

    monkeypatch.setattr(sweep_module, "Worker", Logged)
    recs = _by_variant(_sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]",
                              *options).store)
    assert [v for m, v in asked if m == "fill_caches"] == (["inductor"] if filled else [])
    if filled:
        assert asked.index(("fill_caches", "inductor")) < asked.index(("setup", "eager"))
    assert {r.status for r in recs.values()} == {"ok"}


COMPILED: list[bool] = []  # counting_backend's: per graph compiled, whether it was a float64 one


def counting_backend(gm, example_inputs):
    COMPILED.append(any(isinstance(x, torch.Tensor) and x.dtype == torch.float64 for x in example_inputs))
    return gm


def test_a_float64_check_taken_apart_is_the_setups_and_is_not_taken_again(tmp_path):
    from experiments.bench import Bench, Spec
    from experiments.variants import Variant

    torch._dynamo.reset()
    COMPILED.clear()
    spec = Spec("mlp", "eval", None, "tiny", Variant("counted", compile={"backend": "tests.harness.test_sweep:counting_backend"}),
                "cpu", 0, 2, {"bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-6}, 3.0)
    reference = str(tmp_path / "reference.pt")
    Bench(spec).reference(reference)
    checker = Bench(spec)
    check = checker.check_float64(reference)
    assert check.seconds > 0 and check.results and COMPILED == [True] and checker.task is None
    torch._dynamo.reset()
    setup = Bench(spec).setup(reference, check)
    assert COMPILED == [True, False]  # the measured instance only: no second float64 compile
    assert setup.float64_check_s == check.seconds and setup.numerics.passed and setup.build_s > 0
    # a wrong float64 result handed over fails the setup's numerics as its own would
    wrong = dataclasses.replace(check, results={k: dataclasses.replace(n, passed=False) for k, n in check.results.items()})
    torch._dynamo.reset()
    assert not Bench(spec).setup(reference, wrong).numerics.passed
    # out of memory: nothing kept, for the sweep to check it again alone
    torch._dynamo.reset()
    oom = dataclasses.replace(spec, variant=Variant("oom", compile={"backend": "tests.harness.test_sweep:runs_out_in_float64"}))
    assert Bench(oom).check_float64(reference) is None


def test_a_sweep_stopped_during_a_setup_kills_every_worker_and_records_the_rest_as_interrupted(make_cfg, monkeypatch):
    """SIGINT while a variant sets up (a TP worker may hang there, in NCCL): no worker is waited
    for, the one being set up included, and the variants not yet recorded say interrupted."""
    started, asked = [], []

    class Stopped(sweep_module.Worker):
        def __init__(self, spec, timeout_s):
            super().__init__(spec, timeout_s)
            started.append(self)
            asked.append("start")

        def request(self, method, *args):
            asked.append(method)
            super().request(method, *args)

        def reply(self):
            if self._method == "setup":  # the first, after the reference and the float64 checks
                raise KeyboardInterrupt
            return super().reply()

    monkeypatch.setattr(sweep_module, "Worker", Stopped)
    sweep = Sweep(make_cfg("workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]"))
    with pytest.raises(KeyboardInterrupt):
        sweep.run()
    # the reference's worker, and eager's and inductor's, each measured and float64-checked
    assert len(started) == 5 and not any(w._proc.is_alive() for w in started)
    # the variants' workers were started beside the reference's, before it was asked for the reference
    assert asked[:6] == ["start"] * 5 + ["reference"]
    assert {r.variant: r.status for r in sweep.store.load()} == {"eager": "interrupted", "inductor": "interrupted"}


def test_a_failed_numerics_reference_fails_every_variant_with_its_reason(make_cfg, monkeypatch):
    class NoReference(sweep_module.Worker):
        def call(self, method, *args):
            if method == "reference":
                raise WorkerError("reference: OutOfMemoryError: CUDA out of memory")
            return super().call(method, *args)

    monkeypatch.setattr(sweep_module, "Worker", NoReference)
    recs = _by_variant(_sweep(make_cfg, "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]").store)
    assert {v: (r.status, r.reason) for v, r in recs.items()} == {
        v: ("failed", "numerics reference: reference: OutOfMemoryError: CUDA out of memory") for v in ("eager", "inductor")}


def test_an_interrupted_workload_is_recorded_as_such_and_measured_on_resume(make_cfg, monkeypatch):
    overrides = ["workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,inductor]"]
    sweep = Sweep(make_cfg(*overrides))

    def stopped(*args):
        raise KeyboardInterrupt  # what `timeout -s INT` delivers in the middle of a compile

    monkeypatch.setattr(sweep, "_time_rounds", stopped)
    with pytest.raises(KeyboardInterrupt):
        sweep.run()
    recs = _by_variant(sweep.store)
    assert {v: r.status for v, r in recs.items()} == {"eager": "interrupted", "inductor": "interrupted"}
    assert "SIGINT" in recs["eager"].reason
    resumed = _sweep(make_cfg, *overrides)
    assert {r.status for r in resumed.store.latest().values()} == {"ok"}


def test_an_experiments_settings_for_a_workload_left_out_are_ignored(make_cfg):
    sweep = Sweep(make_cfg("experiment=tp", "workload=[XLNET-I]"))  # tp.yaml also sets DALLE2's batch
    assert [(e.name, e.batch) for e in sweep.entries] == [("xlnet", 128)]


def test_a_variant_with_its_own_dynamo_settings_traces_what_stock_dynamo_skips(make_cfg):
    sweep = _sweep(make_cfg, "workload=[ST]", "size=tiny", "variant=[inductor]",
                   "+variant.scalars.compile.backend=inductor", "+variant.scalars.dynamo.capture_scalar_outputs=true")
    recs = _by_variant(sweep.store)
    stock, scalars = recs["inductor"], recs["scalars"]
    assert stock.status == "ok" and scalars.status == "ok" and scalars.numerics.passed, scalars.reason
    # stock: the decode loop's frame runs without a graph; the encoder and the decoding step it calls
    # are compiled (the step twice: one token, then any number)
    assert stock.unique_graphs == 3 and any("frame skipped" in r for r in stock.graph_break_reasons)
    assert scalars.unique_graphs >= 1 and not any("frame skipped" in r for r in scalars.graph_break_reasons)


@pytest.mark.parametrize("fallback", ["capture", "pi"])
def test_a_capture_out_of_memory_fails_the_setup_as_an_out_of_memory(tmp_path, monkeypatch, fallback):
    """GraCE runs a partition whose capture ran out of GPU memory without its graph, and one whose PI
    check did with copies (never the user's problem); the harness would then measure a variant without
    its graphs or PI. Its setup fails instead, as out of memory, so the sweep sets it up again on its own
    (the test above)."""
    import grace
    from experiments.bench import Bench, Spec
    from experiments.variants import Variant
    from grace import backend
    from grace.backend import GraphReport, Options
    from grace.runtime import Stats, Status

    spec = Spec("mlp", "eval", None, "tiny", Variant("eager"), "cpu", 0, 1, {"bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-6}, 3.0)
    reference = str(tmp_path / "reference.pt")
    Bench(spec).reference(reference)
    assert Bench(spec).setup(reference).numerics.passed
    oom = f"{fallback} failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB."
    degraded = (dict(status=Status.EAGER, reason=oom) if fallback == "capture"
                else dict(status=Status.CAPTURED, pi_reasons=[oom]))
    reports = list(backend.REPORTS)
    monkeypatch.setattr(backend, "REPORTS", reports)
    monkeypatch.setattr(grace, "REPORTS", reports)
    prepare = Bench._prepare

    def measured_instance_runs_out(bench, task):  # not the float64 check's instance, which runs first
        fn = prepare(bench, task)
        if task is bench.task:
            reports.append(GraphReport(0, Options(), partitions=[
                Stats(0, False, 0), Stats(0, True, 1, **degraded)]))
        return fn

    monkeypatch.setattr(Bench, "_prepare", measured_instance_runs_out)
    with pytest.raises(torch.OutOfMemoryError, match=f"GraCE left a partition without its graph or PI: {fallback} failed") as e:
        Bench(spec).setup(reference)
    assert out_of_memory(f"setup: {type(e.value).__name__}: {e.value}")


def wrong_on_its_second_call(gm, example_inputs):
    """A Dynamo backend that is right except on the second call, where graphs would be recorded."""
    calls = iter(range(1, 1_000))

    def run(*args):
        out = gm(*args)
        return type(out)(o * 1.5 for o in out) if next(calls) == 2 else out

    return run


def test_numerics_catch_a_variant_wrong_only_on_the_step_that_records(tmp_path):
    """The step after rewinding replays graphs; a variant wrong only where it records (a backward graph run
    twice over activations it had overwritten) is caught at step 2, which the reference also takes."""
    from experiments.bench import Bench, Spec
    from experiments.variants import Variant

    def setup(variant):
        spec = Spec("mlp", "eval", None, "tiny", variant, "cpu", 0, 2, {"bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-6}, 3.0)
        reference = str(tmp_path / f"{variant.name}.pt")
        Bench(spec).reference(reference)
        return Bench(spec).setup(reference).numerics

    torch._dynamo.reset()
    assert setup(Variant("eager")).passed
    n = setup(Variant("second", compile={"backend": "tests.harness.test_sweep:wrong_on_its_second_call"}))
    assert not n.passed and n.part == "outputs at step 2 in float64", n
    assert n.detail == "failed: outputs at step 2 in float64, outputs at step 2", n


def _fails_in_float64(error):
    def backend(gm, example_inputs):
        if any(isinstance(x, torch.Tensor) and x.dtype == torch.float64 for x in example_inputs):
            raise error
        return gm
    return backend


# a Dynamo backend that cannot compile a float64 graph, as Inductor's mix-order reduction could not
fails_in_float64 = _fails_in_float64(
    RuntimeError("Loop-carried variable accum0 has initial type fp32 but is re-assigned to fp64\nmore"))
# one whose float64 copy does not fit beside the other variants' setups
runs_out_in_float64 = _fails_in_float64(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.54 GiB."))


def test_a_variant_that_cannot_compile_in_float64_is_still_checked_and_says_so(tmp_path, caplog):
    """A compiler's float64-only failure is the check's problem, not the variant's: the variant is set up
    and checked in its compute dtype, and its numerics say why float64 was left out."""
    from experiments.bench import Bench, Spec
    from experiments.variants import Variant

    torch._dynamo.reset()
    variant = Variant("no_float64", compile={"backend": "tests.harness.test_sweep:fails_in_float64"})
    spec = Spec("mlp", "eval", None, "tiny", variant, "cpu", 0, 2, {"bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-6}, 3.0)
    reference = str(tmp_path / "reference.pt")
    Bench(spec).reference(reference)
    setup = Bench(spec).setup(reference)
    n = setup.numerics
    assert n.passed and "in float64" not in n.part and setup.float64_check_s is None, n
    assert n.detail == "not checked in float64: RuntimeError: Loop-carried variable accum0 has initial type fp32 "\
        "but is re-assigned to fp64", n
    assert "not checked in float64" in caplog.text
    # out of memory is not the compiler's: it reaches the sweep, which sets the variant up again alone
    torch._dynamo.reset()
    spec = dataclasses.replace(spec, variant=Variant(
        "oom_in_float64", compile={"backend": "tests.harness.test_sweep:runs_out_in_float64"}))
    with pytest.raises(Exception) as e:
        Bench(spec).setup(reference)
    assert out_of_memory(f"setup: {type(e.value).__name__}: {e.value}"), e.value


def test_spread_measures_each_workload_twice_with_fresh_processes(make_cfg):
    """experiment=spread (runs: 2): its path, end to end on tiny sizes."""
    from experiments import report

    sweep = _sweep(make_cfg, "experiment=spread", "workload=[mlp]", "workload.mlp.size=tiny",
                   "variant=[eager,inductor]")
    recs = sweep.store.load()
    assert sorted((r.variant, r.run) for r in recs) == [("eager", 0), ("eager", 1), ("inductor", 0), ("inductor", 1)]
    assert all(r.status == "ok" and r.experiment == "spread" for r in recs)
    text = report.spread(recs)
    assert "mlp" in text and "eager" in text and "spread %" in text


def test_workers_are_all_asked_to_close_before_any_is_waited_for():
    """Workers exit side by side (each takes seconds: CUDA context, compile subprocesses); when the sweep
    is being stopped, none is waited for."""
    events = []

    class Fake:
        def __init__(self, n):
            self.n = n

        def ask_to_close(self):
            events.append(("ask", self.n))

        def close(self, wait_s):
            events.append(("wait", self.n, wait_s))

    with sweep_module._closing([Fake(0), Fake(1)]) as workers:
        workers.append(Fake(2))
    assert events == [("ask", 0), ("ask", 1), ("ask", 2), ("wait", 0, 60), ("wait", 1, 60), ("wait", 2, 60)]
    events.clear()
    with pytest.raises(KeyboardInterrupt), sweep_module._closing([Fake(0)]):
        raise KeyboardInterrupt
    assert events == [("ask", 0), ("wait", 0, 0)]


def test_the_optimizers_step_is_compiled_with_the_variant_when_asked(tmp_path):
    from experiments.bench import Bench, Spec
    from experiments.variants import Variant

    torch._dynamo.reset()
    inductor = Variant("inductor", compile={"backend": "inductor"})
    spec = Spec("dcgan", "train", None, "tiny", inductor, "cpu", 0, 2, {"bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-6}, 3.0,
                compile_optimizer=True)
    reference = str(tmp_path / "reference.pt")
    Bench(spec).reference(reference)
    bench = Bench(spec)
    assert bench.setup(reference).numerics.passed
    assert bench.task.optimizer_step != bench.task.optimizer.step  # the compiled one, which the step calls


def test_a_waiting_worker_stopped_by_ctrl_c_exits_quietly(capfd, monkeypatch):
    """Ctrl-C reaches every process of the group: a worker waiting for its next request leaves it to
    the parent (which records the workload as interrupted), with no traceback of its own, even where
    its parent ignores SIGINT (the worker would inherit that, and wait for ever)."""
    import multiprocessing as mp
    import os
    import signal

    from experiments import worker as worker_module
    from experiments.bench import Spec
    from experiments.variants import Variant

    monkeypatch.setattr(worker_module, "_context", lambda: mp.get_context("spawn"))  # a fresh interpreter
    spec = Spec("mlp", "eval", None, "tiny", Variant("eager"), "cpu", 0, 1, {"float64": 1e-6}, 3.0)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        worker = worker_module.Worker(spec, 120)
    finally:
        signal.signal(signal.SIGINT, previous)
    worker.ready()
    os.kill(worker._proc.pid, signal.SIGINT)
    worker._proc.join(60)
    assert worker._proc.exitcode == 0
    assert "Traceback" not in capfd.readouterr().err
    worker.close()


def test_a_worker_stopped_by_ctrl_c_while_it_exits_exits_quietly(capfd, monkeypatch, tmp_path):
    """Ctrl-C reaching a worker that is already leaving, in its exit's cleanup (a spawned worker runs
    Inductor's atexit, which waits for its compile subprocesses: seconds on a GPU host), prints no
    traceback: on an H100, eight float64 checkers closing when a time limit struck printed eight."""
    import multiprocessing as mp
    import os
    import signal
    import time

    from experiments import worker as worker_module
    from experiments.bench import Spec
    from experiments.variants import Variant

    exiting = tmp_path / "exiting"  # the stand-in for Inductor's atexit: says it began, then takes a while
    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, os, time\n"
        "def _cleanup():\n"
        "    open(os.environ['GRACE_TEST_EXITING'], 'w').close()\n"
        "    time.sleep(5)\n"
        "if os.environ.get('GRACE_TEST_EXITING'):\n"
        "    atexit.register(_cleanup)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("GRACE_TEST_EXITING", str(exiting))
    monkeypatch.setattr(worker_module, "_context", lambda: mp.get_context("spawn"))  # it runs atexit
    spec = Spec("mlp", "eval", None, "tiny", Variant("eager"), "cpu", 0, 1, {"float64": 1e-6}, 3.0)
    worker = worker_module.Worker(spec, 120)
    worker.ready()
    worker.ask_to_close()
    deadline = time.monotonic() + 60
    while not exiting.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exiting.exists()
    os.kill(worker._proc.pid, signal.SIGINT)
    worker._proc.join(60)
    assert worker._proc.exitcode == 0
    assert "Traceback" not in capfd.readouterr().err
    worker.close()
