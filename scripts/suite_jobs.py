"""The suite's workloads this machine has not yet measured whole with this code, packed into one device
call by how long their sessions took before: the arguments of scripts/device_run.sh for that call.

    A=$(python scripts/suite_jobs.py --seconds 540) && bash scripts/device_run.sh $A

prints, say, `full workload=EOS,ALNET,DR-T`. A workload is measured whole by `full` (all eight variants in
one session) or by `fig9` and `fig10` (two sessions that share the baseline and grace); one whose `full`
session would not fit a call goes by `fig9`, then `fig10`. Its expected time is the latest whole session of
that variant set on this machine, else on another, scaled by the most this machine was slower on a workload
both measured; never less than a session of that set ran here before it was stopped. The call takes the
longest that fit (first fit, decreasing), then one more whose end does not matter (the sweep measures a
workload its time ran out on again, whole): one never measured, else the shortest left. Where none fits, one never measured goes alone, by `fig9`. A rerun after each call packs
again from what is left.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments

from experiments import environment  # noqa: E402
from experiments.records import Record, RecordStore, Selection, latest  # noqa: E402
from experiments.sweep import AA_SUFFIX, FLOOR  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SETS = ("full", "fig9", "fig10")


def variants(experiment: str, cuda: bool) -> frozenset[str]:
    """The variants that `experiment` records in a session: its own, the A/A control and on CUDA the floor."""
    conf = OmegaConf.load(REPO / "conf" / "experiment" / f"{experiment}.yaml")
    own = next(d["override /variant"] for d in conf.defaults if "override /variant" in d)
    base = OmegaConf.load(REPO / "conf" / "config.yaml")
    return frozenset([*own, base.baseline + AA_SUFFIX] + ([FLOOR] if cuda else []))


def workload(name: str) -> tuple[str, str]:
    """A suite name's workload and mode, as its records carry them."""
    conf = OmegaConf.load(REPO / "conf" / "workload" / f"{name}.yaml")[name]
    return conf.name, conf.mode


def sessions(records: list[Record], sets: dict[str, frozenset[str]], stopped: bool = False) -> dict[tuple, float]:
    """(workload, mode, set) -> seconds of the latest session that ran that set's variants to the end (the
    floor aside: older sessions had none), whatever their status; with `stopped`, the longest a session of
    that set ran before it was stopped, the least that set needs here."""
    held: dict[str, set[str]] = {}
    for r in records:
        held.setdefault(r.session, set()).add(r.variant)
    cut = {r.session for r in records if r.status == "interrupted"}
    took: dict[tuple, float] = {}
    for r in records:  # oldest first: a later session replaces an earlier one, its last record the whole time
        for s, want in sets.items():
            if (r.session in cut) == stopped and held[r.session] - {FLOOR} == want - {FLOOR} and r.workload_s:
                k = (r.workload, r.mode, s)
                took[k] = max(took.get(k, 0.0), r.workload_s) if stopped else r.workload_s
    return took


def done(final: set[Selection], newest: dict[Selection, Record], key: tuple[str, str],
         sets: dict[str, frozenset[str]]) -> set[str]:
    """The variant sets of `key` (workload, mode) whose records are `final` (those a rerun leaves alone:
    RecordStore.final_keys), all from one session (`newest`: the latest record per key)."""
    sessions = {k.variant: newest[k].session for k in final if (k.workload, k.mode) == key}
    return {s for s, want in sets.items() if want <= sessions.keys() and len({sessions[v] for v in want}) == 1}


def pack(left: list[tuple[str, str, float | None]], seconds: float) -> list[tuple[str, str]]:
    """One call from `left` ((name, set, expected seconds or None), all of one set taken in a call): the
    longest that fit, then one more of that set whose end does not matter, as the sweep measures a workload
    its time ran out on again whole: one never measured, else the shortest left. With none that fits, the
    first of unknown length alone, by Fig 9's set where nothing of it is known."""
    call, total = [], 0.0
    for name, s, t in sorted((x for x in left if x[2] is not None), key=lambda x: -x[2]):
        if total + t <= seconds and (not call or call[0][1] == s):
            call.append((name, s))
            total += t
    if not call:
        unknown = [x for x in left if x[2] is None]
        name, s, t = unknown[0] if unknown else min(left, key=lambda x: x[2])
        return [(name, "fig9" if s == "full" and t is None else s)]
    rest = [x for x in left if x[1] == call[0][1] and (x[0], x[1]) not in call]
    if rest:
        name, s, _ = min(rest, key=lambda x: x[2] if x[2] is not None else -1.0)
        call.append((name, s))
    return call


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=540, help="the time one call has for its sessions")
    p.add_argument("--results", type=Path, default=Path("results/full"))
    args = p.parse_args(argv)
    env = environment.current()
    cuda = env.device == "cuda"
    sets = {s: variants(s, cuda) for s in SETS}
    here = environment.device_tag(env)
    store = RecordStore(args.results / here / "records.jsonl")
    mine = store.load()
    final, newest = store.final_keys(code=env.code), latest(mine)
    others = [RecordStore(f).load() for f in sorted(args.results.glob("*/records.jsonl")) if f.parent.name != here]
    took_here, stopped = sessions(mine, sets), sessions(mine, sets, stopped=True)
    took_there = {}
    for recs in others:
        took_there.update(sessions(recs, sets))
    # the most this machine was slower on any workload, a stopped session counting by what it ran: a call
    # planned too short loses its whole time, one planned too long only some of it
    both = [here_s / took_there[k] for t in (took_here, stopped) for k, here_s in t.items() if k in took_there]
    slower = max(both, default=1.0)

    def expected(key: tuple[str, str], s: str) -> float | None:
        k = (*key, s)
        guess = took_here.get(k) or (took_there[k] * slower if k in took_there else None)
        return max(guess or 0.0, stopped.get(k, 0.0)) or None

    names = OmegaConf.load(REPO / "conf" / "experiment" / "full.yaml").hydra.sweeper.params.workload.split(",")
    left = []
    for name in names:
        key = workload(name)
        have = done(final, newest, key, sets)
        if "full" in have or {"fig9", "fig10"} <= have:
            continue
        whole = expected(key, "full")
        if not have and (whole is None or whole <= args.seconds):
            left.append((name, "full", whole))
        else:
            s = "fig9" if "fig9" not in have else "fig10"
            left.append((name, s, expected(key, s)))
    if not left:
        print(f"every suite workload is measured whole in {args.results / here} with this code", file=sys.stderr)
        return 1
    call = pack(left, args.seconds)
    print(f"{call[0][1]} workload={','.join(n for n, _ in call)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
