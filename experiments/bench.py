"""Measure one (workload, variant) in the current process: set up, time rounds, profile.

The sweep drives one Bench per variant, each in its own worker process (experiments/worker.py), and
alternates between them round by round.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from experiments import tp, workloads
from experiments.cores import pin_threads
from experiments.numerics import compare, judge
from experiments.host_profile import profile_host
from experiments.profiling import profile_iterations
from experiments.records import HostStats, KernelStats, Numerics, error_line, out_of_memory
from experiments.task import Task
from experiments.timing import capture_whole, launch_cost_us, sm_clock_mhz, synchronize, time_iterations
from experiments.variants import Variant
import grace
from experiments.instrument import (collect_cudagraph_skip_reasons, cudagraph_skips, dynamo_stats,
                                   forget_counters, pytree, shape_padding_choices)

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Spec:
    workload: str
    mode: str
    batch: int | None
    size: str
    variant: Variant
    device: str
    seed: int
    warmup: int  # untimed calls after the first; graph trees record on the second call
    tolerance_floor: dict[str, float]  # numerics: rel_err allowed beyond eager's, by compute dtype
    tolerance_multiplier: float  # numerics: rel_err allowed as a multiple of eager's
    tp: int = 1  # tensor-parallel degree (experiments/tp_bench.py runs the ranks)
    compile_optimizer: bool = False  # train: compile the optimizer's step too, with the variant's settings
    timing_cpus: tuple[int, ...] = ()  # cores every variant's timed rounds run on (one at a time), a group per
                                       # TP rank: none, the OS's choice
    cold_caches: bool = False  # compile with empty, private Inductor and Triton caches (experiments/worker.py)


@dataclass(frozen=True)
class Diagnostics:
    peak_mem_mb: float | None  # the most allocated at once from the compile on: recording, SCG's and PI's runs, rounds
    held_mem_mb: float | None  # reserved after the rounds with the cache emptied: what the variant keeps
    # from every other process (model, state, CUDA-graph memory pools, their freed blocks included)
    cudagraph_skips: int
    cudagraph_skip_reasons: list[str]
    graph_breaks: int
    unique_graphs: int
    graph_break_reasons: list[str]
    grace: dict | None  # what the grace backend did in one iteration (grace.explain), for its variants
    shape_padding: dict[str, dict]  # Inductor's benchmarked choice, per misaligned GEMM, to pad it or not


@dataclass(frozen=True)
class Round:
    times_ms: list[float]  # wall time of each timed iteration (TP: of the slowest rank)
    launch_us: float  # the host's launch cost right after them
    sm_clock_mhz: float | None  # and the SM clock
    rank_times_ms: list[list[float]] | None = None  # TP: each rank's own times, by rank


@dataclass(frozen=True)
class Float64Check:
    """The variant's steps run and judged in float64 (Bench._check_in_float64)."""

    results: dict[str, Numerics]  # by part and step, as Bench._judge keys them
    seconds: float | None  # None: not run
    unchecked: str = ""  # why not: what the numerics detail says


@dataclass(frozen=True)
class Setup:
    batch: int
    build_s: float  # the workload's model and inputs built, its initial state kept
    compile_s: float
    warmup_s: float
    check_s: float  # the rewound step, the step on fresh inputs, and the numerics check against the reference
    float64_check_s: float | None  # the variant run and checked in float64 first (None: not run, TP)
    numerics: Numerics | None  # None on tensor-parallel ranks other than 0
    floor_method: str | None = None  # the floor variant's: how its time is taken (Bench._take_floor)
    shape_padding: dict[str, dict] = dataclasses.field(default_factory=dict)  # as Diagnostics's, once set up


def capture_out_of_memory(start: int) -> str | None:
    """Why the grace backend left a partition of this process (of the start-th graph on) without a CUDA
    graph or without PI, if a capture or PI's check ran out of GPU memory (a condition of the machine,
    other workers beside this one, not of GraCE's choosing: the sweep sets such a variant up again on
    its own)."""
    reasons = grace.without_graph_reasons(start) + grace.copied_reasons(start)
    return next((reason for reason in reasons if "OutOfMemoryError" in reason), None)


def _host(observation: dict[str, Any]) -> dict[str, Any]:
    return pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, observation)


class Bench:
    def __init__(self, spec: Spec, rank: int = 0, control: dist.ProcessGroup | None = None):
        """`rank`: this process's rank in a tensor-parallel workload (spec.tp > 1, experiments/tp_bench.py);
        `control`: the ranks' host-side group, for their results."""
        self.spec, self.rank, self.control = spec, rank, control
        self.device = torch.device(spec.device, rank) if spec.device == "cuda" and spec.tp > 1 else torch.device(spec.device)
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)
        self.task: Task | None = None
        self.fn = None
        self._skip_reasons = collect_cudagraph_skip_reasons()  # a Bench lives in a worker process of its own
        self._graphs_from = 0  # the first of grace's graph reports that are the measured instance's
        # the floor variant's (_take_floor): what its rounds time and profile, and the GPU time added
        self._timed: Any = None
        self._profiled: Any = None
        self._added_ms = 0.0

    def _step(self) -> Any:
        return self.task.step(self.fn)

    def ready(self) -> float:
        """Before any setup: the workload's modules imported and the CUDA context made, so that a worker
        started early (the sweep starts every variant's beside the numerics reference) has paid for them
        before its setup. Returns when it was done, on the machine's monotonic clock, which every process
        of the machine shares (Worker.ready takes its start from it)."""
        workloads.get(self.spec.workload)
        if self.device.type == "cuda":
            torch.zeros(1, device=self.device)
            synchronize(self.device)
            self._release()
        return time.monotonic()

    def _task(self) -> Task:
        spec = self.spec
        return Task(workloads.get(spec.workload)(spec.mode, spec.batch, spec.size, spec.device), spec.seed)

    def reference(self, path: str) -> None:
        """The numerics check's yardsticks, once per workload, before any variant is set up (the sweep
        runs this alone: the float64 copy of a training workload is the largest allocation of all): in
        eager, in its compute dtype and in float64, the first two steps of the task as built and a step
        from its initial state on fresh inputs (Task.fresh_inputs); the observations and those inputs go
        to `path`, on the host."""
        task = self._task()
        fresh = _host(task.fresh_inputs(self.spec.seed + 1))
        self._release()
        ref = task.twin(torch.float64)
        steps = {"eager": {}, "float64": {}}
        twins = ((task, steps["eager"]), (ref, steps["float64"]))
        for twin, observed in twins:
            twin.keep_initial()
            observed["first"] = _host(twin.observe(twin.target))
        repeats = task.unchanged()  # the second step computes the first again: kept once (TP XLNet's logits: 17 GB in float64)
        for twin, observed in twins:
            observed["second"] = observed["first"] if repeats else _host(twin.observe(twin.target))
            twin.rewind()
            with twin.fed(fresh):
                observed["fresh"] = _host(twin.observe(twin.target))
        torch.save({**steps, "inputs": fresh}, path)

    def _prepare(self, task: Task) -> Any:
        """`task`'s target (the model; in train, with its loss) as the variant runs it, and its optimizer's
        step (compiled too with compile_optimizer: the whole iteration, as the paper's harness compiles it)."""
        if task.optimizer is not None:
            task.optimizer_step = self.spec.variant.optimizer_step(task.optimizer, self.spec.compile_optimizer)
        return self.spec.variant.apply(task.target)

    def _checked_steps(self, task: Task, fn: Any, fresh: Any) -> Iterator[tuple[str, str | None, dict | None]]:
        """The steps that numerics checks, as (when, the reference's step it matches, the observation): the
        first (compiled, run without graphs), the second (where graphs are recorded, and GraCE's PI and SCG
        run a partition more than once), ("warmed up", None, None) after the other warm-up steps, then a
        step of the task rewound to its initial state (graphs replayed) and one from there on fresh inputs
        (a replay that reads its old inputs gets it wrong)."""
        yield "step 1", "first", task.observe(fn)
        yield "step 2", "second", task.observe(fn)
        for _ in range(self.spec.warmup - 1):
            task.step(fn)
        yield "warmed up", None, None
        task.rewind()
        yield "a rewound step", "first", task.observe(fn)
        task.rewind()
        with task.fed(fresh):
            yield "fresh inputs", "fresh", task.observe(fn)

    def _judge(self, results: dict[str, Numerics], when: str, step: str, observation: dict, yardsticks: dict,
               dtype: torch.dtype) -> None:
        """Each part of `observation` against the reference's `step`, into `results`; in float64 eager
        float64 is the reference itself (experiments/numerics.py)."""
        float64 = dtype == torch.float64
        for part, value in observation.items():
            ref = yardsticks["float64"][step][part]
            eager = ref if float64 else yardsticks["eager"][step][part]
            results[f"{part} at {when}" + (" in float64" if float64 else "")] = compare(
                value, eager, ref, dtype, self.spec.tolerance_floor, self.spec.tolerance_multiplier)

    def _check_in_float64(self, yardsticks: dict) -> dict[str, Numerics]:
        """The variant run in float64 from the task's initial state, through the steps the check takes
        (_checked_steps), each judged at once; then dropped, with all it compiled and counted, before the
        variant is compiled in its compute dtype."""
        task = self.task.twin(torch.float64)
        task.keep_initial()
        results: dict[str, Numerics] = {}
        fn = None
        # Inductor's mix-order reduction declares its accumulator float32 and then fails to compile in
        # float64 (DGPT2's layer-norm backward); the check needs float64, not that kernel
        try:
            with torch._inductor.config.patch({"triton.mix_order_reduction": False}):
                fn = self._prepare(task)
                for when, step, observation in self._checked_steps(task, fn, yardsticks["inputs"]):
                    if step is not None:
                        self._judge(results, when, step, observation, yardsticks, torch.float64)
            if oom := capture_out_of_memory(self._graphs_from):  # it checked the variant without its graphs
                raise torch.OutOfMemoryError(f"GraCE left a partition without its graph or PI in float64: {oom}")
        finally:  # also when it failed: the traceback keeps this frame, not the float64 model
            task = fn = observation = None
            self._forget_compiled()
        return results

    def _forget_compiled(self) -> None:
        """Drop what the float64 check compiled and counted, before the measured instance is compiled."""
        grace.reset()
        forget_counters()
        self._skip_reasons.clear()
        self._graphs_from = len(grace.REPORTS)
        self._release()

    def _float64_check(self, yardsticks: dict) -> Float64Check:
        """_check_in_float64 of self.task; out of GPU memory is raised (beside other workers: the sweep
        checks or sets the variant up again alone)."""
        t0 = time.perf_counter()
        try:
            return Float64Check(self._check_in_float64(yardsticks), time.perf_counter() - t0)
        except Exception as e:  # e.g. a compiler's float64-only bug: the check in the compute dtype still runs
            if out_of_memory(f"{type(e).__name__}: {e} {error_line(e)}"):
                raise
            unchecked = f"not checked in float64: {error_line(e)}"
            log.warning("%s %s: %s", self.spec.workload, self.spec.variant.name, unchecked, exc_info=True)
            return Float64Check({}, None, unchecked)

    def check_float64(self, reference: str) -> Float64Check | None:
        """The float64 check alone, for a setup in another process (Bench.setup's `float64`): the sweep
        runs it in a process of its own per variant, all at once, and ends those processes, so that
        nothing it compiled, cached or calibrated stays with the measured instance. None where it ran out
        of GPU memory (beside the other checks)."""
        yardsticks = torch.load(reference, weights_only=False, mmap=True)
        self.task = self._task()
        try:
            return self._float64_check(yardsticks)
        except Exception as e:
            if not out_of_memory(f"{type(e).__name__}: {e} {error_line(e)}"):
                raise
            return None
        finally:
            self.task = None
            self._release()

    def setup(self, reference: str, float64: Float64Check | None = None) -> Setup:
        """Build; check the variant in float64 (_check_in_float64), unless `float64` is that check, taken
        in another process (check_float64); compile in the compute dtype (the first step), warm up, then
        check the steps that _checked_steps takes against the reference's (Bench.reference) as they come."""
        spec = self.spec
        t0 = time.perf_counter()
        # on every rank (the fresh inputs), mapped: the yardsticks are read only as they are compared
        yardsticks = torch.load(reference, weights_only=False, mmap=True)
        self.task = self._task()
        judged = self.rank == 0  # TP: the other ranks step in lockstep, and are not compared
        checked_here = 0.0
        if spec.tp == 1 and float64 is None:  # TP: the reference is the whole model, and so would be the check
            t64 = time.perf_counter()
            float64 = self._float64_check(yardsticks)
            checked_here = time.perf_counter() - t64
        float64 = float64 or Float64Check({}, None)
        results = dict(float64.results)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if spec.tp > 1:  # this rank keeps its slice of the model; the reference is the whole model (TP1)
            tp.parallelize(spec.workload, self.task.model, self.rank, spec.tp, dist.group.WORLD)
        self.task.keep_initial()
        self.fn = self._prepare(self.task)
        synchronize(self.device)
        built = time.perf_counter()
        steps = self._checked_steps(self.task, self.fn, yardsticks["inputs"])
        timed: list[float] = []
        for when, step, observation in steps:
            if step is None or step == "first" and not timed:
                synchronize(self.device)
                timed.append(time.perf_counter())  # after the first step, and after the warm-up
            if step is None:
                if oom := capture_out_of_memory(self._graphs_from):  # it would be measured without its graphs
                    raise torch.OutOfMemoryError(f"GraCE left a partition without its graph or PI: {oom}")
            elif judged:
                self._judge(results, when, step, observation, yardsticks, self.task.compute_dtype)
        numerics = judge(results) if judged else None
        if numerics is not None and float64.unchecked:
            numerics = dataclasses.replace(numerics, detail="; ".join(filter(None, [numerics.detail, float64.unchecked])))
        t3 = time.perf_counter()
        floor_method = self._take_floor() if spec.variant.floor else None
        self._release()
        t1, t2 = timed
        return Setup(self.task.workload.batch, built - t0 - checked_here, t1 - built, t2 - t1,
                     t3 - t2, float64.seconds, numerics, floor_method, shape_padding_choices())

    def fill_caches(self, reference: str, float64: Float64Check) -> float:
        """The setup once, for the caches that the measured workers share (Sweep._fill_caches), then dropped;
        returns its compile seconds."""
        compile_s = self.setup(reference, float64).compile_s
        self.close()
        return compile_s

    def _take_floor(self) -> str:
        """The floor variant's timed step (Variant.floor), its numerics checked as its variant's: the step
        captured whole into one CUDA graph and replayed on the same inputs; where it cannot be captured, an
        empty synchronize with the step's GPU time added (a floor no host can go under). Returns which,
        and why the capture failed."""
        try:
            graph = capture_whole(self._step, self.device)
        except Exception as e:  # a step that synchronizes, or copies a CPU tensor in: it is not one graph
            why = error_line(e)
            synchronize(self.device)
            self._added_ms = profile_iterations(self._step, self.spec.warmup, self.device).gpu_kernel_ms
            self._timed = lambda: None
            return f"GPU time + empty synchronize (the step is not one CUDA graph: {why})"
        self._timed = self._profiled = graph.replay  # the graph keeps its memory pool, and so its outputs
        return "replay"

    def close(self) -> None:
        """Drop the compiled model and free every CUDA graph recorded (grace.reset: stock graph trees
        through Dynamo's reset, GraCE's own). A TP rank must do this before destroying its process group:
        NCCL counts the graphs that captured its collectives, and destroying a communicator waits until
        every one is freed (pytorch#115388). Dropping the model and resetting Dynamo freed stock's graphs
        but not GraCE's, which Inductor's module cache kept: a grace rank would hang there."""
        self.fn = self.task = None
        grace.reset()

    def _release(self) -> None:
        """Give the allocator's cached blocks back to the device, between requests: every variant of a
        workload has a worker on the one GPU, and one's cache is memory the others cannot have (training
        workers each keeping its peak ran GraCE's captures out of memory). CUDA-graph pools
        stay; the next round's untimed step pays for allocating again."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def time_round(self, iters: int, launches: int) -> Round:
        """One untimed step first: a process that sat idle while others ran pays for cold caches on its
        next call."""
        if self.spec.timing_cpus:  # every variant's rounds on the same cores: no worker gets a faster core or node
            k = len(self.spec.timing_cpus) // self.spec.tp
            pin_threads(self.spec.timing_cpus[self.rank * k:(self.rank + 1) * k])
        step = self._timed or self._step
        step()
        # to the nanosecond, the timer's own resolution: digits beyond it were most of a record's size
        times = [round(t + self._added_ms, 6) for t in time_iterations(step, iters, self.device)]
        every = None
        if self.spec.tp > 1:  # an iteration takes as long as its slowest rank
            every = [None] * self.spec.tp
            dist.all_gather_object(every, times, group=self.control)
            times = [max(t) for t in zip(*every)]
        result = Round(times, round(launch_cost_us(self.device, launches), 3), sm_clock_mhz(self.device), every)
        self._release()
        return result

    def profile(self, iters: int) -> KernelStats:
        kernels = profile_iterations(self._profiled or self._step, iters, self.device)
        self._release()
        return kernels

    def profile_host(self, iters: int) -> HostStats:
        host = profile_host(self._profiled or self._step, iters, lambda: synchronize(self.device))
        self._release()
        return host

    def diagnostics(self) -> Diagnostics:
        """Called after profiling; for a grace variant it runs one more step to count what it replays."""
        peak = held = None
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / 2**20
            self._release()
            held = torch.cuda.memory_reserved(self.device) / 2**20
        summary = (grace.explain_call(self._step, self._graphs_from).summary() if self.spec.variant.uses_grace
                   else None)
        return Diagnostics(peak, held, cudagraph_skips(), list(dict.fromkeys(self._skip_reasons)), **dynamo_stats(),
                           grace=summary, shape_padding=shape_padding_choices())
