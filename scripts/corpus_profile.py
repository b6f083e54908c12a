"""Where grace is slower than stock on a corpus program: per variant (inductor, pt2_cg, grace), the
latency of a synchronized call in blocks of 10, grace.explain, and a profile of 5 calls (cProfile for
grace; torch.profiler's host ops by self time, and the GPU time per call, for each).

    python scripts/corpus_profile.py torch_cond cpu_tensor_input torchvision/raft_small
    python scripts/corpus_profile.py torch_cond --variants grace grace-no-pi grace-no-scg

`grace-no-<option>`: grace with that option (cgct, pi, scg) off, to tell which one costs the time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments and grace

import grace  # noqa: E402
from experiments.corpus import PROGRAMS, VARIANTS, _compiler  # noqa: E402


def median_us(step, args, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step(*args)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return round(statistics.median(times), 1)


def variant(name: str) -> dict | None:
    """torch.compile's arguments for a corpus variant, or for grace with one option off."""
    if name in VARIANTS:
        return VARIANTS[name]
    option = name.removeprefix("grace-no-")
    if option == name or option not in ("cgct", "pi", "scg"):
        raise SystemExit(f"corpus_profile: unknown variant {name!r} (a corpus variant or grace-no-<cgct|pi|scg>)")
    return {"backend": "grace", "options": {option: False}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("programs", nargs="+")
    p.add_argument("--variants", nargs="+", default=["inductor", "pt2_cg", "grace"])
    opts = p.parse_args(argv)  # not `args`: each program's inputs are called that below
    compile_args = {v: variant(v) for v in opts.variants}
    device = torch.device("cuda")
    for name in opts.programs:
        for v in opts.variants:
            torch.compiler.reset()
            grace.reset()
            start = len(grace.REPORTS)
            torch.manual_seed(0)
            with torch._dynamo.config.patch(recompile_limit=64):
                t0 = time.time()
                p = PROGRAMS[name](device, _compiler(compile_args[v]))
                for i in range(4):  # as the corpus calls it before timing
                    p.step(*p.inputs(i))
                args = p.inputs(3)
                torch.cuda.synchronize()
                print(f"== {name} {v}: set up {time.time() - t0:.0f} s; median us per block of 10 calls:",
                      [median_us(p.step, args, 10) for _ in range(8)], flush=True)
                if v.startswith("grace"):
                    print(grace.explain_call(lambda: p.step(*args), start), flush=True)
                    pr = cProfile.Profile()
                    pr.enable()
                    for _ in range(5):
                        p.step(*args)
                        torch.cuda.synchronize()
                    pr.disable()
                    pstats.Stats(pr).sort_stats("tottime").print_stats(14)
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        p.step(*args)
                        torch.cuda.synchronize()
                events = prof.key_averages()
                print(events.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=50), flush=True)
                print("GPU us per call:", round(sum(e.self_device_time_total for e in events) / 5, 1), flush=True)


if __name__ == "__main__":
    main()
