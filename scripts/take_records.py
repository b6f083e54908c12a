"""Take the records files a device call brought back (scripts/device_run.sh writes `<experiment
name>_records.jsonl`) over the committed ones, checking first that each only appends to its committed
file, so that nothing recorded is lost:

    python scripts/take_records.py /work/.device/7

Each goes to results/<experiment name>/<device folder of its newest record>/records.jsonl, before the next
call, which plans from them. A file that does not start with its committed file's lines is left alone,
with a one-line error and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments

from experiments import environment  # noqa: E402


def target(returned: Path, results: Path) -> Path:
    """Where a returned records file belongs: its experiment's folder, its newest record's device."""
    lines = returned.read_bytes().splitlines()
    if not lines:
        raise ValueError(f"{returned}: no records")
    machine = SimpleNamespace(gpu=json.loads(lines[-1])["env"]["gpu"])  # all that device_tag reads
    return results / returned.name.removesuffix("_records.jsonl") / environment.device_tag(machine) / "records.jsonl"


def take(returned: Path, results: Path) -> tuple[Path, int]:
    """Copy `returned` over its committed file; the number of records it adds."""
    to = target(returned, results)
    new = returned.read_bytes()
    old = to.read_bytes() if to.exists() else b""
    if not new.startswith(old):
        raise ValueError(f"{returned} does not extend {to}: left alone")
    to.parent.mkdir(parents=True, exist_ok=True)
    to.write_bytes(new)
    return to, new.count(b"\n") - old.count(b"\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="where the call's files came back (the run's files_at)")
    p.add_argument("--results", type=Path, default=Path("results"))
    args = p.parse_args(argv)
    status = 0
    for returned in sorted(args.folder.glob("*_records.jsonl")):
        try:
            to, added = take(returned, args.results)
            print(f"{to}: {added} records added")
        except (ValueError, KeyError) as e:  # json.JSONDecodeError is a ValueError
            print(f"take_records: {e}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
