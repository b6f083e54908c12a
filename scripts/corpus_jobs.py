"""The corpus programs this machine has not yet recorded with this code, as Hydra jobs for a multirun:
the value of `corpus.programs` (one bracketed list of programs per job).

    P=$(python scripts/corpus_jobs.py --per-job 3)             (or only some: ... --per-job 7 hazards/ timm/)
    python run.py -m experiment=corpus "corpus.programs=$P" hydra/launcher=joblib hydra.launcher.n_jobs=14

Each job gets at most one heavy program (detection, video, optical flow, the largest classifiers,
training and generation: minutes each to compile three times), the rest light ones, so that jobs side by
side finish at about the same time and a call stopped at its time limit loses at most one heavy program
per job. Regrouped on every call from what is left, no job is given only programs already recorded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments

from experiments.corpus import recorded, select, where  # noqa: E402

HEAVY = ("rcnn", "retina", "fcos", "ssd", "raft", "mc3", "mvit", "r2plus1d", "r3d", "s3d", "swin3d", "train/",
         "generate", "densenet", "efficientnet_b", "efficientnet_v2", "maxvit", "swin", "vit_h", "vit_l",
         "regnet_y_128", "deeplab", "fcn", "hf/")


def jobs(left: list[str], per_job: int) -> list[list[str]]:
    """`left` in jobs of `per_job`, each led by a heavy program while there are any."""
    heavy = [n for n in left if any(h in n for h in HEAVY)]
    light = [n for n in left if n not in heavy]
    out = []
    while heavy or light:
        job, heavy = heavy[:1], heavy[1:]
        take = per_job - len(job)
        job, light = job + light[:take], light[take:]
        out.append(job)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("results/corpus"))
    p.add_argument("--per-job", type=int, default=3)
    p.add_argument("only", nargs="*", help="programs or families ('hazards/', 'timm/'); default: all")
    args = p.parse_args(argv)
    env, path = where(args.out)
    done = recorded(path, env)
    try:
        left = [n for n in select(args.only) if n not in done]
    except ValueError as e:
        p.error(str(e))
    if not left:
        print(f"every program is recorded in {path} with this code", file=sys.stderr)
        return 1
    print(",".join("[" + ",".join(job) + "]" for job in jobs(left, args.per_job)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
