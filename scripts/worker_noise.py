"""Why two workers of the same code time differently (issue 29's A/A control): per-process speed, with
Python's hash seed random (as the harness's spawned workers have it), fixed, fixed with address-space
randomization off, pinned to the timing core from the start, and compiled cold (empty caches of its
own, where the others read the shared ones: as the one worker of a sweep that compiled first did).

    python scripts/worker_noise.py [--model mlp] [--size tiny] [--sessions 6] [--per 3] [--rounds 30] [--calls 300]
    python scripts/worker_noise.py --ways "random seed" "compiled cold"

A session starts `per` processes of each way at once, all alive together as a sweep's workers are;
each compiles the suite's `model` with Inductor and waits. Then rounds rotate over the processes, one
timing at a time on the same core (the last of this process's): `calls` calls back to back between
two synchronizations. A process's level is the mean of its rounds' log(us per call); the workers'
noise of a way is the spread of its processes' levels within a session, less what the rounds' own
spread explains, as the log-sd of the ratio of two processes (what experiments.figures.worker_noise
estimates from the sweep's A/A controls): tau^2 = 2 (mean over sessions of var(levels) -
mean(var(rounds) / rounds)). A way's lean is its processes' mean level less the first way's, within
each session, averaged over sessions. Appends one JSON record per session to
results/worker_noise/<device>/sessions.jsonl and prints tau and the lean per way, with bootstrap
intervals over sessions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# How each way's processes start: a command prefix ("{core}" filled in) and PYTHONHASHSEED (None: random).
# "pinned from the start": the process runs on the timing core from its first instruction, so that its
# memory and its CUDA context's host side are placed from there (first touch), not where the OS started it.
WAYS = {"random seed": ([], None), "fixed seed": ([], "0"),
        "fixed seed, no ASLR": (["setarch", os.uname().machine, "-R"], "0"),
        "pinned from the start": (["taskset", "-c", "{core}"], None),
        "compiled cold": ([], None)}
COLD = "compiled cold"  # its processes compile with empty caches of their own (start)


def child(model: str, size: str, calls: int, core: int) -> None:
    """One process: build and compile `model`, then a round per "go" line on stdin, its us per call on stdout."""
    import torch

    sys.path.insert(0, str(REPO))
    from experiments import workloads
    from experiments.task import Task
    from grace.calibrate import per_call_us

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    task = Task(workloads.get(model)("eval", size=size, device=device.type), seed=0)
    inputs = tuple(task.input_sets[0])
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    with torch.inference_mode():
        fn = torch.compile(task.model)
        for _ in range(20):
            fn(*inputs)
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "go":
                return
            print(per_call_us(lambda: fn(*inputs), calls, device), flush=True)


def start(way: str, args, caches: str) -> subprocess.Popen:
    prefix, seed = WAYS[way]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    if way == COLD:
        private = tempfile.mkdtemp(dir=caches)
        env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(private, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(private, "triton"))
    cmd = [*(part.format(core=args.core) for part in prefix), sys.executable, __file__, "--child", "--model", args.model, "--size", args.size,
           "--calls", str(args.calls), "--core", str(args.core)]
    return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def session(args) -> dict:
    """One session: every way's processes alive together, rounds rotating over them."""
    with tempfile.TemporaryDirectory(prefix="worker-noise-caches-") as caches:
        procs = [(way, start(way, args, caches)) for _ in range(args.per) for way in args.ways]
        for _, p in procs:
            if p.stdout.readline().strip() != "ready":
                raise SystemExit(f"error: a {args.model} process did not get ready (exit {p.wait()})")
        rounds = [[] for _ in procs]
        for r in range(args.rounds):
            for i in [(r + j) % len(procs) for j in range(len(procs))]:
                procs[i][1].stdin.write("go\n")
                procs[i][1].stdin.flush()
                rounds[i].append(float(procs[i][1].stdout.readline()))
        for _, p in procs:
            p.stdin.close()
            p.wait()
    return {"processes": [{"way": way, "us_per_call_by_round": rs} for (way, _), rs in zip(procs, rounds)]}


def tau(sessions: list[dict], way: str) -> float:
    """The workers' noise of `way`: the log-sd of the ratio of two of its processes, from their levels
    within each session."""
    between, within = [], []
    for s in sessions:
        logs = [[math.log(x) for x in p["us_per_call_by_round"]] for p in s["processes"] if p["way"] == way]
        between.append(statistics.variance([statistics.fmean(r) for r in logs]))
        within.append(statistics.fmean(statistics.variance(r) / len(r) for r in logs))
    return math.sqrt(2 * max(0.0, statistics.fmean(between) - statistics.fmean(within)))


def lean(sessions: list[dict], way: str, first: str) -> float:
    """How much slower `way`'s processes ran than `first`'s: the mean over sessions of the difference of
    their mean levels (log us per call)."""
    def level(s, w):
        return statistics.fmean(math.log(x) for p in s["processes"] if p["way"] == w for x in p["us_per_call_by_round"])
    return statistics.fmean(level(s, way) - level(s, first) for s in sessions)


def summary(sessions: list[dict], resamples: int = 2000) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Per way of the sessions: tau, and its lean over the first way, each with a 95 % interval, by
    resampling sessions."""
    ways = list(dict.fromkeys(p["way"] for p in sessions[0]["processes"]))
    out = {}
    for way in ways:
        out[way] = {}
        for name, f in (("tau", lambda ss: tau(ss, way)), ("lean", lambda ss: lean(ss, way, ways[0]))):
            rng = random.Random(0)
            boot = sorted(f(rng.choices(sessions, k=len(sessions))) for _ in range(resamples))
            out[way][name] = (f(sessions), boot[int(0.025 * resamples)], boot[int(0.975 * resamples)])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--per", type=int, default=3, help="processes of each way per session")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=list(WAYS),
                        help="the ways a session starts processes in; leans are over the first")
    parser.add_argument("--out", default="results/worker_noise")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.model, args.size, args.calls, args.core)
    if args.per < 2:
        raise SystemExit("error: --per must be at least 2: the noise is the spread between processes")
    sys.path.insert(0, str(REPO))
    from experiments import environment

    env = dataclasses.asdict(environment.current())
    path = Path(args.out) / environment.device_tag(environment.current()) / "sessions.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "child")}
    sessions = []
    for i in range(args.sessions):
        sessions.append({**session(args), **settings, "env": env})
        with path.open("a") as f:  # each session kept as it ends: an interrupted run loses only its last
            f.write(json.dumps(sessions[-1], sort_keys=True) + "\n")
        print(f"session {i + 1} of {args.sessions} recorded", flush=True)
    for way, of in summary(sessions).items():
        print(f"{way:>21}: " + ", ".join(f"{name} {100 * v:+.2f} % [{100 * lo:+.2f}, {100 * hi:+.2f}]"
                                        for name, (v, lo, hi) in of.items()))
    print(f"records: {path}")


if __name__ == "__main__":
    main()
