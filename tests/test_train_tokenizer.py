"""scripts/train_tokenizer.py: where it writes and what it refuses to overwrite, and bad input or a failed
save in one line, leaving what was there."""

from pathlib import Path

import pytest

from common.cli import run_cli
from data import DEFAULT_TOKENIZER_DIR, load_tokenizer
from scripts import train_tokenizer as script


def one_error_line(capsys, *flags: str) -> str:
    """Run the script with flags as its command line does; return its one `error:` line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: script.main(list(flags)))
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert stopped.value.code == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


@pytest.mark.parametrize("bad, message", [
    (["--data_path", "missing.jsonl"], "missing.jsonl: no such file or folder"),
    (["--vocab_size", "100"], "--vocab_size 100 too small"),
    (["--vocab_size", "0"], "argument --vocab_size: invalid positive_int value: '0'"),
])
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, capsys, monkeypatch, bad, message):
    monkeypatch.chdir(tmp_path)
    assert one_error_line(capsys, *bad, "--out_dir", "out").startswith(f"error: {message}")
    assert list(tmp_path.iterdir()) == []


def test_an_out_dir_that_is_a_file_is_refused_before_the_training(tmp_path, capsys, monkeypatch):
    (tmp_path / "notes.txt").write_text("the user's")
    monkeypatch.setattr(script, "train_tokenizer", lambda *args: pytest.fail("trained before the refusal"))
    assert one_error_line(capsys, "--out_dir", str(tmp_path / "notes.txt")) == (
        f"error: --out_dir {tmp_path / 'notes.txt'} is a file, not a folder")
    assert (tmp_path / "notes.txt").read_text() == "the user's"


def test_a_failed_save_is_one_line_and_leaves_the_old_files(tmp_path, tiny_corpus, monkeypatch, capsys):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "tokenizer.json").write_text("old")

    def full_disk(tokenizer, path):
        Path(path).mkdir()
        (Path(path) / "tokenizer.json").write_text("half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(script.PreTrainedTokenizerFast, "save_pretrained", full_disk)
    error = one_error_line(capsys, "--data_path", tiny_corpus, "--vocab_size", "300", "--out_dir", str(out),
                           "--overwrite")
    assert error.endswith("(No space left on device)")
    assert [(p.name, p.read_text()) for p in out.iterdir()] == [("tokenizer.json", "old")]
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]  # no temporary folder left


def test_writes_a_new_folder_and_replaces_one_only_when_told(tmp_path, tiny_corpus, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    destinations = []
    with monkeypatch.context() as patch:  # where the default goes, written nowhere (it was the shipped one)
        patch.setattr(script, "save", lambda tokenizer, out: destinations.append(out))
        script.main(["--data_path", tiny_corpus, "--vocab_size", "260"])
    assert destinations == [Path("out/tokenizer")]
    out = tmp_path / "tok"
    capsys.readouterr()
    script.main(["--data_path", tiny_corpus, "--vocab_size", "300", "--out_dir", str(out)])
    assert capsys.readouterr().out.strip().endswith(f"saved a 300-token tokenizer to {out}")
    tokenizer = load_tokenizer(out)
    assert len(tokenizer) == 300
    assert tokenizer.decode(tokenizer("Full fathom five")["input_ids"]) == "Full fathom five"
    shipped = {p.name: p.read_bytes() for p in DEFAULT_TOKENIZER_DIR.iterdir()}
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "keep.txt").write_text("mine")
    with monkeypatch.context() as patch:  # refused before training, so nothing is ever written
        patch.setattr(script, "train_tokenizer", lambda *a: pytest.fail("trained, then refused"))
        for folder in (out, DEFAULT_TOKENIZER_DIR):
            assert one_error_line(capsys, "--out_dir", str(folder)) == (
                f"error: --out_dir {folder} is not empty; pass --overwrite to replace the tokenizer in it, "
                "or choose a new --out_dir")
        # --overwrite replaces the whole folder, so only one of the files a tokenizer is saved as
        assert one_error_line(capsys, "--out_dir", str(notes), "--overwrite").startswith(
            f"error: --out_dir {notes} holds keep.txt, which --overwrite never deletes")
    assert {p.name: p.read_bytes() for p in DEFAULT_TOKENIZER_DIR.iterdir()} == shipped
    assert len(load_tokenizer(out)) == 300 and (notes / "keep.txt").read_text() == "mine"  # left as they were
    script.main(["--data_path", tiny_corpus, "--vocab_size", "260", "--out_dir", str(out), "--overwrite"])
    assert len(load_tokenizer(out)) == 260
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "tok"]  # no temporary folder left
