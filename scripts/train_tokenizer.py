"""Train the byte-level BPE tokenizer on the train split of a text source and save it for AutoTokenizer.

The shipped data/tokenizer/tokenizer.json is what this writes with no flags (the embedded Shakespeare corpus,
into out/tokenizer: docs/data.md). An --out_dir that is not empty is refused unless it holds only the files
this script saves and --overwrite is given.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from common.cli import ArgumentParser, UserError, positive_int, run_cli, user_path
from common.fs import replaced
from data.corpus import load_texts, reading

# MiniMind's special tokens, in id order: 0 ends every document, 1 and 2 delimit chat turns.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SAVED_FILES = ("tokenizer.json", "tokenizer_config.json")  # what save() writes: all that --overwrite deletes


def train_tokenizer(data_path: str | None = None, text_field: str = "text", vocab_size: int = 6400,
                    streaming: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on the train split of a source (data/corpus.py); with no normalizer
    and no prefix space, decode(encode(text)) == text for any text."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise UserError(f"--vocab_size {vocab_size} too small: byte-level BPE needs every byte, and "
                        f"{len(SPECIAL_TOKENS)} special tokens")
    texts = load_texts(data_path, "train", text_field, streaming)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True)
    with reading(data_path):
        bpe.train_from_iterator((batch["text"] for batch in texts.iter(batch_size=1000)), trainer)
    eot = SPECIAL_TOKENS[0]  # GPT-2's convention: the document separator is also bos, pad and unk
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=eot, eos_token=eot, pad_token=eot,
                                   unk_token=eot, clean_up_tokenization_spaces=False)


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--data_path", default=None, type=user_path,
                        help="text source: a .jsonl/.json/.txt/.parquet file or folder, a Hub dataset "
                        "'owner/name[:config[:split]]', or nothing for the embedded Shakespeare corpus")
    parser.add_argument("--text_field", default="text", help="column or JSON field holding the text")
    parser.add_argument("--vocab_size", type=positive_int, default=6400,
                        help="tokens in the vocabulary, special tokens included")
    parser.add_argument("--out_dir", default="out/tokenizer", type=user_path,
                        help="directory to save tokenizer.json and tokenizer_config.json in")
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace an --out_dir that holds {' and '.join(SAVED_FILES)} only (what this "
                        "script saves); one holding anything else is refused")
    parser.add_argument("--streaming", action="store_true",
                        help="stream the source instead of caching it as Arrow")
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():  # checked before the training, not after it
        raise UserError(f"--out_dir {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()):  # e.g. the shipped data/tokenizer
        if others := sorted(p.name for p in out.iterdir() if p.name not in SAVED_FILES):  # a checkpoint?
            raise UserError(f"--out_dir {out} holds {', '.join(others)}, which --overwrite never deletes (it "
                            f"replaces a folder of {' and '.join(SAVED_FILES)} only); choose a new --out_dir")
        if not args.overwrite:
            raise UserError(f"--out_dir {out} is not empty; pass --overwrite to replace the tokenizer in it, "
                            "or choose a new --out_dir")
    tokenizer = train_tokenizer(args.data_path, args.text_field, args.vocab_size, args.streaming)
    save(tokenizer, out)  # only now, so a bad input leaves nothing behind
    print(f"saved a {len(tokenizer)}-token tokenizer to {args.out_dir}")


def save(tokenizer, out: Path) -> None:
    """Save into a temporary sibling that replaces out once complete: a failed save leaves what was there."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with replaced(out) as tmp:
        tokenizer.save_pretrained(tmp)


if __name__ == "__main__":
    run_cli(main)
