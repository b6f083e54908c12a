import dataclasses

from experiments import environment
from experiments.records import Record, RecordStore
from scripts import suite_jobs


def test_a_call_takes_the_longest_that_fit_then_one_more_whose_end_does_not_matter():
    left = [("A", "full", 100.0), ("B", "full", 300.0), ("C", "full", 250.0), ("D", "full", None),
            ("E", "fig9", 50.0)]
    # B, then A (C no longer fits, E is of another set), then D, never measured, as the one more
    assert suite_jobs.pack(left, 450) == [("B", "full"), ("A", "full"), ("D", "full")]
    # with none never measured, the shortest left is the one more
    assert suite_jobs.pack(left[:3], 450) == [("B", "full"), ("A", "full"), ("C", "full")]


def test_with_none_that_fits_one_goes_alone_by_fig9_where_nothing_of_it_is_known():
    assert suite_jobs.pack([("A", "full", 900.0), ("D", "full", None)], 450) == [("D", "fig9")]
    assert suite_jobs.pack([("A", "fig10", 900.0)], 450) == [("A", "fig10")]


def _session(store, env, name, mode, variants, session, seconds, status="ok"):
    for v in variants:
        store.append(Record(experiment="full", session=session, run=0, workload=name, mode=mode, batch=1,
                            size="full", variant=v, status=status, workload_s=seconds, env=dataclasses.asdict(env)))


def test_only_workloads_not_measured_whole_with_this_code_are_given_out(tmp_path, monkeypatch, capsys):
    env = dataclasses.replace(environment.current(), device="cuda", gpu="GPU A")
    monkeypatch.setattr(suite_jobs.environment, "current", lambda: env)
    sets = {s: suite_jobs.variants(s, cuda=True) for s in suite_jobs.SETS}
    here = RecordStore(tmp_path / "gpu-a" / "records.jsonl")
    there = RecordStore(tmp_path / "gpu-b" / "records.jsonl")
    eos, alnet, dlrm = (suite_jobs.workload(n) for n in ("EOS", "ALNET", "DLRM"))
    _session(here, env, *eos, sets["full"], "s1", 60.0)  # measured whole: not given out
    _session(here, env, *alnet, sets["fig9"], "s2", 40.0)  # half of it: fig10 is left
    _session(here, dataclasses.replace(env, code="0" * 12), *dlrm, sets["full"], "s3", 80.0)  # another code
    _session(there, env, *dlrm, sets["full"], "s4", 40.0)  # 2x slower here than there, by DLRM alone
    _session(there, env, *alnet, sets["fig10"], "s5", 30.0)

    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    # DLRM's own session here: 80 s; ALNET's fig10 there: 30 s, so 60 s here, of another set; then the first
    # workload never measured
    assert capsys.readouterr().out.split()[:2] == ["full", "workload=DLRM,XLNET-I"]
    _session(here, env, *dlrm, sets["full"], "s6", 80.0)
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    call = capsys.readouterr().out.split()
    assert call[0] == "fig10" and call[1].startswith("workload=ALNET")
    assert "EOS" not in " ".join(call) and "DLRM" not in " ".join(call)
    # ALNET's fig10 is expected to take 60 s here: in 50 s it does not fit, and a workload never measured
    # goes alone by Fig 9's set
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "50"]) == 0
    assert capsys.readouterr().out.split() == ["fig9", "workload=XLNET-I"]


def test_a_set_stopped_here_is_expected_to_take_at_least_as_long_as_it_ran(tmp_path, monkeypatch, capsys):
    env = dataclasses.replace(environment.current(), device="cuda", gpu="GPU A")
    monkeypatch.setattr(suite_jobs.environment, "current", lambda: env)
    sets = {s: suite_jobs.variants(s, cuda=True) for s in suite_jobs.SETS}
    here = RecordStore(tmp_path / "gpu-a" / "records.jsonl")
    there = RecordStore(tmp_path / "gpu-b" / "records.jsonl")
    dgpt2 = suite_jobs.workload("DGPT2")
    _session(there, env, *dgpt2, sets["full"], "s1", 80.0)  # fits 100 s by the other machine's time
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["full", "workload=DGPT2,XLNET-I"]
    _session(here, env, *dgpt2, sets["full"], "s2", 110.0, status="interrupted")  # but ran 110 s here, cut
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    call = capsys.readouterr().out.split()
    assert call[0] == "fig9" and "DGPT2" not in call[1]  # by fig9, whose time nothing here tells
    # and the other machine's times scale by the most this one was slower: 110 / 80 (DGPT2), not 1 (DLRM)
    dlrm, eos = suite_jobs.workload("DLRM"), suite_jobs.workload("EOS")
    _session(here, env, *dlrm, sets["full"], "s3", 40.0)
    _session(there, env, *dlrm, sets["full"], "s4", 40.0)
    _session(there, env, *eos, sets["full"], "s5", 70.0)
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "100"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["full", "workload=EOS,XLNET-I"]  # 96 s
    assert suite_jobs.main(["--results", str(tmp_path), "--seconds", "90"]) == 0
    assert "EOS" not in capsys.readouterr().out
