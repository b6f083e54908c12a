"""How much of each A/A control's offset is the host's state at the time (issue 29): every worker times a
tiny launch right after each of its rounds (a record's `launch_us`, per round). Where that cost tracks the
worker's own round times more than the other worker's, the two workers ran in different host states, and
comparing them at a common launch cost takes the state out: each worker's round medians are regressed on
its own launch costs and read at the median of both workers' costs.

    python scripts/host_state.py [--records results/full/nvidia-h200/records.jsonl] [--code 509073974623]

Prints a markdown table, one row per A/A session (the newest of each workload), and the A/A controls'
spread (root mean square of log(A/A)) both ways; then whether the A/A controls of every session lean one
way, apart for sessions whose baseline compiled over twice as long as its A/A worker (which then found
the shared caches full) and for those whose A/A worker was set up first (Sweep._setup_order). A
diagnostic: the records and figures are not adjusted.
"""
import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.figures import label  # noqa: E402
from experiments.records import Record, RecordStore, latest  # noqa: E402

BASELINE, AA = "inductor", "inductor_aa"


def at_common_launch(medians: np.ndarray, launch: np.ndarray, common: float) -> np.ndarray:
    """Round medians moved along their least-squares line on the launch cost to `common`."""
    slope = np.polyfit(launch, medians, 1)[0] if np.ptp(launch) > 0 else 0.0
    return medians - slope * (launch - common)


def aa_rows(records: list[Record], code: str | None = None) -> pd.DataFrame:
    """Per workload with an ok A/A control (the newest session, of `code` if given): the A/A ratio of round
    medians as measured and at a common launch cost, how much each worker's launch cost tracks its own
    round medians (correlation), and how much the two workers' launch costs track each other."""
    chosen = [r for r in records if r.status == "ok" and r.iter_ms and r.launch_us and (code is None or r.env.get("code") == code)]
    newest = latest(chosen)
    pairs = {}
    for r in newest.values():
        if r.variant in (BASELINE, AA):
            pairs.setdefault((label(*r.key.entry), r.session), {})[r.variant] = r
    rows = []
    for (name, _), pair in sorted(pairs.items()):
        if len(pair) < 2 or len(pair[BASELINE].launch_us) != len(pair[AA].launch_us):
            continue
        (ma, la), (mb, lb) = ((np.array([statistics.median(x) for x in pair[v].iter_ms]), np.array(pair[v].launch_us))
                              for v in (BASELINE, AA))
        common = float(np.median(np.concatenate([la, lb])))
        rows.append({"workload": name, "rounds": len(ma),
                     "A/A": float(np.median(mb) / np.median(ma)),
                     "A/A at a common launch cost": float(np.median(at_common_launch(mb, lb, common))
                                                          / np.median(at_common_launch(ma, la, common))),
                     "own launch ~ own rounds (A, A')": f"{np.corrcoef(la, ma)[0, 1]:.2f}, {np.corrcoef(lb, mb)[0, 1]:.2f}",
                     "launch A ~ launch A'": float(np.corrcoef(la, lb)[0, 1])})
    return pd.DataFrame(rows).set_index("workload") if rows else pd.DataFrame()


def offsets(records: list[Record], code: str | None = None) -> pd.DataFrame:
    """Whether the A/A controls lean one way: each session's log A/A (inductor_aa's speedup over inductor,
    one process a side), grouped by the baseline's worker: whether it compiled over twice as long as its
    A/A worker (it filled the shared caches that the A/A worker then read), and whether it was set up
    before or after it (records without setup_position: before); with their mean, standard error, median
    and the share above 1."""
    sessions: dict[str, dict[str, Record]] = {}
    for r in records:
        if r.variant in (BASELINE, AA) and (code is None or r.env.get("code") == code):
            sessions.setdefault(r.session, {})[r.variant] = r
    rows = [{"baseline": ("compiled cold, " if a.compile_s > 2 * b.compile_s else "")
             + ("set up after its A/A control" if (b.setup_position or 0) < (a.setup_position or 0) else "set up first"),
             "log": math.log(b.speedup)}
            for a, b in ((pair.get(BASELINE), pair.get(AA)) for pair in sessions.values())
            if a and b and b.status == "ok" and b.speedup and b.processes == 1 and a.compile_s and b.compile_s]
    if not rows:
        return pd.DataFrame()
    g = pd.DataFrame(rows).groupby("baseline")["log"]
    return pd.DataFrame({"sessions": g.size(), "mean log(A/A) %": 100 * g.mean(), "standard error %": 100 * g.sem(),
                         "median %": 100 * g.median(), "above 1": g.apply(lambda x: float((x > 0).mean()))})


def spread(ratios: pd.Series) -> float:
    """Root mean square of log(ratio): how far from 1 the A/A controls lie."""
    return float(np.sqrt(np.mean(np.log(ratios.to_numpy(float)) ** 2)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=Path, default=Path("results/full/nvidia-h200/records.jsonl"))
    p.add_argument("--code", help="only records of this code hash (env.code)")
    args = p.parse_args(argv)
    table = aa_rows(RecordStore(args.records).load(), args.code)
    if table.empty:
        print(f"error: no A/A control with launch costs in {args.records}", file=sys.stderr)
        return 2
    print(table.to_markdown(floatfmt=".3f"))
    print(f"\nA/A spread (rms of log), as measured: {100 * spread(table['A/A']):.1f} %; at a common launch cost: "
          f"{100 * spread(table['A/A at a common launch cost']):.1f} % ({len(table)} sessions)")
    leaning = offsets(RecordStore(args.records).load(), args.code)
    if not leaning.empty:
        print("\nWhether the A/A controls lean one way (every session, one process a side):\n")
        print(leaning.to_markdown(floatfmt=("", ".0f", ".2f", ".2f", ".2f", ".2f")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
