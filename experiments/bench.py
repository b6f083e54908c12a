"""Measure one (workload, variant) in the current process: set up, time rounds, profile.

The sweep drives one Bench per variant, each in its own worker process (experiments/worker.py), and
alternates between them round by round.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from experiments import tp, workloads
from experiments.numerics import check
from experiments.host_profile import profile_host
from experiments.profiling import profile_iterations
from experiments.records import HostStats, KernelStats, Numerics
from experiments.task import Task
from experiments.timing import launch_cost_us, sm_clock_mhz, synchronize, time_iterations
from experiments.variants import Variant
import grace
from experiments.instrument import (collect_cudagraph_skip_reasons, cudagraph_skips, dynamo_stats, pytree,
                                 shape_padding_choices)


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
    timing_cpus: tuple[int, ...] = ()  # cores every variant's timed rounds run on (one at a time): none, the OS's choice
    cold_caches: bool = True  # compile with empty, private Inductor and Triton caches (experiments/worker.py)


@dataclass(frozen=True)
class Diagnostics:
    peak_mem_mb: float | None
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
class Setup:
    batch: int
    build_s: float  # the workload's model and inputs built, its initial state kept
    compile_s: float
    warmup_s: float
    check_s: float  # the rewound step and the numerics check against the reference
    numerics: Numerics | None  # None on tensor-parallel ranks other than 0


def capture_out_of_memory() -> str | None:
    """Why the grace backend left a partition of this process without a CUDA graph, if it was a capture
    that ran out of GPU memory (a condition of the machine, other workers beside this one, not of GraCE's
    choosing: the sweep sets such a variant up again on its own)."""
    return next((reason for reason in grace.without_graph_reasons() if "OutOfMemoryError" in reason), None)


def _host(observation: dict[str, Any]) -> dict[str, Any]:
    return pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, observation)


def _by_step(observed: dict[str, tuple[dict, int]], reference: dict[str, list]) -> tuple[dict, dict, dict]:
    """Observations of several steps ({when: (observation, index of the reference's step)}) as one, each
    part named with its step, beside the reference's eager and float64 observations of the same steps."""
    out, eager, ref = {}, {}, {}
    for when, (observation, k) in observed.items():
        for part, value in observation.items():
            key = f"{part} at {when}"
            out[key], eager[key], ref[key] = value, reference["eager"][k][part], reference["float64"][k][part]
    return out, eager, ref


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
        runs this alone: the float64 copy of a training workload is the largest allocation of all): the
        first two steps of the task as built, in eager, in its compute dtype and in float64; the
        observations go to `path`, on the host."""
        task = self._task()
        ref = task.twin(torch.float64)
        task.keep_initial()
        observed = {"eager": [_host(task.observe(task.model))], "float64": [_host(ref.observe(ref.model))]}
        repeats = task.unchanged()  # the second step computes the first again: kept once (TP XLNet's logits: 17 GB in float64)
        for twin, steps in ((task, observed["eager"]), (ref, observed["float64"])):
            steps.append(steps[0] if repeats else _host(twin.observe(twin.model)))
        torch.save(observed, path)

    def setup(self, reference: str) -> Setup:
        """Build, compile (the first step), warm up, then check numerics against the reference's steps
        (Bench.reference): the first step (compiled, run without graphs), the second (where graphs are
        recorded, and GraCE's PI and SCG run a partition more than once), and, once warmed up, a step of
        the task rewound to its initial state (graphs replayed), against the reference's first."""
        spec = self.spec
        t0 = time.perf_counter()
        self.task = self._task()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if spec.tp > 1:  # this rank keeps its slice of the model; the reference is the whole model (TP1)
            tp.parallelize(spec.workload, self.task.model, self.rank, spec.tp, dist.group.WORLD)
        self.task.keep_initial()
        workload = self.task.workload
        self.fn = spec.variant.apply(self.task.model)
        if self.task.optimizer is not None and spec.compile_optimizer:  # the whole iteration compiled
            self.task.optimizer_step = spec.variant.apply(self.task.optimizer.step)
        synchronize(self.device)
        built = time.perf_counter()
        first = self.task.observe(self.fn)
        synchronize(self.device)
        t1 = time.perf_counter()
        first = _host(first)
        second = _host(self.task.observe(self.fn))  # the first warm-up step
        for _ in range(spec.warmup - 1):
            self._step()
        synchronize(self.device)
        t2 = time.perf_counter()
        if oom := capture_out_of_memory():  # a grace variant that would be measured without its graphs
            raise torch.OutOfMemoryError(f"GraCE left a partition without a CUDA graph: {oom}")
        self.task.rewind()
        steady = self.task.observe(self.fn)
        numerics = None
        if self.rank == 0:  # the outputs checked (TP: the other ranks step in lockstep, and may still be
            # stepping when rank 0's answer lets the sweep delete the reference)
            yardsticks = torch.load(reference, weights_only=False)  # written by Bench.reference in this sweep
            numerics = check(*_by_step({"step 1": (first, 0), "step 2": (second, 1), "a rewound step": (steady, 0)},
                                       yardsticks),
                             self.task.compute_dtype, spec.tolerance_floor, spec.tolerance_multiplier)
        self._release()
        return Setup(workload.batch, built - t0, t1 - built, t2 - t1, time.perf_counter() - t2, numerics)

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
            os.sched_setaffinity(0, self.spec.timing_cpus)
        self._step()
        times = time_iterations(self._step, iters, self.device)
        every = None
        if self.spec.tp > 1:  # an iteration takes as long as its slowest rank
            every = [None] * self.spec.tp
            dist.all_gather_object(every, times, group=self.control)
            times = [max(t) for t in zip(*every)]
        result = Round(times, launch_cost_us(self.device, launches), sm_clock_mhz(self.device), every)
        self._release()
        return result

    def profile(self, iters: int) -> KernelStats:
        kernels = profile_iterations(self._step, iters, self.device)
        self._release()
        return kernels

    def profile_host(self, iters: int) -> HostStats:
        host = profile_host(self._step, iters, lambda: synchronize(self.device))
        self._release()
        return host

    def diagnostics(self) -> Diagnostics:
        """Called after profiling; for a grace variant it runs one more step to count what it replays."""
        peak = torch.cuda.max_memory_allocated(self.device) / 2**20 if self.device.type == "cuda" else None
        summary = grace.explain_call(self._step).summary() if self.spec.variant.uses_grace else None
        return Diagnostics(peak, cudagraph_skips(), list(dict.fromkeys(self._skip_reasons)), **dynamo_stats(),
                           grace=summary, shape_padding=shape_padding_choices())
