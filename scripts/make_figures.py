"""Regenerate paper_figures/ from committed records, on any machine, in seconds: the figures and
tables, pt2_cg_shortfall.md, and results.md, which also replaces the README's results section.

    python scripts/make_figures.py                      # GPU records of every experiment under results/
    python scripts/make_figures.py --device nvidia-h200 --experiments baselines full
    python scripts/make_figures.py --code ffa3f8d23dd6  # only what that code measured (records' env.code)

Where several experiments recorded the same (workload, mode, batch, size, variant), the newest wins. Only
run 0 goes into the figures and tables; repeats (experiment=spread's run 1) only into the spread report.
"""

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import cuda_tests, figures, report, workloads  # noqa: E402
from experiments.figures import json_lines  # noqa: E402
from experiments.records import current  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=Path("results"), help="folder of <experiment>/<device>/records.jsonl")
    p.add_argument("--device", default="nvidia-h200", help="device folder to read (default: nvidia-h200)")
    p.add_argument("--experiments", nargs="*", help="experiments to read (default: all)")
    p.add_argument("--out", type=Path, default=Path("paper_figures"))
    p.add_argument("--readme", type=Path, default=Path("README.md"), help="README whose results section to replace")
    p.add_argument("--code", help="only records made by this code (their env.code), the corpus's too")
    args = p.parse_args(argv)
    every, first = figures.load(args.results, args.device, args.experiments)
    if args.code:
        every, first = ([r for r in rs if r.env.get("code") == args.code] for rs in (every, first))
    if not every:
        at = f" made by code {args.code}" if args.code else ""
        print(f"error: no records{at} under {args.results}/*/{args.device}/", file=sys.stderr)
        return 2
    revised = workloads.revisions({r.workload for r in every})
    records = current(every, revised)  # a revised workload's older records measured another program
    for out in figures.paper_figures(first, args.out):
        print(out)
    single = figures.single_gpu(first)  # the results section and tables
    print(report.write_shortfall(single, args.out))
    for replays in sorted(args.results.glob(f"replay_overhead/{args.device}/replay.jsonl")):
        print(report.write_replay_overhead(replays, args.out))
    for launches in sorted(args.results.glob(f"pi_launch/{args.device}/launch.jsonl")):
        print(report.write_pi_launch(launches, args.out))
    for sizes in sorted(args.results.glob(f"pi_microbench/{args.device}/sizes.jsonl")):
        print(figures.pi_microbench_figure(sizes, args.out))
    left_out = report.revised(every, revised)
    results = (report.summary(single) + report.noise(single) + report.spread(figures.single_gpu(records))
               + ("\n### Left out: made before their workload's last revision\n\n" + left_out.to_markdown(index=False)
                  + "\n" if len(left_out) else ""))
    corpus = args.results / "corpus" / args.device / "records.jsonl"
    if corpus.is_file():
        programs = [r for r in json_lines(corpus) if not args.code or r["env"].get("code") == args.code]
        results += report.corpus_markdown(programs) if programs else ""
    (args.out / "results.md").write_text(results)
    report.splice(results, args.readme)
    if "<!-- cuda-tests:begin -->" in args.readme.read_text():  # the newest run, on whichever GPU
        report.splice(cuda_tests.status(args.results / "cuda_tests" / "runs.jsonl"), args.readme, "cuda-tests")
    print(args.out / "results.md", "and", args.readme)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
