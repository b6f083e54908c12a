import json

from experiments import corpus
from scripts import corpus_jobs


def test_jobs_lead_with_one_heavy_program_each_and_fill_with_light_ones():
    left = ["a", "hf/x", "b", "c", "torchvision/swin_t", "d", "hf/y"]
    assert corpus_jobs.jobs(left, 3) == [["hf/x", "a", "b"], ["torchvision/swin_t", "c", "d"], ["hf/y"]]
    assert corpus_jobs.jobs(["a", "b", "c"], 2) == [["a", "b"], ["c"]]


def test_only_programs_not_recorded_with_this_code_are_given_out(tmp_path, capsys):
    env, path = corpus.where(tmp_path)
    path.parent.mkdir(parents=True)
    first, second = list(corpus.PROGRAMS)[:2]
    stale = {"program": second, "env": {"code": "0" * 12, "corpus": env.corpus}}
    path.write_text(json.dumps({"program": first, "env": {"code": env.code, "corpus": env.corpus}}) + "\n"
                    + json.dumps(stale) + "\n")
    assert corpus_jobs.main(["--out", str(tmp_path), "--per-job", "1"]) == 0
    given = capsys.readouterr().out.strip().strip("[]").split("],[")
    assert first not in given and second in given and len(given) == len(corpus.PROGRAMS) - 1
