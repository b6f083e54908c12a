"""The config's schema: Hydra checks every value's type when it composes the config, so that a bad
override (`measure.rounds=abc`) is one line at once, not a crash in the middle of a sweep."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class Tolerance:
    multiplier: float = 3.0
    floor: dict[str, float] = field(default_factory=dict)


@dataclass
class Measure:
    rounds: int = 20
    timing_s: float = 0
    max_rounds: int = 200
    iters: int = 5
    warmup: int = 5
    profile_iters: int = 10
    launch_calibration: int = 200
    seed: int = 0
    timeout_s: float = 1800
    parallel_setup: bool = False
    cold_caches: bool = False
    compile_optimizer: bool = True
    timing_cpus: list[int] = field(default_factory=list)
    processes: int = 1
    tolerance: Tolerance = field(default_factory=Tolerance)


@dataclass
class Corpus:
    programs: list[str] = field(default_factory=list)  # names or families (timm/, hazards/); []: all
    variants: list[str] = field(default_factory=lambda: ["eager", "inductor", "pt2_cg", "grace"])
    timing_cpus: list[int] = field(default_factory=lambda: [-2, -1])  # the rounds' cores, which jobs do not compile on


@dataclass
class Config:
    workload: dict[str, Any] = field(default_factory=dict)
    variant: dict[str, Any] = field(default_factory=dict)
    measure: Measure = field(default_factory=Measure)
    experiment_name: str = "default"
    results_dir: str = "results"
    baseline: str = "inductor"
    aa_control: bool = True
    floor: bool = True
    runs: int = 1
    force: bool = False
    size: Optional[str] = None
    tp: int = 1
    gpus: Optional[int] = None
    figure: bool = True
    corpus: Optional[Corpus] = None  # set (experiment=corpus): run the corpus instead of a sweep


_store = ConfigStore.instance()  # registered on import: run.py, the tests and notebooks compose alike
_store.store(name="schema", node=Config)
_store.store(group="measure", name="schema", node=Measure)
