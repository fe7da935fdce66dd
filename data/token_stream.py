"""Tokenize a split once into a flat memory-mapped token file; draw batches from it."""

import contextlib
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow.compute as pc
import torch
from tqdm import tqdm

from common.cli import UserError
from common.environment import usable_cores
from common.fs import replaced, space_needed, taking_turns, write_atomically
from data.corpus import HOLDOUT_EVERY, load_texts, reading, source_identity
from data.tokenizer import tokenizer_fingerprint

# bump when the packing, splitting or metadata rules change, so old caches are not reused
CACHE_FORMAT = 2


def default_cache_dir() -> Path:
    return Path(os.environ.get("MINIMIND_CACHE")
                or Path.home() / ".cache" / "minimind-norm")


@dataclass(frozen=True)
class PackedTokens:
    """A split's documents as one token array, each followed by the end-of-text token;
    num_bytes counts the documents' UTF-8 bytes only,
    num_tokens the (predicted) separators too."""

    path: Path
    tokens: np.memmap
    num_tokens: int
    num_bytes: int
    num_docs: int
    # of the token file, from packing: what the tokens are, however the source was named
    sha256: str
    split: str

    @property
    def bytes_per_token(self) -> float:
        return self.num_bytes / self.num_tokens


def bits_per_byte(loss: float, bytes_per_token: float) -> float:
    """Convert a mean cross-entropy per token (nats) to bits per UTF-8 byte of text."""
    return loss / math.log(2) / bytes_per_token


def _open_cached(path: Path, key: dict) -> PackedTokens | None:
    """The finished cache entry at path, or None (then it is built again):
    the metadata, written after the tokens, must be there, describe this key,
    and match the token file's size."""
    # unfinished, or of another format
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        meta = json.loads(path.with_suffix(".json").read_text())
        dtype = np.dtype(meta["dtype"])
        num_tokens = meta["num_tokens"]
        if (meta["key"] == json.loads(json.dumps(key))
                and path.stat().st_size == num_tokens * dtype.itemsize):
            return PackedTokens(path, np.memmap(path, dtype=dtype, mode="r"), num_tokens,
                                meta["num_bytes"], meta["num_docs"], meta["sha256"],
                                key["split"])
    return None


def _encode(texts, tokenizer, dtype: np.dtype, num_proc: int, streaming: bool,
            split: str):
    """Every document's ids with end-of-text appended, and its UTF-8 bytes
    (lazily if streaming; else written to datasets' cache under HF_HOME)."""
    eot = tokenizer.eos_token_id

    def encode(batch):
        ids = tokenizer(batch, add_special_tokens=False)["input_ids"]
        return {"ids": [doc + [eot] for doc in ids],
                "num_bytes": [len(text.encode()) for text in batch]}

    features = datasets.Features({"ids": datasets.List(datasets.Value(dtype.name)),
                                  "num_bytes": datasets.Value("int64")})
    # datasets warns of more processes than documents (a held-out split of a small file)
    workers = 1 if streaming else min(num_proc, len(texts))
    options = {} if streaming else {"num_proc": workers if workers > 1 else None,
                                    "desc": f"tokenizing {split}"}
    return texts.map(encode, batched=True, input_columns="text", remove_columns=["text"],
                     features=features, **options)


def _pack(encoded, dtype: np.dtype, out, streaming: bool, split: str) -> dict:
    """Write the encoded documents' ids to out; the counts, checksum."""
    counts = {"num_tokens": 0, "num_bytes": 0, "num_docs": 0}
    digest = hashlib.sha256()
    # Streaming has no progress bar of its own;
    # for a Dataset this one shows the (fast) writing pass.
    with tqdm(total=None if streaming else len(encoded), desc=f"packing {split}",
              unit="doc") as progress:
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
    """A split tokenized and packed, from the cache when this source
    (its files' sizes and mtimes, or its Hub name), split, text_field and tokenizer
    were packed before (DDP: one rank first)."""
    key = {"format": CACHE_FORMAT, "split": split, "text_field": text_field,
           "eot": tokenizer.eos_token_id, "source": source_identity(data_path),
           "tokenizer": tokenizer_fingerprint(tokenizer)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    path = cache_dir / f"{split}-{digest}.bin"
    if (packed := _open_cached(path, key)) is not None:
        return packed
    cache_dir.mkdir(parents=True, exist_ok=True)
    # another process packing this entry
    # (a second trainer on the same new data) finishes it first
    with taking_turns(path.with_suffix(".lock"),
                      f"waiting for another process caching the {split} split's tokens "
                      f"in {cache_dir}"):
        if (packed := _open_cached(path, key)) is not None:
            return packed
        texts = load_texts(data_path, split, text_field, streaming)
        dtype = np.dtype(np.uint16 if len(tokenizer) <= 2**16 else np.uint32)
        with reading(data_path):
            encoded = _encode(texts, tokenizer, dtype, num_proc or usable_cores(),
                              streaming, split)
        room = space_needed(cache_dir,
                            f"the {split} split's tokens were not cached; "
                            "free some space, "
                            "or set MINIMIND_CACHE to a folder on a disk with room")
        # the space is measured before the half-written file goes
        with reading(data_path), replaced(path) as tmp, room, open(tmp, "wb") as out:
            counts = _pack(encoded, dtype, out, streaming, split)
        meta = {**counts, "dtype": dtype.name, "key": key}
        write_atomically(path.with_suffix(".json"), json.dumps(meta, indent=1))
    return _open_cached(path, key)


# What a run records as its training order ("sampler"),
# so that runs of another order (an older version's random windows)
# are never compared with its runs, nor resumed by this sampler
ORDER = "epochs"


class BatchSampler:
    """Batches x = window[:-1], y = window[1:] of a split's non-overlapping windows,
    [batch, seq_len] longs.

    Training (shuffle): each epoch reads every window once,
    in a permutation seeded by (seed, epoch), as MiniMind's epoch loop does.
    Evaluation (shuffle=False): the windows in order, the same text every time.
    Under DDP the ranks take turns through one order,
    so their windows are disjoint within an epoch.
    A batch may run on into the next epoch, and state_dict() resumes mid-epoch."""

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1, shuffle: bool = True):
        if len(tokens) < seq_len + 1:
            split = "training" if shuffle else "validation"  # evaluation reads the validation split
            held_out = (" (where a source has no validation split of its own, it is "
                        f"every {HOLDOUT_EVERY}th document, from document 0)")
            raise UserError(f"the {split} split has {len(tokens)} tokens, "
                            f"fewer than seq_len + 1 = {seq_len + 1}; use a shorter "
                            "sequence length (the trainer's --max_seq_len, eval_llm's "
                            f"--seq_len) or more data{'' if shuffle else held_out}")
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.position = 0  # windows this rank has taken
        # (epoch, its permutation): one epoch's order, kept while it lasts
        self._order = (-1, None)

    @property
    def num_windows(self) -> int:
        """Non-overlapping windows in the split: one epoch, all ranks together."""
        return (len(self.tokens) - 1) // self.seq_len

    @property
    def epochs(self) -> float:
        """Epochs read so far, all ranks together."""
        return self.position * self.world_size / self.num_windows

    def window(self, turn: int) -> int:
        """The window read at a turn of the shared order (turns count across epochs)."""
        epoch, index = divmod(turn, self.num_windows)
        if not self.shuffle:
            return index
        if self._order[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order = (epoch, rng.permutation(self.num_windows))
        return int(self._order[1][index])

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        turns = ((self.position + np.arange(self.batch_size)) * self.world_size
                 + self.rank)
        starts = [self.window(turn) * self.seq_len for turn in turns]
        self.position += self.batch_size
        windows = torch.from_numpy(np.stack([self.tokens[s : s + self.seq_len + 1]
                                             for s in starts]))
        return windows[:, :-1].long(), windows[:, 1:].long()  # (copies: contiguous)

    def state_dict(self) -> dict:
        return {"order": ORDER if self.shuffle else "sequential",
                "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
