import dataclasses
import json
import math
import random
import re

import pandas as pd
import pytest

from experiments import figures, report
from experiments.records import HostStats
from tests.harness.test_figures import RECORDS, rec


def test_shortfall_from_records(tmp_path):
    report.write_shortfall(RECORDS, tmp_path)
    table = pd.read_csv(tmp_path / "pt2_cg_shortfall.csv", index_col="workload")
    assert table.loc["a eval b1", "pt2_cg / inductor time"] == 0.5
    assert table.loc["c eval b1", "pt2_cg / inductor time"] == 2.0
    assert list(table["slower than inductor"]) == [False, False, True]
    assert table.loc["b eval b1", "bytes copied/iter"] == 128
    assert "| c eval b1" in (tmp_path / "pt2_cg_shortfall.md").read_text()


def _as_paper(records):
    """RECORDS as three of the paper's workloads (a: ALNET, b: TKE, c: EOS), at the paper's batch sizes."""
    paper = {"a": ("alexnet", 2), "b": ("tke", 1_048_576), "c": ("eos_chain", 1_048_576)}
    return [dataclasses.replace(r, workload=paper[r.workload][0], batch=paper[r.workload][1]) for r in records]


def test_headline_numbers():
    toy = [rec("mlp", "inductor", 10.0), rec("mlp", "pt2_cg", 1.0), rec("mlp", "grace", 1.0)]
    records = _as_paper(RECORDS) + toy
    g = report.geomeans(records)
    # pt2_cg: speedups 2, 3, 0.5 -> geomean 3 ** (1/3); grace: 4 and 9 (EOS failed) -> 6; the smoke
    # workload (10x) is in the per-workload table, not in the headline numbers
    assert g.loc["pt2_cg", "workloads"] == 3 and math.isclose(g.loc["pt2_cg", "geomean speedup"], 3 ** (1 / 3))
    assert g.loc["grace", "workloads"] == 2 and math.isclose(g.loc["grace", "geomean speedup"], 6)
    assert g.loc["pt2_cg", "slower than inductor"] == "EOS" and g.loc["grace", "slower than inductor"] == ""
    # benefit ratio over ALNET and TKE: (6 - 1) / (sqrt(6) - 1)
    assert math.isclose(g.loc["grace", "benefit ratio"], (6 - 1) / (math.sqrt(6) - 1))
    assert f"(a benefit ratio above 2); these records give {(6 - 1) / (math.sqrt(6) - 1):.2f}." in report.summary(records)
    assert "mlp eval b1" in report.per_workload(records).index
    c = report.caveats(records)
    assert c.loc["EOS", "not ok"] == "grace: failed: " and c.loc["ALNET", "measured at"] == "commit unknown"
    assert c["capture out of memory"].isna().all()
    assert report.environment(records).index[0][0] == "NVIDIA H200"
    failed = dataclasses.replace(rec("mlp", "pt2_cg", None, status="failed"), reason="setup: OutOfMemoryError: x\nmore")
    assert report.caveats(toy + [failed]).loc["mlp eval b1", "not ok"] == "pt2_cg: failed: setup: OutOfMemoryError: x"


def test_caveats_name_variants_measured_after_a_capture_ran_out_of_memory():
    starved = rec("a", "grace", 1.0)
    starved.grace = {"not_captured": ["capture failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB"]}
    c = report.caveats([r for r in RECORDS if (r.workload, r.variant) != ("a", "grace")] + [starved])
    assert c.loc["a eval b1", "capture out of memory"] == "grace"


def test_caveats_name_variants_where_grace_fell_back():
    """At one code every GraCE variant fell back to Inductor without its runtime (a torch 2.11 map it
    misread): a bar of GraCE's that measured Inductor must say so."""
    fell = rec("a", "grace", 1.0)
    fell.grace = {"fallbacks": ["graph 1: Inductor without GraCE's runtime (compiling with it failed): TypeError: x",
                                "graph 2: the same"]}
    c = report.caveats([r for r in RECORDS if (r.workload, r.variant) != ("a", "grace")] + [fell])
    assert c.loc["a eval b1", "GraCE fell back"] == ("grace: graph 1: Inductor without GraCE's runtime (compiling "
                                                     "with it failed): TypeError: x")
    assert c["GraCE fell back"].drop("a eval b1").isna().all()


def test_caveats_name_variants_that_inductor_padded_otherwise_beside_others():
    """DGPT2's floor left the LM head's GEMM unpadded beside eight others that padded it."""
    gemm = {"pad": True, "unpadded_ms": 4.5}
    records = [dataclasses.replace(r, shape_padding={"lm_head": gemm} if r.workload == "a" else {}, set_up_beside=2)
               for r in RECORDS]
    assert report.caveats(records)["padded otherwise"].isna().all()
    odd = next(i for i, r in enumerate(records) if (r.workload, r.variant) == ("a", "pt2_cg"))
    records[odd] = dataclasses.replace(records[odd], shape_padding={"lm_head": {**gemm, "pad": False}})
    assert report.caveats(records).loc["a eval b1", "padded otherwise"] == "pt2_cg"
    # a floor compiled otherwise is no floor: no variant of its session is timed over it
    over = [dataclasses.replace(r, over_floor=2.0) for r in records]
    floor = dataclasses.replace(rec("a", "floor", 0.5), set_up_beside=2, shape_padding={"lm_head": gemm})
    def over_floor(workload):
        df = figures.frame(over + [floor])
        return df.loc[(df["workload"] == workload) & (df["variant"] != "floor"), "over_floor"]
    assert (over_floor("a") == 2.0).all()
    floor.shape_padding = {"lm_head": {**gemm, "pad": False}}
    assert over_floor("a").isna().all() and (over_floor("b") == 2.0).all()


def test_where_grace_misses_the_better_stock_choice():
    records = RECORDS + [rec("d", "inductor", 1.0), rec("d", "pt2_cg", 1.0), rec("d", "grace", 1.1),
                         rec("e", "inductor", 1.0), rec("e", "pt2_cg", 0.5, share=1.0), rec("e", "grace", 0.6)]
    # per-round ratios to inductor's rounds: d's grace misses in two rounds of three, e's in all three
    records[-4].round_ratios, records[-2].round_ratios = [1.2, 1.0, 1.1], [0.5, 0.5, 0.5]
    records[-1].round_ratios = [0.6, 0.62, 0.58]
    records[-1].kernels = dataclasses.replace(records[-1].kernels, gpu_kernel_ms=0.15)  # 0.1 in the others
    t = report.within_best_stock(records)
    # a and b beat both; c's grace failed; d: 1.1 x, and no variant replayed a graph; e: 0.6 against 0.5,
    # half of the gap on the GPU
    assert list(t.index[~t["within 3 %"].astype(bool)]) == ["d eval b1", "e eval b1"] and "c eval b1" not in t.index
    assert math.isclose(t.loc["d eval b1", "ratio"], 1.1) and not t.loc["d eval b1", "graphs"]
    assert (t.loc["d eval b1", "per round min"], t.loc["d eval b1", "per round max"]) == (1.0, 1.2)
    assert t.loc["e eval b1", "best stock"] == "pt2_cg" and math.isclose(t.loc["e eval b1", "GPU gap ms"], 0.05)
    assert list(t.index[t["slower every round"].astype(bool)]) == ["e eval b1"]


def test_scg_decisions_count_the_models_agreement():
    def decision(choice, measured, agreed, tied=False):
        return {"choice": choice, "measured_us": {"graph": 1.0} if measured else None, "agreed": agreed,
                "tied": tied}

    grace = rec("a", "grace", 1.0)
    grace.grace = {"scg": {"decisions": [decision("graph", False, None), decision("eager", True, True),
                                         decision("graph_pi", True, False)]}}
    records = [r for r in RECORDS if (r.workload, r.variant) != ("a", "grace")] + [grace]
    (row,) = report.scg_decisions(records).to_dict("records")
    assert row == {"decisions": 3, "graph": 1, "graph_pi": 1, "eager": 1, "by the model": 1, "timed": 2,
                   "model agreed": 1, "ties": 0, "timed alone": 0, "model agreed alone": 0}
    grace.grace["scg"]["decisions"].append(decision("graph", True, None, tied=True))
    grace.set_up_beside = 0  # set up alone: its timings undisturbed
    (row,) = report.scg_decisions(records).to_dict("records")
    assert (row["timed"], row["model agreed"], row["ties"], row["timed alone"], row["model agreed alone"]) == (3, 1, 1, 3, 1)
    assert report.scg_decisions(RECORDS).loc[0, "decisions"] == 0


def test_without_grace_the_tables_say_so():
    records = [r for r in RECORDS if r.variant != "grace"]
    g = report.geomeans(records)
    assert g.loc["grace", "workloads"] == 0 and g["benefit ratio"].isna().all()
    assert report.summary([]) == "No GPU records yet.\n"


def test_time_over_gpu_time():
    table = report.per_workload([rec("a", "inductor", 4.0), rec("a", "pt2_cg", 2.0)])
    assert table.loc["a eval b1", "pt2_cg time / GPU time"] == 20  # 2.0 ms over 0.1 ms of GPU time


def test_time_over_the_floor_where_one_was_measured():
    assert "pt2_cg time / floor" not in report.per_workload([rec("a", "inductor", 4.0), rec("a", "pt2_cg", 2.0)])
    records = _as_paper([dataclasses.replace(rec("a", v, ms), over_floor=ms / 0.5) for v, ms in
                         (("inductor", 4.0), ("pt2_cg", 2.0), ("grace", 1.0))]
                        + [dataclasses.replace(rec("b", v, ms), over_floor=ms / 0.5) for v, ms in
                           (("inductor", 4.0), ("pt2_cg", 2.0), ("grace", 2.0))])
    table = report.per_workload(records)
    assert table.loc["ALNET", "grace time / floor"] == 2 and table.loc["TKE", "inductor time / floor"] == 8
    g = report.geomeans(records)
    assert math.isclose(g.loc["grace", "geomean time / floor"], math.sqrt(2 * 4))
    assert pd.isna(g.loc["grace", "floor low"])  # floors measured without an interval: the geomean has none
    with_ci = [dataclasses.replace(r, over_floor_ci=[0.9 * r.over_floor, 1.1 * r.over_floor]) for r in records]
    g = report.geomeans(with_ci)
    assert g.loc["grace", "floor low"] < math.sqrt(2 * 4) < g.loc["grace", "floor high"] < 1.1 * math.sqrt(2 * 4)


def test_splice_needs_markers(tmp_path):
    path = tmp_path / "R.md"
    path.write_text("no markers\n")
    with pytest.raises(ValueError, match="markers"):
        report.splice("x", path)


def test_spread_reports_runs_measured_twice():
    from tests.harness.test_records import make

    def at(date, commit="abc1234"):
        return {"git_commit": commit, "date": f"2026-11-30T{date}"}

    # pt2_cg: runs 0 and 1 of one sweep, which share its date (run 1 recorded first)
    records = [make("pt2_cg", run=1, median_ms=2.2, env=at("01")), make("pt2_cg", run=0, median_ms=2.0, env=at("01")),
               make("inductor", run=0, median_ms=5.0, env=at("01")),  # measured once: not in the table
               # grace: measured twice by older code, then twice again (a sweep that ran it again): the newest
               # code's measurements count
               make("grace", median_ms=1.0, env=at("01", "old0000")), make("grace", median_ms=3.0, env=at("02", "old0000")),
               make("grace", median_ms=1.5, env=at("03")), make("grace", median_ms=1.2, env=at("04"))]
    text = report.spread(records)
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| mlp")]
    assert rows == [["mlp eval b8 tiny / grace", "1.5", "1.2", "25", "abc1234"],
                    ["mlp eval b8 tiny / pt2_cg", "2", "2.2", "10", "abc1234"]]
    assert report.spread(records[2:3]) == ""


def test_kernel_diff_puts_the_largest_difference_first():
    a, b = rec("a", "pt2_cg", 2.0), rec("a", "runtime", 2.5)
    a.kernels.top = [{"name": "gemm", "in_graph": True, "launches": 4.0, "us": 100.0},
                     {"name": "copy", "in_graph": False, "launches": 1.0, "us": 10.0}]
    b.kernels.top = [{"name": "gemm", "in_graph": True, "launches": 4.0, "us": 101.0},
                     {"name": "adam", "in_graph": False, "launches": 2.0, "us": 60.0}]
    text = report.kernel_diff([a, b], "a eval b1", "pt2_cg", "runtime")
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| ")][1:]
    assert rows == [["adam", "False", "", "60.0", "60.0"], ["copy", "False", "10.0", "", "-10.0"],
                    ["gemm", "True", "100.0", "101.0", "1.0"]]
    assert "median 2.000 ms (pt2_cg) against 2.500 ms (runtime)" in text
    assert report.kernel_diff([a], "a eval b1", "pt2_cg", "runtime") == "a eval b1: no kernel table recorded for runtime.\n"
    assert "Host time" not in text  # neither record has it
    a.host = HostStats(10, {"grace": 5.0, "inductor generated code": 300.0})
    b.host = HostStats(10, {"grace": 1500.0, "inductor generated code": 310.0})
    host = report.kernel_diff([a, b], "a eval b1", "pt2_cg", "runtime").split("Host time")[1]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in host.splitlines() if line.startswith("| ")][1:]
    assert rows == [["grace", "5.0", "1500.0", "1495.0"], ["inductor generated code", "300.0", "310.0", "10.0"]]


def test_kernel_diff_names_the_gemms_inductor_padded_in_one_variant_only():
    a, b = rec("a", "pt2_cg", 2.0), rec("a", "runtime", 2.5)
    a.kernels.top = b.kernels.top = [{"name": "gemm", "in_graph": True, "launches": 1.0, "us": 100.0}]
    assert "padded" not in report.kernel_diff([a, b], "a eval b1", "pt2_cg", "runtime")  # none recorded
    a.shape_padding = {"mm 8192x50257": {"pad": True, "unpadded_ms": 4.3}, "mm 64x7": {"pad": False, "unpadded_ms": 0.1}}
    b.shape_padding = {"mm 8192x50257": {"pad": False, "unpadded_ms": 4.2}, "mm 64x7": {"pad": False, "unpadded_ms": 0.1}}
    text = report.kernel_diff([a, b], "a eval b1", "pt2_cg", "runtime").split("padded GEMMs differently")[1]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| ")][1:]
    assert rows == [["mm 8192x50257", "True", "False"]]


def test_caveats_say_whether_every_variant_was_set_up_alone():
    """Alone: set_up_beside 0, or in a record older than that field, a sweep that set up one at a time."""
    records = [dataclasses.replace(r, set_up_beside=0) if r.workload == "a" else
               dataclasses.replace(r, measure={"parallel_setup": False}) if r.workload == "b" else r for r in RECORDS]
    alone = report.caveats(records)["set up alone"]
    assert list(alone[alone.astype(bool)].index) == ["a eval b1", "b eval b1"]
    # c's inductor alone, its pt2_cg beside two others: c still counts as not alone
    records = [dataclasses.replace(r, set_up_beside=2 if r.variant == "pt2_cg" else 0) if r.workload == "c" else r
               for r in records]
    assert not report.caveats(records).loc["c eval b1", "set up alone"]


def test_caveats_count_the_sessions_a_workloads_variants_come_from():
    assert set(report.caveats(RECORDS)["sessions"]) == {1}
    records = [dataclasses.replace(r, session="later") if (r.workload, r.variant) == ("b", "grace") else r for r in RECORDS]
    assert report.caveats(records).loc["b eval b1", "sessions"] == 2


def test_the_table_takes_the_baseline_of_graces_session():
    """The baseline's newest record is of another session without grace: the table's inductor median,
    and the comparison with the best stock variant, are those of grace's session all the same."""
    later = [dataclasses.replace(r, session="part 1") for r in (rec("b", "inductor", 90.0), rec("b", "cgct", 2.0))]
    table = report.per_workload(RECORDS + later)
    assert table.loc["b eval b1", "inductor median ms"] == 9
    assert report.within_best_stock(RECORDS + later)["within 3 %"].astype(bool).all()


def test_corpus_pass_rates_and_speed_against_the_best_stock_variant():
    noise = random.Random(0)

    def r(program, variant, status="ok", us=None, jitter=0.01, options=None):  # rounds drift by up to +-jitter
        rounds = [[us * (1 + jitter * (2 * noise.random() - 1))] * 5 for _ in range(10)] if us else None
        return {"program": program, "variant": variant, "status": status, "median_us": us, "iter_us": rounds,
                "grace": {"options": [options]} if options else None}

    on = {"cgct": True, "pi": True, "scg": True}
    # GraCE's records by the options they ran: those without options kept are of the defaults then (CGCT)
    records = [r("a", "inductor", us=10), r("a", "pt2_cg", us=5), r("a", "grace", us=6, options=on), r("a", "grace", us=4),
               r("b", "inductor", us=10), r("b", "pt2_cg", "crash"), r("b", "grace_all", us=5), r("b", "grace", us=20),
               r("b", "grace", us=8, options=on), r("c", "inductor", us=10), r("c", "grace", us=10, jitter=0.3, options=on)]
    records[2].update(kernels=10, kernels_in_graphs=4)
    records[2]["grace"]["not_captured"] = ["SCG: faster without a graph"]
    records[2]["env"] = {"git_commit": "bc256dc84f9d"}
    records[1]["device_us"], records[2]["device_us"] = 4.0, 5.0  # a's gap is on the GPU in part
    rates, vs = report.corpus(records)  # the newest counts
    assert rates.loc["pt2_cg", "crash"] == 1 and rates.loc["grace", "ok"] == 3 and rates.loc["grace", "programs"] == 3
    assert rates.loc["grace (cgct)", "programs"] == 2
    assert list(vs.index) == ["a", "c", "b"] and vs.loc["a", "grace / best stock"] == 1.2 and vs.loc["b", "best stock"] == "inductor"
    assert vs.loc["b", "grace / best stock"] == 0.8 and vs.loc["b", "grace (cgct) / best stock"] == 2.0
    assert vs.loc["a", "grace low"] > 1 and list(vs["grace verdict"]) == ["slower", "within noise", "faster"]
    assert vs.loc["a", "grace: kernels in graphs"] == "4 of 10"
    assert vs.loc["a", "grace: why not in a graph"] == "SCG: faster without a graph"
    assert vs.loc["a", "grace: measured at"] == "commit bc256dc" and vs.loc["b", "grace: measured at"] == "commit unknown"
    assert vs.loc["a", "grace: GPU time / best stock's"] == 1.25 and pd.isna(vs.loc["b", "grace: GPU time / best stock's"])
    text = report.corpus_markdown(records)
    assert "grace 0.986 (slower beyond noise on 1 of 3 programs, faster on 1)" in text


def test_a_corpus_record_with_a_code_hash_and_no_options_ran_all_three():
    """Until 93f0567521b0 a grace variant that crashed kept no options; every record with a code hash
    ran grace's defaults of then, all three on."""
    crashed = {"program": "a", "variant": "grace", "status": "crash", "grace": None, "env": {"code": "64bc1dab27a8"}}
    assert report._grace_variant(crashed) == "grace"
    assert report._grace_variant({**crashed, "env": {"git_commit": "0596fd0"}}) == "grace (cgct)"


def test_a_corpus_cell_keeps_distinct_reasons_short():
    fell_back = [f"graph {g}: Inductor without GraCE's runtime: " + "x" * 200 for g in (5, 6)]
    cell = report._reasons(["warm-up", "warm-up", "SCG: faster without a graph", *fell_back, "last"])
    assert cell.startswith("warm-up; SCG: faster without a graph; graph 5: Inductor without")
    assert cell.endswith("...; and 2 more") and len(cell) < 200


def test_host_gap_takes_apart_what_a_workload_spends_beyond_its_gpu_time():
    sync = {"function": "<built-in method torch._C._cuda_synchronize>", "group": "C, charged to its callers",
            "calls": 0.1, "us": 100.0}
    alnet = dataclasses.replace(rec("alexnet", "grace", 1.0, share=0.6), batch=2)  # GPU time 0.1 ms
    alnet.host = HostStats(10, {"torch, other": 120.0, "grace": 30.0, "CUDA graph launch": 5.0}, [sync])
    alnet.grace, alnet.over_floor = {"replays_per_call": 3, "calls_without_graph": 1, "lean_graphs": 2}, 1.4
    tke = dataclasses.replace(rec("tke", "grace", 2.0), batch=1_048_576)
    tke.host = HostStats(10, {"torch, other": 50.0, "grace": 10.0})  # grouped by path, before the fix
    near = dataclasses.replace(rec("eos_chain", "grace", 0.11), batch=1_048_576)  # 1.1x its GPU time
    others = [dataclasses.replace(alnet, variant="pt2_cg"), rec("mlp", "grace", 1.0)]  # not grace; not the paper's
    table = report.host_gap([alnet, tke, near, *others])
    assert list(table.index) == ["TKE", "ALNET"]  # the largest gap first
    a = table.loc["ALNET"]
    assert math.isclose(a["time / GPU time"], 10) and math.isclose(a["gap ms"], 0.9) and math.isclose(a["kernels outside graphs"], 2)
    assert a["waiting on the GPU us"] == 100 and a["torch, other us"] == 20 and a["largest host part"] == "grace"
    assert a["profile grouped"] == "by package" and table.loc["TKE", "profile grouped"] == "by path"
    assert table.loc["TKE", "largest host part"] == "torch, other"
    assert (a["graph replays"], a["partition calls without graph"], a["graphs called lean"], a["time / floor"]) == (3, 1, 2, 1.4)
    assert pd.isna(table.loc["TKE", "time / floor"])


def _session(workload, aa, aa_ci, grace, grace_ci):
    """One session of `workload`: the baseline, its A/A control and grace, with their speedups and intervals."""
    made = [rec(workload, "inductor", 1.0), rec(workload, "inductor_aa", 1 / aa), rec(workload, "grace", 1 / grace)]
    for r, (speedup, ci) in zip(made[1:], [(aa, aa_ci), (grace, grace_ci)]):
        r.session, r.speedup, r.speedup_ci = workload, speedup, list(ci)
    made[0].session = workload
    return made


def test_every_figure_and_table_widens_by_one_workers_noise_from_every_aa_control(tmp_path, monkeypatch):
    # a paper workload (ALNET) and one beyond the paper (mlp), each with an A/A control off by its own amount:
    # the workers' noise is the harness's, so Fig 9, the extras' figure and the report all take both
    stock = dataclasses.replace(rec("a", "pt2_cg", 0.95), session="a")
    records = (_as_paper(_session("a", 1.06, (1.04, 1.08), 1.06, (1.03, 1.09)) + [stock])
               + _session("mlp", 0.90, (0.88, 0.92), 1.2, (1.15, 1.25)))
    both = figures.worker_noise(figures.frame(records))
    drawn = []
    monkeypatch.setattr(figures, "_noise_note", lambda noise: drawn.append(noise) or "")
    figures.paper_figures(records, tmp_path)
    assert both[1] == 2 and len(drawn) >= 3 and set(drawn) == {both}
    for r in records:  # rounds, so that the report judges grace against the best stock variant
        r.iter_ms = [[r.median_ms * (1 + i / 100)] * 5 for i in range(4)]
    widened = []
    monkeypatch.setattr(report, "widen", lambda *args: widened.append(args[-1]) or figures.widen(*args))
    report.within_best_stock(records)
    assert widened == [both[0]] and figures.worker_noise(figures.frame(records[:4]))[0] < both[0]
    g = report.geomeans(records)  # one paper workload: grace's geomean interval is its widened interval
    assert (g.loc["grace", "low"], g.loc["grace", "high"]) == pytest.approx(figures.widen(1.06, 1.03, 1.09, both[0]), rel=1e-3)
    assert pd.isna(g.loc["pt2_cg", "low"])  # measured without rounds: no interval, none for its geomean


def test_the_workers_noise_is_what_the_aa_controls_show_beyond_their_rounds_and_widens_every_verdict():
    centred = _session("a", 1.01, (0.97, 1.05), 1.06, (1.03, 1.09)) + _session("b", 0.99, (0.95, 1.03), 1.2, (1.15, 1.25))
    tau, n = figures.worker_noise(figures.frame(centred))
    assert (tau, n) == (0.0, 2)  # each A/A offset lies well within its own interval: the rounds saw it all
    off = _session("a", 1.06, (1.04, 1.08), 1.06, (1.03, 1.09)) + _session("b", 0.94, (0.92, 0.96), 1.2, (1.15, 1.25))
    tau, n = figures.worker_noise(figures.frame(off))
    # Paule-Mandel: each control's squared offset over its rounds' variance plus tau^2 sums to their count
    weighed = [math.log(aa) ** 2 / ((math.log(hi / lo) / (2 * figures.Z95)) ** 2 + tau ** 2)
               for aa, lo, hi in [(1.06, 1.04, 1.08), (0.94, 0.92, 0.96)]]
    assert n == 2 and math.isclose(sum(weighed), 2, rel_tol=1e-6)
    lo, hi = figures.widen(1.06, 1.03, 1.09, tau)
    assert lo < 1 < hi and figures.widen(1.06, 1.03, 1.09, 0.0) == pytest.approx((1.03, 1.09))
    text = report.noise(off)
    assert "excludes 1 in 2 of 2 sessions" in text
    assert re.search(r"1\.060 \[0\.9\d\d, 1\.1\d\d\] within noise", text)  # a win by the rounds alone
    assert re.search(r"1\.200 \[1\.0\d\d, 1\.3\d\d\] win", text)


def test_one_session_with_noisy_rounds_does_not_take_the_workers_noise_away():
    # six controls off by +-1 % with tight rounds, then one centred with rounds 5 % wide (log-sd): a plain
    # mean of log(aa)^2 - sd^2 would fall to 0 and narrow every other session's interval
    def control(workload, offset, sd):
        aa = math.exp(offset)
        return _session(workload, aa, (aa * math.exp(-figures.Z95 * sd), aa * math.exp(figures.Z95 * sd)), 1.2,
                        (1.15, 1.25))
    tight = [r for i in range(6) for r in control(f"w{i}", (-1) ** i * 0.01, 0.0005)]
    before, _ = figures.worker_noise(figures.frame(tight))
    after, n = figures.worker_noise(figures.frame(tight + control("noisy", 0.0, 0.05)))
    assert n == 7 and 0.0099 < before < 0.01 and after > 0.9 * before


def test_sessions_of_several_processes_a_variant_neither_set_the_workers_noise_nor_get_widened_by_it():
    single = _session("a", 1.06, (1.04, 1.08), 1.06, (1.03, 1.09))
    several = _session("b", 1.001, (0.97, 1.03), 1.2, (1.15, 1.25))
    for r in several:
        r.processes = 3  # their intervals resampled each side's processes
    alone = figures.worker_noise(figures.frame(single))
    assert figures.worker_noise(figures.frame(single + several)) == alone and alone[0] > 0
    text = report.noise(single + several)
    assert "1.200 [1.150, 1.250] win" in text and not re.search(r"1\.060 \[1\.030, 1\.090\]", text)


def test_each_row_of_the_noise_table_is_one_session():
    def session(name, date, **speedups):
        made = [rec("a", "inductor", 1.0)] + [rec("a", v, 1 / x) for v, x in speedups.items()]
        for r in made:
            r.session, r.env = name, {**r.env, "date": date}
            r.speedup, r.speedup_ci = 1 / r.median_ms, [0.99 / r.median_ms, 1.01 / r.median_ms]
        return made

    fig9 = session("fig9", "2026-12-01", inductor_aa=1.0, pt2_cg=2.0, grace=2.5)
    fig10 = session("fig10", "2026-12-02", inductor_aa=1.0, grace=3.0, cgct=2.0)  # newer, without pt2_cg
    text = report.noise(fig9 + fig10)
    assert re.search(r"\| a eval b1 \| 1\.000 \[[^|]*\| 2\.000 [^|]*\| 2\.500 ", text)  # not fig10's 3.0 beside it


def _aa_session(name, date, aa_ci, grace, code="c1"):
    made = [rec("a", "inductor", 1.0), rec("a", "inductor_aa", 1.0), rec("a", "pt2_cg", 0.5),
            rec("a", "grace", 1 / grace)]
    for r in made:
        r.session, r.env = name, {**r.env, "date": date, "code": code}
        r.speedup, r.speedup_ci = 1 / r.median_ms, [0.99 / r.median_ms, 1.01 / r.median_ms]
    made[1].speedup, made[1].speedup_ci = 1.0, list(aa_ci)
    return made


def test_a_session_whose_aa_control_missed_3_percent_gives_way_to_one_that_met_it():
    met = _aa_session("met", "2026-12-01", (0.98, 1.02), 2.5)
    missed = _aa_session("missed", "2026-12-02", (1.01, 1.44), 4.0)  # newer, on a slowed host
    chosen = figures.one_session(met + missed, ["inductor", "grace"])
    assert {r.session for r in chosen.values()} == {"met"}
    assert math.isclose(report.geomeans(_as_paper(met + missed)).loc["grace", "geomean speedup"], 2.5)
    text = report.noise(met + missed)
    assert re.search(r"\| a eval b1 \| 1\.000 \[0\.980, 1\.020\] [^|]*\|[^|]*\| 2\.500 ", text)
    assert "a eval b1 (code c1): 1.000 [1.010, 1.440]" in text
    # with no session that met it, the newest stands, and nothing is said to be set aside
    assert {r.session for r in figures.one_session(missed, ["inductor", "grace"]).values()} == {"missed"}
    assert "set aside" not in report.noise(missed)


def test_a_workload_measured_at_a_newer_code_leaves_its_older_codes_sessions_behind():
    """The figures move to one code: an older code's session does not come back for a control that met
    +-3 %; among the newer code's sessions, one that met it still comes first."""
    old = _aa_session("old", "2026-12-01", (0.98, 1.02), 2.5, code="c1")
    missed = _aa_session("missed", "2026-12-02", (1.01, 1.04), 3.0, code="c2")
    assert {r.session for r in figures.one_session(old + missed, ["inductor", "grace"]).values()} == {"missed"}
    met = _aa_session("met", "2026-12-03", (0.99, 1.01), 2.8, code="c2")
    again = _aa_session("again", "2026-12-04", (1.01, 1.05), 3.1, code="c2")
    chosen = figures.one_session(old + missed + met + again, ["inductor", "grace"])
    assert {r.session for r in chosen.values()} == {"met"}


def test_grace_against_the_best_stock_variant_is_judged_on_its_sessions_rounds():
    jitter = random.Random(1)

    def timed(workload, variant, ms, spread):
        r = rec(workload, variant, ms)
        r.iter_ms = [[ms * (1 + spread * (2 * jitter.random() - 1)) for _ in range(5)] for _ in range(12)]
        return r

    records = [timed("d", "inductor", 2.0, 0.01), timed("d", "pt2_cg", 1.0, 0.01), timed("d", "grace", 1.2, 0.01),
               timed("e", "inductor", 2.0, 0.3), timed("e", "pt2_cg", 1.0, 0.3), timed("e", "grace", 1.05, 0.3)]
    t = report.within_best_stock(records)
    d = t.loc["d eval b1"]
    assert d["verdict"] == "slower" and 1.15 < d["low"] <= d["high"] < 1.25
    assert t.loc["e eval b1", "verdict"] == "within noise"
    records[2].session = "another"  # grace measured in another session: no paired rounds, no verdict
    assert pd.isna(report.within_best_stock(records).loc["d eval b1", "verdict"])


def test_the_results_say_how_many_records_the_code_checked_out_made():
    at = dataclasses.replace(RECORDS[0], env={**RECORDS[0].env, "code": "abc"})
    records = [at, *RECORDS[1:]]  # 8 ok records, one of them made at code abc
    assert report.code_note(records, "abc").endswith("hashes to abc; 1 of the 8 ok records were made with it.")
    assert "0 of the 8 ok records" in report.code_note(records, "def")
    assert "hashes to" in report.summary(_as_paper(RECORDS))


def test_replay_overhead_gives_grace_against_each_way_with_its_interval(tmp_path):
    env = {"date": "2026-12-03T13:49:00", "git_commit": "b11f74b0", "gpu": "G", "driver": "1", "torch": "t", "triton": "3"}
    rounds = {"bare": [3.0, 3.1, 2.9, 3.0, 3.2, 3.0, 2.9], "grace": [26.0, 25.5, 27.0, 26.2, 25.8, 26.4, 26.1],
              "pi": [22.0, 21.5, 22.8, 21.9, 22.3, 22.1, 21.7],  # grace slower in every round: beyond noise
              "scg": [26.5, 25.0, 27.5, 25.9, 26.6, 25.7, 26.3], "sync": [8.0] * 7}  # scg: within noise
    rows = [{"model": "pointwise", "size": "full", "synchronized": True, "env": env, "us_per_call_by_round": rounds,
             "median_us_per_call": {k: sorted(v)[3] for k, v in rounds.items()},
             "over_bare_us": {k: sorted(v)[3] - 3.0 for k, v in rounds.items()}},
            {"model": "mlp", "size": "full", "synchronized": False, "env": env,  # no grace: no row of its own
             "us_per_call_by_round": {"bare": [1.0] * 7}, "median_us_per_call": {"bare": 1.0}, "over_bare_us": {"bare": 0.0}}]
    replays = tmp_path / "replay.jsonl"
    replays.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report.write_replay_overhead(replays, tmp_path).read_text()
    against = text.split("grace slower above 1, faster below:")[1]
    (row,) = [line for line in against.splitlines() if line.startswith("| pointwise")]
    cells = dict(zip(["bare", "pi", "scg"], [c.strip() for c in row.split("|")[5:8]]))
    assert cells["pi"].startswith("**1.19 [") and cells["bare"].startswith("**8.")
    assert not cells["scg"].startswith("**") and "mlp" not in against and "sync" not in against.splitlines()[2]


def test_pi_launch_gives_the_cost_a_patched_node_against_the_goal(tmp_path):
    env = {"date": "2026-12-07T10:00:00", "git_commit": "9e32a20e", "gpu": "G", "driver": "1", "torch": "t"}

    def graph(nodes, reads, per_node):  # every way's time: the bare graph's plus per_node a re-pointed node
        bare = [10.0 + nodes + i for i in range(3)]  # rounds that drift: the slope is taken within each
        by_round = {"bare": bare, "moving": [b + per_node * nodes + 0.5 for b in bare],
                    "raw": [b + 0.9 * nodes for b in bare], "copy": [b + 7 for b in bare]}
        return {"kernels": nodes, "reads": reads, "patched_nodes": nodes if reads == "every" else 1, "rounds": 3,
                "env": env, "sync_us_by_round": by_round,
                "median_us_per_call": {w: sorted(v)[1] for w, v in by_round.items()}}
    launches = tmp_path / "launch.jsonl"
    rows = [graph(16, "first", 1.2), graph(16, "every", 1.2), graph(256, "every", 1.2)]
    launches.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report.write_pi_launch(launches, tmp_path).read_text()
    assert "| moving: PI (grace.pi.Indirection) | 1.20 | 1.20-1.20 | yes |" in text
    assert "| raw: the driver's call alone (ctypes) | 0.90 | 0.90-0.90 |  |" in text
    launches.write_text("".join(json.dumps(graph(n, "every", 2.5)) + "\n" for n in (16, 64)))
    assert "| 2.50 | 2.50-2.50 | no |" in report.write_pi_launch(launches, tmp_path).read_text()
    launches.write_text(json.dumps(graph(16, "first", 1.0)) + "\n")  # no every graphs: the times alone
    assert "patched node (median" not in report.write_pi_launch(launches, tmp_path).read_text()


def test_grace_against_each_optimization_alone_is_judged_on_its_sessions_rounds():
    jitter = random.Random(2)

    def timed(workload, variant, ms, spread=0.01):
        r = rec(workload, variant, ms)
        r.iter_ms = [[ms * (1 + spread * (2 * jitter.random() - 1)) for _ in range(5)] for _ in range(12)]
        return r

    # d: all-on 20 % slower than PI alone, faster than CGCT alone; e: all within noise; f: no scg, no row
    records = ([timed("d", v, ms) for v, ms in (("inductor", 2.0), ("grace", 1.2), ("cgct", 1.5), ("pi", 1.0),
                                                  ("scg", 1.2))]
               + [timed("e", v, 1.0, 0.3) for v in ("inductor", "grace", "cgct", "pi", "scg")]
               + [timed("f", v, 1.0) for v in ("inductor", "grace", "cgct", "pi")])
    table, line = report.against_single_options(records)
    assert list(table.index) == ["d eval b1", "e eval b1"] and list(table.columns) == ["cgct", "pi", "scg"]
    assert table.loc["d eval b1", "pi"].startswith("**1.2") and not table.loc["d eval b1", "cgct"].startswith("**")
    assert not any(c.startswith("**") for c in table.loc["e eval b1"])
    assert line == ("grace is slower than one option alone beyond noise on 1 of 2 workloads: d eval b1 (pi); "
                    "of its 6 comparisons, chance alone would call 0.2 so, on average.")
