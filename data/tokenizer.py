"""The tokenizer: loading it, and its fingerprint for cache keys
(train_tokenizer.py trains one)."""

import hashlib
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from common.cli import UserError, first_line

DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parent / "tokenizer"


def load_tokenizer(path: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer saved in a directory
    (None: the shipped one), loaded with AutoTokenizer."""
    path = Path(path) if path else DEFAULT_TOKENIZER_DIR
    # Checked first:
    # AutoTokenizer would take a missing "a/b" for a Hub model and go online.
    if path.is_file():  # tokenizer.json, say
        raise UserError(f"{path}: pass the folder that holds it, {path.parent}")
    if not path.is_dir():
        raise UserError(f"{path}: no such folder")
    if not (path / "tokenizer.json").is_file():
        raise UserError(f"{path}: not a tokenizer directory (no tokenizer.json); "
                        "a run's step-N folders hold theirs, "
                        "and scripts/train_tokenizer.py trains one")
    try:  # never the folder's own code: transformers would ask about it in the terminal
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                                  trust_remote_code=False)
    # a corrupt file fails in tokenizers' Rust or transformers, each in its own way
    except Exception as err:
        raise UserError(
            f"{path}: cannot load the tokenizer ({first_line(err)})") from None
    if tokenizer.eos_token_id is None:
        raise UserError(f"{path}: the tokenizer has no eos_token; "
                        "it is needed to separate documents")
    # The document separator stands in for a missing bos (what a prompt starts after)
    # and pad (as in GPT-2).
    if tokenizer.bos_token is None:
        tokenizer.bos_token = tokenizer.eos_token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerFast) -> str:
    """A short hash of the tokenizer's JSON
    (vocab, merges, special tokens, pipeline)."""
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:16]
