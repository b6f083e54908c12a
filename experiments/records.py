"""Result records: one JSON line per (workload, variant, run), appended atomically.

A record is final when its status is `ok` or `mismatch` (a measurement was made); a rerun leaves a
workload whose variants are all final, or skipped for want of what this machine lacks, unless forced.
`failed` and `interrupted` records are kept as history, and their workload measured again. Readers take the latest record per key, passing over an `interrupted`
one where an earlier record exists.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)

STATUSES = ("ok", "mismatch", "failed", "skipped", "interrupted")
FINAL_STATUSES = frozenset({"ok", "mismatch"})


def error_line(e: BaseException, chars: int = 300) -> str:
    """An error as one line of a record: the innermost exception that Dynamo's and Inductor's wrappers
    carry (inner_exception), as its type and its message's first line."""
    while isinstance(getattr(e, "inner_exception", None), BaseException):
        e = e.inner_exception
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:chars]}"


def out_of_memory(error: str) -> bool:
    """Whether an error's text says the GPU ran out of memory (the sweep then sets the variant up alone)."""
    return any(s in error for s in ("OutOfMemoryError", "out of memory", "ALLOC_FAILED"))


def padded_apart(padding: Mapping[str, Mapping[str, dict]], beside: Mapping[str, int]) -> list[str]:
    """Of the variants with their shape padding choices (Bench.Setup.shape_padding) and how many others
    each was set up beside, those set up beside others that chose otherwise than the workload for some
    GEMM that several compiled. Inductor times the GEMM padded and unpadded while it compiles, beside
    compiling workers wrongly (docs/harness.md): the workload's choice is that of the variants set up
    alone where they agree, else the majority's; on a tie, every one set up beside others chose otherwise."""
    apart: set[str] = set()
    for gemm in {k for choices in padding.values() for k in choices}:
        chose = {name: choices[gemm]["pad"] for name, choices in padding.items() if gemm in choices}
        alone = {pad for name, pad in chose.items() if beside[name] == 0}
        votes = Counter(chose.values())
        right = (alone.pop() if len(alone) == 1 else None if votes[True] == votes[False]
                 else votes.most_common(1)[0][0])
        if len(chose) > 1:
            apart |= {name for name, pad in chose.items() if beside[name] > 0 and pad != right}
    return [name for name in padding if name in apart]


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
    check_s: float | None = None  # its setup's end: a rewound step, one on fresh inputs, the numerics check
    float64_check_s: float | None = None  # the variant run and checked in float64: in the newer records in
    # a process of its own beside the other variants' checks, ahead of every setup, and out of setup_s
    workload_s: float | None = None  # seconds from the start of this workload's measurement (its numerics
    # reference) to this record: for the last record of a workload, how long measuring it took
    set_up_beside: int | None = None  # other variants' workers setting up at the same time (0: alone):
    # compile_s, and SCG's timings taken while setting up, are undisturbed only at 0
    start_s: float | None = None  # its worker's start until ready (process, imports, CUDA context), every
    # variant's started together, beside the numerics reference
    setup_s: float | None = None  # from asking its worker (with others: the group's) to set up to the answer:
    # build_s + compile_s + warmup_s + check_s and what passes between processes. Records without start_s
    # count from starting the worker, so their worker's start too
    setup_position: int | None = None  # its worker's place in the order its group's workers were set up
    # (0: first; Sweep._setup_order): the baseline and its A/A control trade places in half the sessions
    iter_ms: list[list[float]] = field(default_factory=list)  # wall time per timed iteration, per round
    processes: int = 1  # worker processes of this variant (measure.processes): a round holds each one's in turn
    median_ms: float | None = None  # TP: of each iteration's slowest rank (rank_median_ms: each rank's own)
    rank_median_ms: list[float] | None = None  # TP: each rank's median over its own timed iterations
    p25_ms: float | None = None
    p75_ms: float | None = None
    baseline: str | None = None  # variant that round_ratios divide by, when it ran in the same session
    round_ratios: list[float] | None = None  # per round: median(this) / median(baseline)
    speedup: float | None = None  # median(baseline) / median(this), both of this session
    speedup_ci: list[float] | None = None  # its 95 % interval, a paired bootstrap over the rounds (stats.speedup_interval)
    over_floor: float | None = None  # median(this) / median(floor), the floor variant of this session
    over_floor_ci: list[float] | None = None  # its 95 % interval, as speedup_ci's
    floor_method: str | None = None  # the floor variant's: replay (its step as one CUDA graph), or GPU time
    # + an empty synchronize, and why the step could not be captured
    launch_us: list[float] = field(default_factory=list)  # host cost of one tiny launch, per round
    sm_clock_mhz: list[float | None] = field(default_factory=list)  # SM clock after each round
    kernels: KernelStats | None = None
    host: HostStats | None = None  # where the host's time went (cProfile), by part of the stack
    peak_mem_mb: float | None = None
    held_mem_mb: float | None = None  # GPU memory the variant keeps from others after its rounds (bench.Diagnostics)
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
    def key(self) -> Selection:
        return Selection(self.workload, self.mode, self.batch, self.size, self.variant, self.run, self.tp)

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


@dataclass(frozen=True)
class Selection:
    """What one record measured: a variant of one workload (mode, batch, size), the run, the TP degree.
    The newest record of each is the one that counts (latest)."""
    workload: str
    mode: str
    batch: int | None
    size: str
    variant: str
    run: int = 0
    tp: int = 1

    @property
    def entry(self) -> tuple[str, str, int | None, str]:
        """The workload as configured: what figures.label names."""
        return self.workload, self.mode, self.batch, self.size

    def in_session(self, session: str) -> tuple:
        """This workload's run in `session`, whatever the variant: what its variants are compared within."""
        return (session, dataclasses.replace(self, variant=""))


def latest(records: Iterable[Record]) -> dict[Selection, Record]:
    """The newest record per key (records oldest first). An `interrupted` record (the sweep's time ran out
    mid-workload) says nothing about the variant, so it does not hide the record before it."""
    newest: dict[Selection, Record] = {}
    for r in records:
        if r.status != "interrupted" or newest.get(r.key, r).status == "interrupted":
            newest[r.key] = r
    return newest


def session_baselines(records: Iterable[Record], baseline: str) -> dict[tuple, Record]:
    """Per Selection.in_session, the newest record of the `baseline` variant in that session (an
    `interrupted` one passed over): what the session's other variants are compared with."""
    newest = {}
    for r in records:  # oldest first
        if r.variant == baseline and r.status != "interrupted":
            newest[r.key.in_session(r.session)] = r
    return newest


# Tensor-parallel records (tp > 1) made before this date were slowed by the harness: another variant's idle
# rank kept a kernel spinning on the timed rank's GPU (experiments/tp_bench.py, docs/harness.md).
TP_REVISED = "2026-12-01T00:27"


def valid_since(r: Record, revised: Mapping[str, str]) -> str:
    """The UTC date since which a record like `r` measures what a sweep would now: its workload's last
    revision (`revised`: name -> date) and, at tp > 1, the tensor-parallel harness's (TP_REVISED)."""
    return max(revised.get(r.workload, ""), TP_REVISED if r.tp > 1 else "")


def current(records: Iterable[Record], revised: Mapping[str, str]) -> list[Record]:
    """The records made since their workload's last revision (`revised`: name -> UTC date) and, at tp > 1,
    since TP_REVISED."""
    return [r for r in records if r.env.get("date", "") >= valid_since(r, revised)]


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

    def latest(self) -> dict[Selection, Record]:
        return latest(self.load())

    def final_keys(self, revised: Mapping[str, str] | None = None, alone: bool = False,
                   code: str | None = None, measure: Mapping[str, Any] | None = None) -> set[Selection]:
        """Keys a rerun leaves alone: measured (ok, mismatch) or skipped (the machine lacks what the variant
        needs: the records are per device); of a workload in `revised` (name -> date of its revision), and
        at tp > 1, only those recorded since valid_since; with `alone`, only measurements set up with the
        GPU to themselves (Record.set_up_alone); with `code`, only those that code made (Environment.code);
        with `measure`, only measurements made with those settings (same_measure)."""
        revised = revised or {}
        return {k for k, r in self.latest().items()
                if (r.status == "skipped" or r.status in FINAL_STATUSES and (r.set_up_alone or not alone)
                    and (measure is None or same_measure(r.measure, measure)))
                and r.env.get("date", "") >= valid_since(r, revised) and (code is None or r.env.get("code") == code)}


# Settings that do not change what a measurement means: the cores a job of a multirun gets, how long a
# silent worker is waited for
PLACEMENT = frozenset({"timing_cpus", "timeout_s"})


def same_measure(recorded: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a record made with the settings `recorded` (Record.measure) measured what `wanted` would:
    more rounds, more processes or another tolerance is another measurement."""
    return ({k: v for k, v in recorded.items() if k not in PLACEMENT}
            == {k: v for k, v in wanted.items() if k not in PLACEMENT})
