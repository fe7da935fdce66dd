"""Every training flag in one place:
its default, its type (argparse checks the value) and whether it must match on --resume.
The trainer and the ablation runner share it."""

import argparse

from common.cli import (
    ArgumentParser,
    UserError,
    count,
    finite_float,
    non_negative,
    positive_int,
    user_path,
)
from model import PRESETS, SWITCHES, variant_fields, variant_problem
from model.model_minimind import config_problem, with_implied
from trainer.optim import OPTIMIZERS
from trainer.runtime import pick_device

# Defaults that depend on the device.
# CPU: minutes on 2 cores, a narrower model and the batch, steps and lr that won a sweep
# (docs/training.md); diag_interval None is --log_interval.
# CUDA: MiniMind2-small, 128 x 256 tokens per GPU per micro-step,
# one pass over the plays (docs/gpu.md).
DEVICE_DEFAULTS = {
    "cpu": {"hidden_size": 128, "batch_size": 8, "max_steps": 760,
            "learning_rate": 6e-3, "warmup_steps": 100, "diag_interval": None},
    "cuda": {"hidden_size": 512, "batch_size": 128, "max_steps": 50,
             "learning_rate": 3e-3, "warmup_steps": 10, "diag_interval": 100},
}
# Steps of one epoch (every training window once)
# of the embedded plays at the CPU defaults:
# 6,169 windows of 256 tokens in batches of 8 (tests/test_data.py counts them)
EPOCH_STEPS_ON_CPU = 771
# Flags a --resume must repeat besides the architecture and the data:
# they fix what the run computes.
# Lr, schedule and intervals may change, to train further.
MUST_MATCH = ("max_seq_len", "optimizer", "batch_size", "accumulation_steps",
              "weight_decay", "norm_weight_decay", "seed")
# Flags a --resume may change, to train further: the schedule and the evaluation
# (a warning names each that differs from the checkpoint's run)
MAY_CHANGE = ("max_steps", "learning_rate", "min_lr_ratio", "min_lr", "lr_decay_steps",
              "warmup_steps", "grad_clip", "eval_interval", "eval_steps")
# Flags that name a run's data (a --resume checks the data itself, by its tokens' hashes)
DATA_FLAGS = ("data_path", "text_field", "tokenizer_path")
# Flags that never change what a run computes:
# a study may vary them and still reuse a finished run.
BOOKKEEPING = ("out_dir", "resume", "overwrite", "keep_checkpoints", "no_layers_plot",
               "num_proc", "dist_timeout", "use_wandb", "wandb_project",
               "wandb_run_name", "wandb_group", "wandb_job")
# What a run is to its study (a wandb tag):
# a run, an lr grid's point, a seed at the chosen lr
WANDB_JOBS = ("run", "grid", "seed")


def on_device(name: str) -> str:
    cuda, cpu = (DEVICE_DEFAULTS[device][name] for device in ("cuda", "cpu"))
    return f"default: {cuda:g} on CUDA, {cpu:g} on CPU"


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description="Pretrain a MiniMind decoder "
                                   "(default: on Shakespeare's plays, embedded).")
    data = p.add_argument_group("data")
    data.add_argument("--data_path", type=user_path,
                      help="omit for the embedded plays; "
                           "a .jsonl/.json/.txt/.parquet file or folder; "
                           "or a Hugging Face dataset such as roneneldan/TinyStories")
    data.add_argument("--text_field", default="text",
                      help="the column that holds the text")
    data.add_argument("--tokenizer_path", type=user_path,
                      help="tokenizer folder (default: the shipped data/tokenizer)")
    data.add_argument("--streaming", action="store_true",
                      help="stream the corpus while tokenizing it")
    data.add_argument("--max_seq_len", type=positive_int, default=256,
                      help="tokens per training sequence")

    model = p.add_argument_group("model",
                                 "--preset, then --variant, then the flags given decide")
    model.add_argument("--preset", choices=sorted(PRESETS),
                       help="a model size (docs/model.md)")
    model.add_argument("--variant", metavar="NAME",
                       help="a normalization setup by its study name: "
                            "pre-rmsnorm, post-layernorm, pre+qk_head-rmsnorm, "
                            "peri+qkv-rmsnorm, rezero, nanochat, ...")
    for switch in SWITCHES:
        # --norm_type, --norm
        names = [f"--{switch.name}"] + ([f"--{switch.flag}"] if switch.flag else [])
        if switch.type is bool:
            model.add_argument(*names, action="store_true", dest=switch.flag_name,
                               help=switch.help)
        else:  # the width stays unset here: the device decides it
            per_device = switch.name in DEVICE_DEFAULTS["cpu"]
            model.add_argument(*names, type=switch.type,
                               default=None if per_device else switch.default,
                               choices=switch.choices or None, dest=switch.flag_name,
                               help=switch.help + (f" ({on_device(switch.name)})"
                                                   if per_device else ""))

    opt = p.add_argument_group("optimization")
    opt.add_argument("--max_steps", type=positive_int,
                     help=f"optimizer steps ({on_device('max_steps')}; "
                          "one epoch of the embedded plays "
                          f"is {EPOCH_STEPS_ON_CPU} steps at the CPU defaults)")
    opt.add_argument("--batch_size", type=positive_int,
                     help="sequences per micro-batch per process "
                          f"({on_device('batch_size')})")
    opt.add_argument("--accumulation_steps", type=positive_int, default=1,
                     help="micro-batches per step")
    opt.add_argument("--learning_rate", type=non_negative,
                     help=f"peak lr ({on_device('learning_rate')})")
    opt.add_argument("--min_lr_ratio", type=non_negative, default=0.1,
                     help="the cosine decay ends at this fraction of the peak, "
                          "so every lr anneals alike")
    opt.add_argument("--min_lr", type=non_negative,
                     help="an absolute end of the decay, in place of --min_lr_ratio "
                          "(the studies in docs/results before 2026-11-26 used 2e-4)")
    opt.add_argument("--lr_decay_steps", type=positive_int,
                     help="length of the cosine schedule (default: --max_steps); "
                          "to stop early and --resume later with a larger --max_steps")
    opt.add_argument("--warmup_steps", type=count,
                     help=f"linear warmup ({on_device('warmup_steps')})")
    opt.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS,
                     help="muon: torch.optim.Muon for the blocks' weight matrices, "
                          "AdamW for the rest, at one --learning_rate "
                          "(docs/training.md)")
    opt.add_argument("--weight_decay", type=non_negative, default=0.1,
                     help="on weight matrices only")
    opt.add_argument("--norm_weight_decay", action="store_true",
                     help="also decay norm gains")
    opt.add_argument("--grad_clip", type=non_negative, default=1.0,
                     help="clip the gradient norm (0 = off)")

    run = p.add_argument_group("run")
    run.add_argument("--out_dir", default="out/pretrain", type=user_path,
                     help="checkpoints and metrics go here")
    run.add_argument("--device", default="auto",
                     help="auto (cuda if available, else cpu), cpu, cuda, cuda:1")
    run.add_argument("--dtype", default="auto",
                     choices=["auto", "bfloat16", "float16", "float32"],
                     help="autocast dtype; auto: bfloat16 on GPUs that have it, "
                          "else float16; float32 on CPU")
    run.add_argument("--compile", action="store_true", help="torch.compile the model")
    run.add_argument("--seed", type=count, default=0,
                     help="seed of the initialization and batches")
    run.add_argument("--log_interval", type=positive_int, default=10,
                     help="steps between logged metrics")
    run.add_argument("--diag_interval", type=positive_int,
                     help="steps between per-block diagnostics, an extra forward each "
                          "(default: 100 on CUDA, --log_interval on CPU)")
    run.add_argument("--eval_interval", type=positive_int, default=100,
                     help="steps between evaluations")
    run.add_argument("--eval_steps", type=positive_int, default=20,
                     help="validation batches per evaluation (at most the whole split, "
                          "each window once)")
    run.add_argument("--save_interval", type=positive_int, default=200,
                     help="steps between checkpoints")
    fresh = run.add_mutually_exclusive_group()
    fresh.add_argument("--resume", action="store_true",
                       help="continue from the newest checkpoint that loads")
    fresh.add_argument("--overwrite", action="store_true",
                       help="discard the run in --out_dir and start afresh: "
                            "only in a folder the trainer made (its .lock says so), "
                            "and only its step-N folders, metrics, summary, layers.png "
                            "and wandb run")
    run.add_argument("--keep_checkpoints", type=positive_int, default=2,
                     help="newest checkpoints to keep")
    run.add_argument("--no_layers_plot", action="store_true",
                     help="skip layers.png at the end")
    run.add_argument("--num_proc", type=positive_int,
                     help="tokenizer processes (default: the usable cores)")
    run.add_argument("--dist_timeout", type=finite_float, default=30,
                     help="minutes a rank waits for the others under torchrun "
                          "before it fails")

    log = p.add_argument_group("wandb")
    log.add_argument("--use_wandb", action="store_true",
                     help="log to wandb: online with an API key, else offline")
    log.add_argument("--wandb_project", default="minimind-norm", help="wandb project")
    log.add_argument("--wandb_run_name",
                     help="wandb run name (default: <variant>-s<seed>)")
    log.add_argument("--wandb_group",
                     help="wandb group (the ablation runner sets one per study)")
    log.add_argument("--wandb_job", default="run", choices=WANDB_JOBS,
                     help="what the run is to its study")
    return p


class RunConfig(argparse.Namespace):
    """Every flag of one run, resolved once by resolve() and read-only from then on,
    so what a run records (vars(run), in its checkpoints and summary) is what it read."""

    def __init__(self, values: dict):
        self.__dict__.update(values)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError("the run's flags are resolved once (trainer/args.py): "
                             f"cannot set {name}")

    @property
    def arch(self) -> dict:
        """The model config's fields, by their names there (--norm is norm_type)."""
        return {switch.name: getattr(self, switch.flag_name) for switch in SWITCHES}


def device_defaults(device: str) -> dict:
    return DEVICE_DEFAULTS["cuda" if pick_device(device).type == "cuda" else "cpu"]


def final_lr(args: argparse.Namespace) -> float:
    """Where the cosine decay ends:
    --min_lr if given, else --min_lr_ratio of the peak."""
    return (args.min_lr if args.min_lr is not None
            else args.min_lr_ratio * args.learning_rate)


def resolve(args: argparse.Namespace) -> RunConfig:
    """The flags as the run reads them:
    the device's defaults (DEVICE_DEFAULTS) for those unset, the width included,
    and the switches the placement implies (with_implied),
    so that a run records the model it trained.
    Left unset: what the model derives from the other switches
    (the SwiGLU width, DeepNorm's scales).
    What argparse cannot check alone is one line naming the flag."""
    values = dict(vars(args))
    for name, value in device_defaults(args.device).items():
        if values[name] is None:
            values[name] = value
    values["diag_interval"] = values["diag_interval"] or values["log_interval"]
    switches = with_implied({s.name: values[s.flag_name] for s in SWITCHES})
    if problem := config_problem(
            switches, name={s.name: f"--{s.flag_name}" for s in SWITCHES}.get, training=True):
        raise UserError(problem)
    for switch in SWITCHES:  # what the placement implies (HybridNorm's q, k and v norms)
        if values[switch.flag_name] is None:
            values[switch.flag_name] = getattr(switches, switch.name)
    run = RunConfig(values)
    # the cosine "decay" would raise the rate
    if not 0 <= final_lr(run) <= run.learning_rate:
        raise UserError(f"the decay would end at {final_lr(run):g}, "
                        f"not in [0, --learning_rate {run.learning_rate:g}]; "
                        "set --min_lr_ratio in [0, 1], "
                        "or --min_lr at most --learning_rate")
    return run


def parse_args(argv: list[str] | None = None) -> RunConfig:
    """The command line resolved: a --preset's, then a --variant's fields
    set the architecture flags not given, then resolve() the rest."""
    parser = build_parser()
    args = parser.parse_args(argv)
    fields = dict(PRESETS[args.preset]) if args.preset else {}
    if args.variant:
        # a name that makes no model alone is refused in its own words,
        # not in those of flags the user never typed
        if problem := variant_problem(args.variant):
            raise UserError(f"--{problem}" if problem.startswith("variant ") else
                            f"--variant {args.variant!r} makes no model ({problem})")
        fields |= variant_fields(args.variant)
    # what the command line gives wins over preset and variant
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    given = vars(parser.parse_args(argv))
    for switch in SWITCHES:
        if switch.name in fields and switch.flag_name not in given:
            setattr(args, switch.flag_name, fields[switch.name])
    return resolve(args)
