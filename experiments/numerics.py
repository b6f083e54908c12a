"""Is a variant's output right? Judged against a float64 reference, with eager's own error as the yardstick.

A compiled bfloat16 model legitimately differs from eager bfloat16 (Inductor keeps fused intermediates in
float32), by more in deep models than in shallow ones, so a fixed tolerance on |variant - eager| is either
too loose for one or too tight for the other. As PyTorch's own accuracy checks do, both are compared with
the same computation in float64: the variant passes when

    rel_err(variant, fp64) <= multiplier * rel_err(eager, fp64) + floor[compute dtype]

where rel_err = ||a - b|| / ||b|| over all floating outputs together. Non-floating outputs (labels,
indices) get the same yardstick with the share of elements that differ from the float64 reference: equal
to it wherever eager is, and where eager's own labels already differ (detection models whose top-k or NMS
flips on near-ties, VM), within multiplier x eager's share. NaN, or a different structure or shape, never
passes.

In bfloat16, eager's own error is about 1 %, so that check cannot tell a variant 1 % off from a right
one. The harness therefore also runs each variant in float64 (Bench.setup): eager float64 is then the
reference itself (its rel_err 0), and the tolerance is floor[float64], far above the float64 rounding
error a compiled program adds and far below any real error. Its parts are named "... in float64".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from experiments.records import Numerics
from experiments.instrument import pytree


def _split(tree: Any) -> tuple[Any, list[torch.Tensor], list[Any]]:
    leaves, spec = pytree.tree_flatten(tree)
    floating = [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]
    exact = [t for t in leaves if not (isinstance(t, torch.Tensor) and t.is_floating_point())]
    return spec, floating, exact


CHUNK = 1 << 24  # elements compared at a time: XLNet's logits at batch 128 are 2.1e9 elements (17 GB in float64)


def _device() -> torch.device:
    """Where the comparison runs: the GPU where there is one (float64 comparisons of a model's gradients
    take many seconds on a few host cores), else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _rel_err(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[float, float]:
    """(||a - b|| / ||b||, max |a - b|) in float64, a chunk at a time (on _device()); a and b pairwise of
    one shape, wherever they lie (the observations are kept on the host)."""
    diff_sq = ref_sq = max_abs = 0.0
    device = _device()
    for x, y in zip(a, b):
        x, y = x.detach().reshape(-1), y.detach().reshape(-1)
        for start in range(0, x.numel(), CHUNK):
            xs, ys = (t[start:start + CHUNK].to(device).to(torch.float64) for t in (x, y))
            d = xs - ys
            diff_sq += float(d.pow(2).sum())
            ref_sq += float(ys.pow(2).sum())
            m = float(d.abs().max())
            max_abs = m if math.isnan(m) else max(max_abs, m)  # max() would drop a NaN
    rel = math.sqrt(diff_sq) / math.sqrt(ref_sq) if ref_sq > 0 else math.sqrt(diff_sq)
    return rel, max_abs


def _differ(a: list[Any], b: list[Any]) -> float:
    """Share of elements of the non-floating leaves `a` that differ from `b` (a leaf of another shape or
    type differs entirely)."""
    differ = total = 0
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            n = max(x.numel(), 1)
            differ += int((x.cpu() != y.cpu()).sum()) if x.shape == y.shape else n
        else:
            n = 1
            differ += not (type(x) is type(y) and x == y)
        total += n
    return differ / total if total else 0.0


def judge(results: Mapping[str, Numerics]) -> Numerics:
    """Parts of observations, each compared on its own, as one: the part that came closest to failing
    (largest rel_err / tolerance), passing only if every part passes."""
    part, worst = max(results.items(), key=lambda kv: (not kv[1].passed, kv[1].rel_err / kv[1].tolerance
                                                       if kv[1].tolerance > 0 else math.inf))
    failed = [p for p, n in results.items() if not n.passed]
    detail = "; ".join(filter(None, [worst.detail, f"failed: {', '.join(failed)}" if failed else ""]))
    return dataclasses.replace(worst, part=part, detail=detail)


def check(out: Mapping[str, Any], eager: Mapping[str, Any], ref: Mapping[str, Any], dtype: torch.dtype,
          floors: Mapping[str, float], multiplier: float) -> Numerics:
    """Each part of an observation (Task.observe) compared on its own, and judged together."""
    return judge({part: compare(out[part], eager[part], ref[part], dtype, floors, multiplier) for part in out})


def compare(out: Any, eager: Any, ref: Any, dtype: torch.dtype, floors: Mapping[str, float],
            multiplier: float) -> Numerics:
    """`out` from the variant, `eager` from eager in the compute dtype, `ref` from eager in float64."""
    dtype_name = str(dtype).removeprefix("torch.")
    floor = float(floors[dtype_name])
    out_spec, out_float, out_exact = _split(out)
    eager_spec, eager_float, eager_exact = _split(eager)
    ref_spec, ref_float, ref_exact = _split(ref)
    same_shape = (out_spec == eager_spec == ref_spec
                  and all(o.shape == e.shape == r.shape for o, e, r in zip(out_float, eager_float, ref_float)))
    if not same_shape:
        return Numerics(False, math.inf, math.inf, math.nan, math.nan, dtype_name, "outputs differ in structure or shape")
    rel, max_abs = _rel_err(out_float, ref_float)
    eager_rel, _ = _rel_err(eager_float, ref_float)
    tolerance = multiplier * eager_rel + floor
    out_differ, eager_differ = _differ(out_exact, ref_exact), _differ(eager_exact, ref_exact)
    exact = out_differ <= multiplier * eager_differ
    passed = exact and math.isfinite(rel) and rel <= tolerance
    detail = "" if exact else (f"non-floating outputs: {out_differ:.1%} differ from float64's, eager's "
                               f"{eager_differ:.1%}")
    return Numerics(passed, max_abs, rel, eager_rel, tolerance, dtype_name, detail)
