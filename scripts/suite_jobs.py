"""The suite's workloads this machine has not yet measured whole with this code, packed into one device
call by how long their sessions took before: the arguments of scripts/device_run.sh for that call.

    A=$(python scripts/suite_jobs.py --seconds 540) && bash scripts/device_run.sh $A
    bash scripts/device_run.sh suite       (the same, asked again after each session with the time left)

The first prints, say, `full workload=EOS,ALNET,DR-T`. A workload is measured whole when each of its eight variants
is recorded with this code in a session that also holds the baseline, grace, the A/A control and the
floor: by `full` (one session), or where that would not fit a call, by `fig9` (inductor, pt2_cg, grace)
and then the ablation, `fig10`, whole or, where that would not fit either, in parts (`fig10
variant=[inductor,grace,runtime,cgct]`), each part a session with the same anchors.

A session whose A/A control misses +-3 % (a host slowed mid-session) is measured once more, with
`force=true`; the second stands whatever its control says.

A session's workers are set up one after another, so its time is counted per worker: the longest whole
session of the workload on this machine (among those of the most workers), whatever its code; else the
longest whole session on another machine, scaled by the most this machine was slower on a workload both
measured; planned a quarter longer (MARGIN), as a session may outrun the longest before it, and each
session given SESSION_S more for its job's start and end. Either way never less
than a quarter more than the latest session of it stopped here since ran. The call takes the longest
that fit (first fit, decreasing), then one never measured, whose end does not matter: it teaches its
time, and the sweep measures a workload its time ran out on again, whole. With `--fit`, only those that
fit. One that is known not to fit is never sent: a call that ends early keeps its device time. A
workload whose `fig9` set or one ablation variant with the anchors would not fit by its time on this
machine is named on stderr and left out; by another machine's time only (what a session stopped here ran
leaving Fig 9's set room), it is tried by `fig9` as one never measured. A rerun after each call packs
again from what is left.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments

from experiments import environment  # noqa: E402
from experiments.figures import aa_missed  # noqa: E402
from experiments.records import FINAL_STATUSES, Record, RecordStore, Selection, latest  # noqa: E402
from experiments.sweep import AA_SUFFIX, FLOOR  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BASE = OmegaConf.load(REPO / "conf" / "config.yaml").baseline
ANCHORS = (BASE, "grace")  # in every session of a workload measured in parts


# A session stopped here needed more than it ran, by an unknown amount: planned again as if it needed this
# much more, so that one stopped near a call's end is split rather than planned whole into the same time
STOPPED_NEEDS = 1.25
# A session may outrun the longest of it before (docs/harness.md), and one stopped loses all it ran: each is
# planned with this much more than its time per worker
MARGIN = 1.25
# A session's job takes longer than its workload_s: Hydra's job start and imports before, the workers' exit after
SESSION_S = 40.0


def own(experiment: str) -> list[str]:
    """The variants `experiment` selects, in its order."""
    conf = OmegaConf.load(REPO / "conf" / "experiment" / f"{experiment}.yaml")
    return list(next(d["override /variant"] for d in conf.defaults if "override /variant" in d))


def workers(selected: list[str], cuda: bool) -> int:
    """Worker processes of a session of `selected`: one each, the A/A control's and on CUDA the floor's."""
    return len(selected) + 1 + cuda


def workload(name: str) -> tuple[str, str]:
    """A suite name's workload and mode, as its records carry them."""
    conf = OmegaConf.load(REPO / "conf" / "workload" / f"{name}.yaml")[name]
    return conf.name, conf.mode


def per_worker(records: list[Record]) -> tuple[dict[tuple, float], dict[tuple, float]]:
    """(workload, mode) -> seconds per worker of its longest session that ran to the end (`workload_s`, its
    last record's, over the session's workers), whatever their status and code; and that of the latest
    session stopped since, counted as if all its workers had been set up: the least a worker takes here.
    The longest, not the latest: one workload's sessions on one machine took up to twice as long as
    another of its sessions (DLRM 72 and 137 s), and a call planned too short loses all it ran. Among
    the sessions with the most workers: a session of fewer spreads its shared part (the numerics
    reference, the float64 checks) over fewer workers (ST: 48 s a worker with 5, 15-21 with 10). Only
    sessions with the A/A control count: one from before it had no float64 checks either, which can take
    a worker's time again."""
    held: dict[str, set[str]] = {}
    for r in records:
        held.setdefault(r.session, set()).add(r.variant)
    cut = {r.session for r in records if r.status == "interrupted"}
    took: dict[tuple, float] = {}
    stopped: dict[tuple, float] = {}
    whole: dict[tuple, tuple[int, float]] = {}  # per whole session: its workers, its last record's time
    for r in records:  # oldest first: a later stopped session replaces an earlier one
        if not r.workload_s or BASE + AA_SUFFIX not in held[r.session]:
            continue
        k, t = (r.workload, r.mode), r.workload_s / len(held[r.session])
        if r.session in cut:
            stopped[k] = t
        else:
            whole[(k, r.session)] = len(held[r.session]), t
            stopped.pop(k, None)  # a stopped session before the latest whole one says nothing more
    for (k, _), (n, t) in sorted(whole.items(), key=lambda x: x[1]):  # the most workers, then the longest
        took[k] = t
    return took, stopped


def again(records: list[Record], key: tuple[str, str], code: str) -> bool:
    """Whether `key`'s only session with this code's A/A control missed figures.AA_WITHIN: then it is
    measured once more, and the second stands whatever its control says, so that a workload whose noise
    is its own is not measured forever."""
    controls = [r for r in records if (r.workload, r.mode) == key and r.variant == BASE + AA_SUFFIX
                and r.status == "ok" and r.env.get("code") == code and r.speedup_ci]
    return len(controls) == 1 and bool(aa_missed(controls))


def measured(records: list[Record], final: set[Selection], newest: dict[Selection, Record], key: tuple[str, str],
             cuda: bool) -> set[str]:
    """The variants of `key` (workload, mode) whose records are `final` (RecordStore.final_keys: those a
    rerun leaves alone, `newest` the latest per key), each in a session where the anchors, the A/A control
    and on CUDA the floor are final too."""
    fixed = {*ANCHORS, BASE + AA_SUFFIX} | ({FLOOR} if cuda else set())
    done: dict[str, set[str]] = {}
    for r in records:
        if (r.workload, r.mode) == key and r.status in FINAL_STATUSES | {"skipped"}:
            done.setdefault(r.session, set()).add(r.variant)
    return {k.variant for k in final if (k.workload, k.mode) == key
            and fixed <= done.get(newest[k].session, set())}


def session_s(selected: list[str], seconds_per_worker: float, cuda: bool) -> float:
    """The seconds a call gives a session of `selected`: its workers' time and its job's own (SESSION_S)."""
    return workers(selected, cuda) * seconds_per_worker + SESSION_S


def next_session(left: list[str], seconds_per_worker: float | None, seconds: float,
                 cuda: bool) -> tuple[str, list[str]] | None:
    """The next session of a workload whose variants `left` are not yet measured: its run.py arguments
    beyond the workload and the variants it selects, or None where not even the smallest fits."""
    def fits(selected: list[str]) -> bool:
        return seconds_per_worker is None or session_s(selected, seconds_per_worker, cuda) <= seconds

    full, fig9, fig10 = own("full"), own("fig9"), own("fig10")
    if set(left) == set(full) and fits(full):
        return "full", full
    ablation = [v for v in fig10 if v in left and v not in ANCHORS]
    if set(fig9) - set(ANCHORS) & set(left) or not ablation:  # fig9 first; it holds the anchors too
        return ("fig9", fig9) if fits(fig9) else None
    if len(ablation) == len(fig10) - len(ANCHORS) and fits(fig10):
        return "fig10", fig10
    part = list(ANCHORS)
    for v in ablation:
        if not fits([*part, v]):
            break
        part.append(v)
    return (f"fig10 variant=[{','.join(part)}]", part) if len(part) > len(ANCHORS) else None


def pack(left: list[tuple[str, str, float | None]], seconds: float, fit: bool = False) -> list[tuple[str, str]]:
    """One call from `left` ((name, session arguments, expected seconds or None), all with the same
    arguments in a call): the longest that fit, then, unless `fit`, the first never measured (its end does
    not matter: it teaches its time, and the sweep measures a workload its time ran out on again whole)."""
    call, total = [], 0.0
    for name, s, t in sorted((x for x in left if x[2] is not None), key=lambda x: -x[2]):
        if total + t <= seconds and (not call or call[0][1] == s):
            call.append((name, s))
            total += t
    unknown = [(name, s) for name, s, t in left if t is None and (not call or call[0][1] == s)]
    return call + unknown[:1] if not fit else call


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=540, help="the time one call has for its sessions")
    p.add_argument("--results", type=Path, default=Path("results/full"))
    p.add_argument("--fit", action="store_true", help="only sessions expected to fit (scripts/device_run.sh suite)")
    p.add_argument("--call", type=float, help="the time a whole call has, which decides how a workload is split "
                   "(default: --seconds); --seconds is then what is left of this one")
    args = p.parse_args(argv)
    env = environment.current()
    cuda = env.device == "cuda"
    here = environment.device_tag(env)
    store = RecordStore(args.results / here / "records.jsonl")
    mine = store.load()
    final, newest = store.final_keys(code=env.code), latest(mine)
    took_here, stopped = per_worker(mine)
    took_there: dict[tuple, float] = {}
    for f in sorted(args.results.glob("*/records.jsonl")):
        if f.parent.name != here:
            took_there.update(per_worker(RecordStore(f).load())[0])
    # the most this machine was slower on any workload, a stopped session counting by what it ran: a call
    # planned too short loses its whole time, one planned too long only some of it
    slower = max([t / took_there[k] for d in (took_here, stopped) for k, t in d.items() if k in took_there]
                 or [1.0])

    call_s = args.call or args.seconds  # what decides how a workload is split
    left = []
    for name in OmegaConf.load(REPO / "conf" / "experiment" / "full.yaml").hydra.sweeper.params.workload.split(","):
        key = workload(name)
        repeat = again(mine, key, env.code)
        todo = [v for v in own("full") if repeat or v not in measured(mine, final, newest, key, cuda)]
        if not todo:
            continue
        guess = took_here.get(key) or (took_there[key] * slower if key in took_there else None)
        ran = STOPPED_NEEDS * stopped.get(key, 0.0)  # the least it takes here, by a session stopped here
        w = max(MARGIN * (guess or 0.0), ran) or None
        session = next_session(todo, w, call_s, cuda)
        if session is None and key not in took_here and next_session(own("fig9"), ran or None, call_s, cuda):
            # too long only by another machine's time (scaled by the most this one was slower on any workload),
            # not by what it ran here: tried alone, by Fig 9's set, when nothing else fits
            session, w = ("fig9", own("fig9")), None
        if session is None:
            print(f"{name}: no session of it fits {call_s:.0f} s ({w:.0f} s a worker)", file=sys.stderr)
            continue
        arguments, selected = session
        arguments += " force=true" * repeat  # the sweep passes over what is recorded with this code otherwise
        left.append((name, arguments, session_s(selected, w, cuda) if w else None))
    if not left:
        print(f"nothing of the suite left to measure in {args.results / here} with this code", file=sys.stderr)
        return 1
    call = pack(left, args.seconds, args.fit)
    if not call:
        print(f"no session left fits {args.seconds:.0f} s", file=sys.stderr)
        return 1
    experiment, *rest = call[0][1].split()
    print(" ".join([experiment, f"workload={','.join(n for n, _ in call)}", *rest]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
