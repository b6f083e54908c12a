import dataclasses

import pytest

from experiments import environment
from experiments.records import Record, RecordStore
from scripts import suite_jobs


@pytest.fixture(autouse=True)
def exact(monkeypatch):
    """Sessions planned by their times alone, without the margin and the job's own seconds (tested apart)."""
    monkeypatch.setattr(suite_jobs, "MARGIN", 1.0)
    monkeypatch.setattr(suite_jobs, "SESSION_S", 0.0)


def test_a_call_takes_the_longest_that_fit_then_one_never_measured():
    left = [("A", "full", 100.0), ("B", "full", 300.0), ("C", "full", 250.0), ("D", "full", None),
            ("E", "fig9", 50.0)]
    # B, then A (C no longer fits, E is of another set), then D, never measured, whose end does not matter
    assert suite_jobs.pack(left, 450) == [("B", "full"), ("A", "full"), ("D", "full")]
    # one known not to fit is never sent: the call ends early and keeps its device time
    assert suite_jobs.pack(left[:3], 450) == [("B", "full"), ("A", "full")]
    assert suite_jobs.pack([("A", "fig10", 900.0)], 450) == []
    # with none that fits, the first of unknown length alone
    assert suite_jobs.pack([("A", "full", 900.0), ("D", "fig9", None)], 450) == [("D", "fig9")]
    # with `fit` (device_run.sh suite asks again with the time left), only those that fit
    assert suite_jobs.pack(left, 450, fit=True) == [("B", "full"), ("A", "full")]
    assert suite_jobs.pack([("A", "full", 900.0), ("D", "fig9", None)], 450, fit=True) == []


def test_a_workload_goes_whole_then_by_fig9_then_by_the_ablation_whole_then_in_parts():
    full, fig9 = suite_jobs.own("full"), suite_jobs.own("fig9")
    ablation = [v for v in suite_jobs.own("fig10") if v not in suite_jobs.ANCHORS]
    # on CUDA a session has the A/A control and the floor too: full 10 workers, fig9 5, fig10 9
    assert suite_jobs.next_session(full, 50.0, 500, cuda=True) == ("full", full)
    assert suite_jobs.next_session(full, 51.0, 500, cuda=True) == ("fig9", fig9)
    assert suite_jobs.next_session(full, None, 500, cuda=True) == ("full", full)  # nothing known: whole
    assert suite_jobs.next_session(ablation, 55.0, 500, cuda=True)[0] == "fig10"
    # 90 s a worker: the anchors, the A/A control, the floor and one ablation variant (450 s), a part
    part = suite_jobs.next_session(ablation, 90.0, 500, cuda=True)
    assert part == (f"fig10 variant=[inductor,grace,{ablation[0]}]", ["inductor", "grace", ablation[0]])
    assert suite_jobs.next_session(ablation[3:], 70.0, 500, cuda=True)[1] == ["inductor", "grace", *ablation[3:]]
    assert suite_jobs.next_session(full, 101.0, 500, cuda=True) is None  # not even fig9's five workers fit


def _session(store, env, name, mode, variants, session, seconds, status="ok"):
    for v in variants:
        store.append(Record(experiment="full", session=session, run=0, workload=name, mode=mode, batch=1,
                            size="full", variant=v, status=status, workload_s=seconds, env=dataclasses.asdict(env)))


@pytest.fixture
def gpu(tmp_path, monkeypatch):
    """This machine as a CUDA one, "GPU A", and the records of it and of another, "GPU B"."""
    env = dataclasses.replace(environment.current(), device="cuda", gpu="GPU A")
    monkeypatch.setattr(suite_jobs.environment, "current", lambda: env)
    return env, RecordStore(tmp_path / "gpu-a" / "records.jsonl"), RecordStore(tmp_path / "gpu-b" / "records.jsonl")


def _sets(cuda=True):
    extra = ["inductor_aa", "floor"] if cuda else ["inductor_aa"]
    return {s: [*suite_jobs.own(s), *extra] for s in ("full", "fig9", "fig10")}


def test_only_workloads_not_measured_whole_with_this_code_are_given_out(tmp_path, gpu, capsys):
    env, here, there = gpu
    sets = _sets()
    eos, alnet, dlrm = (suite_jobs.workload(n) for n in ("EOS", "ALNET", "DLRM"))
    _session(here, env, *eos, sets["full"], "s1", 60.0)  # measured whole: not given out
    _session(here, env, *alnet, sets["fig9"], "s2", 40.0)  # half of it: the ablation is left, 8 s a worker
    _session(here, dataclasses.replace(env, code="0" * 12), *dlrm, sets["full"], "s3", 80.0)  # another code
    _session(there, env, *dlrm, sets["full"], "s4", 40.0)  # 2x slower here than there, by DLRM alone
    _session(there, env, *alnet, sets["fig10"], "s5", 30.0)

    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    # DLRM's own session here: 80 s; ALNET's fig10, 9 workers at 8 s, is of other arguments; then the first
    # workload never measured
    assert capsys.readouterr().out.split()[:2] == ["full", "workload=DLRM,XLNET-I"]
    _session(here, env, *dlrm, sets["full"], "s6", 80.0)
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    call = capsys.readouterr().out.split()
    assert call[0] == "fig10" and call[1].startswith("workload=ALNET")
    assert "EOS" not in " ".join(call) and "DLRM" not in " ".join(call)
    # in 45 s ALNET's ablation goes in parts: the anchors, A/A, floor and one variant, 40 s
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "45"]) == 0
    assert capsys.readouterr().out.split()[:3] == ["fig10", "workload=ALNET", "variant=[inductor,grace,runtime]"]
    # that part measured, the next part takes the next variant
    _session(here, env, *alnet, ["inductor", "grace", "runtime", "inductor_aa", "floor"], "s7", 40.0)
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "45"]) == 0
    assert capsys.readouterr().out.split()[:3] == ["fig10", "workload=ALNET", "variant=[inductor,grace,cgct]"]


def test_a_part_counts_only_in_a_session_with_the_anchors(gpu):
    env, here, _ = gpu
    eos = suite_jobs.workload("EOS")
    _session(here, env, *eos, _sets()["fig9"], "s1", 25.0)
    _session(here, env, *eos, ["inductor", "runtime", "inductor_aa", "floor"], "s2", 20.0)  # without grace
    measured = suite_jobs.measured(here.load(), here.final_keys(code=env.code), here.latest(), eos, cuda=True)
    assert measured == {"pt2_cg", "grace"}  # runtime and the baseline's newest are of the session without grace


def test_a_workload_stopped_here_is_expected_to_take_at_least_as_long_as_it_ran(tmp_path, gpu, capsys):
    env, here, there = gpu
    sets = _sets()
    dgpt2 = suite_jobs.workload("DGPT2")
    _session(there, env, *dgpt2, sets["full"], "s1", 80.0)  # fits 100 s by the other machine's time
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["full", "workload=DGPT2,XLNET-I"]
    _session(here, env, *dgpt2, sets["full"], "s2", 110.0, status="interrupted")  # but ran 110 s here, cut
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    call = capsys.readouterr().out.split()
    assert call[:2] == ["fig9", "workload=DGPT2"]  # 11 s a worker: fig9's five fit, not the whole ten
    # and the other machine's times scale by the most this one was slower: 110 / 80 (DGPT2), not 1 (DLRM)
    dlrm, eos = suite_jobs.workload("DLRM"), suite_jobs.workload("EOS")
    _session(here, env, *dlrm, sets["full"], "s3", 40.0)
    _session(there, env, *dlrm, sets["full"], "s4", 40.0)
    _session(there, env, *eos, sets["full"], "s5", 70.0)  # 96 s here: whole in 100 s, by fig9 in 48 s
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["full", "workload=EOS,XLNET-I"]
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "90"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["fig9", "workload=DGPT2"]  # EOS's 48 s do not fit after it


def test_a_workload_stopped_just_short_of_a_calls_end_is_split_not_planned_whole_again(tmp_path, gpu, capsys):
    env, here, _ = gpu
    dgpt2 = suite_jobs.workload("DGPT2")
    _session(here, env, *dgpt2, _sets()["full"], "s1", 95.0, status="interrupted")  # needed more than 95 s
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100", "--fit"]) == 0
    assert capsys.readouterr().out.split() == ["fig9", "workload=DGPT2"]


def test_one_too_long_only_by_another_machines_time_is_tried_by_fig9_when_nothing_else_fits(
        tmp_path, gpu, capsys):
    env, here, there = gpu
    vm = suite_jobs.workload("VM")
    _session(there, env, *vm, _sets()["full"], "s1", 1000.0)  # 100 s a worker: fig9's five need 500 s
    names = suite_jobs.OmegaConf.load(suite_jobs.REPO / "conf/experiment/full.yaml").hydra.sweeper.params.workload
    for name in names.split(","):  # every other workload measured whole here
        if name != "VM":
            _session(here, env, *suite_jobs.workload(name), _sets()["full"], f"h-{name}", 10.0)
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    assert capsys.readouterr().out.split() == ["fig9", "workload=VM"]
    # stopped here after 150 s of ten workers: at least 15 s a worker (18.75 planned), so fig9's five may fit;
    # by the other machine's time, as fast as this one on DLRM, 100 s a worker: not even fig9 fits (DALLE2 on
    # the H200: 55 s a worker where it ran, 115 by the H100's time scaled by the most the H200 was slower)
    _session(there, env, *suite_jobs.workload("DLRM"), _sets()["full"], "s-dlrm", 10.0)
    _session(here, env, *vm, _sets()["full"], "s2", 150.0, status="interrupted")
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    assert capsys.readouterr().out.split() == ["fig9", "workload=VM"]
    _session(here, env, *vm, _sets()["fig9"], "s3", 100.0, status="interrupted")  # too long here: left out
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 1
    assert "VM: no session of it fits" in capsys.readouterr().err


def test_what_is_left_of_a_call_does_not_split_a_workload_that_a_whole_call_holds(tmp_path, gpu, capsys):
    env, here, _ = gpu
    alnet = suite_jobs.workload("ALNET")
    _session(here, env, *alnet, ["inductor", "inductor_aa", "floor"], "s1", 30.0)  # 10 s a worker
    # 60 s left of a 540 s call: the whole session (100 s) waits for a call of its own, not split to fit
    assert suite_jobs.main(["--results", str(tmp_path), "--call", "540", "--seconds", "60", "--fit"]) == 1
    assert suite_jobs.main(["--results", str(tmp_path), "--call", "540", "--seconds", "100", "--fit"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["full", "workload=ALNET"]


def test_a_workloads_own_sessions_here_count_whatever_their_code(tmp_path, gpu, capsys):
    env, here, there = gpu
    older = dataclasses.replace(env, code="0" * 12)
    sets = _sets()
    dlrm, eos = suite_jobs.workload("DLRM"), suite_jobs.workload("EOS")
    _session(there, env, *eos, sets["full"], "s1", 50.0)
    _session(here, older, *eos, sets["full"], "s2", 300.0, status="interrupted")  # 30 s a worker, cut
    newer = dataclasses.replace(env, code="1" * 12)  # a newer code than the 0s, not yet this one
    _session(here, newer, *dlrm, sets["full"], "s3", 40.0)  # here as fast as there
    _session(there, env, *dlrm, sets["full"], "s4", 40.0)
    # a code change here does not forget EOS's stopped session: 300 s of it, at least, is never sent
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100", "--fit"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["full", "workload=DLRM"]
    # a whole session of EOS since, of any code, replaces both its stopped one and the other machine's
    _session(here, older, *eos, sets["full"], "s5", 60.0)
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100", "--fit"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["full", "workload=EOS,DLRM"]  # 60 s and 40 s
    # and a session stopped after that counts again, the latest one, a quarter longer
    _session(here, newer, *eos, sets["full"], "s6", 70.0, status="interrupted")
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100", "--fit"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["full", "workload=EOS"]  # 87.5 s: DLRM no longer fits


def test_a_workload_is_planned_by_its_longest_whole_session_not_its_latest(tmp_path, gpu, capsys):
    """One workload's sessions on one machine took up to twice as long as another of its sessions: planned by
    the latest, DLRM was sent into 100 s twice and stopped both times."""
    env, here, _ = gpu
    older, old = dataclasses.replace(env, code="0" * 12), dataclasses.replace(env, code="1" * 12)
    dlrm = suite_jobs.workload("DLRM")
    _session(here, older, *dlrm, _sets()["full"], "s1", 137.0)
    _session(here, old, *dlrm, _sets()["full"], "s2", 72.0)
    names = suite_jobs.OmegaConf.load(suite_jobs.REPO / "conf/experiment/full.yaml").hydra.sweeper.params.workload
    for name in names.split(","):  # every other workload measured whole with this code
        if name != "DLRM":
            _session(here, env, *suite_jobs.workload(name), _sets()["full"], f"h-{name}", 10.0)
    _session(here, old, *dlrm, _sets()["fig9"], "s3", 100.0)  # 20 s a worker, but five share the reference
    assert suite_jobs.per_worker(here.load())[0][dlrm] == pytest.approx(13.7)
    assert suite_jobs.main(["--results", str(tmp_path), "--call", "540", "--seconds", "100", "--fit"]) == 1
    assert suite_jobs.main(["--results", str(tmp_path), "--call", "540", "--seconds", "140", "--fit"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["full", "workload=DLRM"]


def test_a_session_from_before_the_aa_control_does_not_count(tmp_path, gpu, capsys):
    env, here, there = gpu
    dgpt2 = suite_jobs.workload("DGPT2")
    # 80 s by a session without the A/A control (and so without float64 checks): not a time to plan by
    _session(there, env, *dgpt2, suite_jobs.own("full"), "s1", 80.0)
    assert suite_jobs.per_worker(there.load()) == ({}, {})
    _session(there, env, *dgpt2, _sets()["full"], "s2", 500.0)  # 50 s a worker, with it
    assert suite_jobs.per_worker(there.load())[0] == {dgpt2: 50.0}


def test_a_session_whose_aa_control_missed_3_percent_is_measured_once_more(tmp_path, gpu, capsys):
    env, here, _ = gpu
    names = suite_jobs.OmegaConf.load(suite_jobs.REPO / "conf/experiment/full.yaml").hydra.sweeper.params.workload
    for name in names.split(","):  # every workload measured whole here, 10 s a worker
        _session(here, env, *suite_jobs.workload(name), _sets()["full"], f"h-{name}", 100.0)

    def control(name, session, ci):
        key = suite_jobs.workload(name)
        here.append(Record(experiment="full", session=session, run=0, workload=key[0], mode=key[1], batch=1,
                           size="full", variant="inductor_aa", status="ok", workload_s=100.0, speedup_ci=ci,
                           env=dataclasses.asdict(env)))
    control("DLRM", "h-DLRM", [0.99, 1.02])  # within 3 %: it stands
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "500"]) == 1
    capsys.readouterr()
    control("EOS", "h-EOS", [1.01, 1.44])  # missed it: once more, forced past what is recorded
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "500"]) == 0
    assert capsys.readouterr().out.split() == ["full", "workload=EOS", "force=true"]
    control("EOS", "a-EOS", [0.90, 1.05])  # the second session with the control stands, whatever it says
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "500"]) == 1


def test_a_session_is_planned_with_a_margin_and_its_jobs_own_seconds(tmp_path, gpu, capsys, monkeypatch):
    """distilgpt2_dynamic, planned by its one whole session on an H100 (209.6 s), took 250 s and 35 s more for
    its job, and the workload after it was stopped; MTCG-T's Fig 9 set, planned at 406 s in 420, was stopped
    at its last worker."""
    monkeypatch.setattr(suite_jobs, "MARGIN", 1.25)
    monkeypatch.setattr(suite_jobs, "SESSION_S", 40.0)
    env, here, _ = gpu
    names = suite_jobs.OmegaConf.load(suite_jobs.REPO / "conf/experiment/full.yaml").hydra.sweeper.params.workload
    for name in names.split(","):  # every other workload measured whole with this code
        if name not in ("DLRM", "EOS"):
            _session(here, env, *suite_jobs.workload(name), _sets()["full"], f"h-{name}", 10.0)
    older = dataclasses.replace(env, code="0" * 12)
    _session(here, older, *suite_jobs.workload("DLRM"), _sets()["full"], "s1", 200.0)  # 20 s a worker
    _session(here, older, *suite_jobs.workload("EOS"), _sets()["full"], "s2", 40.0)  # 4 s a worker
    # DLRM needs 10 x 20 x 1.25 + 40 = 290 s, EOS 10 x 4 x 1.25 + 40 = 90 s
    for seconds, call in ((289, "workload=EOS"), (290, "workload=DLRM"), (380, "workload=DLRM,EOS")):
        assert suite_jobs.main(["--results", str(tmp_path), "--call", "540", "--seconds", str(seconds), "--fit"]) == 0
        assert capsys.readouterr().out.split()[:2] == ["full", call]
    assert suite_jobs.main(["--results", str(tmp_path), "--call", "540", "--seconds", "89", "--fit"]) == 1
    # in a call of 280 s, DLRM's ten workers do not fit, Fig 9's five do (165 s)
    assert suite_jobs.main(["--results", str(tmp_path), "--call", "280", "--seconds", "280", "--fit"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["fig9", "workload=DLRM"]
