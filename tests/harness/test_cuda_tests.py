import json

import pytest

from experiments import cuda_tests


def test_counts_read_pytests_last_line():
    assert cuda_tests.counts("1 failed, 27 passed, 2 skipped, 271 deselected in 221.93s") == {
        "passed": 27, "failed": 1, "skipped": 2}
    assert cuda_tests.counts("3 passed, 1 error in 2s")["failed"] == 1


def test_a_recorded_run_makes_the_status_line(tmp_path):
    log, runs = tmp_path / "cuda.log", tmp_path / "runs.jsonl"
    log.write_text("..F.\nFAILED tests/x.py::test_y\n===== 1 failed, 3 passed, 1 skipped in 5.0s =====\n")
    entry = cuda_tests.record(log, "HEAD", "NVIDIA H200, driver 1", "2.11.0", runs)
    assert (entry["passed"], entry["failed"], entry["grace_tree"]) == (3, 1, cuda_tests.grace_tree("HEAD"))
    assert json.loads(runs.read_text()) == entry
    line = cuda_tests.status(runs)
    assert "NVIDIA H200" in line and "1 failed" in line and "grace/ is unchanged since" in line
    assert cuda_tests.status(tmp_path / "none.jsonl") == "CUDA tests: never run on a GPU.\n"
    assert entry["command"] == cuda_tests.COMMAND
    other = cuda_tests.record(log, "HEAD", "gpu", "t", runs, command="pytest -m cuda tests/harness")
    assert json.loads(runs.read_text().splitlines()[1])["command"] == other["command"] == "pytest -m cuda tests/harness"


def test_a_run_stopped_before_the_end_is_not_called_passed(tmp_path):
    log, runs = tmp_path / "cuda.log", tmp_path / "runs.jsonl"
    log.write_text("....\n===== 4 passed in 5.0s =====\n")
    cuda_tests.record(log, "HEAD", "NVIDIA H200, driver 1", "2.11.0", runs)
    log.write_text("..\n!!!!! KeyboardInterrupt !!!!!\n===== 2 passed, 1 skipped in 9.0s =====\n")
    entry = cuda_tests.record(log, "HEAD", "NVIDIA H200, driver 1", "2.11.0", runs)
    assert entry["interrupted"] and entry["passed"] == 2
    line = cuda_tests.status(runs)
    assert line.startswith("CUDA tests on NVIDIA H200 (torch 2.11.0): interrupted before the end (2 passed,")
    assert "; the last run to the end: passed (4 passed, 0 failed, 0 skipped)" in line


def test_a_log_without_a_summary_is_refused(tmp_path):
    log = tmp_path / "cuda.log"
    log.write_text("collecting ...\nKilled\n")
    with pytest.raises(ValueError, match="no pytest summary"):
        cuda_tests.record(log, "HEAD", "gpu", "t", tmp_path / "runs.jsonl")
