"""Every torch-private name this project uses, in one place: a torch upgrade touches only this file.

Written against torch 2.11 (the GPU machine) and checked on the CI's torch 2.14.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
import torch._inductor.cudagraph_utils as _cudagraph_utils
from torch._dynamo.utils import counters as _counters
from torch.utils import _pytree as pytree  # noqa: F401  (tree_map, tree_flatten, tree_leaves)


def cudagraph_skips() -> int:
    """How many times Inductor has decided not to use CUDA graphs for a graph, in this process."""
    return _counters["inductor"]["cudagraph_skips"]


def dynamo_stats() -> dict[str, int]:
    """Graph breaks and distinct graphs compiled by Dynamo in this process."""
    return {"graph_breaks": sum(_counters["graph_break"].values()),
            "unique_graphs": _counters["stats"]["unique_graphs"]}


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


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
