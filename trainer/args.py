"""Every training flag: its default, check and role, in one place (the trainer and the ablation runner share it)."""

import argparse
import math
from pathlib import Path

import torch

from common.cli import ArgumentParser, UserError, require_positive, require_writable_dir
from model import (
    ATTN_GATES,
    EMBED_NORMS,
    NORM_GAINS,
    NORM_POSITIONS,
    NORM_SCALINGS,
    NORM_TYPES,
    QK_NORMS,
    V_NORMS,
)
from model.model_minimind import QKV_PLACEMENTS
from trainer.device import pick_device
from trainer.optim import OPTIMIZERS
from trainer.run_dir import find_checkpoints, no_checkpoint, previous_run

# Defaults that depend on the device. The no-flag run must finish in minutes on a 2-core CPU, so off-GPU the
# model is narrower, and the CPU preset's batch, steps and peak learning rate are the winners of the sweep in
# the README (Training > Choosing the default CPU run). On CUDA the default is MiniMind2-small (512 wide) at
# 128 x 256 = 32,768 tokens per GPU per micro-step, the least that keeps a modern GPU busy rather than waiting on
# kernel launches, for 50 steps: one pass over the embedded corpus's 1.58M training tokens (docs/gpu.md says how
# its learning rate and warmup were chosen; no GPU has measured them yet). Depth stays at 8 layers everywhere, so
# the 17-norm structure is the one users study. diag_interval None = every --log_interval step.
DEVICE_DEFAULTS = {
    "cpu": {"hidden_size": 128, "batch_size": 8, "max_steps": 760, "learning_rate": 6e-3, "warmup_steps": 100,
            "diag_interval": None},
    "cuda": {"hidden_size": 512, "batch_size": 128, "max_steps": 50, "learning_rate": 3e-3, "warmup_steps": 10,
             "diag_interval": 100},
}


def device_defaults(device) -> dict:
    """DEVICE_DEFAULTS for a torch.device: CUDA's, or the CPU preset for anything else."""
    return DEVICE_DEFAULTS["cuda" if device.type == "cuda" else "cpu"]


def on_device(name: str, unset: str = "") -> str:
    def shown(value):
        return unset if value is None else f"{value:g}"
    return f"default: {shown(DEVICE_DEFAULTS['cuda'][name])} on CUDA, {shown(DEVICE_DEFAULTS['cpu'][name])} on CPU"


MIN_LR = 2e-4  # the cosine decay's floor unless --min_lr says otherwise
# What a run is to its study (--wandb_job): a plain run, a point of a learning-rate grid, another seed at the chosen lr
WANDB_JOBS = ("run", "grid", "seed")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        description="Pretrain a MiniMind decoder (default: on Shakespeare's plays, embedded, offline).",
    )
    data = p.add_argument_group("data")
    data.add_argument("--data_path", default=None,
                      help="corpus: omit for the embedded Shakespeare plays; a .jsonl/.txt/.parquet file or folder; "
                           "or a Hugging Face dataset name such as roneneldan/TinyStories")
    data.add_argument("--text_field", default="text", help="column that holds the text")
    data.add_argument("--tokenizer_path", default=None, help="tokenizer directory (default: the shipped data/tokenizer)")
    data.add_argument("--streaming", action="store_true",
                      help="stream the corpus while tokenizing it (for corpora larger than memory)")
    data.add_argument("--max_seq_len", type=int, default=256, help="tokens per training sequence")

    model = p.add_argument_group("model")
    model.add_argument("--hidden_size", type=int, default=None, help=f"model width ({on_device('hidden_size')})")
    model.add_argument("--num_hidden_layers", type=int, default=8, help="number of transformer blocks")
    model.add_argument("--num_attention_heads", type=int, default=8, help="query heads")
    model.add_argument("--num_key_value_heads", type=int, default=2, help="key/value heads (grouped-query attention)")
    model.add_argument("--norm", default="rmsnorm", choices=sorted(NORM_TYPES),
                       help="normalization layer, used in every norm slot of the placement. batchnorm is a "
                            "demonstration, not a candidate: its statistics pool every position of the batch, so "
                            "in training each token is normalized with statistics of later tokens (it leaks the "
                            "future a causal LM must not see) and of the other sequences in the batch")
    model.add_argument("--norm_position", default="pre", choices=NORM_POSITIONS,
                       help="where the norms sit in each block. pre: x + F(N(x)), final norm (Llama); post: "
                            "N(x + F(x)) (2017 Transformer); peri: x + N(F(N(x))), final norm (Peri-LN, Gemma 2 "
                            "sandwich); reorder: x + N(F(x)), final norm (OLMo 2); deepnorm: N(a*x + F(x)) with "
                            "a = (2L)^(1/4) and init scaled by (8L)^(-1/4) (DeepNet); mix: the first "
                            "--mix_ln_fraction of the blocks post, the rest pre, final norm (Mix-LN); hybrid: "
                            "N(x + Attn(x)) with q, k, v normalized per head, then h + FFN(h) with no norm, final "
                            "norm (HybridNorm; implies --qk_norm head --v_norm head); hybrid_star: block 0 pre, the "
                            "rest hybrid (HybridNorm*)")
    model.add_argument("--mix_ln_fraction", type=float, default=0.25,
                       help="with --norm_position mix: share of the blocks, counted from the input, that are "
                            "Post-Norm (floor(fraction * layers) of them)")
    model.add_argument("--norm_scaling", default="none", choices=NORM_SCALINGS,
                       help="depth: multiply the input norms of block l (l = 1..L) by 1/sqrt(l) (LayerNorm "
                            "Scaling, 'The Curse of Depth'); only with --norm_position pre or mix")
    model.add_argument("--qk_norm", default=None, choices=QK_NORMS,
                       help="normalize queries and keys before RoPE with --norm's statistics. head: over each "
                            "head's dimensions (Qwen3, Gemma 3); proj: over the whole q and k projections, "
                            "across heads (OLMo 2) (default: head with --norm_position hybrid or hybrid_star, "
                            "else none)")
    model.add_argument("--v_norm", default=None, choices=V_NORMS,
                       help="head: normalize each head's values before attention with --norm's statistics "
                            "(self_attn.v_norm; with --qk_norm head this is Gemma 3n/4's QKV-norm) (default: "
                            "head with --norm_position hybrid or hybrid_star, else none)")
    model.add_argument("--attn_gate", default="none", choices=ATTN_GATES,
                       help="scale each head's attention output by sigmoid(gate), the gate computed by q_proj from "
                            "the attention's input (Gated Attention, Qiu et al. 2025). elementwise: one gate per "
                            "output dimension, q_proj twice as wide (Qwen3-Next); headwise: one gate per head, "
                            "q_proj wider by the number of heads")
    model.add_argument("--attn_sinks", action="store_true",
                       help="give each head a learnable sink logit (self_attn.sinks, init 0) that joins its "
                            "softmax, so a head can attend to nothing (GPT-OSS, DeepSeek-V4)")
    model.add_argument("--sub_norm", action="store_true",
                       help="add norms inside the sublayers: on the concatenated heads before o_proj "
                            "(self_attn.attn_sub_norm) and on the SwiGLU product before down_proj (mlp.ffn_sub_norm), "
                            "as BitNet's Sub-LN")
    model.add_argument("--embed_norm", default="none", choices=EMBED_NORMS,
                       help="what the blocks get from the embedding lookup. scale: times sqrt(hidden_size) (Gemma); "
                            "norm: a --norm norm right after the lookup (model.word_embeddings_layernorm, BLOOM)")
    model.add_argument("--norm_gain", default="w", choices=NORM_GAINS,
                       help="how every norm gain is stored. w: as is, initialized to 1; one_plus_w: as w, initialized "
                            "to 0 and applied as 1 + w in float32 (Gemma 2/3), so --norm_weight_decay pulls the gain "
                            "toward 1 instead of 0")
    model.add_argument("--dyt_alpha_init", type=float, default=0.5,
                       help="with --norm dyt or derf: initial alpha of tanh(alpha * x) or erf(alpha * x + shift) in "
                            "every norm not set below, QK-norms included (0.5 is the DyT paper's default for "
                            "non-LLM models, and the Derf paper's)")
    for slot, where in (("attn", "the attention sublayer's norms (before it, in pre)"),
                        ("mlp", "the MLP sublayer's norms (before it, in pre)"), ("final", "the final norm")):
        model.add_argument(f"--dyt_alpha_init_{slot}", type=float, default=None,
                           help=f"with --norm dyt or derf: initial alpha of {where} (default: --dyt_alpha_init). The "
                                "paper's LLaMA 7B recipe is attn 0.8, mlp 0.2, final 0.2; none exists for this size")
    model.add_argument("--logit_softcap", type=float, default=0.0,
                       help="soft-cap the logits z at C: C * tanh(z / C), in float32, in training and generation "
                            "(Gemma 2 uses 30, nanochat 15); 0 = off")

    opt = p.add_argument_group("optimization")
    opt.add_argument("--max_steps", type=int, default=None, help=f"optimizer steps ({on_device('max_steps')})")
    opt.add_argument("--batch_size", type=int, default=None,
                     help=f"sequences per micro-batch per process ({on_device('batch_size')})")
    opt.add_argument("--accumulation_steps", type=int, default=1, help="micro-batches per optimizer step")
    opt.add_argument("--learning_rate", type=float, default=None,
                     help=f"peak learning rate ({on_device('learning_rate')})")
    opt.add_argument("--min_lr", type=float, default=None,
                     help=f"learning rate at the end of the cosine decay (default: {MIN_LR:g}, or --learning_rate "
                          "when that is lower)")
    opt.add_argument("--lr_decay_steps", type=int, default=None,
                     help="length of the cosine schedule (default: --max_steps); set it to stop a run early and "
                          "later --resume it with a larger --max_steps on the same schedule")
    opt.add_argument("--warmup_steps", type=int, default=None,
                     help=f"linear warmup steps, 0 = none ({on_device('warmup_steps')})")
    opt.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS,
                     help="adamw: AdamW for every parameter. muon: Muon (torch.optim.Muon) for the weight matrices "
                          "inside the blocks (q, k, v, o, gate, up, down projections), AdamW for the rest "
                          "(embeddings, an untied lm_head, norm parameters, scalars), with the one --learning_rate "
                          "and --weight_decay: Muon's lr is scaled to match AdamW's update size")
    opt.add_argument("--weight_decay", type=float, default=0.1,
                     help="decoupled weight decay on weight matrices, AdamW's and Muon's (never on norms, biases, "
                          "embeddings)")
    opt.add_argument("--norm_weight_decay", action="store_true",
                     help="also apply --weight_decay to norm gains (pulls a gain toward 0, or toward 1 with --norm_gain "
                          "one_plus_w; default off)")
    opt.add_argument("--grad_clip", type=float, default=1.0, help="clip the global gradient norm (0 = off)")

    run = p.add_argument_group("run")
    run.add_argument("--out_dir", default="out/pretrain", help="checkpoints and metrics go here")
    run.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1, ...")
    run.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                     help="autocast dtype; auto = bfloat16 on GPUs with native bf16, else float16 (with a "
                          "GradScaler); float32 on CPU (bf16 on a CPU without bf16 hardware trains ~40x slower)")
    run.add_argument("--compile", action="store_true",
                     help="torch.compile the model (off by default everywhere: on a 2-core CPU it paid little, and "
                          "no GPU has measured it yet; scripts/gpu_check.py does). The first step, which compiles, "
                          "is timed apart as compile_time_s")
    run.add_argument("--seed", type=int, default=0, help="seed for initialization and batch sampling")
    run.add_argument("--log_interval", type=int, default=10, help="steps between logged metrics")
    run.add_argument("--diag_interval", type=int, default=None,
                     help="steps between the per-block diagnostics (layer_grad_norm and the layer statistics: an "
                          "extra forward and a host read each time); such a step also logs, and the last step "
                          f"always does both ({on_device('diag_interval', '--log_interval')})")
    run.add_argument("--eval_interval", type=int, default=100, help="steps between validation evaluations")
    run.add_argument("--eval_steps", type=int, default=20, help="validation batches per evaluation")
    run.add_argument("--save_interval", type=int, default=200, help="steps between checkpoints")
    run.add_argument("--resume", action="store_true",
                     help="continue exactly from the newest checkpoint in --out_dir that loads")
    run.add_argument("--overwrite", action="store_true",
                     help="start afresh in an --out_dir that holds another run, deleting its checkpoints and metrics")
    run.add_argument("--keep_checkpoints", type=int, default=2,
                     help="how many of the newest checkpoints to keep (earlier ones are what --resume falls back "
                          "to when the newest is damaged)")
    run.add_argument("--no_layers_plot", action="store_true",
                     help="skip layers.png, the per-layer figure drawn at the end of a run (about a second of "
                          "matplotlib on a CPU, more than a tiny run's training)")
    run.add_argument("--num_proc", type=int, default=None,
                     help="processes for tokenizing the corpus (default: the cores this process may use)")
    run.add_argument("--dist_timeout", type=float, default=30,
                     help="minutes a process waits for the others under torchrun (a collective, or local rank 0 "
                          "tokenizing the corpus on first use) before the job fails instead of hanging")

    log = p.add_argument_group("wandb")
    log.add_argument("--use_wandb", action="store_true",
                     help="log to Weights & Biases: online if an API key is configured, else offline")
    log.add_argument("--wandb_project", default="minimind-norm", help="wandb project")
    log.add_argument("--wandb_run_name", default=None, help="wandb run name (default: <variant>-s<seed>, e.g. pre-rmsnorm-s0)")
    log.add_argument("--wandb_group", default=None, help="wandb group (the ablation runner sets one per study)")
    log.add_argument("--wandb_job", default="run", choices=WANDB_JOBS,
                     help="what the run is to its study, as a wandb tag (job=...): run, a plain run; grid, a point of "
                          "a learning-rate grid; seed, another seed at a chosen learning rate (the ablation runner "
                          "sets it)")
    return p


# Every flag's role, declared once. The resume checks (trainer/run_dir.py), the ablation runner's reuse of finished
# runs and model_config() derive from it, and a test fails for a flag without one.
ARCH = "arch"  # a model-config field: on --resume the checkpoint's model decides, and a value given must agree
FIXED = "fixed"  # changes what the run computes and cannot change mid-run: must match on --resume
DATA = "data"  # names the data; --resume compares the data's fingerprint (these flags only for older checkpoints)
ADJUSTABLE = "adjustable"  # changes what the run computes or records, but may change on --resume (a longer run)
BOOKKEEPING = "bookkeeping"  # where and how a run is kept and watched: never changes what it computes
FLAG_ROLES = {
    "data_path": DATA, "text_field": DATA, "tokenizer_path": DATA, "streaming": ADJUSTABLE, "max_seq_len": FIXED,
    "hidden_size": ARCH, "num_hidden_layers": ARCH, "num_attention_heads": ARCH, "num_key_value_heads": ARCH,
    "norm": ARCH, "norm_position": ARCH, "mix_ln_fraction": ARCH, "norm_scaling": ARCH, "qk_norm": ARCH,
    "v_norm": ARCH, "attn_gate": ARCH, "attn_sinks": ARCH, "sub_norm": ARCH, "embed_norm": ARCH, "norm_gain": ARCH,
    "dyt_alpha_init": ARCH, "dyt_alpha_init_attn": ARCH, "dyt_alpha_init_mlp": ARCH, "dyt_alpha_init_final": ARCH,
    "logit_softcap": ARCH, "optimizer": FIXED,
    "max_steps": ADJUSTABLE, "batch_size": FIXED, "accumulation_steps": FIXED, "learning_rate": ADJUSTABLE,
    "min_lr": ADJUSTABLE, "lr_decay_steps": ADJUSTABLE, "warmup_steps": ADJUSTABLE, "weight_decay": FIXED,
    "norm_weight_decay": FIXED, "grad_clip": ADJUSTABLE,
    "out_dir": BOOKKEEPING, "device": ADJUSTABLE, "dtype": ADJUSTABLE, "compile": ADJUSTABLE, "seed": FIXED,
    "log_interval": ADJUSTABLE, "diag_interval": ADJUSTABLE, "eval_interval": ADJUSTABLE, "eval_steps": ADJUSTABLE,
    "save_interval": ADJUSTABLE,
    "resume": BOOKKEEPING, "overwrite": BOOKKEEPING, "keep_checkpoints": BOOKKEEPING, "no_layers_plot": BOOKKEEPING,
    "num_proc": BOOKKEEPING, "dist_timeout": BOOKKEEPING,
    "use_wandb": BOOKKEEPING, "wandb_project": BOOKKEEPING, "wandb_run_name": BOOKKEEPING, "wandb_group": BOOKKEEPING,
    "wandb_job": BOOKKEEPING,
}
# An architecture flag sets the model-config field of its name, except these.
CONFIG_FIELD = {"norm": "norm_type"}


def flags_with(role: str) -> tuple[str, ...]:
    return tuple(flag for flag, r in FLAG_ROLES.items() if r == role)


def config_fields() -> dict[str, str]:
    """Each architecture flag and the model-config field it sets."""
    return {flag: CONFIG_FIELD.get(flag, flag) for flag in flags_with(ARCH)}


POSITIVE = ("max_steps", "batch_size", "accumulation_steps", "max_seq_len", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "log_interval", "eval_interval", "eval_steps",
            "save_interval", "keep_checkpoints", "diag_interval", "hidden_size", "lr_decay_steps", "num_proc")  # the last three may be unset
NON_NEGATIVE = ("min_lr", "warmup_steps", "weight_decay", "grad_clip")
# Floats that must be > 0. Every float flag must be finite besides: NaN passes any "< 0" test, and inf passes
# "> 0" only to turn every weight into NaN at the first update. (The model config checks the architecture's.)
POSITIVE_FLOATS = ("learning_rate", "dist_timeout")


def float_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [action.dest for action in parser._actions if action.type is float]


def fill_device_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the unset flags of DEVICE_DEFAULTS for the device the run will use. The width stays unset here (the
    model config picks it), so a run's recorded flags read the same as those of runs from before this table."""
    for name, value in device_defaults(pick_device(args.device)).items():
        if name != "hidden_size" and getattr(args, name) is None:
            setattr(args, name, value)
    if args.diag_interval is None:
        args.diag_interval = args.log_interval
    for name in ("qk_norm", "v_norm"):  # the placement's own (HybridNorm normalizes q, k and v), as in the config
        if getattr(args, name) is None:
            setattr(args, name, "head" if args.norm_position in QKV_PLACEMENTS else "none")
    if args.min_lr is None:  # a decay that ends above the peak would raise the rate
        args.min_lr = min(MIN_LR, args.learning_rate)
    return args


def validate(args: argparse.Namespace) -> argparse.Namespace:
    """Reject bad values with one line naming the flag, before anything is loaded or written."""
    fill_device_defaults(args)
    require_positive(args, POSITIVE)
    for name in float_flags(build_parser()):
        if getattr(args, name) is not None and not math.isfinite(getattr(args, name)):
            raise UserError(f"--{name} must be a finite number, got {getattr(args, name)}")
    for name in NON_NEGATIVE:
        if getattr(args, name) < 0:
            raise UserError(f"--{name} must be >= 0, got {getattr(args, name)}")
    for name in POSITIVE_FLOATS:
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            raise UserError(f"--{name} must be > 0, got {getattr(args, name)}")
    if args.optimizer == "muon" and not hasattr(torch.optim, "Muon"):
        raise UserError(f"--optimizer muon needs torch.optim.Muon (torch 2.9 or newer); this is torch "
                        f"{torch.__version__}: upgrade torch, or use --optimizer adamw")
    if args.min_lr > args.learning_rate:  # the cosine "decay" would raise the rate from the peak to min_lr
        raise UserError(f"--min_lr {args.min_lr:g} is above --learning_rate {args.learning_rate:g}, so the decay "
                        "would raise the rate; set --min_lr at most --learning_rate")
    if not 0 <= args.seed < 2**32:  # numpy refuses a negative seed; 32 bits are a seed every RNG library takes
        raise UserError(f"--seed must be in [0, 2**32 - 1], got {args.seed}")
    out = Path(args.out_dir)
    require_writable_dir("--out_dir", out)
    if args.resume and args.overwrite:
        raise UserError("--resume continues the run in --out_dir and --overwrite discards it; pass one of them")
    if args.resume and not find_checkpoints(out):
        if records := previous_run(out):
            raise UserError(f"--resume: {no_checkpoint(out, records)}")
        raise UserError(f"--resume: no checkpoint in {out}; run without --resume to start fresh")
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return validate(build_parser().parse_args(argv))
