"""Every torch-private name the harness uses to observe a run (GraCE's own are in grace/torch_adapter.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator

import torch
import torch._inductor.cudagraph_utils as _cudagraph_utils
from torch._dynamo.utils import counters as _counters
from torch._inductor.codecache import CacheBase as _InductorCacheBase
from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir  # noqa: F401  (where generated code lies)
from torch.utils import _pytree as pytree  # noqa: F401  (tree_map, tree_flatten, tree_leaves)


def cudagraph_skips() -> int:
    """How many times Inductor has decided not to use CUDA graphs for a graph, in this process."""
    return _counters["inductor"]["cudagraph_skips"]


def forget_counters() -> None:
    """Zero what cudagraph_skips and dynamo_stats count (Dynamo's reset keeps it): what a process compiled
    before is not counted against what it compiles next."""
    _counters.clear()


def dynamo_stats() -> dict[str, object]:
    """Graph breaks and distinct graphs compiled by Dynamo in this process, and why Dynamo broke a graph
    or gave up on a frame (the first line of each of its "unimplemented" messages; a frame it skipped,
    after a graph break inside a loop say, runs eager and adds no graph break to the count)."""
    skipped: dict[str, bool] = {}  # first line -> whether a frame was skipped over it
    for message in _counters["unimplemented"]:
        reason = message.splitlines()[0]
        skipped[reason] = skipped.get(reason, False) or "frame skipped" in message or "Skipping the frame" in message
    return {"graph_breaks": sum(_counters["graph_break"].values()),
            "unique_graphs": _counters["stats"]["unique_graphs"],
            "graph_break_reasons": [r + (" -> frame skipped, runs eager" if s else "") for r, s in skipped.items()]}


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def check_dynamo_config(settings: dict) -> None:
    """Raise ValueError naming a setting that torch._dynamo.config does not have."""
    import torch._dynamo.config as dynamo_config

    unknown = [name for name in settings if not hasattr(dynamo_config, name)]
    if unknown:
        raise ValueError(f"torch._dynamo.config has no setting {', '.join(map(repr, unknown))}")


def set_dynamo_config(settings: dict) -> None:
    """Set torch._dynamo.config fields for the rest of the process (a harness variant's own process)."""
    import torch._dynamo.config as dynamo_config

    check_dynamo_config(settings)
    for name, value in settings.items():
        setattr(dynamo_config, name, value)


def collect_cudagraph_skip_reasons() -> list[str]:
    """From now on, for the life of the process, the reasons Inductor logs for not using CUDA graphs
    ("skipping cudagraphs due to ..." at WARNING on the `cudagraphs` log artifact) are appended to the
    list returned. The artifact stays off (torch._logging.set_logs would print all of its verbose
    partition logging): the handler sits on the one logger that reports skips."""
    handler = _Collect()
    _cudagraph_utils.cudagraphs_log.addHandler(handler)
    return handler.messages


@contextlib.contextmanager
def count_graph_input_copies() -> Iterator[list[int]]:
    """Within the block, the bytes that CUDA graph trees copy into graph input placeholders are added
    to the yielded one-item list. Graph trees (torch/_inductor/cudagraph_trees.py) copy every non-static
    input with one torch._foreach_copy_ per replay; GraCE's runtime copies through the same function."""
    original = torch._foreach_copy_
    total = [0]

    def counting(dsts, srcs, *args, **kwargs):
        total[0] += sum(d.numel() * d.element_size() for d in dsts)
        return original(dsts, srcs, *args, **kwargs)

    torch._foreach_copy_ = counting
    try:
        yield total
    finally:
        torch._foreach_copy_ = original


def shape_padding_choices() -> dict[str, dict]:
    """What Inductor's shape padding (fx_passes/pad_mm.py) chose for each GEMM with a misaligned dim, by its
    key (operand shapes, strides, dtypes): whether the operands are padded (a pad_mm benchmark found
    padding at least 1.1x faster) and the unpadded GEMM's benchmarked time in ms. Read from Inductor's
    local benchmark cache, so it covers every compile in this process since its cache dir was made."""
    path = _InductorCacheBase.get_local_cache_path()
    cache = json.loads(path.read_text()).get("cache", {}) if path.is_file() else {}
    base = "base mm time: "
    unpadded_ms = {k.removeprefix(base): v for k, v in cache.items() if k.startswith(base)}
    # a decision's key is its base-time key with where padding is paid ('exclude_pad:...') in place of None
    return {k: {"pad": v, "unpadded_ms": unpadded_ms.get(re.sub(r"'exclude_pad:\w+'", "None", k))}
            for k, v in cache.items() if isinstance(v, bool)}


def all_reduce_sum(t: torch.Tensor, group) -> torch.Tensor:
    """A sum over the group's ranks that Dynamo traces into the graph (a functional collective) and that
    a CUDA graph captures under NCCL."""
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(t, "sum", group)
