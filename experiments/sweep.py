"""Run an experiment: each selected workload, with all its selected variants, in one session of its own.

A session: a worker of its own takes the numerics reference (the first steps in eager, in the compute
dtype and in float64); each variant gets its own worker process, started beside the reference's, and
another that checks it in float64 beside the others' checks (they time nothing kept) and ends; the
baseline's checker first sets the baseline up once, alone, filling the caches that the workers share, so
that no measured worker compiles cold and the others warm; then the
variants are set up one at a time, so that compile latencies do not overlap; each setup checks its
steps against the reference. With `aa_control`, the baseline is set up twice (`<baseline>_aa`): the ratio of
the two is the session's noise. With `measure.processes=N`, each variant has N workers, timed in every
round and recorded as one. With `floor` (on a GPU, one rank), a third time as the floor: its step
captured whole into one CUDA graph and replayed, every variant's time over it in its record. Then
`rounds` short rounds (more, up to `max_rounds`, until they took `timing_s`): in each, every variant
runs `iters` timed iterations in turn, in an order drawn afresh (seeded), so that drift, and whatever a
variant leaves behind for the next, hits every variant alike. Then
each is profiled, and one record per variant is appended, with its speedup over the session's baseline
and a 95 % interval from the rounds. A workload whose selected variants all have final records of this
code and these measure settings is passed over (unless forced), so a rerun resumes; one with any left is
measured again whole. Running workloads
side by side, on several GPUs or nodes, is Hydra's: a multirun with a launcher (conf/hydra/launcher/).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from experiments import environment, stats, workloads
from experiments.bench import Float64Check, Round, Setup, Spec
from experiments.cores import timing_cores
from experiments.records import Record, RecordStore, Selection, out_of_memory, padded_apart
from experiments.variants import Variant
from experiments.worker import Worker, WorkerError

log = logging.getLogger(__name__)
AA_SUFFIX = "_aa"  # the A/A control: the baseline measured by a second worker, named <baseline>_aa
FLOOR = "floor"  # the variant that times the floor (Variant.floor)
PROCESS = "#"  # a variant's further worker processes (measure.processes): <variant>#1, <variant>#2, ...


class ConfigError(ValueError):
    """Bad input from the command line or config: reported in one line, nothing recorded."""


@dataclass(frozen=True)
class Entry:
    """One workload selection of the experiment."""

    name: str
    mode: str
    batch: int  # resolved: the workload's default for the mode when the config says null
    size: str


def _entries(workload_cfg: Mapping[str, Any], size: str | None) -> list[Entry]:
    entries = []
    for label, w in workload_cfg.items():
        if "name" not in w:  # an experiment's settings for a workload that the command line left out
            log.warning("workload %r: not selected, its settings %s are ignored", label, dict(w))
            continue
        try:
            cls = workloads.get(w["name"])
            wl = cls(w["mode"], w.get("batch"), size or w.get("size", "full"))
        except (workloads.UnknownWorkload, NotImplementedError, ValueError) as e:
            raise ConfigError(f"workload {label!r}: {e}") from None
        entries.append(Entry(w["name"], wl.mode, wl.batch, wl.size))
    return entries


def _rank_medians(rounds: list[Round]) -> list[float] | None:
    """TP: each rank's median over all its timed iterations; None for one rank."""
    if not rounds[0].rank_times_ms:
        return None
    return [stats.median(stats.flatten(by_round)) for by_round in zip(*(r.rank_times_ms for r in rounds))]


def _merged(by_process: list[list[Round]]) -> list[Round]:
    """The rounds of a variant's processes as one: in each round, every process's iterations in turn
    (stats.speedup_interval reads them so), its launch cost and SM clock the processes' mean."""
    if len(by_process) == 1:
        return by_process[0]
    merged = []
    for rs in zip(*by_process):
        clocks = [r.sm_clock_mhz for r in rs if r.sm_clock_mhz is not None]
        merged.append(Round([t for r in rs for t in r.times_ms], statistics.fmean(r.launch_us for r in rs),
                            statistics.fmean(clocks) if clocks else None))
    return merged


def _checked_as(v: Variant) -> str:
    """What a variant's float64 check runs: the same for variants that differ only in name and in how
    they are timed (the baseline, its A/A control, the floor)."""
    return repr((v.compile, v.dynamo, v.mutation))


@contextlib.contextmanager
def _closing(workers: list[Worker]) -> Iterator[list[Worker]]:
    """Close `workers` (those added inside the block too) on the way out; at once if the sweep is being
    stopped from outside (SIGINT), so that its records still get written: a worker may be stuck in a
    collective its peers left (a TP worker stuck in NCCL would hold the sweep)."""
    stopping = False
    try:
        yield workers
    except KeyboardInterrupt:
        stopping = True
        raise
    finally:
        for worker in workers:  # all asked first, so that they exit side by side
            worker.ask_to_close()
        for worker in workers:
            worker.close(wait_s=0 if stopping else 60)


def records_path(cfg: DictConfig, env: environment.Environment) -> Path:
    return Path(cfg.results_dir) / cfg.experiment_name / environment.device_tag(env) / "records.jsonl"


class Sweep:
    def __init__(self, cfg: DictConfig, gpu: int | None = None):
        self.cfg = cfg
        self.measure = cfg.measure
        try:
            self.measure.timing_cpus = timing_cores(list(cfg.measure.timing_cpus), gpu or 0, cfg.tp)  # recorded as used
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if cfg.measure.processes < 1 or (cfg.measure.processes > 1 and cfg.tp > 1):
            raise ConfigError(f"measure.processes={cfg.measure.processes}: at least 1, and 1 with tensor parallelism")
        self.env = environment.current()
        self.entries = _entries(OmegaConf.to_container(cfg.workload), cfg.size)
        try:
            self.variants = [Variant.from_config(n, OmegaConf.to_container(v)) for n, v in cfg.variant.items()]
        except (TypeError, ValueError) as e:
            raise ConfigError(f"variant config: {e}") from None
        if not self.variants:
            raise ConfigError("no variant selected")
        baseline = next((v for v in self.variants if v.name == cfg.baseline), None)
        if cfg.aa_control and baseline is not None:
            self.variants.append(replace(baseline, name=baseline.name + AA_SUFFIX,
                                         description=f"A/A control: {baseline.name} in a second worker"))
        if cfg.floor and baseline is not None and cfg.tp == 1:
            self.variants.append(replace(baseline, name=FLOOR, floor=True, requires_cuda=True,
                                         description=f"the floor: {baseline.name}'s step as one CUDA graph"))
        self.store = RecordStore(records_path(cfg, self.env))
        self._appended: set[str] = set()
        # per variant, of its last setup: the workers set up beside its own, its worker's start and its setup
        # in seconds, and its place in the set-up order (Record.start_s, setup_s, setup_position)
        self._setups: dict[str, tuple[int, float, float, int]] = {}
        self._started: float | None = None  # when the workload being measured started (time.monotonic)
        self._float64: dict[str, Float64Check] = {}  # the workload's float64 checks taken apart (_checked_as)
        self.session = uuid.uuid4().hex[:12]

    def run(self) -> Path:
        revised = workloads.revisions(e.name for e in self.entries)  # records before these measured another program
        done = set() if self.cfg.force else self.store.final_keys(revised=revised, alone=not self.measure.parallel_setup,
                                                                  code=self.env.code,
                                                                  measure=OmegaConf.to_container(self.measure))
        newest = self.store.latest()
        for entry in tqdm(self.entries, desc=self.cfg.experiment_name, unit="workload"):
            for run in range(self.cfg.runs):
                keys = [Selection(entry.name, entry.mode, entry.batch, entry.size, v.name, run, self.cfg.tp) for v in self.variants]
                if all(k in done for k in keys) and len({newest[k].session for k in keys}) == 1:
                    log.info("%s run %d: already recorded", entry.name, run)
                    continue
                self.session = uuid.uuid4().hex[:12]  # one session per workload: every variant's record carries it
                self._measure(entry, run, self.variants)
        return self.store.path

    def _record(self, entry: Entry, run: int, variant: Variant, status: str, **fields) -> Record:
        return Record(experiment=self.cfg.experiment_name, session=self.session, run=run, workload=entry.name,
                      mode=entry.mode, batch=entry.batch, size=entry.size, variant=variant.name, status=status,
                      tp=self.cfg.tp,
                      measure=OmegaConf.to_container(self.measure), env=asdict(self.env), **fields)

    def _unmeasured(self, entry: Entry, run: int, variant: Variant, status: str, reason: str) -> None:
        log.warning("%s / %s: %s: %s", entry.name, variant.name, status, reason)
        name, _, process = variant.name.partition(PROCESS)
        if process and name in self._appended:  # another of its processes failed first
            return
        self._append(self._record(entry, run, replace(variant, name=name), status,
                                  reason=f"process {int(process) + 1}: {reason}" if process else reason))

    def _processes(self, v: Variant) -> list[Variant]:
        """The worker processes of variant v: itself, then measure.processes - 1 more of its kind."""
        return [v] + [replace(v, name=f"{v.name}{PROCESS}{j}") for j in range(1, self.measure.processes)]

    def _append(self, record: Record) -> None:
        if self._started is not None:
            record.workload_s = round(time.monotonic() - self._started, 1)
        self.store.append(record)
        self._appended.add(record.variant)

    def _tp_unavailable(self) -> str | None:
        gpus = torch.cuda.device_count()
        if self.cfg.tp > 1 and self.env.device == "cuda" and self.cfg.tp > gpus:
            return f"tp={self.cfg.tp} needs {self.cfg.tp} GPUs, this machine has {gpus}"
        return None

    def _spec(self, entry: Entry, variant: Variant) -> Spec:
        m = self.measure
        return Spec(entry.name, entry.mode, entry.batch, entry.size, variant, self.env.device, m.seed, m.warmup,
                    OmegaConf.to_container(m.tolerance.floor), m.tolerance.multiplier, self.cfg.tp,
                    m.compile_optimizer, tuple(m.timing_cpus), m.cold_caches)

    def _measure(self, entry: Entry, run: int, variants: list[Variant]) -> None:
        start = self._started = time.monotonic()
        available = []
        for v in variants:
            reason = v.unavailable_reason(self.env.device, entry.mode) or self._tp_unavailable()
            if reason:
                self._unmeasured(entry, run, v, "skipped", reason)
            else:
                available.append(v)
        self._appended = set()  # variants of this workload recorded so far
        try:
            with tempfile.TemporaryDirectory(prefix="grace-reference-") as folder, _closing([]) as early:
                # Every variant's worker starts now, beside the reference's: their imports and CUDA contexts
                # are then paid for side by side, before the first setup, not inside each setup one by one.
                processes = [p for v in available for p in self._processes(v)]
                early += [Worker(self._spec(entry, p), self.measure.timeout_s) for p in processes]
                prestarted = dict(zip((p.name for p in processes), early))
                # and a process per float64 check (TP: none, the reference is the whole model), one for the
                # variants that run the same code (the baseline, its A/A control and the floor)
                checkers: dict[str, Worker] = {}
                for v in available if self.cfg.tp == 1 else []:
                    if _checked_as(v) not in checkers:
                        checkers[_checked_as(v)] = Worker(self._spec(entry, v), self.measure.timeout_s)
                early += checkers.values()
                reference = self._reference(entry, run, available, os.path.join(folder, "reference.pt"))
                log.info("%s: numerics reference after %.0f s", entry.name, time.monotonic() - start)
                if reference is None:
                    return
                filler = self._filler(available, checkers)
                self._float64 = self._check_float64(entry, checkers, reference, start, keep=filler)
                if filler:
                    self._fill_caches(entry, checkers[filler], self._float64.get(filler), reference, start)
                deferred = self._measure_group(entry, run, available, reference, start, prestarted, defer=True)
                if deferred:
                    # Those that ran out of memory beside the others' workers, in a group of their own, with
                    # the stock variants again, so that each is compared with them in one interleaved run
                    again = [v for v in available if v not in deferred and not v.uses_grace]
                    log.info("%s: %s again, with %s, apart from the others (out of GPU memory beside them)",
                             entry.name, ", ".join(v.name for v in deferred), ", ".join(v.name for v in again))
                    self._measure_group(entry, run, again + deferred, reference, start, {}, defer=False)
        except KeyboardInterrupt:  # stopped from outside (a time limit): say so in a record, retried later
            for v in available:
                if v.name not in self._appended:
                    self._unmeasured(entry, run, v, "interrupted",
                                     f"stopped (SIGINT) {time.monotonic() - start:.0f} s into this workload")
            raise

    def _filler(self, available: list[Variant], checkers: dict[str, Worker]) -> str | None:
        """The checker that fills the shared caches (_fill_caches): the baseline's, where the workers share
        caches and the baseline is measured and compiled."""
        baseline = next((v for v in available if v.name == self.cfg.baseline), None)
        if (baseline is None or baseline.compile is None or self.measure.cold_caches
                or _checked_as(baseline) not in checkers):
            return None
        return _checked_as(baseline)

    def _fill_caches(self, entry: Entry, checker: Worker, float64: Float64Check | None, reference: str,
                     start: float) -> None:
        """The baseline set up once in its float64 checker, alone, which then ends: with shared caches the
        first worker to compile a graph compiles it cold and the later ones read what it left, and the
        process that compiled cold was more often the slower of an A/A pair (docs/harness.md).
        Every measured worker then sets up from these caches, the baseline's as its A/A control's. Nothing
        it measures is kept; a failure is the baseline's own setup's to report, as is a float64 check that
        did not finish here (the setup would take it again)."""
        try:
            if float64 is None:
                log.warning("%s: caches not filled (the float64 check did not finish); the baseline compiles "
                            "first", entry.name)
                return
            compile_s = checker.call("fill_caches", reference, float64)
            log.info("%s: caches filled by %s (compiled in %.0f s) after %.0f s", entry.name, checker.variant,
                     compile_s, time.monotonic() - start)
        except WorkerError as e:
            log.warning("%s: caches not filled (%s); the baseline compiles first", entry.name, e)
        finally:
            checker.close()

    def _check_float64(self, entry: Entry, checkers: dict[str, Worker], reference: str,
                       start: float, keep: str | None = None) -> dict[str, Float64Check]:
        """Each float64 check (Bench.check_float64; `checkers` by _checked_as) in a process of its own, all
        at once (nothing they time is kept: they need not wait their turn as the measured compiles do), then
        those that ran out of GPU memory beside the others, one at a time. Each process then ends, so that
        nothing of its float64 copy stays on the GPU, except `keep`'s, for the caller. A variant left
        without a check here is checked in its setup."""
        checked: dict[str, Float64Check] = {}
        pending = list(checkers)
        for together in (True, False):
            alone: list[str] = []  # out of memory beside the others: checked again one at a time
            for group in [pending] if together else [[name] for name in pending]:
                asked = []
                for name in group:
                    try:
                        checkers[name].request("check_float64", reference)
                        asked.append(name)
                    except WorkerError as e:  # its setup checks again, and says so if it fails there too
                        log.warning("%s / %s: float64 check not started (%s)", entry.name, checkers[name].variant, e)
                for name in asked:
                    try:
                        result = checkers[name].reply()
                    except WorkerError as e:
                        log.warning("%s / %s: float64 check failed (%s)", entry.name, checkers[name].variant, e)
                        continue
                    if result is None and together:
                        alone.append(name)
                    elif result is not None:
                        checked[name] = result
                done = [checkers[name] for name in group if name not in alone and name != keep]
                for worker in done:  # asked first: they exit side by side, their memory the next group's
                    worker.ask_to_close()
                for worker in done:
                    worker.close()
            pending = alone
        log.info("%s: %d of %d float64 checks taken apart after %.0f s", entry.name, len(checked), len(checkers),
                 time.monotonic() - start)
        return checked

    def _measure_group(self, entry: Entry, run: int, variants: list[Variant], reference: str, start: float,
                       prestarted: dict[str, Worker], defer: bool) -> list[Variant]:
        """Set up, time interleaved, profile and record `variants`, in the workers of `prestarted` (taken
        from it) or new ones; with `defer`, returns those that ran out of GPU memory even when set up alone
        beside the others' workers, unrecorded."""
        m = self.measure
        workers: dict[str, tuple[Variant, Worker, Setup]] = {}
        names = {v.name: [p.name for p in self._processes(v)] for v in variants}
        with _closing([]) as started:  # every worker, set up or not
            deferred = self._set_up(entry, run, [p for v in self._setup_order(variants) for p in self._processes(v)],
                                    workers, reference, defer, started, prestarted)
            deferred = [v for v in variants if any(d.name in names[v.name] for d in deferred)]
            for v in variants:  # a variant is timed with all its processes or not at all
                if not all(n in workers for n in names[v.name]):
                    for n in names[v.name]:
                        workers.pop(n, None)
            log.info("%s: %d variants set up after %.0f s", entry.name, len(workers) // m.processes,
                     time.monotonic() - start)
            rounds = self._time_rounds(entry, run, workers)
            log.info("%s: timed after %.0f s", entry.name, time.monotonic() - start)
            timed = {v.name: _merged([rounds[n] for n in names[v.name]]) for v in variants
                     if all(n in workers for n in names[v.name])}  # every process timed to the end
            baseline_rounds, floor_rounds = timed.get(self.cfg.baseline), timed.get(FLOOR)
            for name in timed:
                v, worker, setup = workers[name]
                try:
                    kernels = worker.call("profile", m.profile_iters)
                    host = worker.call("profile_host", m.profile_iters)
                    diagnostics = worker.call("diagnostics")
                except WorkerError as e:
                    self._unmeasured(entry, run, v, "failed", str(e))
                    continue
                beside, start_s, setup_s, position = self._setups[name]
                self._append(self._measured(entry, run, v, setup, timed[name], baseline_rounds, floor_rounds,
                                            kernels=kernels, host=host, set_up_beside=beside,
                                            start_s=round(start_s, 1), setup_s=round(setup_s, 1),
                                            setup_position=position,
                                            **asdict(diagnostics)))
            return deferred

    def _setup_order(self, variants: list[Variant]) -> list[Variant]:
        """The variants in the order their workers are set up: as selected, except that the baseline and its
        A/A control trade places in half the sessions (drawn from the session id). Set up first and near
        last, the A/A worker was the faster of the two in most sessions on the H100, with the caches filled
        for both (docs/harness.md): the A/A control then measures what the place costs, and a record's
        setup_position says which place its worker had."""
        order = list(variants)
        names = [v.name for v in order]
        baseline, aa = self.cfg.baseline, self.cfg.baseline + AA_SUFFIX
        if baseline in names and aa in names and random.Random(self.session).random() < 0.5:
            i, j = names.index(baseline), names.index(aa)
            order[i], order[j] = order[j], order[i]
        return order

    def _reference(self, entry: Entry, run: int, variants: list[Variant], path: str) -> str | None:
        """The numerics reference of this workload (Bench.reference), in a worker of its own before any
        variant's: `path`, or None (each variant then recorded as failed, with the reason)."""
        if not variants:
            return None
        spec = replace(self._spec(entry, variants[0]), tp=1)  # the whole model, eager
        with _closing([Worker(spec, self.measure.timeout_s)]) as (worker,):
            try:
                worker.call("reference", path)
                return path
            except WorkerError as e:
                for v in variants:
                    self._unmeasured(entry, run, v, "failed", f"numerics reference: {e}")
                return None

    def _set_up(self, entry: Entry, run: int, variants: list[Variant], workers: dict, reference: str,
                defer: bool, started: list[Worker], prestarted: dict[str, Worker]) -> list[Variant]:
        """Take a worker per variant from `prestarted`, or start one (each added to `started`, for the caller
        to close), and once it is ready set it up,
        adding those that succeed to `workers`: one after another, so that compile latencies do not
        overlap, or all at once (measure.parallel_setup). Those
        that time themselves while setting up (SCG) are set up one at a time after the others, on a GPU no
        other worker is using: timings taken beside compiling workers choose wrong (docs/harness.md). A variant that ran out of GPU memory while others set up beside it is set up again
        on its own afterwards; with `defer`, one that ran out of memory on its own beside the workers set up
        already is returned, unrecorded, for a group of its own (a large training workload's variants may not
        fit on one GPU together)."""
        m = self.measure
        deferred, position = [], 0
        if m.parallel_setup:
            alone = [v for v in variants if v.uses_scg]
            groups = [[v for v in variants if v not in alone]] + [[v] for v in alone]
        else:
            groups = [[v] for v in variants]
        groups = [g for g in groups if g]
        while groups:
            group = groups.pop(0)
            group_workers = [(v, prestarted.pop(v.name, None) or Worker(self._spec(entry, v), m.timeout_s))
                             for v in group]
            started += [worker for _, worker in group_workers]
            ready = []
            for v, worker in group_workers:
                try:
                    ready.append((v, worker, worker.ready()))
                except WorkerError as e:
                    worker.close()
                    self._unmeasured(entry, run, v, "failed", str(e))
            began = time.monotonic()
            for v, worker, _ in ready:
                worker.request("setup", reference, self._float64.get(_checked_as(v)))
            for v, worker, start_s in ready:
                try:
                    workers[v.name] = (v, worker, worker.reply())
                    self._setups[v.name] = (len(ready) - 1, start_s, time.monotonic() - began, position)
                    position += 1
                except WorkerError as e:
                    worker.close()
                    if len(group) > 1 and out_of_memory(str(e)):
                        log.info("%s / %s: out of memory beside %d others: set up again alone (%s)",
                                 entry.name, v.name, len(group) - 1, e)
                        groups.append([v])
                    elif defer and workers and out_of_memory(str(e)):
                        log.info("%s / %s: out of memory beside %d workers set up: deferred (%s)",
                                 entry.name, v.name, len(workers), e)
                        deferred.append(v)
                    else:
                        self._unmeasured(entry, run, v, "failed", str(e))
            if not groups:  # then those whose GEMMs Inductor padded otherwise than the others did, alone
                groups = [[v] for v in self._padded_apart(entry, workers)]
        return deferred

    def _padded_apart(self, entry: Entry, workers: dict) -> list[Variant]:
        """Variants set up beside others whose shape padding (Inductor's timed choice to pad a misaligned
        GEMM) differs from the workload's (padded_apart); their workers closed and dropped from `workers`."""
        beside = {name: self._setups[name][0] for name in workers}
        apart = []
        for name in padded_apart({name: setup.shape_padding for name, (_, _, setup) in workers.items()}, beside):
            v, worker, _ = workers.pop(name)
            worker.close()
            log.info("%s / %s: Inductor padded a GEMM otherwise than the other variants did, set up beside "
                     "%d others: set up again alone", entry.name, name, beside[name])
            apart.append(v)
        return apart

    def _time_rounds(self, entry: Entry, run: int, workers: dict) -> dict[str, list[Round]]:
        """Interleaved rounds; a worker that fails is recorded, closed and dropped from `workers`."""
        m = self.measure
        rounds: dict[str, list[Round]] = {name: [] for name in workers}
        start, r = time.monotonic(), 0
        # A fresh order each round: rotating one order kept each variant's predecessor, and whatever state it
        # leaves (clocks, caches), the same in every round
        order = random.Random(m.seed)
        # `rounds` at least; then more until they took `timing_s` (a fast workload's interval narrows for free)
        while workers and (r < m.rounds or (r < m.max_rounds and time.monotonic() - start < m.timing_s)):
            for name in order.sample(list(workers), len(workers)):
                v, worker, _ = workers[name]
                try:
                    rounds[name].append(worker.call("time_round", m.iters, m.launch_calibration))
                except WorkerError as e:
                    del workers[name]
                    worker.close()
                    self._unmeasured(entry, run, v, "failed", str(e))
            r += 1
        return rounds

    def _measured(self, entry: Entry, run: int, v: Variant, setup: Setup, rounds: list[Round],
                  baseline_rounds: list[Round] | None, floor_rounds: list[Round] | None, **fields) -> Record:
        iter_ms = [r.times_ms for r in rounds]
        both = (self.measure.processes,) * 2  # each side's worker processes (_merged)
        if floor_rounds is not None and not v.floor:  # this over the floor: the speedup of floor over this
            over_floor, over_floor_ci = stats.speedup_interval(iter_ms, [r.times_ms for r in floor_rounds],
                                                               processes=both)
            fields.update(over_floor=over_floor, over_floor_ci=over_floor_ci)
        all_ms = stats.flatten(iter_ms)
        p25, p75 = stats.quartiles(all_ms)
        compare_to_baseline = baseline_rounds is not None and v.name != self.cfg.baseline
        status, reason = "ok", ""
        if not setup.numerics.passed:
            status = "mismatch"
            n = setup.numerics
            reason = (f"{n.part} off: rel_err {n.rel_err:.3g} against float64 > tolerance {n.tolerance:.3g} "
                      f"(eager's rel_err {n.eager_rel_err:.3g} in {n.dtype})") + (f"; {n.detail}" if n.detail else "")
            log.warning("%s / %s: %s", entry.name, v.name, reason)
        return self._record(
            entry, run, v, status, reason=reason, build_s=setup.build_s, compile_s=setup.compile_s,
            warmup_s=setup.warmup_s, check_s=setup.check_s, float64_check_s=setup.float64_check_s,
            iter_ms=iter_ms, median_ms=stats.median(all_ms), p25_ms=p25, p75_ms=p75,
            rank_median_ms=_rank_medians(rounds),
            baseline=self.cfg.baseline if compare_to_baseline else None,
            round_ratios=stats.round_ratios(iter_ms, [r.times_ms for r in baseline_rounds]) if compare_to_baseline else None,
            **(dict(zip(("speedup", "speedup_ci"), stats.speedup_interval([r.times_ms for r in baseline_rounds], iter_ms,
                                                                          processes=both)))
               if compare_to_baseline else {}),
            launch_us=[r.launch_us for r in rounds], sm_clock_mhz=[r.sm_clock_mhz for r in rounds],
            numerics=setup.numerics, floor_method=setup.floor_method, processes=self.measure.processes, **fields)
