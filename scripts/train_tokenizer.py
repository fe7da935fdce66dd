"""Train the byte-level BPE tokenizer on the train split of a text source and save it for AutoTokenizer.

The shipped data/tokenizer/ is the output of running this with no flags (embedded Shakespeare corpus).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, run_cli
from data.tokenizer import DEFAULT_TOKENIZER_DIR, DEFAULT_VOCAB_SIZE, save_tokenizer, train_tokenizer


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--data_path", default=None, help="text source: a .jsonl/.json/.txt/.parquet file or folder, "
                        "a Hub dataset 'owner/name[:config[:split]]', or nothing for the embedded Shakespeare corpus")
    parser.add_argument("--text_field", default="text", help="column or JSON field holding the text")
    parser.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help="tokens in the vocabulary, special tokens included")
    parser.add_argument("--out_dir", default=str(DEFAULT_TOKENIZER_DIR),
                        help="directory to save tokenizer.json and tokenizer_config.json in ")
    parser.add_argument("--streaming", action="store_true", help="stream the source instead of caching it as Arrow")
    args = parser.parse_args(argv)
    tokenizer = train_tokenizer(args.data_path, args.text_field, args.vocab_size, args.streaming)
    save_tokenizer(tokenizer, args.out_dir)  # only now, so a bad input leaves nothing behind
    print(f"saved a {len(tokenizer)}-token tokenizer to {args.out_dir}")


if __name__ == "__main__":
    run_cli(main)
