"""run.py as a user runs it: bad input gets one line and a non-zero exit, and touches no record."""

import hashlib
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # run.py in a process of its own, sweeps in workers


def _run(tmp_path, *args, multirun=False):
    return subprocess.run([sys.executable, "run.py", *(["-m"] if multirun else []), f"results_dir={tmp_path}",
                           "hydra.run.dir=" + str(tmp_path / "h"), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def recorded(tmp_path):
    path = tmp_path / "smoke" / "cpu" / "records.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"already": "recorded"}\n')
    return path


@pytest.mark.parametrize("args,message", [
    (["experiment=smoke", "workload=[mlp,nope]"], "error: unknown workload 'nope' (known: ALNET, BERT,"),
    (["experiment=smoke", "variant=eager,nope"], "error: unknown variant 'nope' (known: cgct, cgct_pi, eager,"),
    (["experiment=smoke", "workload=[mlp]", "workload.mlp.name=nope"], "error: workload 'mlp': unknown workload 'nope'"),
    (["experiment=smoke", "workload=[EOS]", "workload.EOS.mode=train"], "no train mode"),
    (["experiment=smoke", "measure.rounds=abc"],
     "error: Error merging override measure.rounds=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    (["-m", "experiment=smoke", "measure.rounds=3,abc"], "error: Error merging override measure.rounds=abc"),
    (["experiment=smoke", "measure.nosuch=1"], "error: Could not override 'measure.nosuch': Key 'nosuch' not in 'Measure'"),
    (["experiment=smoke", "workload=[alexnet]"], "error: unknown workload 'alexnet' (the model of ALNET: use that)"),
    (["experiment=smoke", "+variant.x.dynamo.no_such_setting=1"], "torch._dynamo.config has no setting 'no_such_setting'"),
    (["experiment=corpus", "corpus.programs=[nope/]"], "error: unknown program, family or variant ['nope/']"),
])
def test_bad_input(tmp_path, recorded, args, message):
    before = hashlib.sha256(recorded.read_bytes()).hexdigest()
    proc = _run(tmp_path, *args)
    assert proc.returncode != 0
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert hashlib.sha256(recorded.read_bytes()).hexdigest() == before


def test_main_job_writes_records_and_a_figure(tmp_path):
    proc = _run(tmp_path, "experiment=smoke", "workload=[mlp]", "workload.mlp.size=tiny", "variant=[eager,pt2_cg]",
                "measure.rounds=2", "measure.iters=2")
    assert proc.returncode == 0, proc.stderr
    device_dirs = list((tmp_path / "smoke").iterdir())
    assert len(device_dirs) == 1
    assert (device_dirs[0] / "records.jsonl").read_text().count("\n") == 2
    assert (device_dirs[0] / "speedup.png").stat().st_size > 0
    assert (device_dirs[0] / "speedup.csv").exists()


@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=gpus", "gpus=2"], ["hydra/launcher=submitit_local"]])
def test_multirun_runs_one_job_per_workload_through_hydras_launchers(tmp_path, launcher):
    """The basic launcher one job after another; joblib's two side by side (each holding one of two
    "GPUs"); submitit's local executor, as it runs a Slurm job."""
    proc = _run(tmp_path, "experiment=smoke", "workload=mlp,EOS,cpu_scalar", "size=tiny", "variant=[eager]",
                "measure.rounds=1", "measure.iters=2", "measure.warmup=1", "measure.profile_iters=1", "figure=false",
                f"hydra.sweep.dir={tmp_path / 'm'}", *launcher, multirun=True)
    assert proc.returncode == 0, proc.stderr
    lines = next((tmp_path / "smoke").iterdir()).joinpath("records.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert sorted(r["workload"] for r in records) == ["cpu_scalar", "eos_chain", "mlp"]
    assert len({r["session"] for r in records}) == 3 and {r["status"] for r in records} == {"ok"}


def test_the_corpus_runs_as_an_experiment(tmp_path):
    proc = _run(tmp_path, "experiment=corpus", "corpus.programs=[python_int_argument]",
                "corpus.variants=[eager,inductor]")
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "corpus" / "cpu" / "records.jsonl").read_text().splitlines()]
    assert [(r["program"], r["variant"], r["status"]) for r in records] == [
        ("python_int_argument", "eager", "ok"), ("python_int_argument", "inductor", "ok")]
    assert len(records[1]["iter_us"]) == 10 and all(len(r) == 5 for r in records[1]["iter_us"])
