import dataclasses
import json
import multiprocessing as mp

from experiments import report
from experiments.records import TP_REVISED, HostStats, KernelStats, Numerics, Record, RecordStore, current, session_baselines


def make(variant="inductor", status="ok", run=0, **fields) -> Record:
    return Record(experiment="t", session="s", run=run, workload="mlp", mode="eval", batch=8, size="tiny",
                  variant=variant, status=status, **fields)


def full() -> Record:
    """A record with every field set to something other than its default."""
    return make(reason="r", tp=2, build_s=0.25, compile_s=1.5, warmup_s=0.5, check_s=0.125, float64_check_s=0.75, workload_s=42.0, set_up_beside=0, start_s=4.5, setup_s=2.5, setup_position=3, iter_ms=[[1.0, 2.0], [3.0, 4.0]], processes=2, median_ms=2.5, rank_median_ms=[2.4, 2.5], p25_ms=1.75,
                p75_ms=3.25, baseline="inductor", round_ratios=[0.9, 1.1], speedup=1.25, speedup_ci=[1.1, 1.4], over_floor=1.6, over_floor_ci=[1.5, 1.7],
                floor_method="replay", launch_us=[7.0, 8.0],
                sm_clock_mhz=[1980.0, None], kernels=KernelStats(10, 0.2, 12.0, 1.0, 1.0, 4096.0, [{"name": "k", "in_graph": True, "launches": 1.0, "us": 2.0}]),
                host=HostStats(10, {"grace": 3.0}, [{"function": "f", "group": "grace", "calls": 1.0, "us": 3.0}]), peak_mem_mb=12.0, held_mem_mb=20.0,
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


def test_latest_wins_and_what_was_measured_or_skipped_is_final(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    store.append(make("a", "failed"))
    store.append(make("b", "ok"))
    store.append(make("c", "skipped"))
    store.append(make("d", "mismatch"))
    store.append(make("a", "ok", median_ms=1.0))
    assert store.latest()[make("a").key].median_ms == 1.0
    assert {k.variant for k in store.final_keys()} == {"a", "b", "c", "d"}


def test_an_interrupted_run_does_not_hide_the_record_before_it(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    store.append(make("a", "ok", median_ms=1.0))
    store.append(make("a", "interrupted"))
    store.append(make("b", "interrupted", reason="first"))
    store.append(make("b", "interrupted", reason="second"))
    latest = store.latest()
    assert latest[make("a").key].median_ms == 1.0 and latest[make("b").key].reason == "second"
    assert {k.variant for k in store.final_keys()} == {"a"}


def test_records_made_before_their_workloads_revision_are_not_final_and_not_current(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    old, new = make("a", env={"date": "2026-11-30T07:23:30+00:00"}), make("b", env={"date": "2026-11-30T09:41:02+00:00"})
    other = dataclasses.replace(old, workload="eos_chain")
    for r in (old, new, other):
        store.append(r)
    revised = {"mlp": "2026-11-30T08:00"}
    assert {(k.workload, k.variant) for k in store.final_keys(revised=revised)} == {("mlp", "b"), ("eos_chain", "a")}
    assert current([old, new, other], revised) == [new, other]


def test_tensor_parallel_records_made_before_the_harness_fix_are_not_final_and_not_current(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    before, after = {"date": "2026-11-30T23:00:00+00:00"}, {"date": "2026-12-01T01:00:00+00:00"}
    assert before["date"] < TP_REVISED < after["date"]
    tp1, tp2_old, tp2_new = make("a", tp=1, env=before), make("b", tp=2, env=before), make("c", tp=2, env=after)
    for r in (tp1, tp2_old, tp2_new):
        store.append(r)
    assert {k.variant for k in store.final_keys()} == {"a", "c"}
    assert current([tp1, tp2_old, tp2_new], {}) == [tp1, tp2_new]
    assert report.revised([tp1, tp2_old, tp2_new], {}).to_dict("records") == [
        {"workload": "mlp", "tp": 2, "records": 1, "made before": TP_REVISED}]


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


def test_session_baselines_are_each_sessions_newest_record_of_the_baseline_but_an_interrupted_one():
    first, failed, later = make(), make(status="failed"), dataclasses.replace(make(), session="s2")
    stopped = dataclasses.replace(make(status="interrupted"), session="s2")
    assert session_baselines([first, make("grace"), failed, later, stopped], "inductor") == {
        first.key.in_session("s"): failed, first.key.in_session("s2"): later}
    assert first.key.in_session("s") == make("grace").key.in_session("s") != first.key.in_session("s2")


def test_records_of_other_code_are_not_final_when_the_code_is_asked(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    store.append(make("a", env={"code": "old"}))
    store.append(make("b", env={"code": "new"}))
    assert {k.variant for k in store.final_keys(code="new")} == {"b"}
    assert {k.variant for k in store.final_keys()} == {"a", "b"}


def test_a_measurement_with_other_settings_is_not_final_but_another_cores_is(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    settings = {"rounds": 20, "processes": 1, "timing_cpus": [14, 15], "timeout_s": 1800}
    for r in [make("a", measure=settings), make("b", measure={**settings, "processes": 3}),
              make("c", measure={**settings, "timing_cpus": [12, 13], "timeout_s": 60}),
              make("d", status="skipped", measure={**settings, "rounds": 2})]:
        store.append(r)
    assert {k.variant for k in store.final_keys(measure=settings)} == {"a", "c", "d"}
    assert {k.variant for k in store.final_keys()} == {"a", "b", "c", "d"}
