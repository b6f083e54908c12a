import logging

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
    assert got["passed"] and set(got["parts"]) == {f"outputs at {w}" for w in ("step 1", "step 2", "a rewound step",
                                                                             "rewound again")}
    assert got["repeats_step_1"] == {"a rewound step": True, "rewound again": True} and got["off"] == {}


def test_a_one_percent_error_fails_every_step(monkeypatch):
    monkeypatch.setattr(torch, "compile", _compile_as(lambda out: out * 1.01))
    got = float64_repeat.child("mlp", "eval", "tiny", "cpu", 0)
    assert not got["passed"]
    assert all(abs(p["rel_err"] - 0.01) < 1e-9 for p in got["parts"].values())
    assert all(leaf["off_rows"]["count"] == leaf["off_rows"]["of"] for off in got["off"].values() for leaf in off)


def test_an_error_in_one_row_is_located_there(monkeypatch):
    def second_row_off(out):
        out = out.clone()
        out[1] += 1.0
        return out
    monkeypatch.setattr(torch, "compile", _compile_as(second_row_off))
    got = float64_repeat.child("mlp", "eval", "tiny", "cpu", 0)
    (leaf,) = got["off"]["outputs at step 1"]
    assert leaf["off_rows"]["count"] == 1 and leaf["off_rows"]["first"] == [1]
    assert leaf["off_columns"]["count"] == leaf["off_columns"]["of"]


def test_a_program_that_computes_otherwise_each_run_does_not_repeat_step_1(monkeypatch):
    calls = iter(range(100))
    monkeypatch.setattr(torch, "compile", _compile_as(lambda out: out * (1 + next(calls) * 1e-3)))
    got = float64_repeat.child("mlp", "eval", "tiny", "cpu", 0)
    assert got["repeats_step_1"] == {"a rewound step": False, "rewound again": False}


def test_the_autotuners_choices_are_collected_from_its_debug_line():
    chosen = float64_repeat._Chosen()
    log = logging.getLogger("torch._inductor.runtime.triton_heuristics")
    log.addHandler(chosen)
    log.setLevel(logging.DEBUG)
    try:
        log.debug("Best config for %s: %s: %f, nreg %d, nspill %d, #shared-mem %s", "triton_red_0", "XBLOCK: 1",
                  0.1, 32, 0, 0)
        log.debug("something else %s", "x")
    finally:
        log.removeHandler(chosen)
        log.setLevel(logging.NOTSET)
    assert chosen.configs == {"triton_red_0": "XBLOCK: 1"}


def test_acronyms_and_bad_plans_are_named():
    assert float64_repeat.resolve("MTCG-I") == ("mt5", "eval")
    assert float64_repeat.resolve("mlp:train") == ("mlp", "train")
    for argv, says in ((["NOPE"], "unknown workload"), (["MTCG-I", "--plan", "hot"], "each run is cold or warm"),
                       (["MTCG-I", "--plan", "cold:fast"], "each run is cold or warm"),
                       (["MTCG-I", "--plan", "warm,cold"], "the first is cold")):
        with pytest.raises(SystemExit, match=says):
            float64_repeat.main(argv)


def test_a_deterministic_run_turns_on_pytorchs_and_inductors_deterministic_modes(monkeypatch):
    monkeypatch.setattr(torch, "compile", _compile_as(lambda out: out))
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch._inductor.config.deterministic)
    try:
        got = float64_repeat.child("mlp", "eval", "tiny", "cpu", 0, deterministic=True)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch._inductor.config.deterministic = before[2]
    assert got["passed"] and got["deterministic"] == {"algorithms": True, "inductor": True}
