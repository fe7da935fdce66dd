"""Sample from, measure and compare trained checkpoints.

    # default prompts, or type your own
    python eval_llm.py --model_path out/pretrain
    python eval_llm.py --model_path out/pretrain --prompt $'**HAMLET**  \\nTo be' \\
        --temperature 0
    # loss, ppl, bpb, held-out plays
    python eval_llm.py --model_path out/pretrain --eval_data
    # every ablation run, side by side
    python eval_llm.py --compare out/ablation/runs/* --eval_data

A model folder is the trainer's --out_dir (its newest step-N folder that loads),
a step folder, or any folder AutoModelForCausalLM loads,
e.g. a Llama export of extras/interop/convert_to_hf.py;
the tokenizer is its own unless --tokenizer_path is given,
and one that is not the tokenizer the folder records
(by content, not only its size) is refused.
Each prompt is encoded after the tokenizer's bos token (the document separator),
as every training document started after one.
With --eval_data and no --prompt a single model is only evaluated;
--compare always generates.
The loss comes from the model's logits, so every family is measured the same way.
"""

import argparse
import contextlib
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from transformers import AutoModelForCausalLM, TextStreamer
from transformers.utils import logging as hf_logging

import model  # noqa: F401  (registers MiniMind with the Auto classes)
from common.cli import (
    ArgumentParser,
    UserError,
    count,
    non_negative,
    positive_float,
    positive_int,
    probability,
    run_cli,
    user_path,
)
from data import (
    DEFAULT_PROMPTS,
    BatchSampler,
    bits_per_byte,
    load_tokenizer,
    prepare_split,
)
from data.corpus import is_embedded
from model import norm_variant
from trainer.checkpoint import load_newest, newest_state, run_folder, tokenizer_problem
from trainer.evaluation import evaluate
from trainer.runtime import autocast, pick_device, resolve_dtype

DEFAULT_SEQ_LEN = 256
DEFAULT_NEW_TOKENS = 100


@dataclass(frozen=True)
class Sampling:
    """How continuations are drawn; the defaults are the CLI's.
    temperature 0 means greedy."""
    # None: DEFAULT_NEW_TOKENS, or half the model's context where that is less
    max_new_tokens: int | None = None
    temperature: float = 0.8
    top_p: float = 0.9
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int = 0
    # recompute the prefix for every token: the same tokens, a check of the cache
    no_kv_cache: bool = False


@dataclass
class Result:
    """One checkpoint's part of a comparison:
    its label, norm variant, continuations and held-out metrics."""
    name: str
    variant: str
    continuations: list[str]
    metrics: dict | None = None
    # why it could not be loaded; then it has no continuations or metrics
    error: str | None = None


def load(path, tokenizer_path=None, device="cpu"):
    """(model, tokenizer) from a model folder or run folder
    (trainer/checkpoint.py's load_newest: a run's newest checkpoint that loads),
    the model on device in eval mode."""
    given_tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path else None

    def read(model_dir: Path):
        tokenizer = given_tokenizer
        # read with the weights: a later read could find the folder replaced
        if tokenizer is None:
            if not (model_dir / "tokenizer.json").is_file():
                raise UserError(f"{model_dir}: has no tokenizer.json; "
                                "pass the model's tokenizer with --tokenizer_path")
            tokenizer = load_tokenizer(model_dir)
        lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                  local_files_only=True,
                                                  trust_remote_code=False)
        return lm, tokenizer

    folder, (lm, tokenizer) = load_newest(Path(path), read)
    # The trainer sizes a MiniMind vocabulary to its tokenizer exactly,
    # so any difference means the wrong one.
    # Other models may pad their vocabulary;
    # there only a tokenizer with ids the model cannot embed is refused.
    exact = lm.config.model_type == "minimind"
    if (len(tokenizer) > lm.config.vocab_size
            or (exact and len(tokenizer) != lm.config.vocab_size)):
        own = (folder / "tokenizer.json").is_file()
        advice = ("leave --tokenizer_path out to use the model folder's own"
                  if tokenizer_path and own
                  else "pass the tokenizer it was trained with (--tokenizer_path)")
        raise UserError(f"the tokenizer has {len(tokenizer)} tokens "
                        f"but the model's vocabulary has {lm.config.vocab_size}; {advice}")
    # the same size can still split text otherwise
    if problem := tokenizer_problem(folder, tokenizer):
        raise UserError(f"{problem}; pass that one with --tokenizer_path, "
                        "or leave the flag out to use the model folder's own")
    return lm.to(device).eval(), tokenizer


def display_name(path) -> str:
    return run_folder(path).name


def recorded_args(run: Path) -> dict | None:
    """The trainer flags a run recorded: in its summary.json once it has ended,
    else (still training, or stopped) in its newest step's training state that loads."""
    args = None
    # none, damaged, or not the trainer's: the training state
    with contextlib.suppress(Exception):
        args = json.loads((run / "summary.json").read_text(encoding="utf-8"))["args"]
    if not isinstance(args, dict):
        args = (newest_state(run) or {}).get("args")
    return args if isinstance(args, dict) else None


def trained_on(path) -> str | None:
    """The data a run recorded (path: the run folder or a step folder in it),
    as --eval_data takes it, with --text_field where that is not "text";
    None for the embedded plays, or where none is recorded."""
    args = recorded_args(run_folder(path)) or {}
    data, field = args.get("data_path"), args.get("text_field")
    if not isinstance(data, str) or not isinstance(field, str):  # none, or not the trainer's
        return None
    if not data or is_embedded(data):  # "": the plays, in earlier versions
        return None
    return shlex.quote(data) + (f" --text_field {shlex.quote(field)}" if field != "text" else "")


def with_windows_of(path, eval_kwargs: dict) -> dict:
    """eval_kwargs where --seq_len is not given: the run's own --max_seq_len, the windows of the val loss
    it printed (None, for a model no run recorded: evaluate_split's default)."""
    if eval_kwargs.get("seq_len"):
        return eval_kwargs
    length = (recorded_args(run_folder(path)) or {}).get("max_seq_len")
    return dict(eval_kwargs, seq_len=length if isinstance(length, int) else None)


# a MiniMind model's normalization setup, or another model's type
def variant_of(config) -> str:
    return norm_variant(config) if config.model_type == "minimind" else config.model_type


def encode_prompt(tokenizer, prompt: str, context: int,
                  max_new_tokens: int) -> tuple[torch.Tensor, str]:
    """([1, n] ids: bos then the prompt, the prompt as the model sees it):
    the prompt cut from the left so that n + max_new_tokens fits the context."""
    ids = [tokenizer.bos_token_id] + tokenizer.encode(prompt, add_special_tokens=False)
    limit = context - max_new_tokens
    # bos, and at least one token of a prompt that has any
    if limit < min(len(ids), 2):
        raise UserError(f"--max_new_tokens {max_new_tokens} leaves no room for the prompt "
                        f"in the model's context of {context} tokens (one is bos): "
                        f"pass at most {context - min(len(ids), 2)}")
    if len(ids) > limit:
        print(f"warning: prompt of {len(ids) - 1} tokens cut to its last {limit - 1}: "
              f"the model's context is {context} tokens, one is bos "
              f"and {max_new_tokens} are kept for --max_new_tokens", file=sys.stderr)
        ids = ids[:1] + ids[len(ids) - (limit - 1):]
        # (a cut inside a character shows as �)
        prompt = "…" + tokenizer.decode(ids[1:])
    return torch.tensor([ids]), prompt


@torch.no_grad()
def generate_text(lm, tokenizer, prompt: str, sampling: Sampling = Sampling(),
                  stream: bool = False) -> str:
    """The continuation of prompt, printed after the prompt as it is produced when stream
    is set.
    The seed is set for every prompt, so a continuation does not depend on earlier ones
    and several checkpoints draw the same random numbers."""
    context = lm.config.max_position_embeddings
    new_tokens = sampling.max_new_tokens or min(DEFAULT_NEW_TOKENS, context // 2)
    ids, seen = encode_prompt(tokenizer, prompt, context, new_tokens)
    ids = ids.to(lm.device)
    if stream:  # once the prompt is known to fit: an error or warning comes before it
        print(seen, end="", flush=True)
    options = {"max_new_tokens": new_tokens,
               "repetition_penalty": sampling.repetition_penalty,
               "do_sample": sampling.temperature > 0,
               "use_cache": not sampling.no_kv_cache}
    if options["do_sample"]:  # greedy decoding would warn that these are unused
        options.update(temperature=sampling.temperature, top_p=sampling.top_p,
                       top_k=sampling.top_k)
    streamer = (TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
                if stream else None)
    torch.manual_seed(sampling.seed)
    # the trainer's precision
    with autocast(lm.device, resolve_dtype("auto", lm.device)):
        out = lm.generate(ids, attention_mask=torch.ones_like(ids),
                          pad_token_id=tokenizer.pad_token_id, streamer=streamer,
                          **options)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def read_prompts():
    """Prompts typed at the terminal, until an empty line, EOF (Ctrl-D) or Ctrl-C."""
    while True:
        try:
            prompt = input("prompt> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return
        if not prompt:
            return
        yield prompt


def evaluate_split(lm, tokenizer, data_path: str | None = "default",
                   text_field: str = "text", batch_size: int = 8,
                   seq_len: int | None = None, max_batches: int | None = None,
                   progress: bool = False) -> dict:
    """Loss per token, perplexity and bits per byte on data_path's validation split,
    by the trainer's evaluate() over its first max_batches batches (default: all)
    of non-overlapping windows;
    bits per byte use the whole split's bytes per token."""
    context = lm.config.max_position_embeddings
    seq_len = seq_len or min(DEFAULT_SEQ_LEN, context)
    if seq_len > context:
        raise UserError(f"--seq_len {seq_len} is longer than the model's context "
                        f"of {context} tokens")
    split = prepare_split(data_path, "validation", tokenizer, text_field)
    windows = BatchSampler(split.tokens, batch_size, seq_len, shuffle=False).num_windows
    if max_batches is not None:  # the whole split is the most evaluate() reads
        windows = min(windows, max_batches * batch_size)
    loss = evaluate(lm, split.tokens, batch_size, seq_len, max_batches, lm.device,
                    autocast(lm.device, resolve_dtype("auto", lm.device)), progress)
    # no float holds e^709 (a diverged model)
    ppl = math.exp(loss) if loss < 709 else math.inf
    return {"loss": loss, "ppl": ppl, "bpb": bits_per_byte(loss, split.bytes_per_token),
            "tokens": windows * seq_len,
            "seq_len": seq_len}


def compare(paths, prompts, sampling: Sampling = Sampling(), device="cpu",
            tokenizer_path=None, eval_kwargs: dict | None = None) -> list[Result]:
    """Every prompt through every checkpoint, loaded one at a time, with the same seed,
    plus evaluate_split(**eval_kwargs) if given.
    One that cannot be loaded, or cannot take a prompt or --seq_len (its context is shorter),
    is named in a warning and kept as a Result with its error;
    a UserError when none is left."""
    names = [display_name(p) for p in paths]
    # e.g. a/seed0 and b/seed0: only the full paths tell them apart
    if len(set(names)) < len(names):
        names = [str(p) for p in paths]
    results = []
    for i, (path, name) in enumerate(zip(paths, names, strict=True), 1):
        print(f"[{i}/{len(paths)}] {name}", file=sys.stderr)
        variant = "not loaded"
        try:
            lm, tokenizer = load(path, tokenizer_path, device)
            variant = variant_of(lm.config)
            continuations = [generate_text(lm, tokenizer, p, sampling) for p in prompts]
            metrics = (evaluate_split(lm, tokenizer, **with_windows_of(path, eval_kwargs))
                       if eval_kwargs is not None else None)
        except UserError as err:
            print(f"warning: left out of the comparison: {err}", file=sys.stderr)
            results.append(Result(name, variant, [], error=str(err)))
            continue
        results.append(Result(name, variant, continuations, metrics))
    if all(r.error for r in results):
        raise UserError("nothing to compare: no model could be loaded and run "
                        "(the warnings above say why)")
    # by default a run's windows are those it trained on; another model's, up to 256 tokens
    lengths = {r.name: r.metrics["seq_len"] for r in results if r.metrics}
    if len(set(lengths.values())) > 1:
        each = ", ".join(f"{name} {n}" for name, n in lengths.items())
        print(f"warning: the losses are over windows of different lengths ({each} tokens), "
              "and a longer window's tokens see more context: pass one --seq_len", file=sys.stderr)
    return results


def format_comparison(prompts, results: list[Result]) -> str:
    """One block per prompt:
    the prompt, then each checkpoint's continuation under its label."""
    blocks = []
    for i, prompt in enumerate(prompts):
        lines = [f"=== prompt {i + 1} ===", prompt]
        for r in results:
            if r.error is None:
                lines += [f"--- {r.name} ({r.variant}) ---", r.continuations[i]]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def format_metrics_table(results: list[Result]) -> str:
    header = ("checkpoint", "variant", "loss", "ppl", "bpb")
    rows = [header] + [(r.name, r.variant, "—", "—", "—") if r.error else
                       (r.name, r.variant, f"{r.metrics['loss']:.4f}",
                        f"{r.metrics['ppl']:.2f}", f"{r.metrics['bpb']:.4f}")
                       for r in results]
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w)
                               for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--model_path", type=user_path,
                   help="the trainer's --out_dir, a step folder, "
                        "or any AutoModelForCausalLM folder (e.g. a Llama export)")
    p.add_argument("--tokenizer_path", type=user_path,
                   help="tokenizer folder (default: the model folder's own)")
    p.add_argument("--device", default="auto",
                   help="auto (cuda if available, with bf16 autocast, or fp16 where the GPU "
                        "has no bf16; else cpu in fp32), "
                        "cpu, cuda, cuda:1, ...")
    gen = p.add_argument_group("generation")
    gen.add_argument("--prompt", action="append",
                     help="text to continue; repeat for several "
                          "(default: typed at a terminal, "
                          "else, and with --compare, a few Shakespeare prompts; "
                          "with --eval_data alone, none); "
                          "cut from the left to fit the context")
    gen.add_argument("--max_new_tokens", type=positive_int,
                     default=Sampling.max_new_tokens,
                     help=f"tokens to generate (default: {DEFAULT_NEW_TOKENS}, or half the "
                          "model's context where that is less); at most the context minus 2 "
                          "(bos and one token of the prompt)")
    gen.add_argument("--temperature", type=non_negative, default=Sampling.temperature,
                     help="0 = greedy")
    gen.add_argument("--top_p", type=probability, default=Sampling.top_p,
                     help="nucleus sampling (1 = off)")
    gen.add_argument("--top_k", type=count, default=Sampling.top_k,
                     help="the k likeliest tokens only (0 = off)")
    gen.add_argument("--repetition_penalty", type=positive_float,
                     default=Sampling.repetition_penalty,
                     help="above 1, tokens already present become less likely "
                          "(below 1, likelier): their positive logits are divided "
                          "by it, negative ones multiplied (1 = off)")
    gen.add_argument("--seed", type=count, default=Sampling.seed,
                     help="set anew for every prompt")
    gen.add_argument("--no_kv_cache", action="store_true",
                     help="recompute the whole sequence for every token "
                          "(slower, the same tokens: a check of the cache)")
    ev = p.add_argument_group("held-out evaluation")
    ev.add_argument("--eval_data", nargs="?", const="default", metavar="PATH|default",
                    type=user_path,
                    help="loss, perplexity and bits per byte on the validation split "
                         "of this corpus: its own, "
                         "else documents 0, 100, 200, ..., "
                         "as the trainer holds them out (alone: the held-out plays)")
    ev.add_argument("--text_field", default="text",
                    help="the column of --eval_data that holds the text")
    ev.add_argument("--batch_size", type=positive_int, default=8,
                    help="windows per evaluation batch")
    ev.add_argument("--seq_len", type=positive_int,
                    help="tokens per window (default: a run's own --max_seq_len; "
                         f"for another model, min({DEFAULT_SEQ_LEN}, its context))")
    ev.add_argument("--eval_batches", type=positive_int,
                    help="evaluate this many batches (default: all)")
    p.add_argument("--compare", nargs="+", metavar="DIR", type=user_path,
                   help="also these model folders, with the same prompts and seed, "
                        "side by side (one that cannot be loaded, or whose context is too short "
                        "for a prompt or --seq_len, is named and left out)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and check the flags, naming the bad one in a one-line UserError."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model_path is None and not args.compare:
        raise UserError("give --model_path DIR, or --compare DIR [DIR ...] (see --help)")
    # without --eval_data nothing would read them: a user who set one meant to evaluate
    stray = [f"--{name}" for name in ("text_field", "batch_size", "seq_len", "eval_batches")
             if getattr(args, name) != parser.get_default(name)]
    if stray and args.eval_data is None:
        raise UserError(f"{', '.join(stray)} set the held-out evaluation: add --eval_data [PATH]")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    # the per-load "Loading weights" bar is noise here
    hf_logging.disable_progress_bar()
    device = pick_device(args.device)
    sampling = Sampling(**{f.name: getattr(args, f.name) for f in fields(Sampling)})
    eval_kwargs = None
    paths = ([args.model_path] if args.model_path else []) + (args.compare or [])
    # --eval_data alone is the held-out plays, whatever a run trained on
    for path in paths if args.eval_data == "default" else []:
        if data := trained_on(path):
            print(f"warning: {display_name(path)} was trained on {data}; --eval_data alone "
                  f"measures the held-out plays (--eval_data {data}: its own)", file=sys.stderr)
    if args.eval_data is not None:
        eval_kwargs = dict(data_path=args.eval_data, text_field=args.text_field,
                           progress=True, batch_size=args.batch_size,
                           seq_len=args.seq_len, max_batches=args.eval_batches)

    if args.compare:
        prompts = args.prompt or DEFAULT_PROMPTS
        results = compare(paths, prompts, sampling, device, args.tokenizer_path,
                          eval_kwargs)
        print(format_comparison(prompts, results))
        if eval_kwargs is not None:
            print("\n" + format_metrics_table(results))
        return

    lm, tokenizer = load(args.model_path, args.tokenizer_path, device)
    if eval_kwargs is not None:
        metrics = evaluate_split(lm, tokenizer, **with_windows_of(args.model_path, eval_kwargs))
        result = Result(display_name(args.model_path), variant_of(lm.config), [],
                        metrics)
        print(format_metrics_table([result]))
        if not args.prompt:
            return
    prompts = args.prompt or (read_prompts() if sys.stdin and sys.stdin.isatty()
                              else DEFAULT_PROMPTS)
    for prompt in prompts:
        # the prompt, then its continuation (the streamer ends the line)
        generate_text(lm, tokenizer, prompt, sampling, stream=True)
        print()


if __name__ == "__main__":
    try:
        run_cli(main)
    except BrokenPipeError:  # the reader of the output went away (`| head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
