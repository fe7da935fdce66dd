"""Every training flag: its default, check and role, in one place (the trainer and the ablation runner share it)."""

import argparse
import math
from pathlib import Path

import torch

from common.cli import ArgumentParser, UserError, require_positive, require_writable_dir
from model import PRESETS, SWITCH, SWITCHES, variant_fields
from model.model_minimind import config_problem, with_implied
from trainer.device import pick_device
from trainer.optim import OPTIMIZERS
from trainer.run_dir import find_checkpoints, no_checkpoint

# Defaults that depend on the device. The no-flag CPU run must finish in minutes on 2 cores: a narrower model,
# and the batch, steps and peak lr that won the sweep (docs/training.md#choosing-the-default-cpu-run). CUDA:
# MiniMind2-small, 128 x 256 tokens per GPU per micro-step (the least that keeps a GPU busy), for one pass
# over the embedded corpus (docs/gpu.md). 8 layers everywhere: the 17 norms users study. diag_interval None =
# every --log_interval step.
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
    shown = {device: unset if d[name] is None else f"{d[name]:g}" for device, d in DEVICE_DEFAULTS.items()}
    return f"default: {shown['cuda']} on CUDA, {shown['cpu']} on CPU"


# What a run is to its study (--wandb_job): a plain run, a point of a learning-rate grid, another seed at the chosen lr
WANDB_JOBS = ("run", "grid", "seed")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description="Pretrain a MiniMind decoder (default: on Shakespeare's plays, embedded, "
                       "offline).")
    data = p.add_argument_group("data")
    data.add_argument("--data_path", help="corpus: omit for the embedded Shakespeare plays; a .jsonl/.txt/"
                      ".parquet file or folder; or a Hugging Face dataset name such as "
                      "roneneldan/TinyStories")
    data.add_argument("--text_field", default="text", help="column that holds the text")
    data.add_argument("--tokenizer_path", help="tokenizer directory (default: the shipped data/tokenizer)")
    data.add_argument("--streaming", action="store_true",
                      help="stream the corpus while tokenizing it (for corpora larger than memory)")
    data.add_argument("--max_seq_len", type=int, default=256, help="tokens per training sequence")

    model = p.add_argument_group("model", "every architecture switch of the model config, named after its field "
                                 "(docs/model.md has the table); --preset, then --variant, then the flags given decide")
    model.add_argument("--preset", choices=sorted(PRESETS), help="a model size: minimind2-small (512 wide, "
                       "8 layers, 8/2 heads), minimind3 (768 wide, 8 layers, 8/4 heads, per-head QK-norm, "
                       "eps 1e-6, FFN 2432)")
    model.add_argument("--variant", metavar="NAME", help="a normalization setup by name, as the ablation "
                       "runner takes it: <placement>-<norm>, e.g. pre-rmsnorm, post-layernorm, "
                       "hybrid-rmsnorm, pre+qk_head-rmsnorm, peri+qkv-rmsnorm, mix0.5+depth-rmsnorm, "
                       "pre+softcap15-rmsnorm, rezero, nanochat (the parts: docs/model.md)")
    for switch in SWITCHES:
        names = [f"--{switch.name}"] + ([f"--{switch.flag}"] if switch.flag else [])  # --norm_type, alias --norm
        per_device = switch.name in DEVICE_DEFAULTS["cpu"]  # the width: unset here, the device decides
        help = switch.help + (f" ({on_device(switch.name)})" if per_device else "")
        if switch.type is bool:
            model.add_argument(*names, action="store_true", dest=switch.flag_name, help=help)
        else:
            model.add_argument(*names, type=switch.type, default=None if per_device else switch.default,
                               choices=switch.choices or None, dest=switch.flag_name, help=help)

    opt = p.add_argument_group("optimization")
    opt.add_argument("--max_steps", type=int, help=f"optimizer steps ({on_device('max_steps')})")
    opt.add_argument("--batch_size", type=int,
                     help=f"sequences per micro-batch per process ({on_device('batch_size')})")
    opt.add_argument("--accumulation_steps", type=int, default=1, help="micro-batches per optimizer step")
    opt.add_argument("--learning_rate", type=float, help=f"peak learning rate ({on_device('learning_rate')})")
    opt.add_argument("--min_lr_ratio", type=float, default=0.1, help="the cosine decay ends at this fraction of "
                     "the peak --learning_rate, so every lr anneals alike")
    opt.add_argument("--min_lr", type=float, help="an absolute end of the cosine decay, in place of "
                     "--min_lr_ratio (the studies in docs/results before 2026-11-26 used 2e-4)")
    opt.add_argument("--lr_decay_steps", type=int, help="length of the cosine schedule (default: "
                     "--max_steps); set it to stop a run early and later --resume it with a larger "
                     "--max_steps on the same schedule")
    opt.add_argument("--warmup_steps", type=int,
                     help=f"linear warmup steps, 0 = none ({on_device('warmup_steps')})")
    opt.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS,
                     help="adamw: AdamW for every parameter. muon: Muon (torch.optim.Muon) for the weight matrices "
                     "inside the blocks (q, k, v, o, gate, up, down projections), AdamW for the rest "
                     "(embeddings, an untied lm_head, norm parameters, scalars), with the one "
                     "--learning_rate and --weight_decay: Muon's lr is scaled to match AdamW's update size")
    opt.add_argument("--weight_decay", type=float, default=0.1, help="decoupled weight decay on weight "
                     "matrices, AdamW's and Muon's (never on norms, biases, embeddings)")
    opt.add_argument("--norm_weight_decay", action="store_true", help="also apply --weight_decay to norm "
                     "gains (pulls a gain toward 0, or toward 1 with --norm_gain one_plus_w; default off)")
    opt.add_argument("--grad_clip", type=float, default=1.0, help="clip the global gradient norm (0 = off)")

    run = p.add_argument_group("run")
    run.add_argument("--out_dir", default="out/pretrain", help="checkpoints and metrics go here")
    run.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1, ...")
    run.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                     help="autocast dtype; auto = bfloat16 on GPUs with native bf16, else float16 (with a "
                     "GradScaler); float32 on CPU (bf16 on a CPU without bf16 hardware trains ~40x slower)")
    run.add_argument("--compile", action="store_true", help="torch.compile the model (off by default "
                     "everywhere: on a 2-core CPU it paid little, and no GPU has measured it yet; "
                     "scripts/gpu_check.py does). The first step, which compiles, is timed apart as "
                     "compile_time_s")
    run.add_argument("--seed", type=int, default=0, help="seed for initialization and batch sampling")
    run.add_argument("--log_interval", type=int, default=10, help="steps between logged metrics")
    run.add_argument("--diag_interval", type=int, help="steps between the per-block diagnostics "
                     "(layer_grad_norm and the layer statistics: an extra forward and a host read each "
                     "time); such a step also logs, and the last step always does both "
                     f"({on_device('diag_interval', '--log_interval')})")
    run.add_argument("--eval_interval", type=int, default=100, help="steps between validation evaluations")
    run.add_argument("--eval_steps", type=int, default=20, help="validation batches per evaluation")
    run.add_argument("--save_interval", type=int, default=200, help="steps between checkpoints")
    run.add_argument("--resume", action="store_true", help="continue exactly from the newest checkpoint in "
                     "--out_dir that loads")
    run.add_argument("--overwrite", action="store_true",
                     help="start afresh in an --out_dir that holds another run, deleting its checkpoints and metrics")
    run.add_argument("--keep_checkpoints", type=int, default=2, help="how many of the newest checkpoints to "
                     "keep (earlier ones are what --resume falls back to when the newest is damaged)")
    run.add_argument("--no_layers_plot", action="store_true", help="skip layers.png, the per-layer figure "
                     "drawn at the end of a run (about a second of matplotlib on a CPU, more than a tiny "
                     "run's training)")
    run.add_argument("--num_proc", type=int,
                     help="processes for tokenizing the corpus (default: the cores this process may use)")
    run.add_argument("--dist_timeout", type=float, default=30, help="minutes a process waits for the others "
                     "under torchrun (a collective, or local rank 0 tokenizing the corpus on first use) "
                     "before the job fails instead of hanging")

    log = p.add_argument_group("wandb")
    log.add_argument("--use_wandb", action="store_true",
                     help="log to Weights & Biases: online if an API key is configured, else offline")
    log.add_argument("--wandb_project", default="minimind-norm", help="wandb project")
    log.add_argument("--wandb_run_name",
                     help="wandb run name (default: <variant>-s<seed>, e.g. pre-rmsnorm-s0)")
    log.add_argument("--wandb_group", help="wandb group (the ablation runner sets one per study)")
    log.add_argument("--wandb_job", default="run", choices=WANDB_JOBS, help="what the run is to its study, "
                     "as a wandb tag (job=...): run, a plain run; grid, a point of a learning-rate grid; "
                     "seed, another seed at a chosen learning rate (the ablation runner sets it)")
    return p


# Every flag's role, declared once. The resume checks (trainer/run_dir.py), the ablation runner's reuse of finished
# runs and model_config() derive from it, and a test fails for a flag without one.
ARCH = "arch"  # a model-config field: on --resume the checkpoint's model decides, and a value given must agree
FIXED = "fixed"  # changes what the run computes and cannot change mid-run: must match on --resume
DATA = "data"  # names the data; --resume compares the data's fingerprint (these flags only for older checkpoints)
ADJUSTABLE = "adjustable"  # changes what the run computes or records, but may change on --resume (a longer run)
BOOKKEEPING = "bookkeeping"  # where and how a run is kept and watched: never changes what it computes
SHORTHAND = "shorthand"  # sets architecture flags by name; those flags, as set, are what the checks compare
FLAG_ROLES = {
    "data_path": DATA, "text_field": DATA, "tokenizer_path": DATA, "streaming": ADJUSTABLE, "max_seq_len": FIXED,
    **{switch.flag_name: ARCH for switch in SWITCHES}, "preset": SHORTHAND, "variant": SHORTHAND, "optimizer": FIXED,
    "max_steps": ADJUSTABLE, "batch_size": FIXED, "accumulation_steps": FIXED, "learning_rate": ADJUSTABLE,
    "min_lr": ADJUSTABLE, "min_lr_ratio": ADJUSTABLE, "lr_decay_steps": ADJUSTABLE, "warmup_steps": ADJUSTABLE, "weight_decay": FIXED,
    "norm_weight_decay": FIXED, "grad_clip": ADJUSTABLE,
    "out_dir": BOOKKEEPING, "device": ADJUSTABLE, "dtype": ADJUSTABLE, "compile": ADJUSTABLE, "seed": FIXED,
    "log_interval": ADJUSTABLE, "diag_interval": ADJUSTABLE, "eval_interval": ADJUSTABLE, "eval_steps": ADJUSTABLE,
    "save_interval": ADJUSTABLE,
    "resume": BOOKKEEPING, "overwrite": BOOKKEEPING, "keep_checkpoints": BOOKKEEPING, "no_layers_plot": BOOKKEEPING,
    "num_proc": BOOKKEEPING, "dist_timeout": BOOKKEEPING,
    "use_wandb": BOOKKEEPING, "wandb_project": BOOKKEEPING, "wandb_run_name": BOOKKEEPING, "wandb_group": BOOKKEEPING,
    "wandb_job": BOOKKEEPING,
}


def flags_with(role: str) -> tuple[str, ...]:
    return tuple(flag for flag, r in FLAG_ROLES.items() if r == role)


def config_fields() -> dict[str, str]:
    """Each architecture flag and the model-config field it sets."""
    return {switch.flag_name: switch.name for switch in SWITCHES}


POSITIVE = ("max_steps", "batch_size", "accumulation_steps", "max_seq_len", "log_interval", "eval_interval",
            "eval_steps", "save_interval", "keep_checkpoints", "diag_interval", "lr_decay_steps", "num_proc")
NON_NEGATIVE = ("warmup_steps", "weight_decay", "grad_clip")
# Every float flag must also be finite: NaN passes any "< 0" test, and inf passes "> 0" only to turn every weight
# into NaN at the first update. (The model config checks the architecture's.)
POSITIVE_FLOATS = ("learning_rate", "dist_timeout")


def float_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [action.dest for action in parser._actions if action.type is float]


def arch_fields(args: argparse.Namespace, device) -> dict:
    """The model-config fields the flags set (the width from the device's defaults when unset); a UserError in
    the flags' own words when they make no model."""
    fields = {switch.name: getattr(args, switch.flag_name) for switch in SWITCHES}
    fields["hidden_size"] = fields["hidden_size"] or device_defaults(device)["hidden_size"]
    if problem := config_problem(fields, name=lambda field: f"--{SWITCH[field].flag_name}"):
        raise UserError(problem)
    return fields


def fill_device_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the unset flags of DEVICE_DEFAULTS for the device the run will use; the width stays unset (the model
    config picks it), so that a run's recorded flags keep their meaning."""
    for name, value in device_defaults(pick_device(args.device)).items():
        if name != "hidden_size" and getattr(args, name) is None:
            setattr(args, name, value)
    if args.diag_interval is None:
        args.diag_interval = args.log_interval
    # switches the config derives from others (HybridNorm's QKV-norm from its placement), as the config derives them
    implied = with_implied({switch.name: getattr(args, switch.flag_name) for switch in SWITCHES})
    for switch in SWITCHES:
        if getattr(args, switch.flag_name) is None:
            setattr(args, switch.flag_name, getattr(implied, switch.name))
    return args


def validate(args: argparse.Namespace) -> argparse.Namespace:
    """Reject bad values with one line naming the flag, before anything is loaded or written."""
    fill_device_defaults(args)
    require_positive(args, POSITIVE)
    for name in float_flags(build_parser()):
        if not math.isfinite(value := getattr(args, name) or 0):
            raise UserError(f"--{name} must be a finite number, got {value}")
    arch_fields(args, pick_device(args.device))
    for name in NON_NEGATIVE:
        if getattr(args, name) < 0:
            raise UserError(f"--{name} must be >= 0, got {getattr(args, name)}")
    for name in POSITIVE_FLOATS:
        if not getattr(args, name) > 0:
            raise UserError(f"--{name} must be > 0, got {getattr(args, name)}")
    if args.optimizer == "muon" and not hasattr(torch.optim, "Muon"):
        raise UserError(f"--optimizer muon needs torch.optim.Muon (torch 2.9 or newer); this is torch "
                        f"{torch.__version__}: upgrade torch, or use --optimizer adamw")
    if not 0 <= final_lr(args) <= args.learning_rate:  # the cosine "decay" would raise the rate from the peak
        raise UserError(f"the decay would end at {final_lr(args):g}, not in [0, --learning_rate "
                        f"{args.learning_rate:g}]; set --min_lr_ratio in [0, 1], or --min_lr at most --learning_rate")
    if not 0 <= args.seed < 2**32:  # numpy refuses a negative seed; 32 bits are a seed every RNG library takes
        raise UserError(f"--seed must be in [0, 2**32 - 1], got {args.seed}")
    out = Path(args.out_dir)
    require_writable_dir("--out_dir", out)
    if args.resume and args.overwrite:
        raise UserError("--resume continues the run in --out_dir and --overwrite discards it; pass one of them")
    if args.resume and not find_checkpoints(out):
        raise no_checkpoint(out, resume=True)
    return args


def final_lr(args: argparse.Namespace) -> float:
    """Where the cosine decay ends: --min_lr if given, else --min_lr_ratio of the peak."""
    return args.min_lr if args.min_lr is not None else args.min_lr_ratio * args.learning_rate


def given_flags(argv: list[str] | None) -> set[str]:
    """The flags the command line sets itself, which win over a --preset's or --variant's value."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, checked; a --preset's, then a --variant's fields set the architecture flags not given."""
    args = build_parser().parse_args(argv)
    fields = dict(PRESETS[args.preset]) if args.preset else {}
    if args.variant:
        try:
            fields |= variant_fields(args.variant)
        except ValueError as err:
            raise UserError(f"--{err}; e.g. pre-rmsnorm, hybrid-rmsnorm, pre+qk_head-rmsnorm, nanochat") from None
    given = given_flags(argv)
    for switch in SWITCHES:
        if switch.name in fields and switch.flag_name not in given:
            setattr(args, switch.flag_name, fields[switch.name])
    return validate(args)
