"""Where a record was measured: the code it ran is named by its files, not by the commit."""

from importlib import metadata

from experiments import environment


def test_the_code_hash_follows_the_code_and_not_the_records(tmp_path, monkeypatch):
    for folder in environment.CODE:
        (tmp_path / folder).mkdir()
    (tmp_path / "grace" / "runtime.py").write_text("x = 1\n")
    (tmp_path / "conf" / "variant.yaml").write_text("pi: true\n")
    monkeypatch.setattr(environment, "REPO", tmp_path)
    before = environment.code_hash()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "records.jsonl").write_text("{}\n")  # records, committed or not: the same code
    (tmp_path / "grace" / "runtime.cpython-311.pyc").write_bytes(b"\0")
    assert environment.code_hash() == before
    (tmp_path / "conf" / "variant.yaml").write_text("pi: false\n")  # a variant that means another thing
    assert environment.code_hash() != before
    (tmp_path / "conf" / "variant.yaml").write_text("pi: true\n")
    (tmp_path / "experiments" / "figures.py").write_text("a figure's fix\n")  # reads records: the same code
    assert environment.code_hash() == before
    (tmp_path / "grace" / "runtime.py").rename(tmp_path / "grace" / "recording.py")  # the same bytes, moved
    assert environment.code_hash() != before


def test_a_corpus_fix_leaves_the_suites_code_and_moves_the_corpuss(tmp_path, monkeypatch):
    for folder in environment.CODE:
        (tmp_path / folder).mkdir()
    (tmp_path / "grace" / "runtime.py").write_text("x = 1\n")
    (tmp_path / "experiments" / "corpus").mkdir()
    (tmp_path / "experiments" / "corpus" / "hazards.py").write_text("programs = 1\n")
    (tmp_path / "experiments" / "corpus_like.py").write_text("suite = 1\n")  # a name that only starts alike
    monkeypatch.setattr(environment, "REPO", tmp_path)

    def corpus():
        return environment.code_hash(environment.CORPUS, leave_out=())

    suite, own = environment.code_hash(), corpus()
    (tmp_path / "experiments" / "corpus" / "hazards.py").write_text("programs = 2\n")
    assert environment.code_hash() == suite and corpus() != own
    (tmp_path / "experiments" / "corpus_like.py").write_text("suite = 2\n")
    assert environment.code_hash() != suite


def test_every_record_names_the_code_it_ran():
    env = environment.current()
    assert env.code == environment.code_hash() and len(env.code) == 12


def test_every_record_names_the_versions_of_the_libraries_its_models_come_from():
    assert environment.current().libraries["transformers"] == metadata.version("transformers")
