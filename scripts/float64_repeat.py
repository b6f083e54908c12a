"""Stock Inductor on a workload's float64 copy, compiled again and again in fresh processes: is its float64
error a property of the program, of one compile, or of one run? Each run is a process of its own with
Inductor's and Triton's caches in a folder: `cold` a new, empty one, `warm` the first run's (which is cold:
what a later variant set up with shared caches gets), either optionally with environment settings
(`cold:NAME=VALUE`) or in PyTorch's deterministic mode (`cold:deterministic`: deterministic algorithms,
empty tensors filled with NaN, and Inductor choosing its kernels' configs without timing them). A run
compares steps 1 and 2 and two steps rewound to the initial state with eager float64 of the same process
(rel_err as the harness computes it, experiments/numerics.py), and prints one JSON line with: whether the rewound steps repeat step 1 bit for bit (a compiled program that does not is
nondeterministic at run time: a race, or a read of memory it never wrote), where a failing part is off
(which indices of its first two dimensions), and the configs Inductor's autotuner chose for the kernels it
timed (a config chosen by timing differs from process to process).

    python scripts/float64_repeat.py MTCG-I --plan cold,cold,cold,cold:deterministic,cold:deterministic
    python scripts/float64_repeat.py DR-T --size tiny --device cpu --plan cold,warm
"""

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from experiments import workloads  # noqa: E402
from experiments.numerics import compare  # noqa: E402
from experiments.task import Task  # noqa: E402

# the harness's float64 floor: a part fails above it
MEASURE = Path(__file__).resolve().parent.parent / "conf/measure/default.yaml"
FLOORS = OmegaConf.to_container(OmegaConf.load(MEASURE).tolerance.floor)


def resolve(acronym: str) -> tuple[str, str]:
    """(workload name, mode) of the paper's acronym, or of 'name:mode'."""
    if ":" in acronym:
        name, mode = acronym.split(":", 1)
        return name, mode
    for name in workloads.names():
        for mode, paper in workloads.get(name).acronyms.items():
            if paper == acronym:
                return name, mode
    raise SystemExit(f"error: unknown workload {acronym!r} (a paper acronym, or name:mode)")


class _Chosen(logging.Handler):
    """The autotuner's choices, from its debug line "Best config for <kernel>: <config>: <ms>, ..."."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.configs: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith("Best config for") and isinstance(record.args, tuple):
            self.configs[str(record.args[0])] = str(record.args[1])


def located(out, ref, floor: float) -> list[dict]:
    """Each floating leaf's rel_err against `ref`; for one above `floor`, the indices of its first two
    dimensions whose slice is off by more than `floor` (how many, of how many, the first 8)."""
    leaves = [[t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor) and t.is_floating_point()]
              for x in (out, ref)]
    found = []
    for i, (o, r) in enumerate(zip(*leaves)):
        r64 = r.to(torch.float64)
        d, norm = (o.to(torch.float64) - r64).pow(2), r64.pow(2)
        leaf = {"leaf": i, "shape": list(o.shape), "rel_err": float((d.sum() / norm.sum()).sqrt())}
        if leaf["rel_err"] > floor:
            for dim, name in list(enumerate(("rows", "columns")))[:o.dim()]:
                others = [k for k in range(o.dim()) if k != dim]
                per = (d.sum(others) / norm.sum(others)).sqrt() if others else (d / norm).sqrt()
                bad = (per > floor).nonzero().flatten().tolist()
                leaf[f"off_{name}"] = {"count": len(bad), "of": o.shape[dim], "first": bad[:8]}
        found.append(leaf)
    return found


def _same(a, b) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
               for x, y in zip(pytree.tree_leaves(a), pytree.tree_leaves(b)))


def child(name: str, mode: str, size: str, device: str, seed: int, deterministic: bool = False) -> dict:
    """One run: eager float64 and stock Inductor's float64 copy, steps compared part by part."""
    if deterministic:
        # both: torch 2.14 sets Inductor's from the first (Dynamo restores it after each frame), older ones do not
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch._inductor.config.deterministic = True
    task = Task(workloads.get(name)(mode, None, size, device), seed)
    ref, got = task.twin(torch.float64), task.twin(torch.float64)
    del task
    ref.keep_initial()
    got.keep_initial()
    want = [ref.observe(ref.target), ref.observe(ref.target)]
    del ref
    chosen = _Chosen()
    autotuner = logging.getLogger("torch._inductor.runtime.triton_heuristics")
    autotuner.addHandler(chosen)
    level = autotuner.level
    autotuner.setLevel(logging.DEBUG)
    t0 = time.perf_counter()
    # as the harness's float64 check compiles (experiments/bench.py: Inductor's mix-order reduction
    # does not compile in float64)
    with torch._inductor.config.patch({"triton.mix_order_reduction": False}):
        fn = torch.compile(got.target)
        steps = {"step 1": (got.observe(fn), 0)}
        compile_s = time.perf_counter() - t0  # the first call, as the harness's compile_s
        steps["step 2"] = (got.observe(fn), 1)
        for when in ("a rewound step", "rewound again"):
            got.rewind()
            steps[when] = (got.observe(fn), 0)
    autotuner.removeHandler(chosen)
    autotuner.setLevel(level)
    floor = float(FLOORS["float64"])
    parts, where = {}, {}
    for when, (observed, i) in steps.items():
        for part, value in observed.items():
            n = compare(value, want[i][part], want[i][part], torch.float64, FLOORS, 1.0)
            parts[f"{part} at {when}"] = {"rel_err": n.rel_err, "max_abs_err": n.max_abs_err, "passed": n.passed}
            if not n.passed:
                where[f"{part} at {when}"] = located(value, want[i][part], floor)
    first = steps["step 1"][0]
    return {"compile_s": round(compile_s, 1), "passed": all(p["passed"] for p in parts.values()), "parts": parts,
            "repeats_step_1": {when: _same(steps[when][0], first) for when in ("a rewound step", "rewound again")},
            "off": where, "autotuned": chosen.configs,
            "deterministic": {"algorithms": torch.are_deterministic_algorithms_enabled(),
                              "inductor": getattr(torch._inductor.config, "deterministic", None)}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", help="the paper's acronym (MTCG-I), or name:mode")
    p.add_argument("--plan", default="cold,warm,cold", help="runs, comma-separated: cold | warm, each "
                   "optionally followed by :NAME=VALUE (its environment) and :deterministic")
    p.add_argument("--size", default="full", choices=["full", "tiny"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--deterministic", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    name, mode = resolve(args.workload)
    if args.child:
        print(json.dumps(child(name, mode, args.size, args.device, args.seed, args.deterministic)))
        return 0
    runs = [r.split(":") for r in args.plan.split(",")]
    if (any(r[0] not in ("cold", "warm") or any("=" not in kv and kv != "deterministic" for kv in r[1:]) for r in runs)
            or runs[0][0] != "cold"):
        raise SystemExit(f"error: --plan {args.plan!r}: each run is cold or warm, then :NAME=VALUE settings or "
                         ":deterministic; the first is cold")
    root = Path(tempfile.mkdtemp(prefix="float64_repeat_"))
    for i, (cache, *settings) in enumerate(runs):
        folder = root / ("run0" if cache == "warm" else f"run{i}")
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
               "TRITON_CACHE_DIR": str(folder / "triton"), **dict(kv.split("=", 1) for kv in settings if "=" in kv)}
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, args.workload, "--child", "--size", args.size,
                               "--device", args.device, "--seed", str(args.seed)]
                              + ["--deterministic"] * ("deterministic" in settings),
                              env=env, capture_output=True, text=True)
        line = {"run": i, "cache": cache, "settings": settings, "workload": f"{name} {mode} {args.size}",
                "torch": torch.__version__, "wall_s": round(time.perf_counter() - t0, 1)}
        if proc.returncode == 0:
            line.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        else:
            line["error"] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
