"""Run an experiment of the reproduction harness.

    python run.py experiment=smoke                                   # the main job
    python run.py -m experiment=full 'workload=ALNET,DLRM,EOS'       # a Hydra multirun: one job per workload
    python run.py -m experiment=full hydra/launcher=gpus gpus=4      # ... four side by side, one GPU each
    python run.py experiment=corpus 'corpus.programs=[timm/]'        # the corpus (experiments/corpus/)

Records are appended to results/<experiment_name>/<device>/records.jsonl; see conf/config.yaml.
"""

import logging
import re
import sys
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig

from experiments import config  # noqa: F401  (registers the config's schema)

log = logging.getLogger("run")
CONF = Path(__file__).resolve().parent / "conf"


def _models(group: str) -> dict[str, list[str]]:
    """Model ids (a workload's `name`) -> the conf/workload/ entries that run it."""
    if group != "workload":
        return {}
    models: dict[str, list[str]] = {}
    for path in sorted((CONF / group).glob("*.yaml")):
        found = re.search(r"^\s+name:\s*(\S+)", path.read_text(), re.M)
        if found:
            models.setdefault(found.group(1), []).append(path.stem)
    return models


def _overrides(args: list[str]) -> list | None:
    """The command line's overrides, parsed as Hydra parses them; None where they are malformed (Hydra
    reports those itself)."""
    try:
        return OverridesParser.create().parse_overrides([a for a in args if "=" in a and not a.startswith("-")])
    except HydraException:
        return None


def unknown_choice(args: list[str]) -> str | None:
    """One line naming the first unknown workload or variant on the command line, before Hydra's longer
    message: what is known is what conf/<group>/ holds."""
    if (overrides := _overrides(args)) is None:
        return None
    for o in overrides:
        if o.key_or_group not in ("workload", "variant"):
            continue
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else o.value()
        text = ",".join(map(str, values)) if isinstance(values, list) else str(values)  # sweep items may be "[a,b]"
        known = sorted(p.stem for p in (CONF / o.key_or_group).glob("*.yaml"))
        for name in re.findall(r"[^\[\],\s]+", text):
            if name not in known:
                runs = _models(o.key_or_group).get(name)
                hint = f" (the model of {', '.join(runs)}: use that)" if runs else f" (known: {', '.join(known)})"
                return f"error: unknown {o.key_or_group} {name!r}{hint}"
    return None


def refused_override(args: list[str]) -> str | None:
    """One line for the first override the config refuses (a value of the wrong type, a key it lacks),
    in place of Hydra's several: the config composed as a job's would be, once per value of a sweep."""
    if (overrides := _overrides(args)) is None:
        return None
    values = [[f"{o.input_line.split('=', 1)[0]}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
              else [o.input_line] for o in overrides if not o.key_or_group.startswith("hydra")]
    first = [v[0] for v in values]
    jobs = [first] + [first[:i] + [v] + first[i + 1:] for i, vs in enumerate(values) for v in vs[1:]]
    with initialize_config_dir(str(CONF), version_base="1.3"):
        for job in jobs:
            try:
                compose("config", overrides=job)
            except HydraException as e:
                why = [str(x).splitlines()[0].rstrip(".") for x in (e, e.__cause__) if x is not None and str(x)]
                return "error: " + ": ".join(why)
    return None


def run_corpus(cfg: DictConfig) -> None:
    from experiments import corpus, gpus

    from experiments.cores import timing_cores

    with gpus.one_of(cfg.gpus) as gpu:
        try:
            programs = corpus.select(list(cfg.corpus.programs), list(cfg.corpus.variants))
            cores = timing_cores(list(cfg.corpus.timing_cpus), gpu or 0, setting="corpus.timing_cpus")
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        path = corpus.run(programs, list(cfg.corpus.variants), Path(cfg.results_dir) / "corpus", cfg.force, cores)
    log.info("records: %s", path.resolve())


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    if cfg.corpus is not None:
        return run_corpus(cfg)
    from experiments import figures, gpus  # heavy (torch, pandas): after the config is known to be good
    from experiments.sweep import ConfigError, Sweep

    with gpus.one_of(cfg.gpus) as gpu:
        try:
            sweep = Sweep(cfg, gpu)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        try:
            path = sweep.run()
        except KeyboardInterrupt:
            print(f"interrupted: the records so far are in {sweep.store.path.resolve()}", file=sys.stderr)
            sys.exit(130)
    log.info("records: %s", path.resolve())
    if cfg.figure:
        out = figures.speedup_figure(sweep.store.load(), path.parent)
        log.info("figure: %s", out.resolve())


if __name__ == "__main__":
    if message := unknown_choice(sys.argv[1:]) or refused_override(sys.argv[1:]):
        print(message, file=sys.stderr)
        sys.exit(2)
    main()
