"""Where a captured graph's kernels hold the address of each input: a tool for PI's coverage
(grace/pi.py), run on the GPU machine. For each kernel node: its name, how it was launched (one pointer
per parameter, or one packed `extra` buffer), its parameter sizes, the sites PI finds (8-byte words
pointing into an input), and any other place an input's address shows up in the parameter bytes,
shifted right by 0 to 8 bits at any byte offset (an encoded address, as in a TMA descriptor).

    python scripts/pi_nodes.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grace import cuda_driver, pi  # noqa: E402

CASES = {  # name: (function, input shapes): GEMMs whose operands are graph inputs, as in DR-I and backward
    "mm bf16 (DR-I's first layer)": (lambda x, w: x @ w, [(8192, 4096), (4096, 512)]),
    "mm bf16 small": (lambda x, w: x @ w, [(64, 128), (128, 32)]),
    "grad weight (g.T @ x)": (lambda g, x: g.t() @ x, [(8192, 1024), (8192, 4096)]),
    "relu(mm) fp32": (lambda x, w: torch.relu(x @ w), [(4096, 4096), (4096, 1024)]),
}


def _encoded(data: bytes, base: int, size: int) -> list[tuple[int, int]]:
    """(byte offset, shift) where the low bits of 8 bytes of `data` hold (an address inside
    [base, base + size)) >> shift; the bits above it may belong to other fields."""
    found = []
    for shift in range(9):
        lo, hi = base >> shift, (base + size - 1) >> shift
        mask = (1 << hi.bit_length()) - 1
        for offset in range(len(data) - 7):
            if lo <= int.from_bytes(data[offset:offset + 8], "little") & mask <= hi:
                found.append((offset, shift))
    return found


def report(name: str, fn, shapes: list[tuple[int, ...]]) -> None:
    dtype = torch.float32 if "fp32" in name else torch.bfloat16
    inputs = [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]
    fn(*inputs)  # warm-up: library handles, workspaces
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        fn(*inputs)
    ranges = {i: (t.data_ptr(), t.untyped_storage().nbytes()) for i, t in enumerate(inputs)}
    print(f"== {name}: inputs at {', '.join(hex(b) for b, _ in ranges.values())}")
    for node, kind in cuda_driver.nodes(graph.raw_cuda_graph()):
        if kind != "kernel":
            print(f"  {kind} node")
            continue
        params, values = cuda_driver.kernel_params(node)
        launch = "kernelParams" if int(params.kernelParams or 0) else "extra" if int(params.extra or 0) else "none"
        sites = pi.find_sites(values, ranges)
        encoded = {(p, i): _encoded(v, *ranges[i]) for p, v in enumerate(values) for i in ranges}
        print(f"  {cuda_driver.kernel_name(params)[:90]}\n    launch={launch} params={[len(v) for v in values]}"
              f"\n    PI sites={sites}\n    addresses anywhere (param, input): [(byte offset, shift)]="
              f"{ {k: v for k, v in encoded.items() if v} }")


def main() -> None:
    for name, (fn, shapes) in CASES.items():
        report(name, fn, shapes)


if __name__ == "__main__":
    main()
