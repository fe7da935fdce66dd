"""scripts/train_tokenizer.py: where it writes and what it refuses to overwrite, and bad input or a failed save in
one line, leaving what was there."""

from pathlib import Path

import pytest

from common.cli import UserError, run_cli
from data import DEFAULT_TOKENIZER_DIR, load_tokenizer
from scripts import train_tokenizer as script


def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, capsys):
    out_dir = tmp_path / "out"
    for bad in (["--data_path", str(tmp_path / "missing.jsonl")], ["--vocab_size", "100"]):
        with pytest.raises(SystemExit) as stopped:
            run_cli(lambda bad=bad: script.main([*bad, "--out_dir", str(out_dir)]))
        stderr = capsys.readouterr().err
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert stopped.value.code != 0 and len(errors) == 1 and "Traceback" not in stderr
        assert not out_dir.exists()


def test_an_unwritable_out_dir_is_refused_before_training(tmp_path, tiny_corpus, monkeypatch):
    monkeypatch.setattr(script, "train_tokenizer", lambda *a: pytest.fail("trained first"))
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=f"--out_dir {tmp_path / 'file' / 'tok'} is not writable"):
        script.main(["--data_path", tiny_corpus, "--out_dir", str(tmp_path / "file" / "tok")])


def test_a_failed_save_is_one_line_and_leaves_the_old_files(tmp_path, tiny_corpus, monkeypatch):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "tokenizer.json").write_text("old")

    def full_disk(tokenizer, path):
        (Path(path) / "tokenizer.json").write_text("half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(script, "save_tokenizer", full_disk)
    with pytest.raises(UserError, match="cannot write the tokenizer in .*No space left on device"):
        script.main(["--data_path", tiny_corpus, "--vocab_size", "300", "--out_dir", str(out), "--overwrite"])
    assert [(p.name, p.read_text()) for p in out.iterdir()] == [("tokenizer.json", "old")]


def test_writes_a_new_folder_and_replaces_one_only_when_told(tmp_path, tiny_corpus, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    destinations = []
    with monkeypatch.context() as patch:  # where the default goes, written nowhere (it was the shipped folder)
        patch.setattr(script, "save", lambda tokenizer, out: destinations.append(out))
        script.main(["--data_path", tiny_corpus, "--vocab_size", "260"])
    assert destinations == [Path("out/tokenizer")]
    out = tmp_path / "tok"
    capsys.readouterr()
    script.main(["--data_path", tiny_corpus, "--vocab_size", "300", "--out_dir", str(out)])
    assert capsys.readouterr().out.strip().endswith(f"saved a 300-token tokenizer to {out}")
    tokenizer = load_tokenizer(out)
    assert len(tokenizer) == 300 and tokenizer.decode(tokenizer("Full fathom five")["input_ids"]) == "Full fathom five"
    shipped = {p.name: p.read_bytes() for p in DEFAULT_TOKENIZER_DIR.iterdir()}
    with monkeypatch.context() as patch:  # refused before training, so nothing is ever written
        patch.setattr(script, "train_tokenizer", lambda *a: pytest.fail("trained, then refused"))
        for folder in (out, DEFAULT_TOKENIZER_DIR):
            capsys.readouterr()
            with pytest.raises(SystemExit) as stopped:
                run_cli(lambda folder=folder: script.main(["--data_path", tiny_corpus, "--out_dir", str(folder)]))
            assert stopped.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
                f"error: --out_dir {folder} is not empty; pass --overwrite to replace the tokenizer files in it, or "
                "choose a new --out_dir"]
    assert {p.name: p.read_bytes() for p in DEFAULT_TOKENIZER_DIR.iterdir()} == shipped
    assert len(load_tokenizer(out)) == 300  # the refusals left it as it was
    script.main(["--data_path", tiny_corpus, "--vocab_size", "260", "--out_dir", str(out), "--overwrite"])
    assert len(load_tokenizer(out)) == 260
