"""The record of CUDA test runs (results/cuda_tests/runs.jsonl; the logs beside it, per device), and the README's status line
made from it: the CUDA tests cannot run in CI, so each run on a GPU is recorded with the commit and
grace/ tree it tested.

    python -m experiments.cuda_tests record cuda_tests.log --commit <sha> --device "NVIDIA H200, driver ..."
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

RUNS = Path("results/cuda_tests/runs.jsonl")  # every GPU's runs, each naming its device
COMMAND = "python3 -m pytest -q -m cuda -n 2 --dist loadfile -p no:cacheprovider --durations=12"  # scripts/device_run.sh's


def counts(summary: str) -> dict[str, int]:
    """pytest's last line ('28 passed, 2 skipped, 1 failed in 211.55s') as counts."""
    found = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    return {"passed": found.get("passed", 0), "failed": found.get("failed", 0) + found.get("error", 0)
            + found.get("errors", 0), "skipped": found.get("skipped", 0)}


def grace_tree(commit: str) -> str:
    """The hash of grace/ at `commit`: runs of the same package code match whatever else changed."""
    return subprocess.run(["git", "rev-parse", f"{commit}:grace"], capture_output=True, text=True,
                          check=True).stdout.strip()


def record(log: Path, commit: str, device: str, torch: str, runs: Path = RUNS, command: str = COMMAND) -> dict:
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    summary = next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed)", line)), None)
    if summary is None:
        raise ValueError(f"{log}: no pytest summary line (did the run finish?)")
    full = subprocess.run(["git", "rev-parse", commit], capture_output=True, text=True, check=True).stdout.strip()
    entry = {"command": command, "commit": full, "grace_tree": grace_tree(full),
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
             "device": device, "torch": torch, **counts(summary), "summary": summary,
             # stopped (a device call's time limit): what it counts passed, the rest never ran
             "interrupted": any("KeyboardInterrupt" in line for line in lines)}
    runs.parent.mkdir(parents=True, exist_ok=True)
    with runs.open("a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
    return entry


def status(runs: Path = RUNS, head: str = "HEAD") -> str:
    """One line for the README: the newest run, and whether grace/ at `head` is the code it tested."""
    entries = [json.loads(line) for line in runs.read_text().splitlines() if line.strip()] if runs.is_file() else []
    if not entries:
        return "CUDA tests: never run on a GPU.\n"
    last = entries[-1]
    line = f"CUDA tests on {last['device'].split(',')[0]} (torch {last['torch']}): {_run(last, head)}"
    if last.get("interrupted") and (whole := [e for e in entries if not e.get("interrupted")]):
        line += f"; the last run to the end: {_run(whole[-1], head)}"
    return line + ".\n"


def _run(entry: dict, head: str) -> str:
    if entry.get("interrupted"):
        verdict = "interrupted before the end" + (f", {entry['failed']} failed" if entry["failed"] else "")
    else:
        verdict = "passed" if entry["failed"] == 0 and entry["passed"] > 0 else f"{entry['failed']} failed"
    same = grace_tree(head) == entry["grace_tree"]
    return (f"{verdict} ({entry['passed']} passed, {entry['failed']} failed, {entry['skipped']} skipped) at "
            f"{entry['commit'][:7]}, {entry['date']}; grace/ {'is unchanged' if same else 'has changed'} since")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("record", help="append a run from its pytest log")
    r.add_argument("log", type=Path)
    r.add_argument("--commit", required=True, help="the commit the GPU machine ran")
    r.add_argument("--device", default="NVIDIA H200")
    r.add_argument("--torch", default="2.11.0+cu130")
    r.add_argument("--runs", type=Path, default=RUNS)
    r.add_argument("--command", default=COMMAND, help="the command the GPU machine ran")
    sub.add_parser("status", help="print the README's status line")
    args = p.parse_args(argv)
    try:
        if args.what == "record":
            print(json.dumps(record(args.log, args.commit, args.device, args.torch, args.runs, args.command)))
        else:
            print(status(), end="")
    except (ValueError, OSError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
