"""The byte-level BPE tokenizer: training it, loading it, and fingerprinting it for cache keys."""

import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from common.cli import UserError, first_line
from data.corpus import load_texts, reading

# MiniMind's special tokens, in id order: 0 ends every document, 1 and 2 delimit chat turns.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parent / "tokenizer"
DEFAULT_VOCAB_SIZE = 6400
# The class tokenizer_config.json names: transformers 5 saves "TokenizersBackend", unknown to 4.x (which
# llama.cpp's converter pins); "PreTrainedTokenizerFast" is its alias in 5.x and loads the same ids in both.
PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # every byte, plus the special tokens


def train_tokenizer(data_path: str | None = None, text_field: str = "text",
                    vocab_size: int = DEFAULT_VOCAB_SIZE, streaming: bool = False) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on the train split of a source (see data.corpus); with no normalizer
    and no prefix space, decode(encode(text)) == text for any text."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise UserError(f"vocab_size {vocab_size} is too small; byte-level BPE needs at least {MIN_VOCAB_SIZE}")
    texts = load_texts(data_path, "train", text_field, streaming)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True)
    with reading(data_path):
        bpe.train_from_iterator((batch["text"] for batch in texts.iter(batch_size=1000)), trainer)
    # GPT-2 convention: the document separator doubles as bos/pad/unk; nothing is added when encoding.
    eot = SPECIAL_TOKENS[0]
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=eot, eos_token=eot, pad_token=eot,
                                   unk_token=eot, clean_up_tokenization_spaces=False)


def load_tokenizer(path: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer saved in a directory (None: the shipped one), loaded with AutoTokenizer."""
    path = Path(path) if path else DEFAULT_TOKENIZER_DIR
    # Checked first: AutoTokenizer would take a missing "a/b" for a Hub model and go online.
    if not (path / "tokenizer.json").is_file():
        raise UserError(f"{path}: not a tokenizer directory (no tokenizer.json); train one with scripts/train_tokenizer.py")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # a corrupt file fails in tokenizers' Rust or transformers, each in its own way
        raise UserError(f"{path}: cannot load the tokenizer ({first_line(err)})") from None
    if tokenizer.eos_token_id is None:
        raise UserError(f"{path}: the tokenizer has no eos_token; it is needed to separate documents")
    # The document separator stands in for a missing bos (what a prompt starts after) and pad (as in GPT-2).
    if tokenizer.bos_token is None:
        tokenizer.bos_token = tokenizer.eos_token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, path: str | Path) -> None:
    """save_pretrained, with a tokenizer_config.json that transformers 4.x and 5.x both load (with the same ids)."""
    tokenizer.save_pretrained(path)
    config_file = Path(path) / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["tokenizer_class"] = PORTABLE_TOKENIZER_CLASS
    # 5.x also writes further special tokens (MiniMind's tokenizer has 20) as a list named "extra_special_tokens",
    # which 4.x reads as a dict and fails on; "additional_special_tokens" is the list both versions read.
    if isinstance(config.get("extra_special_tokens"), list) and (extra := config.pop("extra_special_tokens")):
        config["additional_special_tokens"] = extra
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerFast) -> str:
    """A short hash of the tokenizer's full JSON serialization (vocab, merges, special tokens, pipeline)."""
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:16]
