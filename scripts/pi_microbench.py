"""PI microbenchmark: time per call of one replayed graph as its input grows, for the three ways to feed
it a new input: stock-style copy into the placeholder, PI (re-point the kernel at the input), and a bare
replay of the same graph on the same input (the floor).

    python scripts/pi_microbench.py [--out results/pi_microbench] [--calls 200] [--rounds 5]

The graph is an EOS-like elementwise chain over three float32 inputs (one Triton kernel under
Inductor), for 2^10 .. 2^24 elements. `copy` and `pi` are GraCE's replay path (a PartitionGraph around
the compiled chain, as scripts/replay_overhead.py builds it) with its inputs copied or re-pointed;
Dynamo's guards and wrappers, the same for both, are left out so that what differs is the input feed.
Each call passes fresh input tensors (three sets are cycled), so `copy` copies and `pi` re-points every
call. Two more ways split PI's cost: `static`, the same partition path with its inputs read in place and
never moved (the runtime's own bookkeeping), and `patch`, PI's kernel-node updates alone, without a
replay; what `pi` costs beyond `static` + `patch` is the launch of a just-updated graph. `pi_still` is
PI's path fed one input set every call (nothing to re-point after the first, as in a loop over fixed
inputs): against `static`, what a graph updated once costs on every later launch. A round times `calls`
back-to-back calls and one synchronization, so a call costs the host's time
or the GPU's, whichever is longer. Writes one JSON line per size, with the partition's PI state (inputs
re-pointed, bytes still copied); `python scripts/make_figures.py` plots paper_figures/pi_microbench.png.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for experiments and grace

from experiments import environment  # noqa: E402
from grace.calibrate import per_call_us  # noqa: E402
from replay_overhead import bare_replay, bench_args, partition_graph  # noqa: E402

SIZES = [2**k for k in range(10, 25, 2)]


def chain(a, b, c):
    return (a * b + c).sin() * a - b / (c.abs() + 1)


def measure(n: int, calls: int, rounds: int) -> dict:
    device = torch.device("cuda")
    sets = [tuple(torch.randn(n, device=device) for _ in range(3)) for _ in range(3)]
    compiled = torch.compile(chain)
    ways, parts = {"bare": bare_replay(compiled, sets[0])}, {}
    static = partition_graph(compiled, 3)  # the runtime's own cost: inputs read in place, never moved
    for _ in range(3):
        static(list(sets[0]))
    ways["static"] = lambda: static(list(sets[0]))
    for way, pi in {"copy": False, "pi": True}.items():
        part = parts[way] = partition_graph(compiled, 3, static=False, pi=pi)
        state = {"i": 0}

        def call(p=part, s=state):
            s["i"] += 1
            return p(list(sets[s["i"] % 3]))

        for _ in range(4):
            call()
        ways[way] = call
    still = parts["pi_still"] = partition_graph(compiled, 3, static=False, pi=True)
    for _ in range(4):
        still(list(sets[0]))
    ways["pi_still"] = lambda: still(list(sets[0]))
    (recording,) = parts["pi"].recordings[()]
    if recording.pi is not None:  # PI's driver updates alone, no replay
        targets = [{i: s[i].data_ptr() for i in recording.pi.inputs} for s in sets]
        state = {"i": 0}

        def patch(s=state):
            s["i"] += 1
            recording.pi.indirection.point(targets[s["i"] % 3])

        ways["patch"] = patch
    per_round = {way: [] for way in ways}
    for r in range(rounds):
        for way in list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]:
            per_round[way].append(per_call_us(ways[way], calls, device))
    expected = chain(*sets[1])
    for way, part in parts.items():
        torch.testing.assert_close(part(list(sets[1]))[0], expected)
    return {"elements": n, "bytes_per_input": 4 * n, "calls": calls, "rounds": rounds,
            "median_us_per_call": {w: statistics.median(v) for w, v in per_round.items()},
            "us_per_call_by_round": per_round,
            "partition": {way: {"status": p.stats.status, "pi_inputs": p.stats.pi_inputs,
                                "copy_bytes_per_replay": p.stats.copy_bytes_per_replay,
                                "pi_reasons": p.stats.pi_reasons} for way, p in parts.items()},
            "env": dataclasses.asdict(environment.current())}


def main() -> None:
    args = bench_args(__doc__, "pi_microbench", calls=200, rounds=5)
    out = Path(args.out) / environment.device_tag(environment.current())
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sizes.jsonl"
    with torch.no_grad():
        for n in SIZES:
            record = measure(n, args.calls, args.rounds)
            with path.open("a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
            print(n, {w: round(v, 1) for w, v in record["median_us_per_call"].items()})
    print(f"records: {path}")


if __name__ == "__main__":
    main()
