import dataclasses
import json
import multiprocessing as mp

from experiments import report
from experiments.records import (TP_REVISED, HostStats, KernelStats, Numerics, Record, RecordStore, Took, beyond_setups,
                                 current, durations, session_baselines)


def make(variant="inductor", status="ok", run=0, **fields) -> Record:
    return Record(experiment="t", session="s", run=run, workload="mlp", mode="eval", batch=8, size="tiny",
                  variant=variant, status=status, **fields)


def full() -> Record:
    """A record with every field set to something other than its default."""
    return make(reason="r", tp=2, build_s=0.25, compile_s=1.5, warmup_s=0.5, check_s=0.125, workload_s=42.0, set_up_beside=0, start_s=4.5, setup_s=2.5, iter_ms=[[1.0, 2.0], [3.0, 4.0]], median_ms=2.5, rank_median_ms=[2.4, 2.5], p25_ms=1.75,
                p75_ms=3.25, baseline="inductor", round_ratios=[0.9, 1.1], launch_us=[7.0, 8.0],
                sm_clock_mhz=[1980.0, None], kernels=KernelStats(10, 0.2, 12.0, 1.0, 1.0, 4096.0, [{"name": "k", "in_graph": True, "launches": 1.0, "us": 2.0}]),
                host=HostStats(10, {"grace": 3.0}, [{"function": "f", "group": "grace", "calls": 1.0, "us": 3.0}]), peak_mem_mb=12.0,
                cudagraph_skips=1, cudagraph_skip_reasons=["skipping cudagraphs due to mutated inputs"],
                graph_breaks=2, unique_graphs=3, graph_break_reasons=["Unsupported Tensor.item() call -> frame skipped, runs eager"],
                numerics=Numerics(True, 1e-3, 2e-3, 1e-3, 1.3e-2, "bfloat16", "d", "loss"),
                grace={"partitions": 2, "captured": 1, "not_captured": ["capture failed: x"]},
                shape_padding={"mm 8192x50257": {"pad": True, "unpadded_ms": 4.3}},
                measure={"rounds": 2, "iters": 3}, env={"gpu": "NVIDIA H200", "torch": "2.11.0", "git_commit": "abc"})


def test_every_field_survives_a_round_trip(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    rec = full()
    store.append(rec)
    (back,) = store.load()
    assert back == rec
    line = json.loads((tmp_path / "r.jsonl").read_text())
    assert set(line) == {f.name for f in dataclasses.fields(Record)}
    for f in dataclasses.fields(Record):  # none was left at its default by `full`
        if f.default is not dataclasses.MISSING:
            assert getattr(rec, f.name) != f.default, f.name
        elif f.default_factory is not dataclasses.MISSING:
            assert getattr(rec, f.name) != f.default_factory(), f.name


def test_bad_status_is_refused():
    try:
        make(status="great")
    except ValueError:
        return
    raise AssertionError("status 'great' accepted")


def test_latest_wins_and_only_ok_or_mismatch_is_final(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    store.append(make("a", "failed"))
    store.append(make("b", "ok"))
    store.append(make("c", "skipped"))
    store.append(make("d", "mismatch"))
    store.append(make("a", "ok", median_ms=1.0))
    assert store.latest()[make("a").key].median_ms == 1.0
    assert {k[4] for k in store.final_keys()} == {"a", "b", "d"}


def test_an_interrupted_run_does_not_hide_the_record_before_it(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    store.append(make("a", "ok", median_ms=1.0))
    store.append(make("a", "interrupted"))
    store.append(make("b", "interrupted", reason="first"))
    store.append(make("b", "interrupted", reason="second"))
    latest = store.latest()
    assert latest[make("a").key].median_ms == 1.0 and latest[make("b").key].reason == "second"
    assert {k[4] for k in store.final_keys()} == {"a"}


def test_records_made_before_a_date_are_not_final_when_asked(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    store.append(make("a", env={"date": "2026-11-30T07:23:30+00:00"}))
    store.append(make("b", env={"date": "2026-11-30T09:41:02+00:00"}))
    assert {k[4] for k in store.final_keys()} == {"a", "b"}
    assert {k[4] for k in store.final_keys(made_before="2026-11-30T09:30")} == {"b"}


def test_records_made_before_their_workloads_revision_are_not_final_and_not_current(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    old, new = make("a", env={"date": "2026-11-30T07:23:30+00:00"}), make("b", env={"date": "2026-11-30T09:41:02+00:00"})
    other = dataclasses.replace(old, workload="eos_chain")
    for r in (old, new, other):
        store.append(r)
    revised = {"mlp": "2026-11-30T08:00"}
    assert {(k[0], k[4]) for k in store.final_keys(revised=revised)} == {("mlp", "b"), ("eos_chain", "a")}
    assert {(k[0], k[4]) for k in store.final_keys("2026-11-30T07:00", revised)} == {("mlp", "b"), ("eos_chain", "a")}
    assert current([old, new, other], revised) == [new, other]


def test_tensor_parallel_records_made_before_the_harness_fix_are_not_final_and_not_current(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    before, after = {"date": "2026-11-30T23:00:00+00:00"}, {"date": "2026-12-01T01:00:00+00:00"}
    assert before["date"] < TP_REVISED < after["date"]
    tp1, tp2_old, tp2_new = make("a", tp=1, env=before), make("b", tp=2, env=before), make("c", tp=2, env=after)
    for r in (tp1, tp2_old, tp2_new):
        store.append(r)
    assert {k[4] for k in store.final_keys()} == {"a", "c"}
    assert current([tp1, tp2_old, tp2_new], {}) == [tp1, tp2_new]
    assert f"mlp TP2 (1 records before {TP_REVISED})" in report.revised([tp1, tp2_old, tp2_new], {})


def test_a_torn_line_is_skipped_not_fatal(tmp_path):
    path = tmp_path / "r.jsonl"
    store = RecordStore(path)
    store.append(make("a"))
    with path.open("a") as f:
        f.write('{"experiment": "t", "sess')  # a writer killed mid-line
    assert [r.variant for r in store.load()] == ["a"]


def _append_many(path, worker):
    store = RecordStore(path)
    for i in range(50):
        store.append(make(f"w{worker}", run=i, iter_ms=[[float(i)] * 200]))


def test_concurrent_appends_never_interleave(tmp_path):
    path = tmp_path / "r.jsonl"
    procs = [mp.get_context("spawn").Process(target=_append_many, args=(path, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    records = RecordStore(path).load()
    assert len(records) == 200 == len(path.read_text().splitlines())


def test_durations_are_the_newest_measurements_longest_record_and_its_variant_count():
    def rec(session, variant, took, status="ok", workload="mlp"):
        return dataclasses.replace(make(variant, status), session=session, workload=workload, workload_s=took)

    records = [rec("old", "eager", 900.0), rec("new", "eager", 30.0), rec("new", "inductor", 80.0),
               rec("x", "eager", 164.0, status="interrupted", workload="xlnet"),  # ran 164 s, then stopped
               dataclasses.replace(make("eager"), workload="eos")]  # nothing timed: no estimate
    assert durations(records) == {("mlp", "eval", 8, "tiny", 1): Took(80.0, 2),
                                  ("xlnet", "eval", 8, "tiny", 1): Took(164.0, 1, "interrupted")}
    # stopped after 50 s: at least as long as the whole one before it; stopped after 120 s: at least that
    stopped = [rec("new2", v, 50.0, status="interrupted") for v in ("eager", "inductor", "grace")]
    assert durations(records + stopped)[("mlp", "eval", 8, "tiny", 1)] == Took(80.0, 2)
    stopped = [dataclasses.replace(r, session="new3", workload_s=120.0) for r in stopped]
    assert durations(records + stopped)[("mlp", "eval", 8, "tiny", 1)] == Took(120.0, 2)


def test_durations_for_a_sweep_setting_up_alone_count_parallel_setups_one_after_another():
    def rec(variant, compile_s, beside, took=100.0):
        return dataclasses.replace(make(variant), session="s", workload_s=took, compile_s=compile_s, warmup_s=1.0,
                                   set_up_beside=beside)

    parallel = [rec("eager", 20.0, 2), rec("inductor", 40.0, 2), rec("grace", 30.0, 0)]  # grace set up alone
    k = ("mlp", "eval", 8, "tiny", 1)
    assert durations(parallel) == {k: Took(100.0, 3)}
    assert durations(parallel, alone=True) == {k: Took(121.0, 3)}  # the shorter parallel setup (20 + 1 s) now comes on top
    serial = [rec("eager", 20.0, 0), rec("inductor", 40.0, 0)]
    assert durations(serial, alone=True) == {k: Took(100.0, 2)}
    # from before workload_s: the setups, those made beside each other overlapping unless `alone`
    untimed = [dataclasses.replace(r, workload_s=None) for r in parallel]
    assert durations(untimed) == {k: Took(31.0 + 41.0, 3, "setups")}
    assert durations(untimed, alone=True) == {k: Took(31.0 + 41.0 + 21.0, 3, "setups")}


def test_beyond_setups_is_the_most_a_measurement_with_started_workers_took_past_its_setups_per_variant():
    def rec(session, variant, took, start_s=5.0, status="ok", workload="mlp"):
        return dataclasses.replace(make(variant, status), session=session, workload=workload, workload_s=took,
                                   compile_s=10.0, warmup_s=2.0, start_s=start_s)

    assert beyond_setups([rec("old", "eager", 500.0, start_s=None)]) is None  # workers started one by one
    records = [rec("a", "eager", 40.0), rec("a", "inductor", 64.0),  # (64 - 2 x 12) / 2
               rec("b", "eager", 30.0, workload="eos"),  # 30 - 12
               rec("c", "eager", 900.0, status="interrupted", workload="xlnet")]  # not whole
    assert beyond_setups(records) == 20.0
    part = [rec("d", "eager", 100.0, workload="mt5")]  # a part of one variant of two: its reference's 88 s on it
    assert beyond_setups(records + part) == 20.0


def test_session_baselines_are_each_sessions_newest_record_of_the_baseline_but_an_interrupted_one():
    first, failed, later = make(), make(status="failed"), dataclasses.replace(make(), session="s2")
    stopped = dataclasses.replace(make(status="interrupted"), session="s2")
    k = ("mlp", "eval", 8, "tiny", 0, 1)
    assert session_baselines([first, make("grace"), failed, later, stopped], "inductor") == {("s", *k): failed,
                                                                                             ("s2", *k): later}
