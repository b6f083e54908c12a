import dataclasses
import math
import re

import pandas as pd
import pytest

from experiments import report
from experiments.records import HostStats
from tests.test_figures import RECORDS, rec


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


def test_summary_numbers():
    toy = [rec("mlp", "inductor", 10.0), rec("mlp", "pt2_cg", 1.0), rec("mlp", "grace", 1.0)]
    text = report.summary(_as_paper(RECORDS) + toy)
    # pt2_cg: speedups 2, 3, 0.5 -> geomean 3 ** (1/3); grace: 4 and 9 (EOS failed) -> 6; the smoke
    # workload (10x) is in the table, not in the headline numbers
    assert f"pt2_cg: geomean speedup over inductor {(2 * 3 * 0.5) ** (1 / 3):.3g} over 3 of the paper's workloads" in text
    assert "grace: geomean speedup over inductor 6 over 2 of the paper's workloads" in text
    assert "slower than inductor on: EOS." in text
    assert "| mlp eval b1" in text
    # benefit ratio over ALNET and TKE: (6 - 1) / (sqrt(6) - 1)
    assert f"over the 2 paper workloads with both: {(6 - 1) / (math.sqrt(6) - 1):.3g} (the paper reports more than 2)" in text
    assert "NVIDIA H200" in text
    assert "capture ran out of GPU memory" not in text
    assert "- Code each workload's records ran: unknown: ALNET, EOS, TKE, mlp eval b1." in text
    assert "- Newest record not ok, so not in the table: EOS (grace: failed: )." in text
    failed = dataclasses.replace(rec("mlp", "pt2_cg", None, status="failed"), reason="setup: OutOfMemoryError: x\nmore")
    assert ("mlp eval b1 (pt2_cg: failed: setup: OutOfMemoryError: x)" in report.summary(toy + [failed]))


def test_summary_names_variants_measured_after_a_capture_ran_out_of_memory():
    starved = rec("a", "grace", 1.0)
    starved.grace = {"not_captured": ["capture failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB"]}
    text = report.summary([r for r in RECORDS if (r.workload, r.variant) != ("a", "grace")] + [starved])
    assert "a capture ran out of GPU memory" in text and ": a eval b1 (grace)." in text


def test_summary_names_where_grace_misses_the_better_stock_choice():
    records = RECORDS + [rec("d", "inductor", 1.0), rec("d", "pt2_cg", 1.0), rec("d", "grace", 1.1),
                         rec("e", "inductor", 1.0), rec("e", "pt2_cg", 0.5, share=1.0), rec("e", "grace", 0.6)]
    # per-round ratios to inductor's rounds: d's grace misses in two rounds of three, e's in all three
    records[-4].round_ratios, records[-2].round_ratios = [1.2, 1.0, 1.1], [0.5, 0.5, 0.5]
    records[-1].round_ratios = [0.6, 0.62, 0.58]
    records[-1].kernels = dataclasses.replace(records[-1].kernels, gpu_kernel_ms=0.15)  # 0.1 in the others
    text = report.summary(records)
    # a and b beat both; c's grace failed; d: 1.1 x, and no variant replayed a graph; e: 0.6 against 0.5,
    # half of the gap on the GPU
    assert ("grace within 3 % of the faster of inductor and pt2_cg on 2 of 4 workloads; not on: "
            "d eval b1 (1.10x, per round 1.00-1.20; GPU time +0 of the +0.1 ms, no CUDA graph in any variant), "
            "e eval b1 (1.20x, per round 1.16-1.24; GPU time +0.05 of the +0.1 ms). Slower by more than 3 % in "
            "every round: e eval b1.") in text


def test_summary_counts_scg_decisions_and_the_models_agreement():
    def decision(choice, measured, agreed, tied=False):
        return {"choice": choice, "measured_us": {"graph": 1.0} if measured else None, "agreed": agreed,
                "tied": tied}

    grace = rec("a", "grace", 1.0)
    grace.grace = {"scg": {"decisions": [decision("graph", False, None), decision("eager", True, True),
                                         decision("graph_pi", True, False)]}}
    text = report.summary([r for r in RECORDS if (r.workload, r.variant) != ("a", "grace")] + [grace])
    assert ("- SCG: 3 decisions (1 eager, 1 graph, 1 graph_pi); 1 settled by the cost model alone, 2 timed, "
            "and on those the model had predicted the timed choice 1 times. Of the timings, 0 were taken with no "
            "other variant setting up on the GPU (the model agreed on 0)") in text
    grace.grace["scg"]["decisions"].append(decision("graph", True, None, tied=True))
    grace.set_up_beside = 0  # set up alone: its timings undisturbed
    text = report.summary([r for r in RECORDS if (r.workload, r.variant) != ("a", "grace")] + [grace])
    assert ("3 timed, and on those the model had predicted the timed choice 1 times (1 timings could not tell "
            "the fastest apart and followed the model). Of the timings, 3 were taken with no other variant "
            "setting up on the GPU (the model agreed on 1)") in text
    assert "- SCG: no decisions recorded yet." in report.summary(RECORDS)


def test_summary_without_grace_says_so():
    text = report.summary([r for r in RECORDS if r.variant != "grace"])
    assert "- grace: not measured yet on the paper's workloads." in text
    assert "not measurable yet (no paper workload has both)" in text
    assert report.summary([]) == "No GPU records yet.\n"


def test_time_over_gpu_time():
    text = report.summary([rec("a", "inductor", 4.0), rec("a", "pt2_cg", 2.0)])
    assert "| a eval b1" in text and " 20 " in text  # 2.0 ms over 0.1 ms of GPU time


def test_splice_needs_markers(tmp_path):
    path = tmp_path / "R.md"
    path.write_text("no markers\n")
    with pytest.raises(ValueError, match="markers"):
        report.splice("x", path)


def test_spread_reports_runs_measured_twice():
    from tests.test_records import make

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
    assert "spread is 17.5 % at the median" in text
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


def test_summary_names_the_workloads_whose_variants_were_all_set_up_alone():
    """Alone: set_up_beside 0, or in a record older than that field, a sweep that set up one at a time."""
    records = [dataclasses.replace(r, set_up_beside=0) if r.workload == "a" else
               dataclasses.replace(r, measure={"parallel_setup": False}) if r.workload == "b" else r for r in RECORDS]
    text = report.summary(records)
    assert "Every variant set up with the GPU to itself: a eval b1, b eval b1. In the other 1 workloads" in text
    # c's inductor alone, its pt2_cg beside two others: c still counts as not alone
    records = [dataclasses.replace(r, set_up_beside=2 if r.variant == "pt2_cg" else 0) if r.workload == "c" else r
               for r in records]
    assert "GPU to itself: a eval b1, b eval b1. In the other 1 workloads" in report.summary(records)
    assert "GPU to itself" not in report.summary([dataclasses.replace(r, set_up_beside=0) for r in RECORDS])


def test_summary_names_the_workloads_whose_variants_were_measured_in_different_sessions():
    assert "compared across sessions" not in report.summary(RECORDS)
    records = [dataclasses.replace(r, session="later") if (r.workload, r.variant) == ("b", "grace") else r for r in RECORDS]
    assert "compared across sessions (so across machines, and outside one interleaved run; a sweep measures " \
           "them again together): b eval b1." in report.summary(records)


def test_summary_names_the_workloads_whose_variants_come_from_several_sessions_each_with_its_baseline():
    parts = [dataclasses.replace(r, session="part 1") for r in (rec("b", "inductor", 8.0), rec("b", "cgct", 2.0))]
    summary = report.summary(parts + RECORDS)  # the part of cgct first, then Fig 9's
    assert "Variants from more than one session, each session with its own run of inductor" in summary
    assert "(measured by more than one experiment): b eval b1." in summary
    assert "compared across sessions" not in summary
    assert re.search(r"\| b eval b1\s+\|\s+9\s+\|\s+3\s+\|\s+1\s+\|\s+3\s+\|\s+9\s+\|", summary)  # Fig 9's session: the newest


def test_summary_takes_the_baseline_measured_beside_grace_while_a_workload_is_between_parts():
    """The baseline's newest record is of a part without Fig 9's variants: the table's inductor median,
    and the within-3 % bar, are those of grace's session all the same."""
    later = [dataclasses.replace(r, session="part 1") for r in (rec("b", "inductor", 90.0), rec("b", "cgct", 2.0))]
    summary = report.summary(RECORDS + later)
    assert re.search(r"\| b eval b1\s+\|\s+9\s+\|\s+3\s+\|\s+1\s+\|\s+3\s+\|\s+9\s+\|", summary)
    assert "within 3 % of the faster of inductor and pt2_cg on 2 of 2 workloads" in summary


def test_noise_shows_each_aa_session_with_intervals_and_verdicts():
    session = [rec("a", "inductor", 2.0), dataclasses.replace(rec("a", "inductor_aa", 2.0), speedup=1.0, speedup_ci=[0.97, 1.04]),
               dataclasses.replace(rec("a", "grace", 1.0), speedup=2.0, speedup_ci=[1.9, 2.1]),
               dataclasses.replace(rec("a", "pt2_cg", 2.1), speedup=0.95, speedup_ci=[0.9, 1.01])]
    other = dataclasses.replace(rec("b", "grace", 1.0), session="another", speedup=3.0, speedup_ci=[2, 4])
    text = report.noise(session + [other])
    row = next(line for line in text.splitlines() if line.startswith("| a eval b1"))
    assert "1.000 [0.970, 1.040]" in row and "2.000 [1.900, 2.100] win" in row and "0.950 [0.900, 1.010] within noise" in row
    assert "b eval b1" not in text  # no A/A control in its session
    assert report.noise(RECORDS) == ""
