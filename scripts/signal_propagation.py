"""Signal propagation at initialization: how each norm placement carries the forward signal and the gradient
through depth, before any training.

    python scripts/signal_propagation.py                                  # 9 variants x depths 4..128, hidden 128
    python scripts/signal_propagation.py --variants pre-rmsnorm post-rmsnorm --depths 4 8 16 --hidden_size 64

Each variant (a name of study/variants.py) at each depth is built as the trainer builds it (same flags and init,
fixed --seed) and runs one forward and backward of the language-model loss on the first --batch_size held-out
windows, recording the trainer's per-block diagnostics (trainer/diagnostics.py). It prints a table and what theory
predicts next to what was measured, and writes the per-block numbers (JSON) and a figure to --out_dir; a run is
read in docs/results/depth.md.

The textbook predictions assume sublayer outputs about as large as the stream they join; with the model's
N(0, 0.02) init at hidden 128 they are far smaller, so some need not hold at init (a block cosine near 1 shows it).
"""

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from tqdm import tqdm

from common.cli import ArgumentParser, UserError, require_positive, run_cli
from common.environment import environment
from data import BatchSampler, load_tokenizer, prepare_split
from study.plots import plot_signal_propagation
from study.variants import VARIANTS
from trainer.args import build_parser
from trainer.diagnostics import block_grad_norms, layer_stats
from trainer.train_pretrain import build_model, model_config

DEFAULT_VARIANTS = ["pre-rmsnorm", "post-rmsnorm", "peri-rmsnorm", "reorder-rmsnorm", "deepnorm-rmsnorm",
                    "mix-rmsnorm", "pre+depth-rmsnorm", "pre+qk_head-rmsnorm", "pre-none"]


def measure(model_args, variant: str, depth: int, tokenizer, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Build the variant at this depth as the trainer would and measure it once, at initialization."""
    args = argparse.Namespace(**{**vars(model_args), **VARIANTS[variant], "num_hidden_layers": depth})
    model = build_model(model_config(args, tokenizer, torch.device("cpu")), args.seed)
    stats = layer_stats(model, x)
    loss = model(input_ids=x, shift_labels=y).loss
    loss.backward()
    grads = block_grad_norms(model.model.layers).tolist()
    # largest over smallest block gradient: 1 when every block would learn at the same rate
    spread = max(grads) / min(grads) if min(grads) > 0 else math.inf
    return {"variant": variant, "depth": depth, "loss": loss.item(), **stats, "layer_grad_norm": grads,
            "gradient_spread": spread}


def loglog_slope(xs, ys) -> float:
    """Exponent p of the least-squares fit ys ~ xs^p."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def rms_range(values: list[float]) -> tuple[str, bool]:
    """How a stream that should have RMS 1 measured, and whether every value is within 0.05 of 1."""
    return f"RMS {min(values):.3f}..{max(values):.3f}", max(abs(v - 1) for v in values) < 0.05


def theory(results: list[dict], head_dim: int, mix_ln_fraction: float,
           hidden_size: int | None = None) -> list[tuple[str, str, str, bool]]:
    """(variant, what theory says, what was measured, whether they agree) for each variant that has a prediction
    and was measured; the deepest depth is used for the within-model claims (hidden_size: for the embedding
    scale's, which is skipped without it)."""
    by = {(r["variant"], r["depth"]): r for r in results}
    depths = sorted({r["depth"] for r in results})
    deep = depths[-1]
    checks = []

    def at_deep(*variants: str) -> bool:
        return all((v, deep) in by for v in variants)

    def every_depth(variant: str) -> list[dict]:
        return [by[variant, d] for d in depths if (variant, d) in by]

    def variance_growth(variant):  # after l blocks (l >= 1): exponent of var ~ l^p and the variance added per block
        var = np.square(by[variant, deep]["residual_rms"][1:])
        blocks = np.arange(1, len(var) + 1)
        return loglog_slope(blocks, var), float(np.polyfit(blocks, var, 1)[0])

    if at_deep("pre-rmsnorm") and deep >= 4:
        p, per_block = variance_growth("pre-rmsnorm")
        checks.append(("pre-rmsnorm", "residual variance grows about linearly with depth (var ~ l^1)",
                       f"var ~ l^{p:.2f} over {deep} blocks, +{per_block:.3g} per block", 0.7 <= p <= 1.3))
        if at_deep("pre+depth-rmsnorm"):
            p_scaled, _ = variance_growth("pre+depth-rmsnorm")
            checks.append(("pre+depth-rmsnorm", "1/sqrt(l) on the input norms slows the variance growth of pre",
                           f"var ~ l^{p_scaled:.2f} vs pre's l^{p:.2f}", p_scaled < p))
    if at_deep("peri-rmsnorm") and deep >= 4:
        p, per_block = variance_growth("peri-rmsnorm")
        checks.append(("peri-rmsnorm", "each sublayer adds an output of RMS 1: variance +2 per block, no faster",
                       f"+{per_block:.2f} per block, var ~ l^{p:.2f}", 1.5 <= per_block <= 2.5))
    if len(post := every_depth("post-rmsnorm")) > 1:
        first = [r["layer_grad_norm"][0] for r in post]
        slope = loglog_slope([r["depth"] for r in post], first)
        checks.append(("post-rmsnorm", "the bottom block's gradient shrinks as depth grows",
                       f"block-0 gradient ~ L^{slope:.2f} ({first[0]:.3g} at L={post[0]['depth']}, "
                       f"{first[-1]:.3g} at L={post[-1]['depth']})", slope < 0))
    if deep_norm := [v for r in every_depth("deepnorm-rmsnorm") for v in r["residual_rms"][1:]]:
        # every block ends in a unit-gain norm, so every block after the first receives RMS 1
        checks.append(("deepnorm-rmsnorm", "the stream stays bounded: RMS 1 after every block, at every depth",
                       *rms_range(deep_norm)))
    if at_deep("pre-rmsnorm"):
        grads, pre_spread = by["pre-rmsnorm", deep]["layer_grad_norm"], by["pre-rmsnorm", deep]["gradient_spread"]
        checks.append(("pre-rmsnorm", "deeper blocks get smaller gradients (the curse of depth)",
                       f"last / first block gradient {grads[-1] / grads[0]:.3g} at L={deep}", grads[-1] < grads[0]))
        for variant in ("peri-rmsnorm", "mix-rmsnorm", "deepnorm-rmsnorm", "pre+depth-rmsnorm"):
            if at_deep(variant):
                spread = by[variant, deep]["gradient_spread"]
                checks.append((variant, "block gradients more even than pre's (smaller max / min over blocks)",
                               f"max / min {spread:.3g} vs pre's {pre_spread:.3g} at L={deep}", spread < pre_spread))
    if at_deep("mix-rmsnorm"):
        n_post = math.floor(mix_ln_fraction * deep)
        after_post = by["mix-rmsnorm", deep]["residual_rms"][1:n_post + 1]
        checks.append(("mix-rmsnorm", f"the first {n_post} (Post-Norm) blocks hand on a stream of RMS 1",
                       *(rms_range(after_post) if after_post else ("RMS n/a", True))))
    if qk := every_depth("pre+qk_head-rmsnorm"):
        largest = max(v for r in qk for v in r["max_attn_logit"])
        checks.append(("pre+qk_head-rmsnorm", f"unit-gain QK-norm caps every logit at sqrt(head_dim) = "
                       f"{math.sqrt(head_dim):.2f}", f"largest logit {largest:.3f}", largest <= math.sqrt(head_dim) + 1e-3))
    for variant, first in (("hybrid-rmsnorm", 1), ("hybrid_star-rmsnorm", 2)):
        # N(x + Attn(x)) hands the MLP RMS 1; the MLP's update at init is small beside it
        if after := [v for r in every_depth(variant) for v in r["residual_rms"][first:]]:
            checks.append((variant, f"Post-Norm around attention: blocks from {first} on receive RMS about 1, at "
                           "every depth", *rms_range(after)))
    if at_deep("pre+sub-rmsnorm", "pre-rmsnorm"):
        sub, pre = by["pre+sub-rmsnorm", deep]["residual_rms"][-1], by["pre-rmsnorm", deep]["residual_rms"][-1]
        checks.append(("pre+sub-rmsnorm", "sub-norms feed o_proj and down_proj unit-RMS inputs, so each sublayer "
                       "writes a larger update than in pre and the stream grows faster",
                       f"last-block RMS {sub:.3g} vs pre's {pre:.3g} at L={deep}", sub > pre))
    if hidden_size and at_deep("pre+embed_scale-rmsnorm", "pre-rmsnorm"):
        ratio = by["pre+embed_scale-rmsnorm", deep]["residual_rms"][0] / by["pre-rmsnorm", deep]["residual_rms"][0]
        checks.append(("pre+embed_scale-rmsnorm", f"x sqrt(d) multiplies the stream entering block 0 by "
                       f"{math.sqrt(hidden_size):.2f}", f"{ratio:.2f} x pre's", abs(ratio / math.sqrt(hidden_size) - 1) < 1e-3))
    if at_deep("pre+embed_norm-rmsnorm"):
        first = by["pre+embed_norm-rmsnorm", deep]["residual_rms"][0]
        checks.append(("pre+embed_norm-rmsnorm", "a unit-gain norm after the lookup: block 0 receives RMS 1 "
                       "(less eps's share at RMS 0.02)", f"RMS {first:.3f}", abs(first - 1) < 0.05))
    for variant, claim, keys, what in (
            ("pre+one_plus_w-rmsnorm", "w = 0 applied as 1 + w is pre's function at init, bit for bit",
             ("loss", "residual_rms", "layer_grad_norm"), "loss, stream RMS and block gradients"),
            ("pre-seednorm", "with beta = 0, tanh(x . beta) = 0 and SeeDNorm is RMSNorm: pre's function at init, "
             "bit for bit", ("loss", "residual_rms"), "loss and stream RMS")):
        if both := [d for d in depths if (variant, d) in by and ("pre-rmsnorm", d) in by]:
            same = all(by[variant, d][key] == by["pre-rmsnorm", d][key] for d in both for key in keys)
            checks.append((variant, claim, f"{what} {'identical' if same else 'differ'}", same))
    if rezero := every_depth("rezero"):  # x + a * F(x) with a = 0: each block hands on exactly what it received
        cosine = min(min(r["block_cosine"]) for r in rezero)
        spread = max(max(r["residual_rms"]) / min(r["residual_rms"]) for r in rezero)
        checks.append(("rezero", "every block is the identity at init (a = 0): cosine 1, the stream's RMS unchanged",
                       f"block cosine >= {cosine:.6f}, RMS varies by a factor {spread:.6f}",
                       cosine > 1 - 1e-5 and spread < 1 + 1e-6))
    if at_deep("pre-none"):
        cosine = by["pre-none", deep]["block_cosine"]
        checks.append(("pre-none", "without norms the 0.02-scale stream hardly moves: blocks act as identity",
                       f"block cosine {min(cosine):.4f}..{max(cosine):.4f}", min(cosine) > 0.9))
    return checks


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS,
                   help="<placement>-<norm> names as in study/variants.py (pre-none = no norm at all)")
    p.add_argument("--depths", nargs="+", type=int, default=[4, 8, 16, 32, 64, 128], help="numbers of blocks")
    p.add_argument("--hidden_size", type=int, default=128, help="model width")
    p.add_argument("--num_attention_heads", type=int, default=8, help="query heads")
    p.add_argument("--num_key_value_heads", type=int, default=2, help="key/value heads")
    p.add_argument("--batch_size", type=int, default=4, help="held-out windows in the one batch")
    p.add_argument("--seq_len", type=int, default=128, help="tokens per window")
    p.add_argument("--seed", type=int, default=0, help="seeds every model's initialization")
    p.add_argument("--data_path", default=None, help="corpus (default: the embedded Shakespeare plays)")
    p.add_argument("--tokenizer_path", default=None, help="tokenizer directory (default: the shipped one)")
    p.add_argument("--out_dir", default="out/signal_propagation",
                   help="writes signal_propagation.json and signal_propagation.png here")
    args = p.parse_args(argv)
    require_positive(args, ("hidden_size", "num_attention_heads", "num_key_value_heads", "batch_size", "seq_len"))
    if any(d < 1 for d in args.depths):
        raise UserError(f"--depths must be positive integers, got {args.depths}")
    if unknown := [v for v in args.variants if v not in VARIANTS]:
        raise UserError(f"unknown variant {unknown[0]!r}; see python scripts/run_ablation.py --help for the names")
    tokenizer = load_tokenizer(args.tokenizer_path)
    held_out = prepare_split(args.data_path, "validation", tokenizer)
    x, y = next(BatchSampler(held_out.tokens, args.batch_size, args.seq_len, sequential=True))
    # The trainer's own defaults, so each model is built exactly as `train_pretrain.py` with these flags builds it.
    model_args = build_parser().parse_args([
        "--hidden_size", str(args.hidden_size), "--num_attention_heads", str(args.num_attention_heads),
        "--num_key_value_heads", str(args.num_key_value_heads), "--max_seq_len", str(args.seq_len),
        "--seed", str(args.seed)])

    results = [measure(model_args, variant, depth, tokenizer, x, y) for variant, depth in
               tqdm([(v, d) for v in args.variants for d in sorted(args.depths)], desc="models", unit="model")]

    print(f"\nat initialization, seed {args.seed}, hidden {args.hidden_size}, one batch of {args.batch_size} x "
          f"{args.seq_len} held-out tokens. rms: residual stream entering block 0 / the last block; grad: gradient "
          "norm of the first / last block's parameters; cos: cosine between a block's input and output; kurt max: "
          "largest excess kurtosis of the stream entering a block; tok0 / sink: attention probability on token 0 / "
          "on the sinks, mean over blocks")
    width = max(22, *(len(v) + 2 for v in args.variants))
    head = f"{'variant':<{width}}{'L':>4}{'loss':>7}{'rms 0':>9}{'rms L-1':>9}{'grad 0':>10}{'grad L-1':>10}" \
           f"{'cos min':>9}{'cos mean':>9}{'max logit':>10}{'kurt max':>9}{'tok0':>7}{'sink':>7}"
    print(head + "\n" + "-" * len(head))
    for r in results:
        rms, grad, cos = r["residual_rms"], r["layer_grad_norm"], r["block_cosine"]
        sink = f"{np.mean(r['attn_sink_share']):>7.3f}" if "attn_sink_share" in r else f"{'-':>7}"
        print(f"{r['variant']:<{width}}{r['depth']:>4}{r['loss']:>7.3f}{rms[0]:>9.3g}{rms[-1]:>9.3g}{grad[0]:>10.3g}"
              f"{grad[-1]:>10.3g}{min(cos):>9.3f}{np.mean(cos):>9.3f}{max(r['max_attn_logit']):>10.3g}"
              f"{max(r['excess_kurtosis']):>9.3g}{np.mean(r['attn_first_token']):>7.3f}{sink}")

    checks = theory(results, args.hidden_size // args.num_attention_heads, model_args.mix_ln_fraction,
                    args.hidden_size)
    if checks:
        print("\ntheory vs measurement")
        for variant, claim, measured, agrees in checks:
            print(f"  {variant:<20} {'agrees ' if agrees else 'DIFFERS'}  theory: {claim}; measured: {measured}")

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"environment": environment(), "config": vars(args), "results": results,
               "theory": [dict(zip(("variant", "claim", "measured", "agrees"), c, strict=True)) for c in checks]}
    (out / "signal_propagation.json").write_text(json.dumps(payload, indent=1))
    plot_signal_propagation(results, out / "signal_propagation.png")
    print(f"\nwrote {out / 'signal_propagation.json'} and {out / 'signal_propagation.png'}")


if __name__ == "__main__":
    run_cli(main)
