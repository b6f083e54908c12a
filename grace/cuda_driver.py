"""The CUDA driver calls GraCE makes through cuda-bindings (on the GPU machine; absent on CPU CI)."""

from __future__ import annotations

import ctypes
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


def nodes(raw_graph: int) -> list[tuple[object, str]]:
    """The nodes of a captured cudaGraph_t with their kinds (kernel, memcpy, memset, other)."""
    graph = driver.CUgraph(raw_graph)
    _, n = _check(driver.cuGraphGetNodes(graph, 0))
    handles, _ = _check(driver.cuGraphGetNodes(graph, n))
    return [(h, _KINDS.get(_check(driver.cuGraphNodeGetType(h)).name, "other")) for h in handles]


def node_counts(raw_graph: int) -> dict[str, int] | None:
    """Nodes of a captured cudaGraph_t by kind; None without cuda-bindings."""
    if driver is None:
        return None
    kinds = Counter(kind for _, kind in nodes(raw_graph))
    return {k: kinds.get(k, 0) for k in ("kernel", "memcpy", "memset", "other")}


def _param_sizes(params) -> list[int]:
    """Sizes of a kernel's parameters, from the function (or, for library kernels, the kernel) handle."""
    info = (lambda i: driver.cuFuncGetParamInfo(params.func, i)) if int(params.func) else (
        lambda i: driver.cuKernelGetParamInfo(params.kern, i))
    sizes = []
    while True:
        err, _, size = info(len(sizes))
        if err != driver.CUresult.CUDA_SUCCESS:
            return sizes
        sizes.append(size)


def kernel_params(node) -> tuple[object, list[bytes]]:
    """A kernel node's parameter struct and the bytes of each of its parameters. A node launched with
    `extra` (one packed buffer) rather than kernelParams is reported with no parameters."""
    params = _check(driver.cuGraphKernelNodeGetParams(node))
    array = int(params.kernelParams or 0)
    if not array:
        return params, []
    values = []
    for i, size in enumerate(_param_sizes(params)):
        address = ctypes.c_void_p.from_address(array + i * ctypes.sizeof(ctypes.c_void_p)).value
        values.append(ctypes.string_at(address, size))
    return params, values


def copy_addresses(node, kind: str) -> list[int]:
    """Device addresses a memcpy (source and destination) or memset (destination) node touches."""
    if kind == "memcpy":
        p = _check(driver.cuGraphMemcpyNodeGetParams(node))
        return [int(p.srcDevice), int(p.dstDevice)]
    p = _check(driver.cuGraphMemsetNodeGetParams(node))
    return [int(p.dst)]


def exec_handle(raw_exec: int):
    """The driver's handle of an instantiated graph (torch.cuda.CUDAGraph.raw_cuda_graph_exec())."""
    return driver.CUgraphExec(raw_exec)


def set_kernel_params(graph_exec, node, params) -> None:
    _check(driver.cuGraphExecKernelNodeSetParams(graph_exec, node, params))
