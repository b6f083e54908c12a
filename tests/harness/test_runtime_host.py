import pytest

from scripts import runtime_host


def test_the_runtime_host_cost_of_a_workload_is_split_by_recording(capsys):
    assert runtime_host.main(["EOS", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "the runtime's calls cost" in out
    assert "| held_output |" in out and "| replay |" in out


def test_config_entries_of_a_workload_that_has_none_are_one_clear_error():
    with pytest.raises(SystemExit, match="EOS is not a HuggingFace workload"):
        runtime_host.main(["EOS", "--hf", "vocab_size=8"])
