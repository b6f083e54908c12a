"""Where two variants of one workload spend their time differently, from committed records (each keeps
its top device activities by time, experiments/profiling.py, and where the host's time went by part of
the stack, experiments/host_profile.py): markdown tables, largest differences first. Runs anywhere, no
GPU needed.

    python scripts/kernel_diff.py MTCG-T pt2_cg runtime
    python scripts/kernel_diff.py "kv_decode eval b8" inductor grace --records results/full/nvidia-h200/records.jsonl
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import report  # noqa: E402
from experiments.records import RecordStore  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", help="as the results name it: the paper's acronym, or 'name mode bN'")
    p.add_argument("a", help="variant")
    p.add_argument("b", help="variant compared with a")
    p.add_argument("--records", type=Path, default=Path("results/full/nvidia-h200/records.jsonl"))
    args = p.parse_args(argv)
    if not args.records.exists():
        print(f"error: no records at {args.records}", file=sys.stderr)
        return 2
    print(report.kernel_diff(RecordStore(args.records).load(), args.workload, args.a, args.b), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
