"""`torch.compile(model, backend="grace")`: Inductor, with GraCE's runtime owning the CUDA graphs.

    torch.compile(model, backend="grace")                              # every optimization on
    torch.compile(model, backend="grace", options={"scg": False})      # CGCT and PI, a graph everywhere
    torch.compile(model, backend="grace", options={"cgct": False, "pi": False, "scg": False})  # the runtime alone

Per Dynamo graph: the CGCT passes rewrite it (grace.cgct), Inductor compiles it (forward and, for
training, backward) split into CUDA-graph partitions, and grace.runtime captures and replays each
partition. What happened to each graph and partition is kept in REPORTS (grace.explain shows it).
Whatever GraCE cannot handle runs as Inductor compiled it, with the reason kept.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import logging
from collections.abc import Mapping
from typing import Any

import torch

from grace import calibrate, cgct, lean, runtime
from grace import torch_adapter as adapter

log = logging.getLogger("grace")


@dataclasses.dataclass(frozen=True)
class Options:
    cgct: bool = True  # CUDA-Graph-aware code transformations (grace.cgct)
    pi: bool = True  # parameter indirection: replays read non-static inputs in place (grace.pi)
    scg: bool = True  # selective CUDA graphs: per recording, graph or not, by cost (grace.scg)

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None) -> Options:
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"grace options are a mapping such as {{'pi': False}}, not {options!r}")
        options = dict(options or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown grace option(s) {unknown} (known: {sorted(known)})")
        odd = {k: v for k, v in options.items() if not isinstance(v, bool)}
        if odd:  # "false" is truthy: it would turn the option on
            raise ValueError(f"grace options are True or False, not {odd}")
        return cls(**options)


@dataclasses.dataclass
class GraphReport:
    """One Dynamo graph compiled by the grace backend."""
    graph: int
    options: Options
    cgct: list[str] = dataclasses.field(default_factory=list)  # what each CGCT pass changed
    notes: list[str] = dataclasses.field(default_factory=list)  # compiled graphs without partitions, ...
    partitions: list[runtime.Stats] = dataclasses.field(default_factory=list)
    fallbacks: list[str] = dataclasses.field(default_factory=list)  # safer settings taken after a failure, and why
    call_path: str = "as compiled"  # "lean" (grace.lean), or why not


REPORTS: list[GraphReport] = []  # every graph the backend compiled in this process, in order
_ids = itertools.count()


def _inner_compile(gm, example_inputs, *, report: GraphReport, candidates: list, **kwargs):
    """Inductor's compile_fx_inner with partitioning on and GraCE's runtime around each partition; an
    inference graph that is one partition end to end goes to `candidates` (grace.lean)."""
    with adapter.partitioned():
        compiled = adapter.compile_fx_inner(gm, example_inputs, **kwargs)
    backward = bool(kwargs.get("is_backward"))
    part = "backward" if backward else "forward"
    if not adapter.is_compiled_graph(compiled):
        report.notes.append(f"{part}: nothing for Inductor to compile; runs as is")
        return compiled
    adapter.finish_post_compile(compiled, example_inputs)
    # A training forward's outputs that AOTAutograd's autograd function returns get their grad_fn set
    # on the tensor object itself: a replay returns new objects for them (grace.recording, fresh outputs)
    training_forward = not backward and not kwargs.get("is_inference")
    parts = adapter.partitions(compiled, kwargs.get("static_input_idxs"),
                               adapter.user_visible_outputs(gm) if training_forward else frozenset())
    if not parts:
        devices = ", ".join(sorted(adapter.device_types(compiled))) or "none"
        report.notes.append(f"{part}: no CUDA-graph partition (devices: {devices}); runs as compiled")
        return compiled
    made: list[runtime.PartitionGraph] = []
    group = adapter.collective_group(gm)  # ranks whose SCG decisions must be taken together

    def wrapper(fn, p: adapter.Partition, stats: runtime.Stats) -> runtime.PartitionGraph:
        made.append(runtime.PartitionGraph(fn, p, stats, scg=report.options.scg, pi=report.options.pi, group=group))
        return made[-1]

    stats = [runtime.Stats(report.graph, backward, p.index) for p in parts]
    report.partitions += stats
    adapter.wrap_partitions(compiled, [functools.partial(wrapper, p=p, stats=s) for p, s in zip(parts, stats)])
    why_not = "training: AOTAutograd's autograd function runs it" if not kwargs.get("is_inference") else \
        adapter.beyond_one_partition(compiled)
    if why_not is None:
        candidates.append(lean.Candidate(made[0], adapter.graph_outputs(gm), adapter.realigned_inputs(compiled),
                                         parts[0].mutated, adapter.partition_inputs(compiled)))
    elif not backward:
        report.call_path = f"as compiled: {why_not}"
    return compiled


def _compile(gm: torch.fx.GraphModule, example_inputs, report: GraphReport | None):
    """Inductor's compile_fx, with GraCE's runtime around each partition (report given) or as stock Inductor
    compiles it without CUDA graphs (None); inputs that CGCT copies to the GPU are kept from pinned memory
    (cgct.cpu_inputs.PinnedCopied)."""
    positions = cgct.cpu_inputs.moved(gm)
    compiled = _compile_partitioned(gm, example_inputs, report)
    if positions:
        return cgct.cpu_inputs.PinnedCopied(compiled, positions, cgct.compute_device(example_inputs))
    return compiled


def _compile_partitioned(gm: torch.fx.GraphModule, example_inputs, report: GraphReport | None):
    with adapter.aot_config():
        if report is None:
            return adapter.compile_fx(gm, example_inputs)
        candidates: list[lean.Candidate] = []
        compiled = adapter.compile_fx(gm, example_inputs, config_patches=adapter.partition_config_patches(),
                                      inner_compile=functools.partial(_inner_compile, report=report,
                                                                      candidates=candidates))
    if len(candidates) != 1:
        return compiled
    return lean.LeanCall(compiled, candidates[0], lambda path: setattr(report, "call_path", path), adapter.lifted(gm))


def _fall_back(report: GraphReport, setting: str, e: Exception) -> None:
    reason = f"{setting}: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    report.fallbacks.append(reason)
    log.warning("grace: graph %d falls back to %s", report.graph, reason)


def grace_backend(gm: torch.fx.GraphModule, example_inputs, options: Mapping[str, Any] | None = None,
                  mode: str | None = None):
    """The Dynamo backend. `options` as in Options; `mode` is accepted and ignored (GraCE decides).

    A failure in a GraCE stage falls back to the next safer setting for the graph: without CGCT, then
    without GraCE's runtime (Inductor as it compiles without CUDA graphs); only Inductor's own error on
    the graph as Dynamo gave it reaches the caller. Dynamo's request to trace the frame again (a pass
    that must specialize a scalar) is no failure: it goes to Dynamo, and this graph's report with it."""
    report = GraphReport(next(_ids), Options.parse(options))
    REPORTS.append(report)
    try:
        return _compile_falling_back(gm, example_inputs, report)
    except adapter.DynamoRestart:
        REPORTS.remove(report)
        raise


def _compile_falling_back(gm: torch.fx.GraphModule, example_inputs, report: GraphReport):
    opts = report.options
    pristine, before = (cgct.copy_graph(gm), str(gm.graph)) if opts.cgct else (None, None)
    if opts.cgct:
        try:
            report.cgct = cgct.apply(gm, example_inputs)
        except adapter.DynamoRestart:
            raise
        except Exception as e:  # a pass's own check undoes it; this is anything beyond that
            cgct.restore_graph(gm, pristine)
            _fall_back(report, "without CGCT (CGCT failed)", e)
    changed = opts.cgct and str(gm.graph) != before
    try:
        return _compile(gm, example_inputs, report)
    except adapter.DynamoRestart:
        raise
    except Exception as e:
        if changed:
            cgct.restore_graph(gm, pristine)
            _fall_back(report, "without CGCT (compiling the rewritten graph failed)", e)
            report.cgct, report.partitions, report.notes, report.call_path = [], [], [], "as compiled"
            try:
                return _compile(gm, example_inputs, report)
            except adapter.DynamoRestart:
                raise
            except Exception as e2:
                e = e2
        report.partitions, report.notes, report.call_path = [], [], "as compiled"
        _fall_back(report, "Inductor without GraCE's runtime (compiling with it failed)", e)
    return _compile(gm, example_inputs, None)


def reset() -> None:
    """torch.compiler.reset(), and free every CUDA graph GraCE recorded in this process (code compiled
    before is compiled again on its next call, and SCG decides on the host's costs measured again). Call
    it before destroying a process group whose collectives GraCE captured: NCCL's destroy waits until
    every CUDA graph that captured one of its collectives is freed (pytorch#115388), and Inductor's module
    cache keeps GraCE's partition wrappers, with their graphs, past Dynamo's reset."""
    torch.compiler.reset()
    runtime.free_all()
    calibrate.forget()
    gc.collect()


adapter.register_backend(grace_backend, "grace")
