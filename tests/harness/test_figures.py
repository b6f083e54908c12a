import dataclasses
import math
import re

import pandas as pd
import pytest

from experiments import figures, report
from experiments.records import KernelStats, Record
from scripts import make_figures


def rec(workload, variant, median_ms, status="ok", share=None, copy_bytes=0.0) -> Record:
    return Record(experiment="t", session="s", run=0, workload=workload, mode="eval", batch=1, size="full",
                  variant=variant, status=status, median_ms=median_ms,
                  kernels=KernelStats(10, 0.1, 5.0, share, 1.0 if share else 0.0, copy_bytes),
                  env={"gpu": "NVIDIA H200", "date": "2026-11-30T00:00:00+00:00"})


RECORDS = [
    rec("a", "inductor", 4.0), rec("a", "pt2_cg", 2.0, share=1.0, copy_bytes=4096), rec("a", "grace", 1.0),
    rec("b", "inductor", 9.0), rec("b", "pt2_cg", 3.0, share=0.5, copy_bytes=128), rec("b", "grace", 1.0),
    rec("c", "inductor", 1.0), rec("c", "pt2_cg", 2.0), rec("c", "grace", 5.0, status="failed"),
]


def test_speedups_divide_the_baseline_median_and_leave_missing_empty(tmp_path):
    figures.speedup_figure(RECORDS, tmp_path, ["pt2_cg", "grace"], "fig9")
    table = pd.read_csv(tmp_path / "fig9.csv", index_col="workload")
    assert table.loc["a eval b1", "pt2_cg"] == 2.0 and table.loc["a eval b1", "grace"] == 4.0
    assert table.loc["b eval b1", "pt2_cg"] == 3.0 and table.loc["b eval b1", "grace"] == 9.0
    assert table.loc["c eval b1", "pt2_cg"] == 0.5
    assert math.isnan(table.loc["c eval b1", "grace"])  # failed: missing, not zero
    geo = table.loc["geomean (n=2)"]  # over the workloads where both variants have a number
    assert math.isclose(geo["pt2_cg"], math.sqrt(6.0)) and math.isclose(geo["grace"], 6.0)
    # sorted by GraCE over PyTorch2-CG, missing last
    assert list(table.index[:3]) == ["a eval b1", "b eval b1", "c eval b1"]
    for ext in ("pdf", "png"):
        assert (tmp_path / f"fig9.{ext}").stat().st_size > 0


def test_each_variant_of_a_workload_measured_in_parts_is_divided_by_its_own_sessions_baseline():
    parts = [dataclasses.replace(r, session="part 1") for r in (rec("a", "inductor", 4.0), rec("a", "cgct", 2.0))] + [
        dataclasses.replace(r, session="part 2") for r in (rec("a", "inductor", 8.0), rec("a", "grace", 2.0))] + [
        dataclasses.replace(rec("a", "pi", 1.0), session="a retry alone")]  # no baseline there: the newest one's
    df = figures.frame(parts)
    assert df.set_index("variant")["baseline_ms"].to_dict() == pytest.approx(
        {"inductor": 8.0, "cgct": 4.0, "grace": 8.0, "pi": math.nan}, nan_ok=True)
    table = figures.speedups(df, ["cgct", "grace", "pi"])
    assert table.loc["a eval b1"].to_dict() == {"cgct": 2.0, "grace": 4.0, "pi": 8.0}


def test_a_workload_split_in_two_sessions_is_compared_within_each(tmp_path, monkeypatch):
    def at(session, date, *measured):
        return [dataclasses.replace(rec("a", v, ms), session=session, env={"gpu": "NVIDIA H200", "date": date})
                for v, ms in measured]

    fig9 = at("fig9", "2026-12-01", ("inductor", 4.0), ("pt2_cg", 2.0), ("grace", 1.0))
    fig10 = at("fig10", "2026-12-02", ("inductor", 8.0), ("grace", 4.0), ("cgct", 4.0), ("cgct_pi", 2.0))
    figures.speedup_figure(fig9 + fig10, tmp_path, ["pt2_cg", "grace"], "fig9")
    assert pd.read_csv(tmp_path / "fig9.csv", index_col="workload").loc["a eval b1"].to_dict() == {
        "pt2_cg": 2.0, "grace": 4.0}  # grace of pt2_cg's session, not the newer one's 2.0
    figures.speedup_figure(fig9 + fig10, tmp_path, ["cgct", "cgct_pi", "grace"], "fig10")
    assert pd.read_csv(tmp_path / "fig10.csv", index_col="workload").loc["a eval b1"].to_dict() == {
        "cgct": 2.0, "cgct_pi": 4.0, "grace": 2.0}
    assert report.per_workload(fig9 + fig10).loc["a eval b1", "grace speedup over inductor"] == 4.0
    # no session with both: the newest of each is drawn, and the footnote says the ratio crosses sessions
    notes = []
    real = figures._bars
    monkeypatch.setattr(figures, "_bars", lambda *a, **k: notes.append(k["footnote"]) or real(*a, **k))
    figures.speedup_figure(fig9[:2] + fig10, tmp_path, ["pt2_cg", "grace"], "fig9")
    assert "bars from more than one session: a eval b1" in notes[0].splitlines()
    figures.speedup_figure(fig9 + fig10, tmp_path, ["cgct", "grace"], "fig10", overlay="pt2_cg")
    assert "PyTorch2-CG markers from another session than the bars: a eval b1" in notes[1].splitlines()
    assert "bars from more than one session" not in notes[1]


def test_geomean_per_variant_when_no_workload_has_them_all():
    table = figures.with_geomean(figures.speedups(figures.frame(RECORDS), ["pt2_cg", "cgct"]))
    label = "geomean (pt2_cg n=3)"
    assert math.isclose(table.loc[label, "pt2_cg"], (2.0 * 3.0 * 0.5) ** (1 / 3))
    assert math.isnan(table.loc[label, "cgct"])


def test_the_geomean_has_an_interval_once_every_workload_it_is_over_has_one():
    table = figures.with_geomean(pd.DataFrame({"grace": [2.0, 8.0]}, index=["a", "b"]))
    lo = pd.DataFrame({"grace": [1.8, 7.0, None]}, index=table.index)
    hi = pd.DataFrame({"grace": [2.2, 9.0, None]}, index=table.index)
    low, high = (e.iloc[-1]["grace"] for e in figures.geomean_errors(table, (lo, hi)))
    sd = math.sqrt(sum((math.log(h / lw) / (2 * figures.Z95)) ** 2 for lw, h in [(1.8, 2.2), (7.0, 9.0)])) / 2
    assert (low, high) == pytest.approx((4 * math.exp(-figures.Z95 * sd), 4 * math.exp(figures.Z95 * sd)))
    assert low < 4 < high and high / low < 9 / 7  # narrower than its widest workload's: the errors average
    lo.iloc[0, 0] = None  # a workload measured before intervals were: the geomean claims none
    assert all(math.isnan(e.iloc[-1]["grace"]) for e in figures.geomean_errors(table, (lo, hi)))


def test_latest_record_wins():
    newer = rec("a", "grace", 2.0)
    table = figures.speedups(figures.frame(RECORDS + [newer]), ["grace"])
    assert table.loc["a eval b1", "grace"] == 2.0


def test_tables_of_coverage_and_copy_bytes(tmp_path):
    figures.coverage_table(RECORDS, tmp_path)
    figures.copy_bytes_table(RECORDS, tmp_path)
    cov = pd.read_csv(tmp_path / "table2_coverage.csv", index_col="workload")
    assert cov.loc["a eval b1", "pt2_cg"] == 100.0 and cov.loc["b eval b1", "pt2_cg"] == 50.0
    assert cov["cgct"].isna().all()
    copies = pd.read_csv(tmp_path / "table3_copy_bytes.csv", index_col="workload")
    assert copies.loc["a eval b1", "pt2_cg"] == 4096 and copies["pi"].isna().all()


def test_make_figures_script(tmp_path):
    path = tmp_path / "results" / "x" / "nvidia-h200" / "records.jsonl"
    path.parent.mkdir(parents=True)
    again = [dataclasses.replace(r, run=1, median_ms=r.median_ms * (2 if r.variant == "pt2_cg" else 1))
             for r in RECORDS[:3]]  # as experiment=spread
    path.write_text("".join(r.to_json() + "\n" for r in RECORDS + again))
    out = tmp_path / "figs"
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- results:begin -->\nold\n<!-- results:end -->\nafter\n")
    assert make_figures.main(["--results", str(tmp_path / "results"), "--out", str(out), "--readme", str(readme)]) == 0
    assert "\nold\n" not in readme.read_text() and "| a eval b1" in readme.read_text()
    assert "Run-to-run spread" in readme.read_text()  # run 1 only there: Fig 9 has one row per workload
    assert pd.read_csv(out / "extra_speedup.csv", index_col="workload").loc["a eval b1", "pt2_cg"] == 2.0
    assert not (out / "fig9_speedup.csv").exists()  # Figs 9 and 10 hold the paper's workloads only
    assert readme.read_text().endswith("<!-- results:end -->\nafter\n")
    assert {p.name for p in out.iterdir()} >= {f"{n}.{e}" for n in ("extra_speedup", "table2_coverage",
                                                                      "table3_copy_bytes") for e in ("pdf", "png", "csv")} | {
        "pt2_cg_shortfall.md", "pt2_cg_shortfall.csv", "results.md"}
    assert make_figures.main(["--results", str(tmp_path / "nothing")]) == 2


def test_make_figures_with_a_code_draws_only_what_that_code_measured(tmp_path):
    old = [dataclasses.replace(r, env={**r.env, "code": "old"}, median_ms=r.median_ms * 3) for r in RECORDS[:3]]
    new = [dataclasses.replace(r, env={**r.env, "code": "new", "date": "2026-12-01T00:00:00+00:00"})
           for r in RECORDS[3:6]]
    path = tmp_path / "results" / "x" / "nvidia-h200" / "records.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(r.to_json() + "\n" for r in old + new))
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:begin -->\n<!-- results:end -->\n")
    argv = ["--results", str(tmp_path / "results"), "--out", str(tmp_path / "figs"), "--readme", str(readme)]
    assert make_figures.main(argv + ["--code", "new"]) == 0
    workloads = pd.read_csv(tmp_path / "figs" / "extra_speedup.csv")["workload"].tolist()
    assert "b eval b1" in workloads and "a eval b1" not in workloads
    assert make_figures.main(argv + ["--code", "none"]) == 2


def test_load_reads_the_sweeps_records_and_leaves_other_formats_to_their_readers(tmp_path, caplog):
    for experiment, lines in (("full", [r.to_json() for r in RECORDS]),
                              ("corpus", ['{"program": "zoo.mlp", "kernels": 3}']),
                              ("corpus_checks", ['{"program": "zoo.rand", "kernels": 3}']),  # another name
                              ("mutation", ['{"caught": true, "workload": "a", "variant": "drop_residual"}'])):
        path = tmp_path / experiment / "nvidia-h200" / "records.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(line + "\n" for line in lines))
    every, _ = figures.load(tmp_path, "nvidia-h200")
    assert len(every) == len(RECORDS) and "unreadable" not in caplog.text


def test_paper_workloads_are_labelled_by_their_acronym():
    r = rec("xlnet", "inductor", 1.0)
    assert figures.frame([r])["label"].tolist() == ["XLNET-I"]
    r.batch = 4  # not the paper's batch (as Fig 11's XLNet at 128): named with its batch, not a paper point
    assert figures.frame([r])[["label", "paper"]].values.tolist() == [["XLNET-I b4", False]]
    r.size = "tiny"  # not the paper's model: described
    assert figures.frame([r])["label"].tolist() == ["xlnet eval b4 tiny"]


def test_pi_microbench_figure_marks_where_pi_starts_to_win(tmp_path):
    import json

    from experiments.figures import pi_microbench_figure

    lines = [{"bytes_per_input": b, "median_us_per_call": {"copy": c, "pi": p, "bare": 3.0}}
             for b, c, p in ((4096, 20.0, 25.0), (65536, 30.0, 24.0), (2**20, 90.0, 24.0))]
    sizes = tmp_path / "sizes.jsonl"
    sizes.write_text("".join(json.dumps(x) + "\n" for x in lines))
    png = pi_microbench_figure(sizes, tmp_path / "out")
    assert png.exists() and (tmp_path / "out" / "pi_microbench.pdf").exists()
    table = (tmp_path / "out" / "pi_microbench.csv").read_text().splitlines()
    assert table[0] == "bytes per input,copy,pi,bare" and table[2].startswith("65536,30.0,24.0")


def test_fig11_from_the_tp_experiments_records_and_the_other_figures_without_them(tmp_path):
    from tests.harness.test_records import make

    records = [dataclasses.replace(make(v, median_ms=ms, tp=t), experiment="tp") for v, t, ms in
               (("pt2_cg", 1, 10.0), ("pt2_cg", 2, 6.0), ("grace", 1, 8.0), ("grace", 2, 5.0))]
    figures.paper_figures(records[::2], tmp_path)  # TP1 alone (TP2 not run yet): TP1's bars
    assert (tmp_path / "fig11_tp.csv").read_text().splitlines()[0] == "workload,PyTorch2-CG TP1,GraCE TP1"
    # Single-GPU sweeps' records are neither TP1 points nor do the tp experiment's TP1 runs enter Fig 9.
    single = [make("inductor", median_ms=20.0), make("pt2_cg", median_ms=3.0), make("grace", median_ms=2.0)]
    assert figures.paper_figures(records + single, tmp_path)[0].name == "fig11_tp.png"
    lines = (tmp_path / "fig11_tp.csv").read_text().splitlines()
    assert lines[0] == "workload,PyTorch2-CG TP1,PyTorch2-CG TP2,GraCE TP1,GraCE TP2"
    assert lines[1].endswith(",10.0,6.0,8.0,5.0")
    extra = pd.read_csv(tmp_path / "extra_speedup.csv", index_col="workload")
    assert extra.loc["mlp eval b8 tiny", "pt2_cg"] == 20.0 / 3.0 and extra.loc["mlp eval b8 tiny", "grace"] == 10.0


def test_fig11_compares_the_variants_of_one_session_only(tmp_path):
    from tests.harness.test_records import make

    def at(variant, tp, ms, session, date):
        r = dataclasses.replace(make(variant, median_ms=ms, tp=tp), experiment="tp", session=session)
        return dataclasses.replace(r, env={**r.env, "date": date})

    records = [at("pt2_cg", 1, 10.0, "old", "2026-11-01"), at("grace", 1, 9.0, "old", "2026-11-01"),
               at("pt2_cg", 1, 12.0, "new", "2026-11-02"), at("grace", 1, 11.0, "new", "2026-11-02"),
               at("pt2_cg", 2, 6.0, "a", "2026-11-03"), at("grace", 2, 4.0, "b", "2026-11-04")]  # TP2: apart
    figures.tp_figure(records, tmp_path)
    table = pd.read_csv(tmp_path / "fig11_tp.csv", index_col="workload")
    row = table.iloc[0]
    assert (row["PyTorch2-CG TP1"], row["GraCE TP1"]) == (12.0, 11.0)  # the newest session with both
    assert math.isnan(row["PyTorch2-CG TP2"]) and math.isnan(row["GraCE TP2"])  # never side by side


def test_a_figure_drawn_again_from_the_same_records_is_the_same_bytes(tmp_path):
    import time

    for out in ("one", "two"):
        figures.speedup_figure(RECORDS, tmp_path / out, ["pt2_cg", "grace"], "fig9")
        time.sleep(1.1)  # a creation date, to the second, would differ
    for ext in ("pdf", "png", "csv"):
        assert (tmp_path / "one" / f"fig9.{ext}").read_bytes() == (tmp_path / "two" / f"fig9.{ext}").read_bytes()


def test_make_figures_leaves_out_records_made_before_their_workloads_revision(tmp_path, monkeypatch):
    from experiments.workloads import eos_chain

    monkeypatch.setattr(eos_chain.Model, "revised", "2026-11-30T12:00")
    stale = [rec("eos_chain", v, 1.0) for v in ("inductor", "pt2_cg")]  # made at 00:00
    path = tmp_path / "results" / "x" / "nvidia-h200" / "records.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(r.to_json() + "\n" for r in RECORDS + stale))
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:begin -->\n<!-- results:end -->\n")
    assert make_figures.main(["--results", str(tmp_path / "results"), "--out", str(tmp_path / "figs"),
                              "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert re.search(r"\| eos_chain\s+\|\s+1\s+\|\s+2\s+\| 2026-11-30T12:00 \|", text) and "| EOS" not in text and "| a eval b1" in text
    assert "eos_chain" not in pd.read_csv(tmp_path / "figs" / "extra_speedup.csv")["workload"].str.cat()


def test_a_speedup_figure_says_which_bars_were_skipped_and_why(tmp_path, monkeypatch):
    cpu = [dataclasses.replace(r, env={"gpu": None, "date": "2026-12-02T00:00:00+00:00"}) for r in RECORDS]
    skipped = [dataclasses.replace(r, status="skipped", median_ms=None, reason="variant 'pt2_cg' needs CUDA, and "
                                   "this machine has none") if r.variant == "pt2_cg" else r for r in cpu]
    df = figures.frame(skipped)
    absent, footnote = figures._absent(df, ["pt2_cg", "grace"])
    assert set(absent["pt2_cg"]) == {"skipped"} and absent.at["c eval b1", "grace"] == "failed"
    assert "pt2_cg: variant 'pt2_cg' needs CUDA, and this machine has none" in footnote.splitlines()
    assert figures._devices(df) == "CPU, no CUDA" and figures._devices(figures.frame(RECORDS)) == "NVIDIA H200"
    assert figures.speedup_figure(skipped, tmp_path).is_file()
    drawn = []
    real = figures._bars
    monkeypatch.setattr(figures, "_bars", lambda *a, **k: drawn.append(k["absent"]) or real(*a, **k))
    figures.speedup_figure(skipped, tmp_path, ["pt2_cg", "grace"])
    assert drawn[0].at["geomean (grace n=2)", "pt2_cg"] == "skipped"  # not "missing"


def test_reasons_that_differ_only_in_their_numbers_share_one_footnote_line():
    stopped = [dataclasses.replace(rec(w, v, None, status="interrupted"), reason=f"stopped (SIGINT) {s} s into this workload")
               for w, s in (("a", 133), ("b", 551), ("c", 1.5e2)) for v in ("pt2_cg", "grace")]
    failed = [dataclasses.replace(rec("d", "grace", None, status="failed"), reason="float64 check: 3 outputs off")]
    _, footnote = figures._absent(figures.frame(stopped + failed), ["pt2_cg", "grace"])
    assert footnote.splitlines() == ["grace: float64 check: 3 outputs off",
                                     "grace, pt2_cg: stopped (SIGINT) 133-551 s into this workload"]


def test_figs_9_and_10_hold_the_paper_workloads_and_the_others_have_their_own(tmp_path):
    paper = [dataclasses.replace(rec("alexnet", v, ms), batch=2) for v, ms in
             (("inductor", 4.0), ("pt2_cg", 2.0), ("grace", 1.0), ("cgct", 2.0), ("cgct_pi", 1.5))]
    names = [p.name for p in figures.paper_figures(paper + RECORDS, tmp_path)]
    assert names[:3] == ["fig9_speedup.png", "fig10_ablation.png", "extra_speedup.png"]
    assert list(pd.read_csv(tmp_path / "fig9_speedup.csv")["workload"]) == ["ALNET", "geomean (n=1)"]
    assert "ALNET" not in set(pd.read_csv(tmp_path / "extra_speedup.csv")["workload"])


def test_the_floor_figure_draws_each_variants_time_over_the_floor_with_its_interval(tmp_path):
    assert figures.floor_figure(RECORDS, tmp_path) is None  # no floor measured: no figure
    floored = [dataclasses.replace(r, over_floor=r.median_ms / 0.5, over_floor_ci=[r.median_ms / 0.6, r.median_ms / 0.4])
               for r in RECORDS]
    path = figures.floor_figure(floored, tmp_path)
    table = pd.read_csv(tmp_path / "floor.csv", index_col="workload")
    assert path.is_file() and table.loc["a eval b1", "inductor"] == 8 and table.loc["b eval b1", "grace"] == 2
    assert math.isnan(table.loc["c eval b1", "grace"])  # failed
    assert math.isclose(table.loc["geomean (n=2)", "pt2_cg"], math.sqrt(4 * 6))


def test_a_figures_title_names_the_code_of_its_bars_or_how_many_versions_they_mix():
    def at(commit, code=None):
        return lambda r: dataclasses.replace(r, env={**r.env, "git_commit": commit, "code": code})

    one = figures.frame(map(at("5850e9b"), RECORDS))  # made before the code hash: the commit names the code
    assert figures._measured(one, ["inductor", "grace"], one["label"]) == "NVIDIA H200, at commit 5850e9b"
    mixed = figures.frame([at("b73d38e")(r) if r.workload == "a" else at("5850e9b")(r) for r in RECORDS])
    assert figures._measured(mixed, ["inductor", "grace"], mixed["label"]) == "NVIDIA H200, records of 2 versions of the code"
    assert figures._measured(mixed, ["inductor", "grace"], ["b eval b1"]) == "NVIDIA H200, at commit 5850e9b"  # drawn only
    # commits that only added records between two device calls ran the same code: one version, not two
    same = figures.frame([at("b73d38e", "509073974623")(r) if r.workload == "a" else at("5850e9b", "509073974623")(r)
                          for r in RECORDS])
    assert figures._measured(same, ["inductor", "grace"], same["label"]) == "NVIDIA H200, at code 509073974623"
