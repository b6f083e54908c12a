"""The CUDA driver calls GraCE makes through cuda-bindings (on the GPU machine; absent on CPU CI)."""

from __future__ import annotations

from collections import Counter

try:
    from cuda.bindings import driver
except ImportError:  # CPU-only installs
    driver = None

_KINDS = {"CU_GRAPH_NODE_TYPE_KERNEL": "kernel", "CU_GRAPH_NODE_TYPE_MEMCPY": "memcpy",
          "CU_GRAPH_NODE_TYPE_MEMSET": "memset"}


def _check(result):
    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver error {err}")
    return values[0] if len(values) == 1 else values


def node_counts(raw_graph: int) -> dict[str, int] | None:
    """Nodes of a captured cudaGraph_t by kind (kernel, memcpy, memset, other); None without
    cuda-bindings."""
    if driver is None:
        return None
    graph = driver.CUgraph(raw_graph)
    _, n = _check(driver.cuGraphGetNodes(graph, 0))
    nodes, _ = _check(driver.cuGraphGetNodes(graph, n))
    kinds = Counter(_KINDS.get(_check(driver.cuGraphNodeGetType(node)).name, "other") for node in nodes)
    return {k: kinds.get(k, 0) for k in ("kernel", "memcpy", "memset", "other")}
