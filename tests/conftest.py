"""Shared fixtures: a tiny JSONL corpus cut from the embedded plays, and a tiny tokenizer trained on it."""

import json

import pytest

from data import load_tokenizer, save_tokenizer, shakespeare_plays, train_tokenizer

TINY_VOCAB_SIZE = 400


@pytest.fixture(scope="session")
def tiny_texts() -> list[str]:
    """About 40 KB in 60 documents: speeches of The Tempest, plus one non-ASCII document."""
    tempest = next(p for p in shakespeare_plays() if p.stem == "the-tempest").read_text(encoding="utf-8")
    speeches = tempest[:40_000].split("\n\n")
    documents = ["\n\n".join(speeches[i : i + 10]) for i in range(0, len(speeches), 10)][:59]
    return documents + ["Ariel sings: «Full fathom five» — ☕ naïve café 😀\n"]


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory, tiny_texts) -> str:
    """Path of a MiniMind-style JSONL file holding tiny_texts, one {"text": ...} object per line."""
    path = tmp_path_factory.mktemp("corpus") / "tiny.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in tiny_texts), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory, tiny_corpus) -> str:
    """A byte-level BPE tokenizer with TINY_VOCAB_SIZE tokens, trained on tiny_corpus and saved like the real one."""
    path = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(train_tokenizer(tiny_corpus, vocab_size=TINY_VOCAB_SIZE), path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    return load_tokenizer(tiny_tokenizer_dir)
