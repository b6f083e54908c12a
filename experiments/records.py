"""Result records: one JSON line per (workload, variant, run), appended atomically.

A record is final when its status is `ok` or `mismatch` (a measurement was made); a rerun skips final
records unless forced (all of them, or those made before a date). `failed`, `skipped` and `interrupted` records
are kept as history and retried. Readers take the latest record per key, passing over an `interrupted`
one where an earlier record exists.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

STATUSES = ("ok", "mismatch", "failed", "skipped", "interrupted")
FINAL_STATUSES = frozenset({"ok", "mismatch"})


@dataclass
class Numerics:
    """The variant's outputs (train: loss and gradients) against the same step in float64 on the same
    inputs, with eager's own error as the yardstick (experiments/numerics.py)."""

    passed: bool
    max_abs_err: float  # max |variant - float64|
    rel_err: float  # ||variant - float64|| / ||float64|| over all floating outputs
    eager_rel_err: float  # the same for eager in the compute dtype
    tolerance: float  # on rel_err: multiplier * eager_rel_err + floor of the compute dtype
    dtype: str  # compute dtype
    detail: str = ""  # what failed, beyond rel_err > tolerance
    part: str = ""  # the part these numbers are of (outputs | loss | gradients): the one nearest failing


@dataclass
class KernelStats:
    """From torch.profiler over `iters` iterations, per iteration."""

    iters: int
    gpu_kernel_ms: float | None  # device time of kernels, memcpys and memsets: the floor under launch overhead
    kernels: float | None  # kernels launched
    kernels_in_graphs_share: float | None  # share of those kernels replayed from CUDA graphs
    graphs: float | None  # CUDA graph launches
    graph_input_copy_bytes: float  # bytes copied into graph input buffers (torch._foreach_copy_)
    top: list[dict[str, Any]] = field(default_factory=list)  # the device activities that took the most
    # time: name, in_graph, launches and us per iteration (experiments.profiling.kernel_table)


@dataclass
class HostStats:
    """From cProfile over `iters` iterations (experiments/host_profile.py), per iteration, in us."""

    iters: int
    groups: dict[str, float]  # own time by part of the stack (grace, Inductor's generated code, ...)
    top: list[dict[str, Any]] = field(default_factory=list)  # functions: function, group, calls, us


@dataclass
class Record:
    experiment: str
    session: str  # id shared by the variants measured together, interleaved, in one job
    run: int  # repetition index, for run-to-run spread
    workload: str
    mode: str  # eval | train
    batch: int
    size: str  # full | tiny
    variant: str
    status: str  # one of STATUSES
    tp: int = 1  # tensor-parallel degree: ranks (GPUs) the workload ran on
    reason: str = ""  # why, for any status but ok
    build_s: float | None = None  # its setup's start: the workload's model and inputs built
    compile_s: float | None = None  # first call: compilation (and for graph variants, warm-up run)
    warmup_s: float | None = None  # the other untimed calls (graph recording happens here)
    check_s: float | None = None  # its setup's end: a rewound step, the numerics check
    workload_s: float | None = None  # seconds from the start of this workload's measurement (its numerics
    # reference) to this record: for the last record of a workload, how long measuring it took
    set_up_beside: int | None = None  # other variants' workers setting up at the same time (0: alone):
    # compile_s, and SCG's timings taken while setting up, are undisturbed only at 0
    start_s: float | None = None  # its worker's start until ready (process, imports, CUDA context), every
    # variant's started together, beside the numerics reference
    setup_s: float | None = None  # from asking its worker (with others: the group's) to set up to the answer:
    # build_s + compile_s + warmup_s + check_s and what passes between processes. Records without start_s
    # (before 2026-12-01) count from starting the worker, one after another, so their worker's start too
    iter_ms: list[list[float]] = field(default_factory=list)  # wall time per timed iteration, per round
    median_ms: float | None = None  # TP: of each iteration's slowest rank (rank_median_ms: each rank's own)
    rank_median_ms: list[float] | None = None  # TP: each rank's median over its own timed iterations
    p25_ms: float | None = None
    p75_ms: float | None = None
    baseline: str | None = None  # variant that round_ratios divide by, when it ran in the same session
    round_ratios: list[float] | None = None  # per round: median(this) / median(baseline)
    launch_us: list[float] = field(default_factory=list)  # host cost of one tiny launch, per round
    sm_clock_mhz: list[float | None] = field(default_factory=list)  # SM clock after each round
    kernels: KernelStats | None = None
    host: HostStats | None = None  # where the host's time went (cProfile), by part of the stack
    peak_mem_mb: float | None = None
    cudagraph_skips: int | None = None  # times Inductor decided against CUDA graphs (its own counter)
    cudagraph_skip_reasons: list[str] = field(default_factory=list)  # what it logged, each reason once
    graph_breaks: int | None = None  # Dynamo's graph breaks while compiling
    unique_graphs: int | None = None  # distinct graphs Dynamo compiled (recompilations included)
    graph_break_reasons: list[str] = field(default_factory=list)  # why Dynamo broke graphs or skipped frames
    numerics: Numerics | None = None
    grace: dict[str, Any] | None = None  # grace backend variants: grace.explain's summary of one iteration
    shape_padding: dict[str, dict] = field(default_factory=dict)  # per GEMM with a misaligned dim, whether
    # Inductor padded it (its pad_mm pass decides by a benchmark at compile time) and the unpadded ms timed
    measure: dict[str, Any] = field(default_factory=dict)  # the measurement settings (conf/measure)
    env: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    @property
    def set_up_alone(self) -> bool:
        """Whether no other variant was setting up beside it (records from before set_up_beside: when set
        up one at a time)."""
        return self.set_up_beside == 0 if self.set_up_beside is not None else self.measure.get("parallel_setup") is False

    @property
    def key(self) -> tuple:
        return key(self.workload, self.mode, self.batch, self.size, self.variant, self.run, self.tp)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        d = dict(d)
        if d.get("kernels") is not None:
            d["kernels"] = KernelStats(**d["kernels"])
        if d.get("host") is not None:
            d["host"] = HostStats(**d["host"])
        if d.get("numerics") is not None:
            d["numerics"] = Numerics(**d["numerics"])
        return cls(**d)


def key(workload: str, mode: str, batch: int, size: str, variant: str, run: int, tp: int = 1) -> tuple:
    return (workload, mode, batch, size, variant, run, tp)


def latest(records: Iterable[Record]) -> dict[tuple, Record]:
    """The newest record per key (records oldest first). An `interrupted` record (the sweep's time ran out
    mid-workload) says nothing about the variant, so it does not hide the record before it."""
    newest: dict[tuple, Record] = {}
    for r in records:
        if r.status != "interrupted" or newest.get(r.key, r).status == "interrupted":
            newest[r.key] = r
    return newest


def session_key(session: str, k: tuple) -> tuple:
    """A record key (records.key) without its variant, in `session`: one run of a workload in one session."""
    return (session, *k[:4], *k[5:])


def session_baselines(records: Iterable[Record], baseline: str) -> dict[tuple, Record]:
    """Per session_key, the newest record of the `baseline` variant in that session (an `interrupted` one
    passed over): what the session's other variants are compared with. A workload measured in parts
    (sweep.py) has one per part."""
    newest = {}
    for r in records:  # oldest first
        if r.variant == baseline and r.status != "interrupted":
            newest[session_key(r.session, r.key)] = r
    return newest


# Tensor-parallel records (tp > 1) made before this date were slowed by the harness: another variant's idle
# rank, waiting for its next command in an NCCL broadcast, kept a kernel spinning on the timed rank's GPU
# (experiments/tp_bench.py; on two H200s DALLE2 at TP2 took 12.1 ms then, 5.3 after).
TP_REVISED = "2026-12-01T00:27"


def valid_since(r: Record, revised: Mapping[str, str]) -> str:
    """The UTC date since which a record like `r` measures what a sweep would now: its workload's last
    revision (`revised`: name -> date) and, at tp > 1, the tensor-parallel harness's (TP_REVISED)."""
    return max(revised.get(r.workload, ""), TP_REVISED if r.tp > 1 else "")


def current(records: Iterable[Record], revised: Mapping[str, str]) -> list[Record]:
    """The records made since their workload's last revision (`revised`: name -> UTC date) and, at tp > 1,
    since TP_REVISED."""
    return [r for r in records if r.env.get("date", "") >= valid_since(r, revised)]


def _took(run: list[Record], alone: bool) -> float | None:
    """How long measuring one run of a workload took: its longest workload_s (records from before that
    field: its setups, compile_s + warmup_s, as a lower bound). With `alone`, as if every variant had been
    set up alone: the setups made beside each other then come one after another, so every one but the
    longest (which the parallel setup waited for) is added."""
    setups = {r.variant: (r.compile_s + (r.warmup_s or 0), r.set_up_alone) for r in run if r.compile_s is not None}
    on_own = [t for t, set_up_alone in setups.values() if set_up_alone]
    beside = [t for t, set_up_alone in setups.values() if not set_up_alone]
    elapsed = [r.workload_s for r in run if r.workload_s is not None]
    took = max(elapsed) if elapsed else sum(on_own) + max(beside, default=0)
    if alone and beside:
        took += sum(beside) - max(beside)
    return took or None


class Took(NamedTuple):
    seconds: float
    variants: int
    of: str = "whole"  # what `seconds` counts: a "whole" measurement, or lower bounds: one "interrupted", or
    # the "setups" (compile_s + warmup_s) of one from before workload_s


def _runs(records: Iterable[Record]) -> dict[tuple, dict[tuple, list[Record]]]:
    """Per workload selection (workload, mode, batch, size, tp), its runs' records by (session, run),
    oldest first."""
    runs: dict[tuple, dict[tuple, list[Record]]] = {}
    for r in records:  # oldest first
        runs.setdefault((r.workload, r.mode, r.batch, r.size, r.tp), {}).setdefault((r.session, r.run), []).append(r)
    return runs


def durations(records: Iterable[Record], alone: bool = False) -> dict[tuple, Took]:
    """Per workload selection (workload, mode, batch, size, tp), how long its newest measurement took
    (see _took; `alone`: for a sweep that sets up one variant at a time) and how many variants it
    measured. A newest one that was interrupted ran at least as long as it did before it was stopped,
    and no shorter than the newest whole one: what it measured is unknown, so all of the whole one's.
    Without a whole one, the longest interrupted one is a lower bound, as is a whole one from before
    workload_s (its setups: DR-I's came to 38 s, and it was stopped after 213 s unfinished)."""
    took = {}
    for k, by_run in _runs(records).items():
        newest = None
        for run in by_run.values():  # oldest first
            t, variants = _took(run, alone), len({r.variant for r in run})
            if t is None:
                continue
            if all(r.status == "interrupted" for r in run):
                newest = newest._replace(seconds=max(t, newest.seconds)) if newest else Took(t, variants, "interrupted")
            else:
                newest = Took(t, variants, "setups" if all(r.workload_s is None for r in run) else "whole")
        if newest:
            took[k] = newest
    return took


def beyond_setups(records: Iterable[Record]) -> float | None:
    """Per variant, the most that a whole measurement whose workers started beside the reference (with
    start_s, since 2026-12-01) took beyond its setups' compile_s and warmup_s: the reference, starting,
    building, checking, timing, profiling and closing (DLRM's: 8.2 s a variant at ba21fa4; MTCG-I's 20.1
    at 22533ea, a HuggingFace model built and checked in 15 s a variant). Only measurements of as many
    variants as any count: a part of a workload (sweep.py) spreads the workload's own costs, its reference
    first, over fewer (MTCG-T's first part of three: 32.2 s a variant). Added to the setups of a
    measurement from before workload_s, it makes an estimate of the whole; None without one."""
    beyond = []  # (variants, seconds per variant)
    for by_run in _runs(records).values():
        for run in by_run.values():
            elapsed = [r.workload_s for r in run if r.workload_s is not None]
            if elapsed and any(r.start_s is not None for r in run) and all(r.status != "interrupted" for r in run):
                setups = sum(r.compile_s + (r.warmup_s or 0) for r in run if r.compile_s is not None)
                variants = len({r.variant for r in run})
                beyond.append((variants, (max(elapsed) - setups) / variants))
    return max(beyond, default=(0, None))[1]


class RecordStore:
    """A JSON-lines file of records. Appends take an exclusive lock and write one whole line in one
    call, then fsync, so concurrent jobs and an interrupted run never leave half a record behind."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def append(self, record: Record) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (record.to_json() + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)  # closing releases the lock

    def load(self) -> list[Record]:
        if not self.path.exists():
            return []
        records = []
        for n, line in enumerate(self.path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(Record.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, ValueError) as e:
                log.warning("%s:%d: unreadable record skipped (%s)", self.path, n, e)
        return records

    def latest(self) -> dict[tuple, Record]:
        return latest(self.load())

    def final_keys(self, made_before: str | None = None, revised: Mapping[str, str] | None = None,
                   alone: bool = False) -> set[tuple]:
        """Keys measured already; with `made_before` (an ISO date, UTC), only those measured since then;
        of a workload in `revised` (name -> date of its revision), and at tp > 1, only those measured
        since valid_since; with `alone`, only those set up with the GPU to themselves (Record.set_up_alone)."""
        revised = revised or {}
        return {k for k, r in self.latest().items() if r.status in FINAL_STATUSES
                and r.env.get("date", "") >= max(made_before or "", valid_since(r, revised))
                and (r.set_up_alone or not alone)}
