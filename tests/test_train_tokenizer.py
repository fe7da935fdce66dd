"""scripts/train_tokenizer.py: where it writes and what it refuses to overwrite, and bad input or a failed save in
one line, leaving what was there."""

from pathlib import Path

import pytest

from common.cli import UserError, run_cli
from data import DEFAULT_TOKENIZER_DIR, load_tokenizer
from scripts import train_tokenizer as script


def files(folder: Path) -> dict[str, bytes] | None:
    return {p.name: p.read_bytes() for p in folder.iterdir()} if folder.is_dir() else None


def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, capsys):
    out_dir = tmp_path / "out"
    for bad in (["--data_path", str(tmp_path / "missing.jsonl")], ["--vocab_size", "100"]):
        with pytest.raises(SystemExit) as stopped:
            run_cli(lambda bad=bad: script.main([*bad, "--out_dir", str(out_dir)]))
        stderr = capsys.readouterr().err
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert stopped.value.code != 0 and len(errors) == 1 and "Traceback" not in stderr
        assert not out_dir.exists()


@pytest.mark.parametrize("case", ["unwritable", "not_empty", "shipped"])
def test_an_out_dir_it_may_not_write_is_refused_before_training(tmp_path, tiny_corpus, monkeypatch, capsys, case):
    out = {"unwritable": tmp_path / "file" / "tok", "not_empty": tmp_path / "tok", "shipped": DEFAULT_TOKENIZER_DIR}[case]
    (tmp_path / "file").write_text("")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("mine")
    before = files(out)
    monkeypatch.setattr(script, "train_tokenizer", lambda *a: pytest.fail("trained, then refused"))
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: script.main(["--data_path", tiny_corpus, "--out_dir", str(out)]))
    why = {"unwritable": f"is not writable ({tmp_path / 'file'} is not a writable directory)"}.get(
        case, "is not empty; pass --overwrite to replace the tokenizer files in it, or choose a new --out_dir")
    assert stopped.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [f"error: --out_dir {out} {why}"]
    assert files(out) == before


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
    assert files(out) == {"tokenizer.json": b"old"}


def test_writes_a_new_folder_and_replaces_one_when_told(tmp_path, tiny_corpus, monkeypatch, capsys):
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
    script.main(["--data_path", tiny_corpus, "--vocab_size", "260", "--out_dir", str(out), "--overwrite"])
    assert len(load_tokenizer(out)) == 260
