"""grace.explain(fn, *inputs, **kwargs): what GraCE did with each graph and partition, and why.

It compiles `fn` (a module or a function; for training, a function that runs the step) with the grace
backend, calls it three times (warm-up, recording, replay; the last under torch.profiler on a GPU, for
the kernels launched inside and outside graphs) and reports, per partition of every graph
compiled on the way: captured or not and why, graph nodes by kind (kernels inside the graph), replays
and calls without the graph in the last call, inputs read in place and inputs copied, bytes copied per
replay (and the largest copies, with where each input comes from), SCG's decision; and per graph what CGCT changed and the compiled graphs that have no partition at
all (kernels that run outside any graph).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Callable

import torch

from grace import backend, profile, scg


@dataclasses.dataclass
class Explanation:
    graphs: list[backend.GraphReport]
    replays_last_call: dict[tuple[int, bool, int], int]  # (graph, backward, partition) -> replays
    eager_last_call: dict[tuple[int, bool, int], int]
    kernels: profile.KernelCounts | None = None  # of the last call, from the profiler (on a GPU)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per partition: what partitions() tabulates."""
        rows = []
        for g in self.graphs:
            for s in g.partitions:
                key = (s.graph, s.backward, s.partition)
                nodes = s.nodes or {}
                rows.append({"graph": s.graph, "pass": "backward" if s.backward else "forward",
                             "partition": s.partition, "status": str(s.status), "calls": s.calls,
                             "recordings_kept": s.kept,
                             "kernels_in_graph": nodes.get("kernel"), "replays": self.replays_last_call.get(key, 0),
                             "without_graph": self.eager_last_call.get(key, 0),
                             "inputs_in_place": s.in_place_inputs, "inputs_copied": s.copied_inputs - s.pi_inputs,
                             "inputs_pi": s.pi_inputs, "inputs_moving": s.moving_inputs,
                             "bytes_copied_per_replay": s.copy_bytes_per_replay,
                             "scg": s.scg["choice"] if s.scg else "",
                             "scg_agreed": s.scg["agreed"] if s.scg else None, "reason": s.reason or ""})
        return rows

    def partitions(self):
        """rows() as a pandas DataFrame (pandas is imported only here)."""
        import pandas as pd

        return pd.DataFrame(self.rows())

    def scg_decisions(self) -> dict[str, Any] | None:
        """SCG's decisions: how many chose each candidate, how many were measured, and of those how many
        the cost model predicted right; with each decision's numbers."""
        decisions = [s.scg for g in self.graphs for s in g.partitions if s.scg]
        if not decisions:
            return None
        measured = [d for d in decisions if d["measured_us"] is not None]
        return {**{c: sum(d["choice"] == c for d in decisions) for c in scg.CANDIDATES},
                "measured": len(measured), "model_agreed": sum(bool(d["agreed"]) for d in measured),
                "tied": sum(bool(d["tied"]) for d in measured),
                "decisions": decisions}

    def summary(self) -> dict[str, Any]:
        """Totals for one call (the last): what the harness keeps in its records."""
        rows = self.rows()

        def total(column: str, times: str | None = None) -> int:
            return int(sum((r[column] or 0) * (r[times] if times else 1) for r in rows))

        return {
            "options": [dict(o) for o in dict.fromkeys(tuple(dataclasses.asdict(g.options).items()) for g in self.graphs)],
            "graphs": len(self.graphs),
            "partitions": len(rows),
            "captured": sum(r["status"] == "captured" for r in rows),
            "replays_per_call": total("replays"),
            # recordings made so far, by why; and kept now (each holds its graph's memory)
            "recorded_for": dict(sum((Counter(s.recorded_for) for g in self.graphs for s in g.partitions), Counter())),
            "recordings_kept": total("recordings_kept"),
            "calls_without_graph": total("without_graph"),
            "bytes_copied_per_call": total("bytes_copied_per_replay", "replays"),
            "kernels_in_graphs": total("kernels_in_graph", "replays"),
            "kernels_launched": self.kernels.kernels if self.kernels else None,
            "kernels_outside_graphs": self.kernels.kernels - self.kernels.in_graphs if self.kernels else None,
            "not_captured": sorted({r["reason"] or f"warm-up: called {r['calls']}x, not yet twice at the same sizes"
                                    for r in rows if r["status"] != "captured"}),
            "without_graph": sorted({r["reason"] or "a first call at new sizes, or SCG's choice at these sizes"
                                     for r in rows if r["status"] == "captured" and r["without_graph"]}),
            "pi_inputs": total("inputs_pi"),
            "moving_inputs_copied": total("inputs_moving"),  # in place, until they kept moving
            "pi_left_to_copy": sorted({why for g in self.graphs for s in g.partitions for why in s.pi_reasons}),
            "largest_copies": [f"graph {s.graph} {'backward' if s.backward else 'forward'} partition {s.partition} "
                               f"{what}: {n} bytes" for n, s, what in sorted(
                                   ((n, s, what) for g in self.graphs for s in g.partitions
                                    for n, what in s.largest_copies), key=lambda c: -c[0])[:5]],
            "scg": self.scg_decisions(),
            "cgct": [note for g in self.graphs for note in g.cgct],
            "notes": [note for g in self.graphs for note in g.notes],
            "fallbacks": [f"graph {g.graph}: {f}" for g in self.graphs for f in g.fallbacks],
            "lean_graphs": sum(g.call_path == "lean" for g in self.graphs),  # calls past the wrappers (grace.lean)
            "call_paths": sorted({g.call_path for g in self.graphs if g.call_path != "lean"}),
        }

    def __str__(self) -> str:
        lines = []
        for g in self.graphs:
            cgct = "; ".join(g.cgct) or "nothing to change" if g.options.cgct else "off"
            lines.append(f"graph {g.graph}: cgct: {cgct}; call path: {g.call_path}")
            lines += [f"  {note}" for note in g.notes]
            lines += [f"  fell back to {f}" for f in g.fallbacks]
        lines.append(self.partitions().to_string(index=False) if self.rows() else "no CUDA-graph partitions")
        if self.kernels:
            lines.append(f"last call: {self.kernels.kernels} kernels, {self.kernels.in_graphs} of them replayed "
                         f"from {self.kernels.graph_launches} graph launches, "
                         f"{self.kernels.kernels - self.kernels.in_graphs} launched outside graphs")
        return "\n".join(lines)


def without_graph_reasons(start: int = 0) -> list[str]:
    """Why partitions of the graphs compiled in this process (from the start-th on) run without a CUDA
    graph, as they stand now: one reason per such partition."""
    return [s.reason for g in backend.REPORTS[start:] for s in g.partitions if s.reason]


def copied_reasons(start: int = 0) -> list[str]:
    """Why partitions of the graphs compiled in this process (from the start-th on) copy inputs that PI
    would read in place (PI's own limits, or PI failed and the partition fell back to copies)."""
    return [why for g in backend.REPORTS[start:] for s in g.partitions for why in s.pi_reasons]


def explain_call(call: Callable[[], Any], start: int = 0) -> Explanation:
    """Run `call` once more and explain it: the graphs the grace backend compiled in this process (from
    the start-th on) with what each partition did during that call."""
    graphs = backend.REPORTS[start:]

    def counts():
        return ({(s.graph, s.backward, s.partition): s.replays for g in graphs for s in g.partitions},
                {(s.graph, s.backward, s.partition): s.eager_calls for g in graphs for s in g.partitions})

    replays0, eager0 = counts()
    kernels = None
    if torch.cuda.is_available():
        kernels = profile.count(profile.trace(call))
    else:
        call()
    graphs = backend.REPORTS[start:]
    replays1, eager1 = counts()
    return Explanation(graphs, {k: v - replays0.get(k, 0) for k, v in replays1.items()},
                       {k: v - eager0.get(k, 0) for k, v in eager1.items()}, kernels)


def explain(fn: Callable, *inputs, options: dict | None = None, calls: int = 3, **kwargs) -> Explanation:
    """Compile `fn` afresh (Dynamo's caches are reset first, as by torch.compiler.reset(): code compiled
    before is compiled again on its next call) and report on `calls` calls with `inputs` and `kwargs`
    (a HuggingFace model's input_ids=..., say), in the caller's grad mode. For inference, call it under
    torch.no_grad() or inference_mode(): in grad mode the forward is compiled for training, saving
    activations for a backward that never comes."""
    torch.compiler.reset()
    compiled = torch.compile(fn, backend="grace", options=options)
    start = len(backend.REPORTS)
    for _ in range(calls - 1):
        compiled(*inputs, **kwargs)
    return explain_call(lambda: compiled(*inputs, **kwargs), start)
