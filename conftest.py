"""The fixtures tests/ and extras/tests/ share (hence at the repository root): a private token cache, a tiny
JSONL corpus cut from the embedded plays, a tiny tokenizer trained on it, the tiny model's trainer flags and
one short run trained with them."""

import json
import os
import tempfile
from pathlib import Path

import pytest

from data import load_tokenizer, shakespeare_plays
from scripts.train_tokenizer import train_tokenizer

TINY_VOCAB_SIZE = 400

# Inductor's cache does not tell kernels built for one vector width from another's: a suite run as
# another CPU would (ATEN_CPU_CAPABILITY, docs/testing.md) would load this CPU's and compute garbage.
if capability := os.environ.get("ATEN_CPU_CAPABILITY"):
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", f"{tempfile.gettempdir()}/torchinductor-{capability}")


@pytest.fixture(scope="session", autouse=True)
def token_cache(tmp_path_factory):
    """One token cache for the session, never the user's (a test that needs an empty one sets its own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINIMIND_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


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
    """A byte-level BPE tokenizer of TINY_VOCAB_SIZE tokens trained on tiny_corpus, saved as the real one."""
    path = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(tiny_corpus, vocab_size=TINY_VOCAB_SIZE).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def other_tokenizer_dir(tmp_path_factory, tiny_texts) -> str:
    """A tokenizer of the same size as tiny_tokenizer's but other merges (trained on the text upper-cased)."""
    path = tmp_path_factory.mktemp("other-tokenizer")
    (path / "upper.jsonl").write_text("".join(json.dumps({"text": t.upper()}) + "\n" for t in tiny_texts))
    train_tokenizer(str(path / "upper.jsonl"), vocab_size=TINY_VOCAB_SIZE).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    return load_tokenizer(tiny_tokenizer_dir)


# The tiny model the training tests share: 2 blocks of width 32, 32-token sequences in batches of 4, 2
# batches per evaluation, and no layers.png (drawing it takes longer than training this model;
# tests/test_diagnostics.py checks it). A test adds --out_dir and what it varies (a flag given again
# overrides: argparse keeps the last). On the CPU: these tests assert CPU arithmetic (bitwise resume, fp32
# tolerances); tests/test_cuda.py has the GPU's.
TINY_MODEL_FLAGS = ["--device", "cpu", "--hidden_size", "32", "--num_hidden_layers", "2",
                    "--num_attention_heads", "2", "--num_key_value_heads", "1", "--max_seq_len", "32",
                    "--batch_size", "4", "--eval_steps", "2", "--num_proc", "1", "--no_layers_plot"]


@pytest.fixture(scope="session")
def tiny_model_flags() -> list[str]:
    return list(TINY_MODEL_FLAGS)


@pytest.fixture(scope="session")
def tiny_flags(tiny_corpus, tiny_tokenizer_dir, tiny_model_flags) -> list[str]:
    """Trainer flags for the tiny model on tiny_corpus with the tiny tokenizer."""
    return ["--data_path", tiny_corpus, "--tokenizer_path", tiny_tokenizer_dir, *tiny_model_flags]


@pytest.fixture(scope="session")
def tiny_flags_drawing_layers(tiny_flags) -> list[str]:
    """tiny_flags for a test that looks at layers.png."""
    return [flag for flag in tiny_flags if flag != "--no_layers_plot"]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, tiny_flags) -> Path:
    """The --out_dir of one short real run (40 steps, logged every 5, evaluated at 20 and 40, one checkpoint
    at step 40), trained once per session in-process and shared: tests read it and never write into it."""
    from trainer.args import parse_args
    from trainer.train_pretrain import train

    out = tmp_path_factory.mktemp("trained") / "rms-pre"
    train(parse_args([*tiny_flags, "--out_dir", str(out), "--max_steps", "40", "--log_interval", "5",
                      "--eval_interval", "20", "--learning_rate", "1e-2", "--warmup_steps", "5"]))
    return out


@pytest.fixture
def fresh_dynamo():
    """For a test that compiles: Dynamo's caches are cleared after it, so the compiled code of one test never
    counts toward another's recompile limit or graph counts."""
    import torch._dynamo

    yield
    torch._dynamo.reset()
