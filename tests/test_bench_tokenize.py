"""scripts/bench_tokenize.py: it builds the corpus it says, and the packed split and encode_batch agree token for
token (the script checks it) before any time is printed."""

import datasets

from scripts import bench_tokenize


def test_small_corpus_timed_both_ways(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", datasets.config.HF_DATASETS_CACHE)  # it sets its own
    bench_tokenize.main(["--megabytes", "0.3", "--num_proc", "1", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("corpus: 0 MB, ") and "usable cores" in lines[1]
    assert lines[2].startswith("encode_batch alone: ")
    assert [line.split(":")[0] for line in lines[3:]] == ["prepare_split, num_proc 1", "prepare_split, num_proc 2"]
    assert all(line.endswith("x encode_batch's time") for line in lines[3:])
