"""Where one grace call's host time goes (issue: to the floor), on the pointwise model and ViT-Tiny at
batch 1: per synchronized call and per call back to back, the compiled call whole, the lean call
(grace.lean) without Dynamo's frame, the partition alone, AOTAutograd's and Inductor's wrappers in its
place, an empty synchronize; the whole call with the lean path off; and a cProfile of 3000 calls.

    python scripts/host_split.py > results/replay_overhead/<device>/host_split.log
"""
import cProfile
import gc
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for grace

import grace  # noqa: E402
from grace import lean  # noqa: E402
from grace.calibrate import per_call_us  # noqa: E402
from replay_overhead import pointwise  # noqa: E402


def sync_us(fn, n=400) -> float:
    """Median microseconds of a synchronized call."""
    return statistics.median(per_call_us(fn, 1, torch.device("cuda")) for _ in range(n))


def host_us(fn, n=2000) -> float:
    """Microseconds per call back to back, the host's alone (the clock stops before the synchronize)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    return t


def dynamo_arguments(f, x) -> tuple:
    """What Dynamo's frame passes the lean call, caught on one call."""
    seen, call = [], lean.LeanCall.__call__

    def spy(self, *args):
        seen.append(args)
        return call(self, *args)
    lean.LeanCall.__call__ = spy
    try:
        f(x)
    finally:
        lean.LeanCall.__call__ = call
    return seen[-1]


def study(name, model, x):
    with torch.inference_mode():
        torch.compiler.reset()
        f = torch.compile(model, backend="grace")
        for _ in range(8):
            f(x)
        g = grace.REPORTS[-1]
        print(name, "call path:", g.call_path,
              [(str(s.status), s.replays, s.reason, s.pi_inputs, s.copied_inputs) for s in g.partitions])
        lc = [o for o in gc.get_objects() if type(o) is lean.LeanCall][-1]  # type(): gc holds weak proxies too
        ways = {"compiled": lambda: f(x), "sync": lambda: None}
        if lc.route is not None:
            args = dynamo_arguments(f, x)
            part_args = [args[i] for i in lc.route.inputs]
            ways["lean_call"] = lambda: lc(*args)
            ways["partition"] = lambda: lc.candidate.part(list(part_args))
            ways["wrappers"] = lambda: lc.compiled(*args)
        for rnd in range(3):
            print(name, rnd, {w: round(sync_us(fn), 1) for w, fn in ways.items()}, "host back to back:",
                  {w: round(host_us(fn), 1) for w, fn in ways.items()})
        if lc.route is not None:
            route, lc.route, lc.watch = lc.route, None, 0
            print(name, "lean off: compiled", round(sync_us(ways["compiled"]), 1), "host",
                  round(host_us(ways["compiled"]), 1))
            lc.route = route
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(3000):
            f(x)
        profile.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(22)
        print(out.getvalue()[-5000:])


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("error: host_split needs a CUDA GPU")
    import timm

    study("pointwise", pointwise, torch.randn(4096, device="cuda"))
    study("vit_tiny", timm.create_model("vit_tiny_patch16_224", pretrained=False).cuda().eval(),
          torch.randn(1, 3, 224, 224, device="cuda"))


if __name__ == "__main__":
    main()
