"""Markdown reports from records: where stock CUDA graphs fall short, and the results summary that
`scripts/make_figures.py` writes to paper_figures/results.md and into the README between markers."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from experiments import stats
from experiments.figures import BASELINE, frame, speedups
from experiments.records import Record

README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"


def _markdown(table: pd.DataFrame, floatfmt) -> str:
    """A markdown table (tabulate) with the workloads as its first column; a missing value stays empty."""
    formats = ("",) + tuple(floatfmt) if isinstance(floatfmt, tuple) else floatfmt
    cells = table.astype(object).where(table.notna(), None).rename_axis("workload").reset_index()
    return cells.to_markdown(index=False, floatfmt=formats, missingval="")


def _ok(df: pd.DataFrame, variant: str) -> pd.DataFrame:
    return df[(df["status"] == "ok") & (df["variant"] == variant)].set_index("label")


def shortfall(records: Iterable[Record]) -> pd.DataFrame:
    """Per workload, what stock CUDA graphs (pt2_cg) did: graphs per iteration, share of kernels in
    graphs, bytes copied into graph inputs, time against `inductor`, Dynamo's graph breaks, Inductor's
    reasons for skipping graphs."""
    df = frame(records)
    cg, base = _ok(df, "pt2_cg"), _ok(df, BASELINE)["median_ms"]
    table = pd.DataFrame({
        "graphs/iter": cg["graphs"],
        "kernels in graphs %": 100 * cg["kernels_in_graphs_share"],
        "bytes copied/iter": cg["graph_input_copy_bytes"],
        "pt2_cg / inductor time": cg["median_ms"] / base.reindex(cg.index),
        "graph breaks": cg["graph_breaks"],
        "cudagraph skips": cg["cudagraph_skips"],
        "skip reasons": cg["cudagraph_skip_reasons"],
    }).sort_index()
    table["slower than inductor"] = table["pt2_cg / inductor time"] > 1.0
    return table


def write_shortfall(records: Iterable[Record], out: Path) -> Path:
    table = shortfall(records)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "pt2_cg_shortfall.csv", index_label="workload")
    path = out / "pt2_cg_shortfall.md"
    path.write_text(_markdown(table, (".3g", ".3g", ",.0f", ".3g")) + "\n")
    return path


def _values(df: pd.DataFrame, column: str) -> str:
    return ", ".join(sorted({str(v) for v in df[column].dropna()})) or "unknown"


def summary(records: Sequence[Record], variants: Sequence[str] = ("pt2_cg", "grace")) -> str:
    """The results section: per-workload latency, speedup over `inductor` and distance from the GPU
    floor (iteration time over GPU kernel time, same record); geomeans; the paper's benefit ratio;
    slowdowns; and the environment the numbers come from."""
    df = frame(records)
    used = df[(df["status"] == "ok") & df["variant"].isin([BASELINE, *variants])]
    if used.empty:
        return "No GPU records yet.\n"
    med = used.pivot_table(index="label", columns="variant", values="median_ms").reindex(
        columns=[BASELINE, *variants])
    floor = (used.assign(ratio=used["median_ms"] / used["gpu_kernel_ms"])
             .pivot_table(index="label", columns="variant", values="ratio").reindex(columns=[BASELINE, *variants]))
    speed = speedups(df, list(variants)).reindex(med.index)
    table = pd.concat({"median ms": med, f"speedup over {BASELINE}": speed, "time / GPU time": floor}, axis=1)
    table.columns = [f"{v} {what}" for what, v in table.columns]
    lines = [_markdown(table, ".3g"), ""]
    for v in variants:
        got = speed[v].dropna()
        if not len(got):
            lines.append(f"- {v}: not measured yet.")
            continue
        slower = ", ".join(got[got < 1].index) or "none"
        lines.append(f"- {v}: geomean speedup over {BASELINE} {stats.geomean(got.tolist()):.3g} over {len(got)} "
                     f"workloads; slower than {BASELINE} on: {slower}.")
    first, last = variants[0], variants[-1]
    both = speed[[first, last]].dropna()
    if len(both):
        g_first, g_last = stats.geomean(both[first].tolist()), stats.geomean(both[last].tolist())
        lines.append(f"- Benefit ratio (speedup - 1) of {last} over {first}, over the {len(both)} workloads with both: "
                     f"{(g_last - 1) / (g_first - 1):.3g} (the paper reports more than 2).")
    else:
        lines.append(f"- Benefit ratio of {last} over {first}: not measurable yet ({last} has no records).")
    lines.append(f"- Measured on {_values(used, 'gpu')}, driver {_values(used, 'driver')}, torch "
                 f"{_values(used, 'torch')}, triton {_values(used, 'triton')}, commits {_values(used, 'git_commit')}, "
                 f"between {used['date'].min()} and {used['date'].max()}.")
    return "\n".join(lines) + "\n"


def splice(text: str, into: Path) -> None:
    """Put `text` between the results markers of `into` (the README), leaving the rest as it is."""
    doc = into.read_text()
    if README_BEGIN not in doc or README_END not in doc:
        raise ValueError(f"{into} has no {README_BEGIN} ... {README_END} markers")
    pattern = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.S)
    into.write_text(pattern.sub(lambda _: f"{README_BEGIN}\n{text}{README_END}", doc))
