"""data/: corpus loading and splits, the tokenizer, the packed token cache, batches, and bad-input errors."""

import errno
import hashlib
import io
import json
import math
import os
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import datasets
import huggingface_hub
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

import data.token_stream
from common.cli import UserError
from data import (
    DEFAULT_TOKENIZER_DIR,
    VALIDATION_PLAYS,
    BatchSampler,
    bits_per_byte,
    load_texts,
    load_tokenizer,
    prepare_split,
    shakespeare_plays,
    tokenizer_fingerprint,
)
from trainer.args import DEVICE_DEFAULTS, EPOCH_STEPS_ON_CPU, build_parser

EOT = "<|endoftext|>"


def write_jsonl(path: Path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_embedded_corpus_splits_by_play():
    plays = shakespeare_plays()
    assert len(plays) == 38 and plays == sorted(plays)
    train, validation = load_texts(None, "train"), load_texts("default", "validation")
    assert (len(train), len(validation)) == (36, 2)
    assert sum(len(t.encode()) for t in validation["text"]) == 292_860
    assert all(t.isascii() for t in validation["text"])
    # Raw Markdown as shipped, in path order: romances/the-tempest sorts before tragedies/hamlet.
    raw = {p.stem: p.read_bytes().decode() for p in plays}
    assert list(validation["text"]) == [raw["the-tempest"], raw["hamlet"]]
    assert set(train["text"]) == {t for name, t in raw.items() if name not in VALIDATION_PLAYS}
    assert [r["text"] for r in load_texts(None, "validation", streaming=True)] == list(validation["text"])


def write_source(tmp_path: Path, name: str) -> str:
    """One local source of each kind the loader reads, named by its file name."""
    if name == "docs.jsonl":  # an empty document is dropped
        docs = [{"content": f"doc {i}", "id": i} for i in range(150)]
        write_jsonl(tmp_path / name, docs + [{"content": ""}])
    elif name == "two.jsonl":  # the fewest documents that split
        write_jsonl(tmp_path / name, [{"text": "first"}, {"text": "second"}])
    elif name == "notes.txt":  # documents are paragraphs
        (tmp_path / name).write_text("first para\nstill first\n\nsecond\n\n\n\nthird\n")
    elif name == "t.parquet":
        pq.write_table(pa.table({"body": ["a", "b", "c"], "n": [1, 2, 3]}), tmp_path / name)
    else:  # a folder: its files in sorted order, documents counted across them
        (tmp_path / name).mkdir()
        write_jsonl(tmp_path / name / "b.jsonl", [{"text": "b0"}, {"text": "b1"}])
        write_jsonl(tmp_path / name / "a.jsonl", [{"text": "a0"}, {"text": "a1"}])
    return str(tmp_path / name)


@pytest.mark.parametrize("name, text_field, validation, train", [
    ("docs.jsonl", "content", ["doc 0", "doc 100"], [f"doc {i}" for i in range(150) if i % 100]),
    ("two.jsonl", "text", ["first"], ["second"]),
    ("notes.txt", "text", ["first para\nstill first"], ["second", "third\n"]),
    ("t.parquet", "body", ["a"], ["b", "c"]),
    ("shards", "text", ["a0"], ["a1", "b0", "b1"]),
])
def test_local_sources_hold_out_every_hundredth_document(tmp_path, name, text_field, validation, train):
    path = write_source(tmp_path, name)
    assert list(load_texts(path, "validation", text_field=text_field)["text"]) == validation
    assert list(load_texts(path, "train", text_field=text_field)["text"]) == train
    assert [r["text"] for r in load_texts(path, "train", text_field=text_field, streaming=True)] == train


def test_hub_dataset_uses_its_validation_split(monkeypatch):
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", lambda *a, timeout: SimpleNamespace(sha="c0"))
    fake = {"train": datasets.Dataset.from_dict({"story": [f"t{i}" for i in range(3)]}),
            "validation": datasets.Dataset.from_dict({"story": ["v0", "v1"]})}
    loaded = []

    def load_dataset(name, config, split, streaming):
        loaded.append((name, config, split))
        return fake[split]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(datasets, "get_dataset_split_names", lambda name, config: list(fake))
    assert list(load_texts("owner/stories:en", "validation", text_field="story")["text"]) == ["v0", "v1"]
    assert list(load_texts("owner/stories", "train", text_field="story")["text"]) == ["t0", "t1", "t2"]
    assert loaded == [("owner/stories", "en", "validation"), ("owner/stories", None, "train")]
    with pytest.raises(UserError, match="^owner/stories::test: has no split 'test', only train, validation$"):
        load_texts("owner/stories::test", "train", text_field="story")
    # A split named in the spec, or no validation split: validation is held out of it.
    assert list(load_texts("owner/stories::validation", "train", text_field="story")["text"]) == ["v1"]
    del fake["validation"]
    assert list(load_texts("owner/stories", "validation", text_field="story")["text"]) == ["t0"]


def test_shipped_tokenizer(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(str(DEFAULT_TOKENIZER_DIR), trust_remote_code=False)
    assert len(tokenizer) == 6400
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tokenizer.eos_token == EOT and tokenizer.eos_token_id == 0
    hamlet = next(p for p in shakespeare_plays() if p.stem == "hamlet").read_text()
    for text in (hamlet[:20_000], "  two spaces,\ttab\r\nCRLF, naïve ☕ 😀 "):
        ids = tokenizer(text)["input_ids"]
        assert ids[0] != tokenizer.bos_token_id  # nothing is prepended
        assert tokenizer.decode(ids) == text
    assert load_tokenizer().backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    packed = prepare_split(None, "validation", load_tokenizer(), cache_dir=tmp_path)  # the held-out plays
    assert packed.num_bytes == 292_860 and packed.num_docs == 2 and 2.5 < packed.bytes_per_token < 4


def test_one_epoch_of_the_embedded_plays_is_the_steps_the_help_gives():
    packed = prepare_split(None, "train", load_tokenizer())
    batch = DEVICE_DEFAULTS["cpu"]["batch_size"]
    windows = BatchSampler(packed.tokens, batch, 256).num_windows  # --max_seq_len's default
    assert round(windows / batch) == EPOCH_STEPS_ON_CPU
    assert f"is {EPOCH_STEPS_ON_CPU} steps" in " ".join(build_parser().format_help().split())


def test_packed_stream_round_trips(tmp_path, tiny_corpus, tiny_tokenizer):
    texts = list(load_texts(tiny_corpus, "train")["text"])
    packed = prepare_split(tiny_corpus, "train", tiny_tokenizer, cache_dir=tmp_path, num_proc=2)
    assert packed.tokens.dtype == np.uint16 and isinstance(packed.tokens, np.memmap)
    assert tiny_tokenizer.decode(packed.tokens.tolist()) == EOT.join(texts) + EOT
    assert (packed.num_docs, packed.num_tokens) == (len(texts), len(packed.tokens))
    assert packed.num_bytes == sum(len(t.encode()) for t in texts)
    assert packed.bytes_per_token == packed.num_bytes / packed.num_tokens
    assert bits_per_byte(3 * math.log(2), 3.0) == pytest.approx(1.0)  # nats per token to bits per byte
    meta = json.loads(packed.path.with_suffix(".json").read_text())
    assert (meta["num_tokens"], meta["num_bytes"], meta["dtype"]) == (packed.num_tokens, packed.num_bytes,
                                                                       "uint16")
    single = prepare_split(tiny_corpus, "train", tiny_tokenizer, cache_dir=tmp_path / "one", num_proc=1)
    streamed = prepare_split(tiny_corpus, "train", tiny_tokenizer, cache_dir=tmp_path / "s", streaming=True)
    assert np.array_equal(single.tokens, packed.tokens) and np.array_equal(streamed.tokens, packed.tokens)
    # The checksum the trainer's resume compares: of the token file, the same however it was packed.
    assert packed.sha256 == meta["sha256"] == hashlib.sha256(packed.path.read_bytes()).hexdigest()
    assert single.sha256 == streamed.sha256 == packed.sha256


def test_a_split_of_fewer_documents_than_processes_is_tokenized_without_a_warning(tmp_path, tiny_tokenizer,
                                                                                   capfd):
    corpus = tmp_path / "small.jsonl"  # 50 documents: the held-out split is document 0 alone
    corpus.write_text("".join(json.dumps({"text": f"word {i}"}) + "\n" for i in range(50)))
    held_out = prepare_split(str(corpus), "validation", tiny_tokenizer, cache_dir=tmp_path, num_proc=2)
    assert held_out.num_docs == 1
    assert "num_proc" not in capfd.readouterr().err


def test_cache_is_reused_invalidated_and_rebuilt_when_half_written(tmp_path, monkeypatch, tiny_corpus,
                                                                    tiny_tokenizer_dir):
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    first = prepare_split(tiny_corpus, "validation", tokenizer, cache_dir=tmp_path)
    expected = np.array(first.tokens)
    with monkeypatch.context() as patch:
        patch.setattr(data.token_stream, "load_texts", lambda *args: pytest.fail("re-tokenized a cached one"))
        again = prepare_split(tiny_corpus, "validation", tokenizer, cache_dir=tmp_path)
    assert again.path == first.path and np.array_equal(again.tokens, expected)
    # A crash mid-write leaves a temp file; one before the metadata, a token file with no .json; a token file
    # of another size than its metadata says is rebuilt too.
    stale = first.path.with_name(first.path.name + ".crashed.tmp")
    stale.write_bytes(b"\xff" * 10)
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path))  # the default cache dir
    for spoil in (lambda: first.path.write_bytes(b"\xff" * 6), first.path.with_suffix(".json").unlink):
        spoil()
        rebuilt = prepare_split(tiny_corpus, "validation", tokenizer)
        assert rebuilt.path == first.path and np.array_equal(rebuilt.tokens, expected)
        assert rebuilt.sha256 == first.sha256
    assert stale.read_bytes() == b"\xff" * 10  # never read nor overwritten
    assert {p.name for p in tmp_path.iterdir()} == {first.path.name, stale.name, f"{first.path.stem}.json",
                                                     f"{first.path.stem}.lock"}
    # A changed tokenizer, or an edited source file, gets a new entry.
    fingerprint = tokenizer_fingerprint(tokenizer)
    tokenizer.add_tokens(["Prospero"])
    assert tokenizer_fingerprint(tokenizer) != fingerprint
    assert prepare_split(tiny_corpus, "validation", tokenizer).path != first.path
    os.utime(tiny_corpus, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert prepare_split(tiny_corpus, "validation", load_tokenizer(tiny_tokenizer_dir)).path != first.path


def starts_read(sampler: BatchSampler, batches: int) -> list[int]:
    """The start token of every window the sampler gives in that many batches (tokens = arange)."""
    return [start for _ in range(batches) for start in next(sampler)[0][:, 0].tolist()]


def test_training_batches_are_shifted_windows_reproducible_from_the_seed():
    tokens = np.arange(10_000, dtype=np.uint16)
    x, y = next(BatchSampler(tokens, 8, 32, seed=7))
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.long
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    assert torch.equal(next(BatchSampler(tokens, 8, 32, seed=7))[0], x)
    assert not torch.equal(next(BatchSampler(tokens, 8, 32, seed=8))[0], x)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_an_epoch_reads_every_window_once_the_ranks_disjoint_then_a_new_order(world_size):
    tokens = np.arange(24 * 10 + 1, dtype=np.uint16)  # 24 windows of 10
    ranks = [BatchSampler(tokens, 4, 10, seed=5, rank=r, world_size=world_size)
             for r in range(world_size)]
    per_rank = 24 // world_size // 4  # batches of 4 that make one epoch, all ranks together
    first = [starts_read(s, per_rank) for s in ranks]
    seen = [start for starts in first for start in starts]
    assert sorted(seen) == list(range(0, 240, 10))  # each window once, none shared by two ranks
    assert [s.epochs for s in ranks] == [1.0] * world_size
    second = [start for s in ranks for start in starts_read(s, per_rank)]
    assert sorted(second) == sorted(seen) and second != seen  # every window again, in a new order


def test_a_batch_runs_on_into_the_next_epoch():
    tokens = np.arange(6 * 10 + 1, dtype=np.uint16)  # 6 windows of 10, batches of 4
    starts = starts_read(BatchSampler(tokens, 4, 10, seed=1), 3)
    assert sorted(starts[:6]) == sorted(starts[6:]) == list(range(0, 60, 10))


def test_sequential_windows_interleave_ranks_and_wrap():
    tokens = np.arange(41, dtype=np.uint16)  # 4 windows of 10
    ranks = [BatchSampler(tokens, 1, 10, rank=r, world_size=2, shuffle=False) for r in (0, 1)]
    starts = [[next(s)[0][0, 0].item() for _ in range(3)] for s in ranks]
    assert starts == [[0, 20, 0], [10, 30, 10]]
    with pytest.raises(UserError, match="^the validation split has 41 tokens, fewer than seq_len"):
        BatchSampler(tokens, 1, 41, shuffle=False)  # not even one window
    with pytest.raises(UserError, match="^the training split has 41 tokens"):
        BatchSampler(tokens, 1, 41)


@pytest.mark.parametrize("shuffle", [True, False])
def test_state_dict_resumes_exactly_mid_epoch(shuffle):
    tokens = np.arange(1000, dtype=np.uint16)  # 15 windows: resumed after 12, it crosses an epoch
    sampler = BatchSampler(tokens, 4, 64, seed=3, shuffle=shuffle)
    for _ in range(3):
        next(sampler)
    buffer = io.BytesIO()
    torch.save(sampler.state_dict(), buffer)
    expected = [next(sampler) for _ in range(3)]
    resumed = BatchSampler(tokens, 4, 64, seed=3, shuffle=shuffle)
    resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    for (x, y), (rx, ry) in zip(expected, (next(resumed) for _ in range(3)), strict=True):
        assert torch.equal(x, rx) and torch.equal(y, ry)


BAD_SOURCES = {  # file name, its content, the one-line error
    "missing.jsonl": (None, "{path}: no such file or folder"),
    "empty.jsonl": ("", "{path}: is empty"),
    "blank.txt": ("\n\n  \n", "{path}: is empty"),
    "table.csv": ("text\nhello\n", "{path}: not .jsonl, .json, .txt or .parquet data"),
    "latin1.txt": ("fine\n\ncaf\u00e9\n".encode("latin-1"), "{path}:3: not UTF-8 text \\(byte 0xe9\\)"),
    "cut.parquet": (b"PAR1 a download stopped short", "{path}: not a readable parquet file"),
    "lines.txt": ("one document\na line each\n", "{path}: has a single document; it needs 2 or more to "
                  "hold one out \\(a .txt file's documents are separated by empty lines; a line of spaces "
                  "does not separate them\\)$"),
    # Notepad's byte-order mark: the error still names the malformed line
    "bom.jsonl": ('\ufeff{"text": "a"}\n{"text": oops}\n', "{path}:2: malformed JSON"),
    "bad.jsonl": ('{"text": "a"}\n{"text": "b"}\n{"text": oops}\n{"text": 1}\n',
                  "{path}:3: malformed JSON \\(Expecting value: column 10\\)"),
    "bad.json": ('[{"text": "a"},\n {"text": b}]\n', "{path}:2: malformed JSON"),
    "trailing.json": ('[\n {"text": "a"}\n]\n]\n', "{path}:4: malformed JSON \\(Extra data: column 1\\)"),
    "unfinished.jsonl": ('{"text": "a"}\n{"text": "b"}\n{"text": \n{"text": "d"}\n',
                         "{path}:3: malformed JSON"),  # not the next line
    "string.jsonl": ('{"text": "a"}\n"just a string"\n', "{path}:2: not a JSON object \\(each line holds one "
                     "record"),
    # a .jsonl file's first line an array: its lines are read as lines, not as one document
    "arrays.jsonl": ('["a", "b"]\n7\n', "{path}:2: not a JSON object"),
    "numbers.jsonl": ('{"text": 1}\n{"text": 2}\n', "{path}: 'text' holds int values, not text"),
    "blanks.jsonl": ('{"text": ""}\n{"text": null}\n', "{path}: has no text"),
    "one.jsonl": ('{"text": "alone"}\n', "{path}: has a single document"),
    "fields.jsonl": ('{"body": "x", "id": 1}\n', "{path}: no field 'text'; its fields are body, id"),
}


def test_a_field_of_records_says_what_a_record_is(tmp_path):
    """A collection nested in one JSON object: --text_field, as the first error hints, names its list."""
    path = tmp_path / "nested.json"
    path.write_text('{"version": 1, "data": [{"text": "a"}, {"text": "b"}]}\n')
    with pytest.raises(UserError, match=r"'data' holds list values, not text \(each record is one document, "
                       r"its text a string in --text_field\)$"):
        load_texts(str(path), "train", "data")


@pytest.mark.parametrize("streaming", [False, True])  # a streamed source reads (and fails) as it is iterated
@pytest.mark.parametrize("name", BAD_SOURCES)
def test_a_bad_source_is_one_line(tmp_path, name, streaming):
    content, message = BAD_SOURCES[name]
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UserError, match="^" + message.format(path=path)) as err:
        list(load_texts(str(path), "train", streaming=streaming))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
@pytest.mark.parametrize("streaming", [False, True])
def test_a_folder_of_files_with_different_fields_names_two_of_them(tmp_path, streaming, kind):
    records = {"a": [{"text": f"a{i}"} for i in range(20)],
               "b": [{"content": f"b{i}", "id": i} for i in range(20)]}
    for name, rows in records.items():
        if kind == "jsonl":
            write_jsonl(tmp_path / f"{name}.jsonl", rows)
        else:
            pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{name}.parquet")
    if kind == "parquet":  # the same columns in another order load fine; a file cut short is named first
        pq.write_table(pa.Table.from_pylist([{"id": 0, "content": "reordered"}]), tmp_path / "b2.parquet")
        cut = tmp_path / "c.parquet"
        cut.write_bytes(b"PAR1 cut short")
        with pytest.raises(UserError, match=f"^{re.escape(str(cut))}: not a readable parquet"):
            list(load_texts(str(tmp_path), "train", streaming=streaming))
        cut.unlink()
    message = f"{tmp_path}: its files hold different fields (a.{kind}: text; b.{kind}: content, id); "
    with pytest.raises(UserError, match="^" + re.escape(message)):
        list(load_texts(str(tmp_path), "train", streaming=streaming))


def test_a_folder_of_jsonl_beside_an_indented_json_names_their_fields(tmp_path):
    """Not 'malformed JSON': an indented .json object is one document, not lines."""
    write_jsonl(tmp_path / "a.jsonl", [{"text": f"a{i}"} for i in range(20)])
    (tmp_path / "meta.json").write_text(json.dumps({"name": "plays", "license": "MIT"}, indent=2))
    message = f"{tmp_path}: its files hold different fields (a.jsonl: text; meta.json: name, license); "
    with pytest.raises(UserError, match="^" + re.escape(message)):
        load_texts(str(tmp_path), "train")


def test_a_folder_s_file_names_give_its_splits(tmp_path):
    """As datasets names them (a Hub dataset's download holds data/train-00000-of-00001.parquet and
    data/validation-...): the validation files are not trained on; test files and hidden folders (a
    notebook's checkpoints) are left out; files of no split's name are training text."""
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "train-00000-of-00001.jsonl", [{"text": f"t{i}"} for i in range(3)])
    write_jsonl(tmp_path / "data" / "validation-00000-of-00001.jsonl", [{"text": "v0"}])
    write_jsonl(tmp_path / "data" / "test-00000-of-00001.jsonl", [{"text": "x0"}])
    write_jsonl(tmp_path / "eval.jsonl", [{"text": "e0"}])  # a test split to datasets
    write_jsonl(tmp_path / "interval.jsonl", [{"text": "i0"}])
    (tmp_path / ".ipynb_checkpoints").mkdir()
    write_jsonl(tmp_path / ".ipynb_checkpoints" / "interval-checkpoint.jsonl", [{"text": "copy"}])
    assert list(load_texts(str(tmp_path), "train")["text"]) == ["t0", "t1", "t2", "i0"]
    assert list(load_texts(str(tmp_path), "validation", streaming=True)) == [{"text": "v0"}]
    # validation files alone: evaluated (eval_llm --eval_data), not trained on
    (tmp_path / "interval.jsonl").unlink()
    (tmp_path / "data" / "train-00000-of-00001.jsonl").unlink()
    assert list(load_texts(str(tmp_path), "validation")["text"]) == ["v0"]
    with pytest.raises(UserError, match="^" + re.escape(f"{tmp_path}: holds validation files but no others")):
        load_texts(str(tmp_path), "train")
    (tmp_path / "data" / "validation-00000-of-00001.jsonl").write_text("\n")
    write_jsonl(tmp_path / "train.jsonl", [{"text": "t0"}])
    with pytest.raises(UserError, match="^" + re.escape(f"{tmp_path}: its validation files are empty")):
        load_texts(str(tmp_path), "validation")
    for split_file in [*tmp_path.glob("*.jsonl"), *(tmp_path / "data").glob("v*")]:
        split_file.unlink()
    with pytest.raises(UserError, match="^" + re.escape(f"{tmp_path}: holds only test files (")):
        load_texts(str(tmp_path), "train")


def test_records_without_the_text_field_are_counted_in_a_warning(tmp_path, capsys):
    records = [{"text": "a"}, {"content": "b"}, {"text": "c"}, {"content": "d"}]
    path = write_jsonl(tmp_path / "mixed.jsonl", records)
    assert list(load_texts(path, "validation")["text"]) == ["a"]  # held out of the same file: said once
    assert list(load_texts(path, "train")["text"]) == ["c"]
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")] == [
        f"warning: {path}: 2 of 4 records have no 'text'; they are left out"]


@pytest.mark.parametrize("name, message", [
    ("", "the data path is empty"),  # --data_path "$UNSET": not the embedded plays, nor the working folder
    ("saved", "saved: a dataset saved by datasets' save_to_disk, which this does not read"),
    ("splits", "splits: a dataset saved by datasets' save_to_disk, which this does not read"),
])
def test_a_data_path_that_is_no_source_is_refused(tmp_path, monkeypatch, name, message):
    saved = datasets.Dataset.from_dict({"text": ["a", "b"]})
    saved.save_to_disk(tmp_path / "saved")
    datasets.DatasetDict({"train": saved, "validation": saved}).save_to_disk(tmp_path / "splits")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="^" + re.escape(message)):
        load_texts(name, "train")


def test_a_folder_mixing_kinds_or_holding_none_is_refused_naming_what_it_found(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / ".hidden.jsonl").write_text('{"text": "a"}\n')
    nothing = (f"{tmp_path}: holds no .jsonl, .json, .txt or .parquet files (hidden files and folders are "
               "not read)")
    with pytest.raises(UserError, match=re.escape(nothing)):
        load_texts(str(tmp_path), "train")
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a"}])
    write_jsonl(tmp_path / "b.json", [{"text": "b"}])  # JSON both
    (tmp_path / "LICENSE.txt").write_text("b")
    (tmp_path / "z.txt").write_text("z")
    message = f"{tmp_path}: holds data of several kinds (LICENSE.txt, a.jsonl); keep one kind in a folder"
    with pytest.raises(UserError, match="^" + re.escape(message) + "$"):
        load_texts(str(tmp_path), "train")


def test_a_txt_files_byte_order_mark_is_no_part_of_its_text(tmp_path):
    path = tmp_path / "notepad.txt"
    path.write_bytes("\ufefffirst\r\n\r\nsecond\r\n".encode())
    assert load_texts(str(path), "validation")[0]["text"] == "first"


@pytest.mark.parametrize("offline", [False, True], ids=["online", "HF_HUB_OFFLINE=1"])
def test_unreachable_hub_fails_fast(offline, monkeypatch):
    """In either mode, whichever the user's environment sets: the suite passes with HF_HUB_OFFLINE=1 (or
    TRANSFORMERS_OFFLINE=1) too."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", offline)
    start = time.monotonic()
    with pytest.raises(UserError, match="minimind-norm-tests/no-such-dataset"):
        load_texts("minimind-norm-tests/no-such-dataset", "train")  # offline here; not found when online
    assert time.monotonic() - start < 30

    def no_network(self, name, timeout):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", no_network)
    reason = r"cannot load it from the Hub \(.*Offline" if offline else r"cannot serve it \(ConnectionError\)"
    with pytest.raises(UserError, match=f"^owner/name: .*{reason}.*embedded corpus"):
        load_texts("owner/name", "train")


def test_two_processes_caching_the_same_split_take_turns(tmp_path, tiny_corpus, tiny_tokenizer, monkeypatch,
                                                         capsys):
    """Two trainers on the same new data: the second waits for the first's cache entry and reads it, rather
    than packing into the same temporary file (both crashed). Threads hold the lock as processes do (flock
    locks an open file, not a process)."""
    pack, packing, calls = data.token_stream._pack, threading.Event(), []

    def slow_pack(*args):
        calls.append(1)
        packing.set()
        time.sleep(1)  # the other starts meanwhile
        return pack(*args)

    monkeypatch.setattr(data.token_stream, "_pack", slow_pack)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(prepare_split, tiny_corpus, "validation", tiny_tokenizer, cache_dir=tmp_path)
        packing.wait()
        second = pool.submit(prepare_split, tiny_corpus, "validation", tiny_tokenizer, cache_dir=tmp_path)
        a, b = first.result(), second.result()
    assert len(calls) == 1 and a.path == b.path and np.array_equal(a.tokens, b.tokens)
    assert "waiting for another process caching the validation split's tokens in" in capsys.readouterr().err


def no_space(*args, **kwargs):
    """A write that failed for want of space, as datasets reports it: its own error, raised from the OS's."""
    try:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as err:
        raise datasets.exceptions.DatasetGenerationError("An error occurred generating the dataset") from err


def numpy_out_of_space(encoded, dtype, out, *rest):
    """What ndarray.tofile raises on a full disk (measured on a full tmpfs): no errno."""
    out.write(b"\0" * 64)
    raise OSError("626436 requested and 524288 written")


@pytest.mark.parametrize("where", ["token cache", "datasets cache"])
def test_a_full_disk_while_caching_is_one_line_naming_the_folder(where, tmp_path, tiny_corpus, tiny_tokenizer,
                                                                 monkeypatch):
    cache = tmp_path / "cache"
    if where == "token cache":  # the token cache's disk is full while the half-written file is there
        monkeypatch.setattr(data.token_stream, "_pack", numpy_out_of_space)
        monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(
            free=0 if path == cache and any(cache.glob(".*.tmp")) else 2**40))
        expected = f"out of disk space in {cache}: the validation split's tokens were not cached; free some"
    else:
        monkeypatch.setattr(datasets, "load_dataset", no_space)
        expected = f"out of disk space in {datasets.config.HF_DATASETS_CACHE}, datasets' cache (under HF_"
    with pytest.raises(UserError) as err:
        prepare_split(tiny_corpus, "validation", tiny_tokenizer, cache_dir=cache)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []  # no half-written entry


def test_bad_tokenizer_dir(tmp_path, tiny_tokenizer_dir):
    with pytest.raises(UserError, match="nope: no such folder$"):
        load_tokenizer(tmp_path / "nope")
    # e.g. a run folder: its step folders hold the tokenizer
    with pytest.raises(UserError, match=f"^{tmp_path}: not a tokenizer directory .*"
                                        "a run's step-N folders hold theirs"):
        load_tokenizer(tmp_path)
    file = Path(tiny_tokenizer_dir) / "tokenizer.json"
    with pytest.raises(UserError, match=f"^{file}: pass the folder that holds it, {tiny_tokenizer_dir}$"):
        load_tokenizer(file)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot load the tokenizer"):
        load_tokenizer(tmp_path)
