"""Take the records files a device call brought back (scripts/device_run.sh writes `<experiment
name>_records.jsonl.gz`: a returned file may have 16 MiB, which the H100's full records outgrew) into the
committed ones, checking first that each only appends to the file it
was sent with, so that nothing recorded is lost:

    python scripts/take_records.py /work/.device/7

Each goes to results/<experiment name>/<device folder of its newest record>/records.jsonl, before the next
call, which plans from them (calls made one after another on a warm machine may be taken together
afterwards). A file that does not start as its committed file does, or that rewrites a record, is left
alone, with a one-line error and exit status 1.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments

from experiments import environment  # noqa: E402


SUFFIXES = ("_records.jsonl.gz", "_records.jsonl")


def _read(returned: Path) -> bytes:
    if returned.suffix != ".gz":
        return returned.read_bytes()
    try:
        return gzip.decompress(returned.read_bytes())
    except (OSError, EOFError, zlib.error) as e:  # not gzip, cut short, corrupt
        raise ValueError(f"{returned}: {e}") from None


def target(returned: Path, results: Path) -> Path:
    """Where a returned records file belongs: its experiment's folder, its newest record's device."""
    lines = _read(returned).splitlines()
    if not lines:
        raise ValueError(f"{returned}: no records")
    machine = SimpleNamespace(gpu=json.loads(lines[-1])["env"]["gpu"])  # all that device_tag reads
    experiment = next(returned.name.removesuffix(s) for s in SUFFIXES if returned.name.endswith(s))
    return results / experiment / environment.device_tag(machine) / "records.jsonl"


def take(returned: Path, results: Path) -> tuple[Path, int]:
    """Add the records of `returned` that its committed file lacks; the number added.

    A call's file is the committed file as it was sent plus that call's records. When calls ran one after
    another on a warm machine before any was taken, the committed file has grown since: the lines past the
    prefix both share are the call's own, and are appended; none if all are there already (taken before),
    and an error if only some are (the returned file then rewrote a record, not only added some)."""
    to = target(returned, results)
    new = _read(returned).splitlines(keepends=True)
    old = to.read_bytes().splitlines(keepends=True) if to.exists() else []
    shared = next((i for i, (a, b) in enumerate(zip(new, old)) if a != b), min(len(new), len(old)))
    added, taken = new[shared:], set(old[shared:])
    if taken.issuperset(added):  # taken before
        added = []
    if (old and not shared) or taken & set(added):
        raise ValueError(f"{returned} does not extend {to}: left alone")
    to.parent.mkdir(parents=True, exist_ok=True)
    to.write_bytes(b"".join(old + added))
    return to, len(added)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="where the call's files came back (the run's files_at)")
    p.add_argument("--results", type=Path, default=Path("results"))
    args = p.parse_args(argv)
    status = 0
    for returned in sorted(f for s in SUFFIXES for f in args.folder.glob("*" + s)):
        try:
            to, added = take(returned, args.results)
            print(f"{to}: {added} records added")
        except (ValueError, KeyError) as e:  # json.JSONDecodeError is a ValueError
            print(f"take_records: {e}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
