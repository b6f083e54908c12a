import json

from scripts import take_records


def _line(gpu, n):
    return json.dumps({"env": {"gpu": gpu}, "n": n}) + "\n"


def test_a_returned_file_replaces_the_committed_one_only_when_it_extends_it(tmp_path, capsys):
    results, back = tmp_path / "results", tmp_path / "back"
    committed = results / "full" / "nvidia-h100-80gb-hbm3" / "records.jsonl"
    committed.parent.mkdir(parents=True)
    committed.write_text(_line("NVIDIA H100 80GB HBM3", 0))
    back.mkdir()
    (back / "full_records.jsonl").write_text(_line("NVIDIA H100 80GB HBM3", 0) + _line("NVIDIA H100 80GB HBM3", 1))
    (back / "corpus_records.jsonl").write_text(_line("NVIDIA H200", 0))  # a folder of its own, new
    assert take_records.main([str(back), "--results", str(results)]) == 0
    assert committed.read_text().count("\n") == 2
    assert (results / "corpus" / "nvidia-h200" / "records.jsonl").exists()
    assert "1 records added" in capsys.readouterr().out

    (back / "full_records.jsonl").write_text(_line("NVIDIA H100 80GB HBM3", 9))  # would lose two records
    assert take_records.main([str(back), "--results", str(results)]) == 1
    assert committed.read_text().count("\n") == 2
    assert "does not extend" in capsys.readouterr().err
