"""When a --resume continues the same run, and what it keeps of the interrupted one."""

import json
from pathlib import Path

from common.cli import UserError
from common.fs import write_file_atomically
from data import PackedTokens, tokenizer_fingerprint
from model import MiniMindConfig
from trainer.args import DATA, FIXED, config_fields, flags_with
from trainer.run_dir import recorded_value
from trainer.tracking import read_metrics

# Flags a checkpoint must be resumed with: another batch shape, seed (its RNG states are restored instead) or
# weight decay (the optimizer state carries its own) would not continue the same run.
RESUME_MUST_MATCH = flags_with(FIXED)
# The architecture comes from the checkpoint: each flag and its name in the model config.
ARCHITECTURE = config_fields()
# What checkpoints from before data fingerprints compare instead: the flags naming the data and tokenizer.
DATA_FLAGS = flags_with(DATA)


def data_fingerprint(tokenizer, train_data: PackedTokens, val_data: PackedTokens) -> dict:
    """What the run trains and evaluates on, whatever the paths were called: the tokenizer's hash and each
    split's token count and checksum."""
    return {"tokenizer": tokenizer_fingerprint(tokenizer),
            **{d.split: {"num_tokens": d.num_tokens, "sha256": d.sha256} for d in (train_data, val_data)}}


def check_resumable(state: dict, config: MiniMindConfig, args, data: dict, world_size: int) -> None:
    """Refuse, in one line, a --resume that would not continue the same run."""
    saved = state["args"]
    for name in RESUME_MUST_MATCH + (() if "data" in state else DATA_FLAGS):
        if recorded_value(saved, name) != getattr(args, name):
            raise UserError(f"--resume: the checkpoint was trained with --{name} {recorded_value(saved, name)}, not "
                            f"{getattr(args, name)}; pass the same value (or start a new --out_dir)")
    for flag, field in ARCHITECTURE.items():
        given = getattr(args, flag)
        if given is not None and given != getattr(config, field):
            raise UserError(f"--resume: the checkpoint's model has --{flag} {getattr(config, field)}, not {given}; "
                            "pass the same value (or start a new --out_dir for another model)")
    recorded = state.get("data", data)
    if recorded["tokenizer"] != data["tokenizer"]:
        raise UserError(f"--resume: --tokenizer_path {args.tokenizer_path or 'default'} is not the tokenizer the "
                        "checkpoint was trained with (a copy of that one is in the checkpoint folder); pass it, "
                        "or start a new --out_dir")
    for split in ("train", "validation"):
        if recorded[split] != data[split]:
            raise UserError(f"--resume: the {split} split of --data_path {args.data_path or 'default'} is not the "
                            f"data the checkpoint was trained on ({recorded[split]['num_tokens']:,} tokens then, "
                            f"{data[split]['num_tokens']:,} now; was it edited?); pass the original data, or "
                            "start a new --out_dir")
    if len(state["sampler"]) != world_size:
        raise UserError(f"--resume: the checkpoint was written by {len(state['sampler'])} processes, not "
                        f"{world_size}; resume with the same number of processes")


def keep_metrics_up_to(path: Path, step: int) -> None:
    """On resume, drop records the interrupted run logged after its last checkpoint (they are redone)."""
    if path.exists():
        kept = [r for r in read_metrics(path) if r["step"] <= step]
        write_file_atomically(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in kept).encode()))
