"""The numerics check, proven: for each workload, eager and each deliberately wrong variant
(variants.MUTATIONS) go through the check the sweep makes (Bench.reference, then Bench.setup), in one
process; every mutant must fail it and eager pass.

    python -m experiments.mutation [--size tiny|full] [--only NAME ...] [--out results/mutation]

The tolerances are the sweep's (conf/measure/default.yaml). A record per (workload, mode, variant) with
its Numerics, appended to <out>/<device>/records.jsonl; a rerun passes over the workloads recorded with this
code (Environment.code) and size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from omegaconf import OmegaConf
from tqdm import tqdm

from experiments import environment, workloads
from experiments.bench import Bench, Spec
from experiments.records import Numerics, error_line
from experiments.variants import MUTATIONS, Variant

MEASURE = Path(__file__).resolve().parents[1] / "conf" / "measure" / "default.yaml"


def check(name: str, mode: str, size: str, device: str) -> dict[str, Numerics]:
    """Numerics of eager and of each mutant that applies to `mode`, by variant name."""
    measure = OmegaConf.load(MEASURE)
    floors, multiplier = OmegaConf.to_container(measure.tolerance.floor), measure.tolerance.multiplier

    def bench(variant: Variant) -> Bench:
        return Bench(Spec(name, mode, None, size, variant, device, measure.seed, measure.warmup, floors, multiplier))

    variants = [Variant("eager")] + [Variant(m, mutation=m) for m in MUTATIONS]
    results = {}
    with tempfile.TemporaryDirectory(prefix="grace-mutation-") as folder:
        reference = str(Path(folder) / "reference.pt")
        bench(variants[0]).reference(reference)
        for variant in variants:
            if variant.unavailable_reason(device, mode) is None:
                b = bench(variant)
                results[variant.name] = b.setup(reference).numerics
                b.close()
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("results/mutation"))
    p.add_argument("--size", choices=("tiny", "full"), default="full")
    p.add_argument("--only", nargs="*", help="workloads to check (default: all)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.only or ()) - set(workloads.names()))
    if unknown:
        print(f"error: unknown workload {', '.join(unknown)} (known: {', '.join(workloads.names())})", file=sys.stderr)
        return 2
    env = environment.current()
    path = args.out / environment.device_tag(env) / "records.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = set() if not path.is_file() else {
        (r["workload"], r["mode"]) for r in map(json.loads, path.read_text().splitlines())
        if r["env"].get("code") == env.code and r["size"] == args.size}
    cases = [(n, m) for n in args.only or workloads.names() for m in workloads.get(n).batch_sizes
             if (n, m) not in done]
    for name, mode in tqdm(cases, desc="mutation", unit="workload"):
        case = {"workload": name, "mode": mode, "size": args.size, "env": dataclasses.asdict(env)}
        try:
            records = [{**case, "variant": variant, "caught": not n.passed if variant != "eager" else None,
                        "numerics": dataclasses.asdict(n)} for variant, n in check(name, mode, args.size, env.device).items()]
        except Exception as e:  # one workload that cannot be checked here (out of memory, say) stops no other
            records = [{**case, "variant": None, "error": error_line(e)}]
            print(f"{name} {mode}: {records[0]['error']}", file=sys.stderr)
        with path.open("a") as f:
            f.writelines(json.dumps(r, sort_keys=True, default=str) + "\n" for r in records)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
