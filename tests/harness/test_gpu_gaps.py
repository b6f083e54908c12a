import pytest

from scripts import gpu_gaps


def _mark(ts, dur):
    return {"name": gpu_gaps.MARK, "cat": "user_annotation", "ts": ts, "dur": dur}


def test_an_iteration_splits_into_lead_busy_idle_and_tail():
    events = [_mark(0, 100),
              {"cat": "kernel", "name": "copy", "ts": 10, "dur": 20},
              {"cat": "gpu_memcpy", "ts": 25, "dur": 10},  # overlaps the copy: busy 10-35
              {"cat": "kernel", "ts": 60, "dur": 30},  # a 25 us gap before it
              {"cat": "kernel", "ts": 150, "dur": 5},  # after the mark: another iteration's
              {"cat": "python_function", "name": "held_output", "ts": 36, "dur": 20},
              {"cat": "python_function", "name": "guards", "ts": 2, "dur": 6},  # inside the lead
              {"cat": "python_function", "name": "step", "ts": 5, "dur": 80}]  # not wholly inside the gap
    (it,) = gpu_gaps.iterations(events)
    assert (it["lead"], it["busy"], it["idle"], it["long idle"], it["tail"]) == (10, 55, 25, 25, 10)
    assert it["gaps"] == [(35, 60)]
    assert gpu_gaps.inside(events, it["gaps"][0]) == [(20, "held_output")]
    assert it["first"] == "copy"
    shown = gpu_gaps.report("grace", events, events)
    assert "lead 10 us" in shown and "first device activity: copy." in shown
    assert "- 10 lead: guards 6" in shown and "- 25 at +35: held_output 20" in shown


def test_a_workload_builds_as_a_worker_builds_it():
    task, fn = gpu_gaps.build("EOS", "eager", device="cpu")
    assert task.step(fn) is not None


def test_no_gpu_is_a_one_line_error(capsys):
    if gpu_gaps.torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert gpu_gaps.main(["EOS", "eager"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
