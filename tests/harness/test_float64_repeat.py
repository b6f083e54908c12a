import pytest
import torch

from scripts import float64_repeat


def _compile_as(perturb):
    """torch.compile replaced by eager, with `perturb` applied to the output."""
    def compile(target):
        def run(*args, **kwargs):
            out = target(*args, **kwargs)
            return perturb(out)
        return run
    return compile


def test_a_compiled_copy_that_computes_eagers_program_passes(monkeypatch):
    monkeypatch.setattr(torch, "compile", _compile_as(lambda out: out))
    got = float64_repeat.child("mlp", "eval", "tiny", "cpu", 0)
    assert got["passed"] and set(got["parts"]) == {"outputs at step 1", "outputs at step 2", "outputs at a rewound step"}


def test_a_one_percent_error_fails_every_step(monkeypatch):
    monkeypatch.setattr(torch, "compile", _compile_as(lambda out: out * 1.01))
    got = float64_repeat.child("mlp", "eval", "tiny", "cpu", 0)
    assert not got["passed"]
    assert all(abs(p["rel_err"] - 0.01) < 1e-9 for p in got["parts"].values())


def test_acronyms_and_bad_plans_are_named():
    assert float64_repeat.resolve("MTCG-I") == ("mt5", "eval")
    assert float64_repeat.resolve("mlp:train") == ("mlp", "train")
    for argv, says in ((["NOPE"], "unknown workload"), (["MTCG-I", "--plan", "hot"], "each run is cold or warm"),
                       (["MTCG-I", "--plan", "warm,cold"], "the first is cold")):
        with pytest.raises(SystemExit, match=says):
            float64_repeat.main(argv)
