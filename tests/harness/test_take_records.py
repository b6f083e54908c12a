import gzip
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


def test_calls_taken_after_one_another_each_add_their_own_records(tmp_path):
    results, first, second = tmp_path / "results", tmp_path / "1", tmp_path / "2"
    committed = results / "full" / "nvidia-h100-80gb-hbm3" / "records.jsonl"
    committed.parent.mkdir(parents=True)
    h100 = "NVIDIA H100 80GB HBM3"
    committed.write_text(_line(h100, 0))
    for folder, n in ((first, 1), (second, 2)):  # both sent with the committed file as it was
        folder.mkdir()
        (folder / "full_records.jsonl").write_text(_line(h100, 0) + _line(h100, n))
    assert take_records.main([str(first), "--results", str(results)]) == 0
    assert take_records.main([str(second), "--results", str(results)]) == 0
    assert take_records.main([str(second), "--results", str(results)]) == 0  # again: nothing to add
    assert [json.loads(x)["n"] for x in committed.read_text().splitlines()] == [0, 1, 2]

    (second / "full_records.jsonl").write_text(_line(h100, 0) + _line(h100, 5) + _line(h100, 2))  # a rewrite
    assert take_records.main([str(second), "--results", str(results)]) == 1
    assert committed.read_text().count("\n") == 3


def test_a_gzipped_file_is_taken_as_its_records_and_a_broken_one_is_left_alone(tmp_path, capsys):
    results, back = tmp_path / "results", tmp_path / "back"
    committed = results / "full" / "nvidia-h100-80gb-hbm3" / "records.jsonl"
    committed.parent.mkdir(parents=True)
    h100 = "NVIDIA H100 80GB HBM3"
    committed.write_text(_line(h100, 0))
    back.mkdir()
    returned = back / "full_records.jsonl.gz"
    returned.write_bytes(gzip.compress((_line(h100, 0) + _line(h100, 1)).encode()))
    assert take_records.main([str(back), "--results", str(results)]) == 0
    assert [json.loads(x)["n"] for x in committed.read_text().splitlines()] == [0, 1]

    returned.write_bytes(gzip.compress((_line(h100, 0) + _line(h100, 1) + _line(h100, 2)).encode())[:-9])  # cut short
    assert take_records.main([str(back), "--results", str(results)]) == 1
    assert committed.read_text().count("\n") == 2
    assert "take_records:" in capsys.readouterr().err
