"""How fast a corpus is tokenized and packed: the data layer's prepare_split (datasets' map over --num_proc processes,
by default the cores this process may use) against the tokenizer's own encode_batch alone on the same documents.

    python scripts/bench_tokenize.py                        # a 200 MB JSONL corpus built from the embedded plays
    python scripts/bench_tokenize.py --num_proc 1 2         # also with one process, for the gain from the cores

The corpus is MiniMind's pretraining format, one {"text": ...} line per document of about 2 KB cut from the plays,
repeated up to the size asked for. prepare_split reads it, tokenizes, appends end-of-text and writes the packed ids
of the train split into a fresh cache each time; encode_batch gets the same documents already in memory, in
batches of 10,000, and does nothing else. The ratio is prepare_split's time over encode_batch's (1 = the packing
pipeline costs nothing beyond tokenizing). docs/data.md ("Tokenizing speed") has a run.
"""

import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import datasets

from common.cli import ArgumentParser, UserError, run_cli
from common.environment import describe, environment, usable_cores, version
from data import load_texts, load_tokenizer, prepare_split, shakespeare_plays

DOCUMENT_BYTES = 2000
ENCODE_BATCH = 10_000


def build_corpus(path: Path, megabytes: float) -> int:
    """Write a JSONL corpus of at least `megabytes` MB; return its number of documents."""
    texts = [play.read_text(encoding="utf-8") for play in shakespeare_plays()]
    documents = [text[i : i + DOCUMENT_BYTES] for text in texts for i in range(0, len(text), DOCUMENT_BYTES)]
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        for count, document in enumerate(itertools.cycle(documents), 1):
            line = json.dumps({"text": document}) + "\n"
            f.write(line)
            written += len(line.encode())
            if written >= megabytes * 1e6:
                return count


def main(argv=None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--megabytes", type=float, default=200, help="size of the JSONL corpus to build (default: 200)")
    p.add_argument("--num_proc", type=int, nargs="+", default=[usable_cores()],
                   help="prepare_split's process counts to time (default: the cores this process may use)")
    p.add_argument("--tokenizer_path", default=None, help="tokenizer directory (default: the shipped data/tokenizer)")
    args = p.parse_args(argv)
    if not args.megabytes > 0 or any(n < 1 for n in args.num_proc):
        raise UserError("--megabytes must be > 0 and --num_proc at least 1")
    tokenizer = load_tokenizer(args.tokenizer_path)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        count = build_corpus(corpus, args.megabytes)
        print(f"corpus: {corpus.stat().st_size / 1e6:.0f} MB, {count:,} documents")
        # Every datasets read below gets a fresh cache, or a later one would reuse an earlier one's JSON reading.
        datasets.config.HF_DATASETS_CACHE = Path(tmp) / "datasets"
        documents = load_texts(str(corpus), "train")["text"]
        # encode_batch first: a datasets map over several processes turns the tokenizer's own threads off
        # (TOKENIZERS_PARALLELISM=false) while it forks, and this process's later encode_batch ran at half speed
        start = time.perf_counter()
        tokens = 0
        for i in range(0, len(documents), ENCODE_BATCH):
            encoded = tokenizer.backend_tokenizer.encode_batch(documents[i : i + ENCODE_BATCH], add_special_tokens=False)
            tokens += sum(len(e.ids) for e in encoded)
        encode_s = time.perf_counter() - start
        packed_s = {}
        for num_proc in args.num_proc:
            datasets.config.HF_DATASETS_CACHE = Path(tmp) / f"datasets{num_proc}"
            start = time.perf_counter()
            packed = prepare_split(str(corpus), "train", tokenizer, cache_dir=Path(tmp) / f"cache{num_proc}",
                                   num_proc=num_proc)
            packed_s[num_proc] = time.perf_counter() - start
    if tokens + len(documents) != packed.num_tokens:  # each packed document ends in one end-of-text token
        raise UserError(f"prepare_split packed {packed.num_tokens:,} tokens, encode_batch gave {tokens:,} plus "
                        f"{len(documents):,} end-of-text tokens")
    print(describe(environment()) + f" tokenizers {version('tokenizers')}, {usable_cores()} usable cores.")
    print(f"encode_batch alone: {encode_s:.1f} s for {tokens:,} tokens")
    for num_proc, seconds in packed_s.items():
        print(f"prepare_split, num_proc {num_proc}: {seconds:.1f} s, {seconds / encode_s:.2f}x encode_batch's time")


if __name__ == "__main__":
    run_cli(main)
