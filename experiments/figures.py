"""The paper's figures and tables, drawn from records (never from anything typed in).

Each writes <out>/<name>.pdf, <name>.png and <name>.csv (the numbers it drew). A variant without an ok
record for a workload is drawn as "missing", never as zero.

- fig9_speedup:   speedup over `inductor` per workload and geomean, PyTorch2-CG vs GraCE (Fig 9)
- fig10_ablation: CGCT, +PI, +SCG with PyTorch2-CG overlaid (Fig 10)
- table2_coverage: % of kernels launched inside CUDA graphs (Table 2)
- table3_copy_bytes: bytes copied into CUDA-graph inputs per iteration (Table 3)
- fig11_tp:       latency per tensor-parallel degree, PyTorch2-CG vs GraCE (Fig 11)
- pi_microbench:  host time per call against input size, copy vs PI vs bare replay (issue 5)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from experiments import stats, workloads
from experiments.records import Record, Selection, latest, padded_apart, session_baselines

TP_EXPERIMENT = "tp"  # conf/experiment/tp.yaml: the records of Fig 11
KEY = ["workload", "mode", "batch", "size", "variant", "run", "tp"]
BASELINE = "inductor"
AA_CONTROL = f"{BASELINE}_aa"  # the baseline measured by a second worker (sweep.AA_SUFFIX)
FLOOR = "floor"  # the variant that times the floor (sweep.FLOOR)
LABELS = {"eager": "Eager", "inductor": "PyTorch2 (no CUDA Graphs)", "pt2_cg": "PyTorch2-CG",
          "runtime": "GraCE runtime", "cgct": "CGCT",
          "pi": "PI", "scg": "SCG", "cgct_pi": "CGCT+PI", "grace": "GraCE",
          "inductor_aa": "A/A control (PyTorch2 again)", "floor": "Floor (the step as one CUDA graph)"}
GEOMEAN = "geomean"
AA_WITHIN = 0.03  # issue 29's goal for the A/A control's interval: a session beyond it is not trusted
NUMBER = re.compile(r"\d+(?:\.\d+)?")  # in a reason: what may differ between workloads
ENV_COLUMNS = ["gpu", "driver", "torch", "triton", "git_commit", "date", "cpu"]


def measured_at(env: dict) -> str:
    """The code a record ran: its hash of grace/, experiments/ and conf/ (environment.code_hash), the same
    for every commit that only adds results, and for a corpus record the hash of the corpus's own code;
    for records made before the hash, their commit."""
    if not env.get("code"):
        return f"commit {(env.get('git_commit') or 'unknown')[:7]}"
    return f"code {env['code']}" + (f", corpus {env['corpus']}" if env.get("corpus") else "")


def padded_otherwise(records: Iterable[Record]) -> dict[tuple[str, str], list[str]]:
    """Per workload label and session of `records` (ok or mismatch), the variants set up beside others
    that Inductor padded a GEMM for otherwise than the session's other variants did (records.padded_apart):
    their kernels are not the workload's. Records without set_up_beside were set up beside others."""
    sessions: dict[tuple[str, str], dict[str, Record]] = {}
    for r in records:
        if r.status in ("ok", "mismatch"):
            sessions.setdefault((label(r.workload, r.mode, r.batch, r.size), r.session), {})[r.variant] = r
    apart = {key: padded_apart({v: r.shape_padding for v, r in by_variant.items()},
                               {v: 1 if r.set_up_beside is None else r.set_up_beside for v, r in by_variant.items()})
             for key, by_variant in sorted(sessions.items())}
    return {key: variants for key, variants in apart.items() if variants}


def _aa_controls(records: Iterable[Record], within: bool) -> dict[tuple, Record]:
    """The sessions (Selection.in_session) whose A/A control's interval lies `within` +-AA_WITHIN or not,
    with that control's record."""
    return {r.key.in_session(r.session): r for r in records
            if r.variant == AA_CONTROL and r.status == "ok" and r.speedup_ci
            and (1 - AA_WITHIN <= r.speedup_ci[0] <= r.speedup_ci[1] <= 1 + AA_WITHIN) == within}


def aa_missed(records: Iterable[Record]) -> dict[tuple, Record]:
    """The sessions whose A/A control's interval reaches beyond +-AA_WITHIN: their host or GPU changed
    under them, so their comparisons are not trusted where the workload has a session that met it."""
    return _aa_controls(records, within=False)


def one_session(records: Iterable[Record], variants: Sequence[str]) -> dict[Selection, Record]:
    """Per workload (and run and TP degree), the records of `variants` from the newest session where every
    one of them was ok: what a comparison of them takes, so that no ratio between two bars crosses
    sessions. Sessions at the code of the workload's newest such session come first (a code measured
    again replaces the one before, so that the figures move to one code), and among them the newest whose
    A/A control met +-AA_WITHIN, where there is one. Workloads with no such session are left out."""
    records = list(records)
    met = _aa_controls(records, within=True)
    sessions: dict[tuple, dict[str, Record]] = {}
    for r in records:  # oldest first: each variant's newest record in the session counts
        if r.variant in variants and r.status != "interrupted":
            sessions.setdefault(r.key.in_session(r.session), {})[r.variant] = r
    whole = {(session, workload): (max(r.env.get("date", "") for r in got.values()), got)
             for (session, workload), got in sessions.items()
             if len(got) == len(set(variants)) and all(r.status == "ok" for r in got.values())}
    newest_code: dict[Selection, tuple[str, str | None]] = {}
    for (_, workload), (date, got) in whole.items():
        newest_code[workload] = max(newest_code.get(workload, ("", None)), (date, _code(got)))
    chosen: dict[Selection, tuple[tuple[bool, bool, str], dict[str, Record]]] = {}
    for (session, workload), (date, got) in whole.items():
        rank = (_code(got) == newest_code[workload][1], (session, workload) in met, date)
        if rank >= chosen.get(workload, ((False, False, ""),))[0]:
            chosen[workload] = (rank, got)
    return {r.key: r for _, got in chosen.values() for r in got.values()}


def _code(session: dict[str, Record]) -> str | None:
    return next(iter(session.values())).env.get("code")


def frame(records: Iterable[Record], together: Sequence[str] = ()) -> pd.DataFrame:
    """One row per key: the latest record (records.latest; records are taken oldest first), with
    `baseline_ms`, the median of the baseline measured in its session (empty where none was ok). With
    `together` (variants to compare), their rows and the baseline's come from one session per workload
    (one_session); a workload with none keeps its latest, and `session` tells them apart."""
    records = list(records)
    anchors = {k: r for k, r in session_baselines(records, BASELINE).items() if r.status == "ok"}
    newest = latest(records)
    if together:
        chosen = one_session(records, [BASELINE, *together])
        newest.update(chosen)
        # and those sessions' A/A controls and floors: the noise and the floor of what is compared
        sessions = {r.key.in_session(r.session) for r in chosen.values()}
        newest.update({r.key: r for r in records if r.variant in (AA_CONTROL, FLOOR) and r.status == "ok"
                       and r.key.in_session(r.session) in sessions})
    # a floor compiled otherwise than the workload's variants is no floor under them (DGPT2's lay above them)
    no_floor = {key for key, variants in padded_otherwise(newest.values()).items() if FLOOR in variants}
    rows = []
    for r in newest.values():
        k = r.kernels
        anchor = anchors.get(r.key.in_session(r.session))
        floored = (label(r.workload, r.mode, r.batch, r.size), r.session) not in no_floor
        rows.append({
            "workload": r.workload, "mode": r.mode, "batch": r.batch, "size": r.size, "variant": r.variant,
            "run": r.run, "tp": r.tp, "processes": r.processes, "status": r.status, "reason": r.reason, "session": r.session, "median_ms": r.median_ms,
            "baseline_ms": anchor.median_ms if anchor else None,
            "round_ratios": r.round_ratios, "speedup": r.speedup,
            "ci_lo": r.speedup_ci[0] if r.speedup_ci else None, "ci_hi": r.speedup_ci[1] if r.speedup_ci else None,
            "gpu_kernel_ms": k.gpu_kernel_ms if k else None, "kernels": k.kernels if k else None,
            "kernels_in_graphs_share": k.kernels_in_graphs_share if k else None, "graphs": k.graphs if k else None,
            "graph_input_copy_bytes": k.graph_input_copy_bytes if k else None,
            "over_floor": r.over_floor if floored else None,
            "floor_lo": r.over_floor_ci[0] if r.over_floor_ci and floored else None,
            "floor_hi": r.over_floor_ci[1] if r.over_floor_ci and floored else None,
            "rel_err": r.numerics.rel_err if r.numerics else None, "cudagraph_skips": r.cudagraph_skips, "graph_breaks": r.graph_breaks,
            "cudagraph_skip_reasons": "; ".join(r.cudagraph_skip_reasons),
            "graph_break_reasons": "; ".join(r.graph_break_reasons),
            "not_captured": "; ".join((r.grace or {}).get("not_captured") or []),
            "fallbacks": "; ".join((r.grace or {}).get("fallbacks") or []),
            "set_up_alone": r.set_up_alone, "measured_at": measured_at(r.env),
            **{k: r.env.get(k) for k in ENV_COLUMNS},
        })
    df = pd.DataFrame(rows, columns=KEY + ["processes", "status", "reason", "session", "median_ms", "baseline_ms", "round_ratios", "speedup", "ci_lo", "ci_hi", "gpu_kernel_ms", "kernels",
                                           "kernels_in_graphs_share", "graphs", "graph_input_copy_bytes", "over_floor", "floor_lo", "floor_hi", "rel_err",
                                           "cudagraph_skips", "graph_breaks", "cudagraph_skip_reasons", "graph_break_reasons",
                                           "not_captured", "fallbacks", "set_up_alone", "measured_at", *ENV_COLUMNS])
    for column in ("baseline_ms", "speedup", "ci_lo", "ci_hi", "over_floor", "floor_lo", "floor_hi"):
        df[column] = df[column].astype(float)  # all empty: None, an object column otherwise
    df["label"] = [label(r.workload, r.mode, r.batch, r.size) for r in df.itertuples()]
    df["paper"] = [acronym(r.workload, r.mode, r.batch, r.size) is not None for r in df.itertuples()]
    return df


def acronym(workload: str, mode: str, batch: int, size: str, any_batch: bool = False) -> str | None:
    """The paper's acronym where the record is that workload as the paper ran it (`any_batch`: at any
    batch size), else None."""
    try:
        cls = workloads.get(workload)
    except workloads.UnknownWorkload:
        return None
    name = cls.acronyms.get(mode)
    return name if name and size == "full" and (any_batch or batch == cls.batch_sizes.get(mode)) else None


def label(workload: str, mode: str, batch: int, size: str) -> str:
    """The paper's acronym where the record is that workload as the paper ran it, with the batch size
    where it is another (Fig 11's XLNET-I at 128), else a description."""
    if paper := acronym(workload, mode, batch, size):
        return paper
    if paper := acronym(workload, mode, batch, size, any_batch=True):
        return f"{paper} b{batch}"
    tiny = " tiny" if size == "tiny" else ""
    return f"{workload} {mode} b{batch}{tiny}"


def _ok(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """label x variant table of `column` over ok records (median over runs); NaN where missing."""
    ok = df[df["status"] == "ok"]
    return ok.pivot_table(index="label", columns="variant", values=column, aggfunc="median")


def speedups(df: pd.DataFrame, variants: Sequence[str]) -> pd.DataFrame:
    """label x variant: median(inductor) / median(variant), inductor's of the variant's own session (a
    workload measured in parts has one per part), else its newest; NaN where either is missing."""
    columns = list(dict.fromkeys([BASELINE, *variants]))
    med = _ok(df, "median_ms").reindex(columns=columns)
    base = _ok(df, "baseline_ms").reindex(index=med.index, columns=columns)
    table = pd.DataFrame({v: stats.speedup(base[v].fillna(med[BASELINE]), med[v]) for v in variants}, index=med.index)
    return table.reindex(sorted(df["label"].unique()))


Z95 = 1.959964  # the normal quantile of a two-sided 95 % interval


def worker_noise(df: pd.DataFrame) -> tuple[float, int]:
    """The spread between two workers of identical code, beyond what the rounds show: the log-sd tau of
    the A/A controls' offsets once their own rounds' spread is taken out, and how many A/A controls it is
    from. Each worker has an offset of its own (two workers of the same code differ by several % on
    host-bound workloads, with the same GPU time), which a bootstrap over one session's rounds cannot see.
    Controls of several processes a side (measure.processes) resample their processes already, and say
    nothing of tau.

    tau is the Paule-Mandel estimate of a random-effects model with a known mean of 0 (log(aa) ~ N(0,
    sd_rounds^2 + tau^2)): it solves sum(log(aa)^2 / (sd_rounds^2 + tau^2)) = n, so that a session with
    noisy rounds weighs little; a plain mean of log(aa)^2 - sd_rounds^2 lets one such session pull tau to 0."""
    aa = df[(df["variant"] == AA_CONTROL) & (df["status"] == "ok") & (df["processes"] == 1)]
    aa = aa.dropna(subset=["speedup", "ci_lo", "ci_hi"])
    if aa.empty:
        return 0.0, 0
    z2 = np.log(aa["speedup"].to_numpy(float)) ** 2
    sd = (np.log(aa["ci_hi"].to_numpy(float)) - np.log(aa["ci_lo"].to_numpy(float))) / (2 * Z95)
    var = np.maximum(sd, 1e-9) ** 2  # an interval of zero width (every round alike) would divide by 0

    def excess(tau2: float) -> float:  # decreasing in tau2, below 0 from tau2 = max(z2) on
        return float(np.sum(z2 / (var + tau2))) - len(z2)

    low, high = 0.0, float(z2.max())
    if excess(low) <= 0:
        return 0.0, len(aa)
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if excess(mid) > 0 else (low, mid)
    return float(np.sqrt(high)), len(aa)


def unresampled(tau: float, processes):
    """The workers' noise left out of a record's interval: tau for one process a variant, none where the
    interval resampled several (measure.processes); elementwise on arrays and frames."""
    return tau * (np.asarray(processes, dtype=float) <= 1) if np.ndim(processes) else tau * (processes <= 1)


def widen(ratio, lo, hi, tau):
    """The interval [lo, hi] of `ratio` with the workers' noise tau added in log space (each side's
    half-width and Z95 * tau in quadrature); elementwise on arrays and Series (tau too)."""
    extra = (Z95 * tau) ** 2
    return (np.exp(np.log(ratio) - np.sqrt(np.log(ratio / lo) ** 2 + extra)),
            np.exp(np.log(ratio) + np.sqrt(np.log(hi / ratio) ** 2 + extra)))


def intervals(df: pd.DataFrame, table: pd.DataFrame, tau: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The 95 % intervals of `table`'s speedups (label x variant): the records' bootstrap over rounds,
    widened by the workers' noise tau (worker_noise, where unresampled); NaN where a record has none
    (measured before the intervals were)."""
    lo, hi, processes = (_ok(df, c).reindex(index=table.index, columns=table.columns)
                         for c in ("ci_lo", "ci_hi", "processes"))
    return widen(table, lo, hi, unresampled(tau, processes.fillna(1)))


def _geomean_rows(table: pd.DataFrame) -> dict[str, pd.Index]:
    """The workloads each column's geomean is over: those where every column has a value; where that
    leaves none (a variant not measured yet), each column's own."""
    complete = table.dropna()
    return {c: complete.index if len(complete) else table[c].dropna().index for c in table.columns}


def with_geomean(table: pd.DataFrame) -> pd.DataFrame:
    """Append a geomean row over _geomean_rows, with the counts in the label (per column, of those that
    have any, where the columns' workloads differ: a bar without a value says why)."""
    rows = _geomean_rows(table)
    row = {c: stats.geomean(table.loc[rows[c], c].tolist()) if len(rows[c]) else np.nan for c in table.columns}
    if len(complete := table.dropna()):
        label = f"{GEOMEAN} (n={len(complete)})"
    else:
        label = f"{GEOMEAN} (" + ", ".join(f"{c} n={len(rows[c])}" for c in table.columns if len(rows[c])) + ")"
    return pd.concat([table, pd.DataFrame(row, index=[label])])


def geomean_interval(values: pd.Series, lo: pd.Series, hi: pd.Series) -> tuple[float, float]:
    """The 95 % interval of the geomean of `values`, each with its own interval [lo, hi]: the workloads were
    measured in sessions of their own, so the variances of their logs add (each from its interval's width
    in log space): sd = sqrt(sum sd_i^2) / n. NaN where any of them has no interval."""
    if values.empty or lo.isna().any() or hi.isna().any():
        return np.nan, np.nan
    centre = float(np.log(values.to_numpy(float)).mean())
    sd = float(np.sqrt((((np.log(hi.to_numpy(float)) - np.log(lo.to_numpy(float))) / (2 * Z95)) ** 2).sum())) / len(values)
    return float(np.exp(centre - Z95 * sd)), float(np.exp(centre + Z95 * sd))


def geomean_errors(table: pd.DataFrame, errors: tuple[pd.DataFrame, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`errors` (the low and high tables of some of `table`'s columns, `table` ending in with_geomean's
    row) with the geomean row's interval filled in (geomean_interval over the same workloads)."""
    lo, hi = (e.copy() for e in errors)
    body, last = table.iloc[:-1], table.index[-1]
    for c, rows in _geomean_rows(body).items():
        if c in lo:
            lo.at[last, c], hi.at[last, c] = geomean_interval(body.loc[rows, c], lo.loc[rows, c], hi.loc[rows, c])
    return lo, hi


def _save(fig, data: pd.DataFrame, out: Path, name: str, index_label: str = "workload") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    data.to_csv(out / f"{name}.csv", index_label=index_label)
    for ext in ("pdf", "png"):
        # no creation date in a PDF: figures regenerated from the same records are the same bytes
        fig.savefig(out / f"{name}.{ext}", bbox_inches="tight", dpi=150,
                    metadata={"CreationDate": None} if ext == "pdf" else None)
    plt.close(fig)
    return out / f"{name}.png"


def _bars(table: pd.DataFrame, title: str, ylabel: str, overlay: pd.Series | None = None,
          reference: float | None = 1.0, errors: tuple[pd.DataFrame, pd.DataFrame] | None = None,
          absent: pd.DataFrame | None = None, footnote: str = ""):
    """Grouped bars, one group per row of `table` and one bar per column, each with its value printed and,
    where `errors` (low, high tables) has them, its interval as an error bar; a missing value is written
    where its bar would be as `absent` says why (its status: skipped, failed, ...), else "missing";
    `footnote`: the reasons, under the axes; `reference`: a horizontal line (1.0: no speedup)."""
    sns.set_theme(style="whitegrid", context="paper")
    labels, variants = list(table.index), list(table.columns)
    width = 0.8 / max(len(variants), 1)
    rows = footnote.count("\n") + 1 if footnote else 0
    fig, axes = plt.subplots(1 + bool(rows), 1, squeeze=False, layout="constrained",
                             figsize=(max(6.0, 0.9 * len(labels) * max(1, len(variants)) / 2 + 2), 4 + 0.12 * rows),
                             height_ratios=[4, 0.12 * rows] if rows else None)
    ax = axes[0, 0]
    colors = sns.color_palette("colorblind", len(variants))
    x = np.arange(len(labels))
    for i, (v, color) in enumerate(zip(variants, colors)):
        pos = x - 0.4 + width * (i + 0.5)
        values = table[v].to_numpy(dtype=float)
        ax.bar(pos, np.nan_to_num(values, nan=0.0), width, label=LABELS.get(v, v), color=color)
        top = values
        if errors is not None and v in errors[0]:
            lo, hi = (e[v].reindex(labels).to_numpy(dtype=float) for e in errors)
            has = ~np.isnan(lo) & ~np.isnan(values)
            ax.errorbar(pos[has], values[has], yerr=[values[has] - lo[has], hi[has] - values[has]], fmt="none",
                        ecolor="0.2", elinewidth=0.7, capsize=1.5)
            top = np.where(has, hi, values)
        for p, val, y in zip(pos, values, top):
            if not np.isnan(val):
                ax.text(p, y, f" {val:.2f}", rotation=90, ha="center", va="bottom", fontsize=6)
        for p, val, label in zip(pos, values, labels):
            if np.isnan(val):
                why = absent.at[label, v] if absent is not None and label in absent.index and v in absent else None
                ax.text(p, 0.02, why if isinstance(why, str) else "missing", rotation=90, ha="center", va="bottom",
                        fontsize=6, color="0.4", transform=ax.get_xaxis_transform())
    if overlay is not None:
        ax.scatter(x, overlay.reindex(labels).to_numpy(dtype=float), marker="_", s=400, color="black", zorder=3,
                   label=LABELS.get(overlay.name, overlay.name))
    if reference is not None:
        ax.axhline(reference, color="0.3", linewidth=0.8)
    low, high = ax.get_ylim()
    ax.set_ylim(low, high + 0.12 * (high - low))  # room above the tallest bar for its value
    ax.set_xticks(x, labels, rotation=35, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the axes: over none of the bars
    if footnote:  # in axes of its own, which the constrained layout keeps clear of the workload names
        note = axes[1, 0]
        note.axis("off")
        note.text(0.0, 1.0, footnote, transform=note.transAxes, fontsize=6, color="0.3", va="top")
    return fig


def speedup_figure(records: Iterable[Record], out: Path, variants: Sequence[str] | None = None,
                   name: str = "speedup", title: str = "Speedup over Inductor without CUDA Graphs",
                   overlay: str | None = None, noise: tuple[float, int] | None = None) -> Path:
    """Bars of speedup over `inductor` per workload plus geomean. Variants default to every one recorded
    but the baseline; workloads are sorted by the last variant's speedup over the first's. `noise`: the
    workers' noise and its count of A/A controls (worker_noise), by default from these records'."""
    records = list(records)
    if variants is None:
        order = list(LABELS)  # the paper's order; variants of one's own come after, by name
        recorded = sorted({r.variant for r in records}, key=lambda v: (order.index(v) if v in order else len(order), v))
        variants = [v for v in recorded if v != BASELINE] or [BASELINE]
    df = frame(records, together=variants)
    noise = worker_noise(df) if noise is None else noise
    table = speedups(df, [*variants, *([overlay] if overlay else [])])
    order = (table[variants[-1]] / table[variants[0]]).sort_values(na_position="last").index
    table = with_geomean(table.reindex(order))
    absent, footnote = _absent(df, list(variants))
    for v in variants:  # a variant that no workload ran (pt2_cg on a CPU): its geomean says why, not "missing"
        statuses = set(df.loc[df["variant"] == v, "status"])
        if pd.isna(table.iloc[-1][v]) and len(statuses) == 1 and statuses != {"ok"}:
            absent.loc[table.index[-1], v] = statuses.pop()
    fig = _bars(table[list(variants)], f"{title} ({_measured(df, [BASELINE, *variants], table.index)})",
                f"speedup over {LABELS[BASELINE]}",
                table[overlay] if overlay else None, absent=absent,
                errors=geomean_errors(table, intervals(df, table[list(variants)], noise[0])),
                footnote="\n".join(filter(None, [_noise_note(noise), _apart(df, variants, overlay), footnote])))
    return _save(fig, table, out, name)


def floor_figure(records: Iterable[Record], out: Path, variants: Sequence[str] = (BASELINE, "pt2_cg", "grace"),
                 name: str = "floor", noise: tuple[float, int] | None = None) -> Path | None:
    """Bars of each variant's time over the floor measured beside it (the step as one CUDA graph), per
    workload and geomean, with the intervals widened by `noise` (as speedup_figure's); None where no
    record has a floor."""
    df = frame(records, together=[v for v in variants if v != BASELINE])
    noise = worker_noise(df) if noise is None else noise
    table = _ok(df, "over_floor").reindex(columns=list(variants)) if len(df) else pd.DataFrame()
    if table.isna().all().all():
        return None
    table = with_geomean(table.dropna(how="all"))
    lo, hi, processes = (_ok(df, c).reindex(index=table.index, columns=table.columns)
                         for c in ("floor_lo", "floor_hi", "processes"))
    fig = _bars(table, f"Time over the floor ({_measured(df, [*variants, 'floor'], table.index)})",
                "time / floor (the step as one CUDA graph)",
                errors=geomean_errors(table, widen(table, lo, hi, unresampled(noise[0], processes.fillna(1)))),
                footnote="\n".join(filter(None, [_noise_note(noise), _apart(df, variants)])))
    return _save(fig, table, out, name)


def _noise_note(noise: tuple[float, int]) -> str:
    """What the error bars are."""
    tau, n = noise
    return (f"error bars: 95 % intervals, the rounds' bootstrap and the workers' noise ({100 * tau:.1f} %, "
            f"from {n} A/A controls)" if n else "error bars: 95 % intervals, the rounds' bootstrap")


def _devices(df: pd.DataFrame) -> str:
    """The machines the records were measured on: the GPU's name, or 'CPU, no CUDA'."""
    return ", ".join(sorted({g if isinstance(g, str) else "CPU, no CUDA" for g in df["gpu"]})) or "no records"


def _measured(df: pd.DataFrame, variants: Sequence[str], labels: Sequence[str]) -> str:
    """Where and at which code the drawn bars were measured: the machines, and the code of the ok records
    of `variants` at `labels` (measured_at), or how many versions of it they mix (a reader must not take
    them for one)."""
    drawn = df["variant"].isin(variants) & df["label"].isin(labels) & (df["status"] == "ok")
    codes = sorted(set(df.loc[drawn, "measured_at"]))
    at = f"at {codes[0]}" if len(codes) == 1 else f"records of {len(codes)} versions of the code" if codes else ""
    return ", ".join(filter(None, [_devices(df), at]))


def _apart(df: pd.DataFrame, variants: Sequence[str], overlay: str | None = None) -> str:
    """A footnote naming the workloads whose ok bars of `variants` and the baseline come from more than
    one session (frame's `together` found none with all of them), and those whose `overlay` marker
    comes from another session than their bars: their ratios cross sessions."""
    ok = df[df["status"] == "ok"]
    drawn = ok[ok["variant"].isin([BASELINE, *variants])]
    sessions = drawn.groupby("label")["session"].agg(set)
    lines = [("bars from more than one session", sorted(w for w, s in sessions.items() if len(s) > 1))]
    if overlay:
        marker = ok[ok["variant"] == overlay].set_index("label")["session"]
        lines.append((f"{LABELS.get(overlay, overlay)} markers from another session than the bars",
                      sorted(w for w, s in marker.items() if w in sessions and s not in sessions[w])))
    return "\n".join(f"{what}: {', '.join(workloads)}" for what, workloads in lines if workloads)


def _absent(df: pd.DataFrame, variants: list[str]) -> tuple[pd.DataFrame, str]:
    """Per workload and variant without an ok record, the newest record's status; and the reasons, one
    line each with the variants they apply to, those that differ only in their numbers ("stopped 133 s
    into ...") sharing one with the range of each."""
    newest = df[df["variant"].isin(variants)].groupby(["label", "variant"]).tail(1)
    bad = newest[newest["status"] != "ok"]
    absent = bad.pivot_table(index="label", columns="variant", values="status", aggfunc="last")
    why = bad["reason"].fillna("").str.split("\n").str[0]
    lines = {}
    for reason, variant in zip(why, bad["variant"]):
        if reason:
            numbers, held = lines.setdefault(NUMBER.sub("{}", reason.replace("{", "{{").replace("}", "}}")), ([], set()))
            numbers.append(NUMBER.findall(reason))
            held.add(variant)
    return absent, "\n".join(f"{', '.join(sorted(held))}: " + template.format(*map(_span, zip(*numbers)))
                              for template, (numbers, held) in sorted(lines.items()))


def _span(values: Sequence[str]) -> str:
    """One number of several reasons: as written where they agree, else the range its values take."""
    if len(set(values)) == 1:
        return values[0]
    return f"{min(values, key=float)}-{max(values, key=float)}"


def _table_figure(table: pd.DataFrame, out: Path, name: str, title: str, fmt) -> Path:
    cells = [[("missing" if pd.isna(v) else fmt(v)) for v in row] for row in table.to_numpy()]
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(table.columns), 0.8 + 0.3 * len(table)))
    ax.axis("off")
    ax.set_title(title)
    if len(table):
        ax.table(cellText=cells, rowLabels=list(table.index), colLabels=[LABELS.get(c, c) for c in table.columns],
                 loc="center")
    return _save(fig, table, out, name)


def coverage_table(records: Iterable[Record], out: Path, variants: Sequence[str] = ("pt2_cg", "cgct")) -> Path:
    df = frame(records)
    table = (100 * _ok(df, "kernels_in_graphs_share")).reindex(index=sorted(df["label"].unique()),
                                                               columns=list(variants))
    return _table_figure(table, out, "table2_coverage", "% of kernels launched inside CUDA graphs",
                         lambda v: f"{v:.1f}")


def copy_bytes_table(records: Iterable[Record], out: Path,
                     variants: Sequence[str] = ("pt2_cg", "cgct", "pi", "cgct_pi")) -> Path:
    df = frame(records)
    table = _ok(df, "graph_input_copy_bytes").reindex(index=sorted(df["label"].unique()), columns=list(variants))
    return _table_figure(table, out, "table3_copy_bytes", "Bytes copied into CUDA-graph inputs per iteration",
                         lambda v: f"{v:,.0f}")


def tp_figure(records: Iterable[Record], out: Path, variants: Sequence[str] = ("pt2_cg", "grace")) -> Path | None:
    """Fig 11: latency per workload at each tensor-parallel degree that ran (TP1 included), PyTorch2-CG
    against GraCE (the slowest rank's iterations), from the tp experiment's records; None without any.
    The variants of a workload and degree are compared within one session, the newest where all were
    ok; where none has them all, their bars are drawn as missing, and the footnote says why."""
    drawn = {(label(*r.key.entry), r.tp) for r in records if r.status == "ok" and r.variant in variants}
    if not drawn:
        return None
    chosen = list(one_session(records, variants).values())
    apart = [f"{name} TP{tp}" for name, tp in sorted(drawn - {(label(*r.key.entry), r.tp) for r in chosen})]
    bars = [f"{LABELS.get(v, v)} TP{t}" for v in variants for t in sorted({tp for _, tp in drawn})]
    table = pd.DataFrame(index=sorted({name for name, _ in drawn}), columns=bars, dtype=float)
    for r in chosen:
        table.at[label(*r.key.entry), f"{LABELS.get(r.variant, r.variant)} TP{r.tp}"] = r.median_ms
    table.index.name = "workload"
    at = f" ({_measured(frame(chosen), variants, table.index)})" if chosen else ""
    fig = _bars(table, f"Fig 11: tensor parallelism{at}", "ms per iteration (slowest rank)",
                reference=None, footnote="each degree's bars come from one session" + (
                    f"; missing: no session with both variants ok ({', '.join(apart)})" if apart else ""))
    return _save(fig, table, out, "fig11_tp")


def single_gpu(records: Iterable[Record]) -> list[Record]:
    """Records for the single-GPU figures and tables: one GPU, not of the tp experiment (its TP1 runs are
    Fig 11's points, measured its way: variants set up one at a time)."""
    return [r for r in records if r.tp == 1 and r.experiment != TP_EXPERIMENT]


def _sweeps(path: Path) -> bool:
    """Whether a records file holds the sweep's records (each with its session), not those of
    experiments/corpus or experiments/mutation, which their own readers read, under whatever name."""
    with path.open() as f:
        first = next((line for line in f if line.strip()), "{}")
    try:
        return "session" in json.loads(first)
    except ValueError:
        return True  # the store's reader says what it cannot read


def load(results: Path, device: str, experiments: Sequence[str] | None = None) -> tuple[list[Record], list[Record]]:
    """Every record of `device` under `results` (of `experiments`, default all), oldest first, and those the
    figures use: made since their workload's last revision, run 0 (later runs only measure the spread)."""
    from experiments.records import RecordStore, current

    paths = [q for q in sorted(results.glob(f"*/{device}/records.jsonl")) if _sweeps(q)]
    if experiments:
        paths = [q for q in paths if q.parent.parent.name in experiments]
    every = sorted((r for q in paths for r in RecordStore(q).load()), key=lambda r: r.env.get("date", ""))
    return every, [r for r in current(every, workloads.revisions({r.workload for r in every})) if r.run == 0]


def paper_figures(records: Sequence[Record], out: Path) -> list[Path]:
    """Figs 9 and 10 over the paper's workloads, their time over the floor where measured, the workloads
    beyond them in a figure of their own, and Tables 2 and 3, from single-GPU records; Fig 11 from the
    tp experiment's."""
    tp = tp_figure([r for r in records if r.experiment == TP_EXPERIMENT], out)
    records = single_gpu(records)
    paper = [r for r in records if acronym(r.workload, r.mode, r.batch, r.size)]
    extra = [r for r in records if not acronym(r.workload, r.mode, r.batch, r.size)]
    noise = worker_noise(frame(records))  # the harness's, from every workload's A/A control: one for all
    figs = [tp] if tp else []
    if paper:
        figs += [speedup_figure(paper, out, ["pt2_cg", "grace"], "fig9_speedup",
                                "Fig 9: speedup over PyTorch2 without CUDA Graphs", noise=noise),
                 speedup_figure(paper, out, ["cgct", "cgct_pi", "grace"], "fig10_ablation", "Fig 10: ablation",
                                overlay="pt2_cg", noise=noise)]
        figs += [f for f in [floor_figure(paper, out, noise=noise)] if f]
    if extra:
        figs.append(speedup_figure(extra, out, ["pt2_cg", "grace"], "extra_speedup",
                                   "Beyond the paper's workloads: speedup over PyTorch2 without CUDA Graphs",
                                   noise=noise))
    return figs + [coverage_table(records, out), copy_bytes_table(records, out)]


def json_lines(path: Path) -> list[dict]:
    """The records of a JSON-lines file written by a benchmark script."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pi_microbench_figure(sizes: Path, out: Path) -> Path:
    """paper_figures/pi_microbench.{png,pdf,csv} from scripts/pi_microbench.py's JSON lines: time
    per call against input size for the copy path, PI and a bare replay, and where PI starts to win; where
    recorded, PI's cost split (the runtime's path with inputs in place, the node updates alone), dashed."""
    rows = json_lines(sizes)
    table = pd.DataFrame({r["bytes_per_input"]: r["median_us_per_call"] for r in rows}).T.sort_index()
    labels = {"copy": "copy into placeholder (stock)", "pi": "PI (re-point kernels)", "bare": "bare replay",
              "static": "runtime, inputs in place", "patch": "PI's node updates alone",
              "pi_still": "PI, inputs never moving"}
    sns.set_theme(style="whitegrid", context="paper")
    fig, ax = plt.subplots(figsize=(6, 4))
    for (way, label), color in zip(labels.items(), sns.color_palette("colorblind", len(labels))):
        if way in table:
            ax.plot(table.index, table[way], marker="o", label=label, color=color,
                    linestyle="--" if way in ("static", "patch", "pi_still") else "-")
    wins = table.index[table["pi"] < table["copy"]]
    if len(wins):
        ax.axvline(wins[0], color="grey", linestyle=":", label=f"PI faster from {wins[0]:,} bytes")
    ax.set(xscale="log", yscale="log", xlabel="bytes per input (three inputs)", ylabel="us per call (host or GPU, whichever is longer)",
           title="One graph, fresh inputs every call")
    ax.legend()
    return _save(fig, table, out, "pi_microbench", index_label="bytes per input")
