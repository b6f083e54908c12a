"""The CUDA driver calls GraCE makes through cuda-bindings (on the GPU machine; absent on CPU CI)."""

from __future__ import annotations

import ctypes
from collections import Counter

try:
    from cuda.bindings import driver
except ImportError:  # CPU-only installs
    driver = None

# Keys of cuLaunchKernel's `extra` array (cuda.h): a kernel launched with one packed parameter buffer
_END, _BUFFER_POINTER, _BUFFER_SIZE = 0, 1, 2
_WORD = ctypes.sizeof(ctypes.c_void_p)

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


def extra_buffer(extra: int) -> bytes:
    """The packed parameter buffer that an `extra` array names (CU_LAUNCH_PARAM_BUFFER_POINTER and
    _SIZE, up to CU_LAUNCH_PARAM_END); empty if it names none."""
    buffer = size = None
    for i in range(0, 8 * _WORD, 2 * _WORD):  # a few key/value pairs at most
        key = ctypes.c_void_p.from_address(extra + i).value or _END
        if key == _END:
            break
        value = ctypes.c_void_p.from_address(extra + i + _WORD).value
        if key == _BUFFER_POINTER:
            buffer = value
        elif key == _BUFFER_SIZE:
            size = ctypes.c_size_t.from_address(value).value
    return ctypes.string_at(buffer, size) if buffer and size else b""


def kernel_name(params) -> str:
    """The kernel's name (mangled), from its function or, for library kernels, its kernel handle."""
    if int(params.func):
        return _check(driver.cuFuncGetName(params.func)).decode()
    return _check(driver.cuKernelGetName(params.kern)).decode()


def kernel_params(node) -> tuple[object, list[bytes]]:
    """A kernel node's parameter struct and the bytes of each of its parameters. A node launched with
    `extra` (one packed buffer, as some library kernels are) has that buffer as its one parameter."""
    params = _check(driver.cuGraphKernelNodeGetParams(node))
    array = int(params.kernelParams or 0)
    if not array:
        extra = int(params.extra or 0)
        return params, [extra_buffer(extra)] if extra else []
    values = []
    for i, size in enumerate(_param_sizes(params)):
        address = ctypes.c_void_p.from_address(array + i * ctypes.sizeof(ctypes.c_void_p)).value
        values.append(ctypes.string_at(address, size))
    return params, values


def point_params(params, buffers: list) -> list:
    """Make `params` hand the kernel these ctypes buffers, the way it was launched (one pointer per
    parameter, or one packed buffer through `extra`); returns what must live as long as `params`."""
    if int(params.kernelParams or 0) or not int(params.extra or 0):
        array = (ctypes.c_void_p * len(buffers))(*[ctypes.addressof(b) for b in buffers])
        params.kernelParams = ctypes.addressof(array)
        return [array]
    (buffer,) = buffers
    size = ctypes.c_size_t(ctypes.sizeof(buffer))
    extra = (ctypes.c_void_p * 5)(_BUFFER_POINTER, ctypes.addressof(buffer), _BUFFER_SIZE,
                                  ctypes.addressof(size), _END)
    params.extra = ctypes.addressof(extra)
    return [size, extra]


def tensor_map_bits(address: int, moved_to: int) -> int:
    """The 1024 bits (little-endian) of a tiled tensor map (TMA descriptor) of a 256 x 256 byte matrix
    encoded at `address`, then moved to `moved_to` by cuTensorMapReplaceAddress."""
    d = driver
    u64, u32 = (lambda *v: [d.cuuint64_t(x) for x in v]), (lambda *v: [d.cuuint32_t(x) for x in v])
    tensor_map = _check(d.cuTensorMapEncodeTiled(  # the sizes as the driver's types: plain ints are refused
        d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, address, u64(256, 256), u64(256), u32(16, 16),
        u32(1, 1),
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    _check(d.cuTensorMapReplaceAddress(tensor_map, moved_to))
    return sum(int(w) << (64 * i) for i, w in enumerate(tensor_map.opaque))


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


def upload(graph_exec, stream: int) -> None:
    """Upload an instantiated graph as it is now, ahead of its next launch on `stream` (a raw cudaStream_t)."""
    _check(driver.cuGraphUpload(graph_exec, driver.CUstream(stream)))
