"""Data layer: text sources, the tokenizer, packed token streams and batches."""

from data.corpus import (
    DEFAULT_PROMPTS,
    HOLDOUT_EVERY,
    VALIDATION_PLAYS,
    load_texts,
    shakespeare_plays,
)
from data.token_stream import (
    BatchSampler,
    PackedTokens,
    bits_per_byte,
    default_cache_dir,
    prepare_split,
)
from data.tokenizer import DEFAULT_TOKENIZER_DIR, load_tokenizer, tokenizer_fingerprint

__all__ = ["DEFAULT_PROMPTS", "DEFAULT_TOKENIZER_DIR", "HOLDOUT_EVERY",
           "VALIDATION_PLAYS", "BatchSampler", "PackedTokens", "bits_per_byte",
           "default_cache_dir", "load_texts", "load_tokenizer", "prepare_split",
           "shakespeare_plays", "tokenizer_fingerprint"]
