"""The numerics check can fail on every workload: each deliberately wrong variant (variants.MUTATIONS)
fails it, and eager passes, on the CPU at tiny size. The same runs on the H200 at full size through
`python -m experiments.mutation` (its records in results/mutation/)."""

import json

import pytest

from experiments import mutation, workloads
from experiments.variants import MUTATIONS

CASES = [(name, mode) for name in workloads.names() for mode in workloads.get(name).batch_sizes]


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", CASES)
def test_every_mutation_fails_the_check_and_eager_passes(name, mode):
    results = mutation.check(name, mode, "tiny", "cpu")
    assert results.pop("eager").passed
    assert set(results) == set(MUTATIONS) - ({"skip_update"} if mode == "eval" else set())
    for variant, n in results.items():
        assert not n.passed, (variant, n)
    perturbed = results["perturb"]  # 1 %: the float64 check catches it, whatever the compute dtype
    assert "in float64" in perturbed.part and perturbed.rel_err > 10 * perturbed.tolerance, perturbed


def test_the_runner_records_each_variant_and_resumes(tmp_path, capsys):
    assert mutation.main(["--size", "tiny", "--only", "mlp", "--out", str(tmp_path)]) == 0
    path = next(tmp_path.glob("*/records.jsonl"))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted((r["mode"], r["variant"], r["caught"]) for r in records) == [
        ("eval", "eager", None), ("eval", "perturb", True), ("eval", "stale_input", True),
        ("train", "eager", None), ("train", "perturb", True), ("train", "skip_update", True),
        ("train", "stale_input", True)]
    assert mutation.main(["--size", "tiny", "--only", "mlp", "--out", str(tmp_path)]) == 0
    assert len(path.read_text().splitlines()) == len(records)  # recorded with this code: passed over
    assert mutation.main(["--only", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown workload nope" in capsys.readouterr().err
