"""Check a GGUF file in llama.cpp itself against the checkpoint it was written from, run by
transformers.

    pip install llama-cpp-python          # builds llama.cpp from source (docs/gguf.md)
    python extras/interop/convert_to_gguf.py out/pretrain out/pretrain.gguf
    python extras/interop/compare_llama_cpp.py out/pretrain out/pretrain.gguf

llama.cpp (through llama-cpp-python) against the plain transformers class of convert_to_hf.py's
export (float32): the token ids of every held-out document, greedy tokens after --prompt, and the
perplexity over consecutive --context windows of held-out tokens, each scored on its own. Exit
status 1 when the ids or greedy tokens differ or the perplexities differ by more than --tolerance.
"""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers.utils import logging as hf_logging

from common.cli import ArgumentParser, UserError, non_negative, positive_int, run_cli
from data import load_texts, load_tokenizer, prepare_split
from extras.interop.export import export_model


def llama_cpp_class(path: Path):
    """llama_cpp.Llama, once the GGUF file is found: checked before the model and data load."""
    try:
        from llama_cpp import Llama
    except ImportError:
        raise UserError("llama_cpp is not importable: `pip install llama-cpp-python` builds "
                        "llama.cpp (about 10-30 min on 2 cores; docs/gguf.md)") from None
    if not path.is_file():
        raise UserError(f"{path}: no such GGUF file (write one with "
                        "extras/interop/convert_to_gguf.py)")
    return Llama


def open_gguf(path: Path, context: int, threads: int):
    """llama.cpp's model of the file, every llama.cpp thread count set to `threads`."""
    Llama = llama_cpp_class(path)
    # n_threads runs one token at a time, n_threads_batch a whole prompt; left unset, the
    # batch count defaults to every core, so --threads 1 would not mean one thread.
    # n_batch = n_ctx: a perplexity window goes through as one batch.
    return Llama(model_path=str(path), n_ctx=context, n_batch=context, logits_all=True,
                 n_threads=threads, n_threads_batch=threads, verbose=False)


def cpp_logits(llm, ids: list[int]) -> torch.Tensor:
    """llama.cpp's logits at every position of ids, from an empty context."""
    llm.reset()
    llm.eval(ids)
    return torch.from_numpy(np.array(llm.scores[:len(ids)], dtype=np.float32))


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0].float()


def greedy(next_logits, prompt: list[int], new_tokens: int) -> list[int]:
    """new_tokens argmax tokens after prompt; next_logits(ids) gives the logits after ids' last."""
    ids = list(prompt)
    for _ in range(new_tokens):
        ids.append(int(next_logits(ids).argmax()))
    return ids[len(prompt):]


def perplexity(logits_of, tokens: np.ndarray, context: int, windows: int | None) -> float:
    """exp(mean next-token loss) over the first `windows` windows of `context` tokens (None:
    all of them)."""
    n = min(windows or len(tokens), len(tokens) // context)
    if n == 0:
        raise UserError(f"the held-out split has {len(tokens)} tokens, fewer than one "
                        f"--context {context} window")
    total, count = 0.0, 0
    for w in tqdm(range(n), desc="windows", leave=False):
        ids = tokens[w * context:(w + 1) * context].tolist()
        losses = F.cross_entropy(logits_of(ids)[:-1], torch.tensor(ids[1:]), reduction="sum")
        total += losses.item()
        count += len(ids) - 1
    return math.exp(total / count)


def compare(src: Path, gguf: Path, data_path=None, text_field="text", context=256,
            windows=None, prompt="", new_tokens=40, threads=2) -> dict:
    """The three comparisons as numbers (see the module docstring)."""
    model_dir, _, model = export_model(src)
    tokenizer = load_tokenizer(model_dir)
    docs = load_texts(data_path, "validation", text_field)["text"]
    prompt_ids = tokenizer(prompt or docs[0][:200], add_special_tokens=False)["input_ids"]
    # the context fits the greedy run too
    llm = open_gguf(gguf, max(context, len(prompt_ids) + new_tokens), threads)
    ours = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in docs]
    theirs = [llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
              for text in docs]
    tokens = prepare_split(data_path, "validation", tokenizer, text_field).tokens

    def transformers_logits(ids):
        return hf_logits(model, ids)

    def llama_cpp_logits(ids):
        return cpp_logits(llm, ids)

    return {
        "documents": len(docs),
        "documents_with_equal_ids": sum(a == b for a, b in zip(ours, theirs, strict=True)),
        "tokens": sum(map(len, ours)),
        "greedy_transformers": greedy(lambda ids: transformers_logits(ids)[-1], prompt_ids,
                                      new_tokens),
        "greedy_llama_cpp": greedy(lambda ids: llama_cpp_logits(ids)[-1], prompt_ids,
                                   new_tokens),
        "ppl_transformers": perplexity(transformers_logits, tokens, context, windows),
        "ppl_llama_cpp": perplexity(llama_cpp_logits, tokens, context, windows),
    }


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("src", type=Path,
                   help="the checkpoint the GGUF file was written from (or its --out_dir)")
    p.add_argument("gguf", type=Path,
                   help="the GGUF file (convert_to_gguf.py; --outtype f32 for exact)")
    p.add_argument("--data_path",
                   help="held-out text source, as the trainer's (default: the embedded plays)")
    p.add_argument("--text_field", default="text", help="the text column of --data_path")
    p.add_argument("--context", type=positive_int, default=256,
                   help="tokens per perplexity window (>= 2)")
    p.add_argument("--windows", type=positive_int, help="perplexity windows to score (default: all)")
    p.add_argument("--prompt", default="",
                   help="greedy prompt (default: the first 200 characters held out)")
    p.add_argument("--new_tokens", type=positive_int, default=40, help="greedy tokens to compare")
    p.add_argument("--threads", type=positive_int, default=2,
                   help="llama.cpp's CPU threads, one token at a time and whole prompts alike")
    p.add_argument("--tolerance", type=non_negative, default=0.01,
                   help="allowed relative perplexity gap")
    args = p.parse_args(argv)
    if args.context < 2:  # a window of one token predicts nothing
        raise UserError(f"--context must be at least 2, got {args.context}")
    llama_cpp_class(args.gguf)  # before minutes of loading
    hf_logging.disable_progress_bar()  # the "Loading weights" bar beside the result lines
    r = compare(args.src, args.gguf, args.data_path, args.text_field, args.context, args.windows,
                args.prompt, args.new_tokens, args.threads)
    same_greedy = r["greedy_transformers"] == r["greedy_llama_cpp"]
    rel = abs(r["ppl_llama_cpp"] / r["ppl_transformers"] - 1)
    print(f"token ids: {r['documents_with_equal_ids']} of {r['documents']} held-out documents "
          f"identical ({r['tokens']:,} tokens)")
    print(f"greedy: {'identical' if same_greedy else 'DIFFERENT'} over {args.new_tokens} tokens")
    print(f"perplexity at context {args.context}: transformers {r['ppl_transformers']:.4f}, "
          f"llama.cpp {r['ppl_llama_cpp']:.4f} (relative difference {rel:.2e})")
    if r["documents_with_equal_ids"] < r["documents"] or not same_greedy or rel > args.tolerance:
        sys.exit(1)


if __name__ == "__main__":
    run_cli(main)
