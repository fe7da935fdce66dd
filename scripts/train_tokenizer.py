"""Train the byte-level BPE tokenizer on the train split of a text source and save it for AutoTokenizer.

The shipped data/tokenizer/ is the output of running this with `--out_dir data/tokenizer --overwrite` and no other
flags (embedded Shakespeare corpus). An --out_dir that is not empty is refused unless --overwrite is given.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, UserError, cannot_write, require_writable_dir, run_cli
from data.tokenizer import DEFAULT_VOCAB_SIZE, save_tokenizer, train_tokenizer


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--data_path", default=None, help="text source: a .jsonl/.json/.txt/.parquet file or folder, "
                        "a Hub dataset 'owner/name[:config[:split]]', or nothing for the embedded Shakespeare corpus")
    parser.add_argument("--text_field", default="text", help="column or JSON field holding the text")
    parser.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help="tokens in the vocabulary, special tokens included")
    parser.add_argument("--out_dir", default="out/tokenizer",
                        help="directory to save tokenizer.json and tokenizer_config.json in")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the tokenizer files in an --out_dir that is not empty")
    parser.add_argument("--streaming", action="store_true", help="stream the source instead of caching it as Arrow")
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    require_writable_dir("--out_dir", out)  # now, not after the training
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:  # e.g. the shipped data/tokenizer
        raise UserError(f"--out_dir {out} is not empty; pass --overwrite to replace the tokenizer files in it, or "
                        "choose a new --out_dir")
    tokenizer = train_tokenizer(args.data_path, args.text_field, args.vocab_size, args.streaming)
    save(tokenizer, out)  # only now, so a bad input leaves nothing behind
    print(f"saved a {len(tokenizer)}-token tokenizer to {args.out_dir}")


def save(tokenizer, out: Path) -> None:
    """Write the tokenizer's files beside their final place, then move each in: a failed or killed save leaves
    the previous files (or nothing), never half of one."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out, prefix=".partial-") as tmp:
            save_tokenizer(tokenizer, tmp)
            for file in Path(tmp).iterdir():
                os.replace(file, out / file.name)
    except OSError as err:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise cannot_write(f"the tokenizer in {out}", err, "free some space or fix the permissions, then run "
                           "again") from None


if __name__ == "__main__":
    run_cli(main)
