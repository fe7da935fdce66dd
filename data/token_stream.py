"""Tokenize a split once into a flat, memory-mapped token file, and draw training batches from it."""

import errno
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow.compute as pc
import torch
from tqdm import tqdm

from common.cli import UserError, cannot_write
from common.environment import usable_cores
from common.fs import write_file_atomically
from data.corpus import load_texts, reading, source_identity
from data.tokenizer import tokenizer_fingerprint

CACHE_FORMAT = 2  # bump when the packing, splitting or metadata rules change, so old caches are not reused
SCAN_CHUNK_BYTES = 1 << 24
CANNOT_WRITE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)


def default_cache_dir() -> Path:
    """$MINIMIND_CACHE or ~/.cache/minimind-norm; refuses, before any tokenizing, a MINIMIND_CACHE that is no
    folder and cannot become one (an existing folder may be read-only: a filled cache is only read)."""
    given = os.environ.get("MINIMIND_CACHE")
    if not given:
        return Path.home() / ".cache" / "minimind-norm"
    path = Path(given)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        problem = f"{existing} is not a folder"
    elif existing != path and not os.access(existing, os.W_OK | os.X_OK):
        problem = f"{path} does not exist and {existing} is not writable"
    else:
        return path
    raise UserError(f"MINIMIND_CACHE={given} cannot hold the token cache ({problem}); point MINIMIND_CACHE at a "
                    "folder this process can create or write, or unset it to use ~/.cache/minimind-norm")


@dataclass(frozen=True)
class PackedTokens:
    """A split's documents as one token array, each followed by the end-of-text token; num_bytes counts the
    documents' UTF-8 bytes only, num_tokens the separators too (the model predicts them)."""

    path: Path
    tokens: np.memmap
    num_tokens: int
    num_bytes: int
    num_docs: int
    sha256: str  # of the token file: what the tokens are, however the source was named
    split: str

    @property
    def bytes_per_token(self) -> float:
        return self.num_bytes / self.num_tokens


def bits_per_byte(loss: float, bytes_per_token: float) -> float:
    """Convert a mean cross-entropy per token (nats) to bits per UTF-8 byte of text."""
    return loss / math.log(2) / bytes_per_token


def _open_cached(path: Path, key: dict, vocab_size: int) -> PackedTokens | None:
    """The finished, intact cache entry at path, or None. Its metadata is written after the tokens, so without it
    the entry is unfinished; a damaged entry is reported in one line, then rebuilt."""
    meta_path = path.with_suffix(".json")
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        dtype, num_tokens, digest = np.dtype(meta["dtype"]), int(meta["num_tokens"]), str(meta["sha256"])
        counts = int(meta["num_bytes"]), int(meta["num_docs"])
        same_key = json.dumps(meta["key"], sort_keys=True) == json.dumps(key, sort_keys=True)
        problem = None if same_key else "its metadata describes another source"
    except (ValueError, KeyError, TypeError) as err:  # not JSON, a field missing or of the wrong kind
        problem = f"unreadable metadata: {type(err).__name__} {err}"
    if problem is None:
        size = path.stat().st_size if path.is_file() else 0
        if size != num_tokens * dtype.itemsize:
            problem = f"the token file has {size:,} bytes, not {num_tokens * dtype.itemsize:,}"
        else:
            actual, top = _scan(path, dtype)
            if actual != digest:
                problem = "the token file's checksum is not the recorded one"
            elif top >= vocab_size:
                problem = f"it holds token id {top}, beyond the tokenizer's {vocab_size} tokens"
    if problem is not None:
        print(f"warning: token cache {path} is damaged ({problem}); tokenizing again", file=sys.stderr)
        return None
    tokens = np.memmap(path, dtype=dtype, mode="r")
    return PackedTokens(path, tokens, num_tokens, *counts, digest, key["split"])


def _scan(path: Path, dtype: np.dtype) -> tuple[str, int]:
    """The sha256 of a token file and its largest id, in one pass of bounded memory."""
    digest, top = hashlib.sha256(), -1
    with open(path, "rb") as f:
        while chunk := f.read(SCAN_CHUNK_BYTES):
            digest.update(chunk)
            top = max(top, int(np.frombuffer(chunk, dtype=dtype).max()))
    return digest.hexdigest(), top


def _pack(texts, tokenizer, dtype: np.dtype, out, num_proc: int, streaming: bool, split: str) -> dict:
    """Tokenize every document, append end-of-text, write the ids to out; return the counts and checksum."""
    eot = tokenizer.eos_token_id

    def encode(batch):
        ids = tokenizer(batch, add_special_tokens=False)["input_ids"]
        return {"ids": [doc + [eot] for doc in ids], "num_bytes": [len(text.encode()) for text in batch]}

    features = datasets.Features({"ids": datasets.List(datasets.Value(dtype.name)), "num_bytes": datasets.Value("int64")})
    options = {} if streaming else {"num_proc": num_proc if num_proc > 1 else None, "desc": f"tokenizing {split}"}
    encoded = texts.map(encode, batched=True, input_columns="text", remove_columns=["text"], features=features, **options)
    counts = {"num_tokens": 0, "num_bytes": 0, "num_docs": 0}
    digest = hashlib.sha256()
    # Streaming has no progress bar of its own; for a Dataset this one shows the (fast) writing pass.
    with tqdm(total=None if streaming else len(encoded), desc=f"packing {split}", unit="doc") as progress:
        for batch in encoded.with_format("arrow").iter(batch_size=1000):
            ids = pc.list_flatten(batch["ids"]).to_numpy().astype(dtype, copy=False)
            ids.tofile(out)
            digest.update(ids.tobytes())
            counts["num_tokens"] += len(ids)
            counts["num_bytes"] += pc.sum(batch["num_bytes"]).as_py()
            counts["num_docs"] += batch.num_rows
            progress.update(batch.num_rows)
    return {**counts, "sha256": digest.hexdigest()}


def prepare_split(data_path: str | None, split: str, tokenizer, text_field: str = "text",
                  cache_dir: str | Path | None = None, num_proc: int | None = None,
                  streaming: bool = False) -> PackedTokens:
    """A split tokenized and packed, from the cache when this source (its files' sizes and mtimes, or its Hub
    name), split, text_field and tokenizer were packed before. Under DDP, call it on one rank first."""
    num_proc = num_proc or usable_cores()
    key = {"format": CACHE_FORMAT, "source": source_identity(data_path), "split": split,
           "text_field": text_field, "tokenizer": tokenizer_fingerprint(tokenizer),
           "eot": tokenizer.eos_token_id}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    path = cache_dir / f"{split}-{digest}.bin"
    if (packed := _open_cached(path, key, len(tokenizer))) is not None:
        return packed
    texts = load_texts(data_path, split, text_field, streaming)
    dtype = np.dtype(np.uint16 if len(tokenizer) <= 2**16 else np.uint32)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with reading(data_path):
            counts = write_file_atomically(path, lambda f: _pack(texts, tokenizer, dtype, f, num_proc, streaming, split))
        meta = {**counts, "dtype": dtype.name, "key": key}
        write_file_atomically(path.with_suffix(".json"), lambda f: f.write(json.dumps(meta, indent=1).encode()))
    except OSError as err:
        if err.errno not in CANNOT_WRITE:
            raise
        raise cannot_write(f"the token cache in {cache_dir}", err,
                           "free some space there, or point MINIMIND_CACHE at another folder") from None
    return _open_cached(path, key, len(tokenizer))


class BatchSampler:
    """Batches of windows from a packed split: x = window[:-1], y = window[1:], [batch, seq_len] longs. Random
    mode draws window starts from a generator seeded by (seed, rank); sequential mode walks the
    non-overlapping windows in order, window k going to rank k % world_size, wrapping at the end. state_dict()
    resumes either exactly."""

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1, sequential: bool = False):
        if len(tokens) < seq_len + 1:
            raise UserError(f"the split has {len(tokens)} tokens, fewer than seq_len + 1 = {seq_len + 1}; "
                            "use a shorter sequence length or more data")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.rank, self.world_size, self.sequential = rank, world_size, sequential
        self.rng = np.random.default_rng([seed, rank])
        self.position = 0  # windows this rank has taken in sequential mode

    @property
    def num_windows(self) -> int:
        """Non-overlapping windows in one sequential pass over the split (all ranks together)."""
        return (len(self.tokens) - 1) // self.seq_len

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sequential:
            k = (self.position + np.arange(self.batch_size)) * self.world_size + self.rank
            starts = k % self.num_windows * self.seq_len
            self.position += self.batch_size
        else:
            starts = self.rng.integers(0, len(self.tokens) - self.seq_len, size=self.batch_size)
        windows = torch.from_numpy(np.stack([self.tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64))
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.position = state["position"]
