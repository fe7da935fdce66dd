"""Pretrain a MiniMind decoder: one process, or many under torchrun (DDP).

    python trainer/train_pretrain.py                                   # Shakespeare, CPU preset, minutes
    python trainer/train_pretrain.py --norm layernorm --norm_position post
    torchrun --nproc_per_node=8 trainer/train_pretrain.py --data_path roneneldan/TinyStories

The loop lives in train(args), which the ablation runner calls too.
"""

import json
import math
import os
import re
import signal
import sys
import time
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def interrupted_while_loading(signum, frame):
    sys.exit(f"error: interrupted by {signal.Signals(signum).name}; nothing was written")


if __name__ == "__main__":  # Ctrl-C or SIGTERM while the libraries below load (seconds on a busy machine) ends
    for sig in (signal.SIGINT, signal.SIGTERM):  # with one line, not a traceback from inside an import
        signal.signal(sig, interrupted_while_loading)

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from data import (
    HOLDOUT_EVERY,
    BatchSampler,
    PackedTokens,
    bits_per_byte,
    load_tokenizer,
    prepare_split,
    tokenizer_fingerprint,
)
from model import MiniMindConfig, MiniMindForCausalLM, count_norms, norm_variant
from model.model_minimind import NORM_MODULES
from trainer.args import device_defaults, parse_args
from trainer.checkpoint import load_checkpoint, save_checkpoint, set_rng_state
from trainer.cli import UserError, run_cli
from trainer.device import Prefetcher, autocast, cpu_has_bf16_matmul, pick_device, resolve_dtype
from trainer.diagnostics import (
    block_grad_norms,
    flops_per_token,
    layer_stats,
    peak_flops,
    peak_memory_mb,
)
from trainer.evaluation import evaluate
from trainer.fs import write_file_atomically
from trainer.memory import require_step_fits
from trainer.optim import build_optimizer, lr_at, step_unless
from trainer.plots import plot_layer_profiles
from trainer.run_dir import claim_run_dir, discard_run
from trainer.tracking import Tracker, read_metrics

# ---------------------------------------------------------------------------------------------------------
# Process setup


def setup_distributed(device_name: str, timeout_min: float) -> tuple[int, int, torch.device]:
    """(rank, world_size, device). torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; NCCL on CUDA, gloo on CPU.

    A rank that waits on a collective longer than timeout_min minutes (a peer died or hangs) fails the job
    rather than holding its devices forever."""
    device = pick_device(device_name)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return 0, 1, device
    if device.type == "cuda":
        device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}")
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=timeout_min))
    return dist.get_rank(), world_size, device


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class SignalHandler:
    """Handles SIGTERM and SIGINT with self._handle while it exists; restore() puts the previous handlers back."""

    def __init__(self):
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        raise NotImplementedError

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class StopFlag(SignalHandler):
    """SIGTERM / SIGINT ask the loop to save and exit after the current step instead of dying mid-write (under
    DDP after the next step that logs, evaluates or saves, where the ranks agree on it)."""

    def __init__(self):
        self.requested = False
        super().__init__()

    def _handle(self, signum, frame):
        self.requested = True


class InterruptGuard(SignalHandler):
    """Outside the loop, SIGTERM acts like Ctrl-C: it raises KeyboardInterrupt in this process, so every cleanup
    runs (temporary files removed, the run directory unlocked). Forked tokenizer workers leave Ctrl-C to this
    process, which stops them, and die quietly on SIGTERM. `signal` names the signal once one came."""

    def __init__(self):
        self.pid, self.signal = os.getpid(), None
        super().__init__()

    def _handle(self, signum, frame):
        if os.getpid() != self.pid:
            if signum == signal.SIGTERM:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        self.signal = signal.Signals(signum).name
        raise KeyboardInterrupt


# ---------------------------------------------------------------------------------------------------------
# Training


def model_config(args, tokenizer, device: torch.device) -> MiniMindConfig:
    """The architecture the flags ask for; checked before any data is touched, so a bad flag fails at once."""
    try:
        config = MiniMindConfig(
            vocab_size=len(tokenizer),
            hidden_size=args.hidden_size or device_defaults(device)["hidden_size"],
            num_hidden_layers=args.num_hidden_layers,
            num_attention_heads=args.num_attention_heads,
            num_key_value_heads=args.num_key_value_heads,
            norm_type=args.norm,
            norm_position=args.norm_position,
            mix_ln_fraction=args.mix_ln_fraction,
            norm_scaling=args.norm_scaling,
            qk_norm=args.qk_norm,
            v_norm=args.v_norm,
            dyt_alpha_init=args.dyt_alpha_init,
            dyt_alpha_init_attn=args.dyt_alpha_init_attn,
            dyt_alpha_init_mlp=args.dyt_alpha_init_mlp,
            dyt_alpha_init_final=args.dyt_alpha_init_final,
            max_position_embeddings=args.max_seq_len,  # the context it is trained for; eval_llm.py respects it
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )
    except ValueError as err:  # name the flags, not the config fields
        message = re.sub(r"\b(num_\w+|hidden_size|norm_position|norm_scaling|qk_norm|v_norm|mix_ln_fraction|dyt_alpha_init\w*)\b",
                         r"--\1", str(err))
        raise UserError(re.sub(r"\bnorm_type\b", "--norm", message)) from err
    return config


def build_model(config: MiniMindConfig, seed: int) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    return MiniMindForCausalLM(config)


# Flags a checkpoint must be resumed with: another batch shape, seed (its RNG states are restored instead) or
# weight decay (the optimizer state carries its own) would not continue the same run.
RESUME_MUST_MATCH = ("max_seq_len", "batch_size", "accumulation_steps", "seed", "weight_decay")
# The architecture comes from the checkpoint: each flag and its name in the model config.
ARCHITECTURE = {"norm": "norm_type", **{flag: flag for flag in (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "norm_position",
    "mix_ln_fraction", "norm_scaling", "qk_norm", "v_norm", "dyt_alpha_init", "dyt_alpha_init_attn", "dyt_alpha_init_mlp",
    "dyt_alpha_init_final")}}
# What checkpoints from before data fingerprints compare instead: the flags naming the data and tokenizer.
DATA_FLAGS = ("data_path", "text_field", "tokenizer_path")


def data_fingerprint(tokenizer, train_data: PackedTokens, val_data: PackedTokens) -> dict:
    """What the run trains and evaluates on, whatever the paths were called: the tokenizer's hash and each
    split's token count and checksum."""
    return {"tokenizer": tokenizer_fingerprint(tokenizer),
            **{d.split: {"num_tokens": d.num_tokens, "sha256": d.sha256} for d in (train_data, val_data)}}


def check_resumable(state: dict, config: MiniMindConfig, args, data: dict, world_size: int) -> None:
    """Refuse, in one line, a --resume that would not continue the same run."""
    saved = state["args"]
    for name in RESUME_MUST_MATCH + (() if "data" in state else DATA_FLAGS):
        if saved[name] != getattr(args, name):
            raise UserError(f"--resume: the checkpoint was trained with --{name} {saved[name]}, not "
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


def require_window(data: PackedTokens, args) -> None:
    """A split too short for one sequence fails now, not at the first batch or evaluation."""
    if data.num_tokens > args.max_seq_len:
        return
    fix = ": lower --max_seq_len or add data"
    if data.split == "validation":
        fix = (f"; a source without a validation split of its own gives it every {HOLDOUT_EVERY}th document (0, "
               f"{HOLDOUT_EVERY}, {2 * HOLDOUT_EVERY}, ...): lower --max_seq_len, or give those documents more text "
               "or the source more documents")
    raise UserError(f"the {data.split} split of --data_path {args.data_path or 'default'} has {data.num_tokens} "
                    f"tokens, fewer than --max_seq_len + 1 = {args.max_seq_len + 1}{fix}")


def keep_metrics_up_to(path: Path, step: int) -> None:
    """On resume, drop records the interrupted run logged after its last checkpoint (they are redone)."""
    if path.exists():
        kept = [r for r in read_metrics(path) if r["step"] <= step]
        write_file_atomically(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in kept).encode()))


def train(args) -> dict:
    """Run one training job and return its summary: the outcome on every rank, all the numbers on rank 0 (which
    also writes them to out_dir/summary.json). Rank 0 owns out_dir meanwhile (see trainer/run_dir.py)."""
    rank, world_size, device = setup_distributed(args.device, args.dist_timeout)
    interrupts = InterruptGuard()
    try:
        tokenizer = load_tokenizer(args.tokenizer_path)
        config = None if args.resume else model_config(args, tokenizer, device)
        with claim_run_dir(Path(args.out_dir), args.resume, args.overwrite) if rank == 0 else nullcontext():
            return run_training(args, rank, world_size, device, tokenizer, config)
    except BaseException:
        if interrupts.signal is None:
            raise
        # Whatever became of the KeyboardInterrupt (datasets' worker pool turns it into an error of its own).
        raise UserError(f"interrupted by {interrupts.signal}; nothing half-written was left behind: run the same "
                        "command again (with --resume if a checkpoint was saved)") from None
    finally:
        interrupts.restore()


def run_training(args, rank: int, world_size: int, device: torch.device, tokenizer, config) -> dict:
    master = rank == 0
    dtype = resolve_dtype(args.dtype, device)
    mixed_precision = autocast(device, dtype)
    out_dir = Path(args.out_dir)

    # One process per machine tokenizes (and caches) first; the others then read its finished cache.
    local_master = int(os.environ.get("LOCAL_RANK", "0")) == 0
    if not local_master:
        barrier()
    splits = [prepare_split(args.data_path, split, tokenizer, args.text_field, num_proc=args.num_proc,
                            streaming=args.streaming) for split in ("train", "validation")]
    if local_master:
        barrier()
    train_data, val_data = splits
    for split_data in splits:
        require_window(split_data, args)
    fingerprint = data_fingerprint(tokenizer, train_data, val_data)

    sampler = Prefetcher(BatchSampler(train_data.tokens, args.batch_size, args.max_seq_len, seed=args.seed,
                                      rank=rank, world_size=world_size), device)
    if args.resume:
        raw_model, state = load_checkpoint(out_dir, repair=master)
        check_resumable(state, raw_model.config, args, fingerprint, world_size)
        if state["step"] >= args.max_steps:
            if master:
                print(f"{out_dir}: the run is already at step {state['step']} of --max_steps {args.max_steps}; "
                      "nothing to train (raise --max_steps to train further)")
            if (out_dir / "summary.json").is_file():  # kept as it is; without one, it is written below
                outcome = {"step": state["step"], "max_steps": args.max_steps, "diverged": False, "interrupted": False}
                return json.loads((out_dir / "summary.json").read_text()) if master else outcome
    else:
        raw_model, state = build_model(config, args.seed), None
    raw_model.to(device).train()
    cfg = raw_model.config
    optimizer = build_optimizer(raw_model, args.learning_rate, args.weight_decay, args.norm_weight_decay)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    step, train_time, run_id = 0, 0.0, None
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        sampler.load_state_dict(state["sampler"][rank])
        step, train_time, run_id = state["step"], state["train_time"], state["wandb_run_id"]
        set_rng_state(state["rng"])

    model = torch.compile(raw_model) if args.compile else raw_model
    if world_size > 1:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    num_params = sum(p.numel() for p in raw_model.parameters())
    require_step_fits(cfg, num_params, args.batch_size, args.max_seq_len, dtype, device)
    norm_params = sum(p.numel() for m in raw_model.modules() if isinstance(m, NORM_MODULES) for p in m.parameters())
    num_norms, dtype_name = count_norms(raw_model), str(dtype).removeprefix("torch.")
    tokens_per_step = args.batch_size * args.max_seq_len * args.accumulation_steps * world_size
    step_flops = flops_per_token(num_params, cfg.num_hidden_layers, cfg.hidden_size, args.max_seq_len) * tokens_per_step
    peak = peak_flops(device, dtype)
    if peak:
        peak *= world_size  # utilization of all the devices together
    val_bpt = val_data.bytes_per_token

    tracker = None
    if master:
        if args.resume:
            keep_metrics_up_to(out_dir / "metrics.jsonl", step)
        elif args.overwrite:
            discard_run(out_dir)
        run_name = args.wandb_run_name or f"{norm_variant(cfg)}-s{args.seed}"
        run_config = {**vars(args), "num_params": num_params, "norm_params": norm_params,
                      "num_norms": num_norms, "hidden_size": cfg.hidden_size, "world_size": world_size,
                      "device": str(device), "dtype": dtype_name, "data": fingerprint}
        tracker = Tracker(out_dir, args.use_wandb, run_config, args.wandb_project, run_name, args.wandb_group, run_id)
        if device.type == "cpu":
            if dtype == torch.bfloat16 and not cpu_has_bf16_matmul():
                print("warning: this CPU has no bf16 matrix units; bf16 autocast trains far slower than float32",
                      file=sys.stderr)
            elif dtype == torch.float16:
                print("warning: float16 autocast on a CPU is far slower than float32 (few CPUs have fp16 matrix "
                      "units); it mainly serves to test the GradScaler path", file=sys.stderr)
            elif args.dtype == "auto" and cpu_has_bf16_matmul():
                print("note: this CPU has AMX bf16 units; --dtype bfloat16 may train faster than the float32 default",
                      file=sys.stderr)
        print(f"model: {num_params / 1e6:.2f}M parameters, {num_norms} norms ({norm_variant(cfg)}), hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers | "
              f"{device} {dtype_name} x{world_size} | train {train_data.num_tokens:,} tokens, "
              f"val {val_data.num_tokens:,} tokens ({val_bpt:.2f} bytes/token)")

    def save() -> None:
        samplers = [sampler.state_dict()]  # every rank's, so each draws its own batches after a resume
        if world_size > 1:
            samplers = [None] * world_size
            dist.all_gather_object(samplers, sampler.state_dict())
        if master:
            save_checkpoint(out_dir, raw_model, tokenizer, {
                "step": step, "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                "sampler": samplers, "train_time": train_time, "wandb_run_id": tracker.run_id, "args": vars(args),
                "data": fingerprint,
            }, args.keep_checkpoints)

    def run_eval() -> dict:
        """On every rank, each evaluating its share of the windows; rank 0 logs the all-reduced loss."""
        loss = evaluate(raw_model, val_data.tokens, args.batch_size, args.max_seq_len, args.eval_steps, device,
                        mixed_precision, rank=rank, world_size=world_size)
        record = {"step": step, "split": "val", "loss": loss, "bpb": bits_per_byte(loss, val_bpt),
                  "train_time_s": train_time}
        if master:
            tracker.log(record)
        return record

    stop = StopFlag()
    diverged = stop_requested = False
    last_val, window_steps, window_start = None, 0, train_time
    # The host reads the device only on steps that log, evaluate or save (or when asked to stop), so in between
    # it queues work without waiting for the GPU. Until then the loss sums up on the device, and so does the
    # index of the first step whose loss or gradient was non-finite (inf while there is none): from that step
    # on every update is skipped on the device, so the weights stay those of the last good step.
    window_loss = torch.zeros((), device=device)
    first_bad = torch.full((), math.inf, device=device)
    pbar = tqdm(total=args.max_steps, initial=step, disable=not master, desc="train", dynamic_ncols=True)
    t0 = time.perf_counter()
    try:
        while step < args.max_steps:
            lr = lr_at(step, args.lr_decay_steps or args.max_steps, args.learning_rate, args.min_lr, args.warmup_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            done = step + 1
            # Decided alike on every rank, since all take part in the reductions at these steps.
            log_now = done % args.log_interval == 0 or done == args.max_steps
            eval_now = done % args.eval_interval == 0 or done == args.max_steps
            save_now = done % args.save_interval == 0 or done == args.max_steps
            loss_sum = torch.zeros((), device=device)
            for micro in range(args.accumulation_steps):
                x, y = next(sampler)
                last_micro = micro == args.accumulation_steps - 1
                # Gradients are all-reduced only on the last micro-step; the others just accumulate locally.
                sync = nullcontext() if last_micro or world_size == 1 else model.no_sync()
                with sync, mixed_precision:
                    out = model(input_ids=x, shift_labels=y)
                    loss = out.loss / args.accumulation_steps
                scaler.scale(loss).backward()
                loss_sum += loss.detach()
            scaler.unscale_(optimizer)
            layer_grads = block_grad_norms(raw_model.model.layers) if log_now and master else None  # before clipping
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), args.grad_clip or math.inf)
            # Divergence is a non-finite loss, or a non-finite gradient unless fp16's GradScaler is on: there an
            # overflowing gradient is routine, the step is skipped and the scale lowered.
            finite_grads = torch.isfinite(grad_norm)
            bad = ~torch.isfinite(loss_sum) if scaler.is_enabled() else ~(torch.isfinite(loss_sum) & finite_grads)
            first_bad = torch.where(bad & first_bad.isinf(), step, first_bad)
            step_unless(optimizer, first_bad.isfinite() | ~finite_grads)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            window_loss += loss_sum
            window_steps += 1
            step += 1
            pbar.update(1)
            if not (log_now or eval_now or save_now or (world_size == 1 and stop.requested)):
                continue

            # One small all-reduce of each kind, so all ranks agree on when to stop (a rank that stopped alone
            # would hang the others): the loss and any rank's stop request summed, the first bad step's minimum.
            summed = torch.stack([window_loss, torch.full((), float(stop.requested), device=device)])
            earliest_bad = first_bad.clone()
            if world_size > 1:
                dist.all_reduce(summed)
                dist.all_reduce(earliest_bad, op=dist.ReduceOp.MIN)
            window_mean, stop_requested = summed[0].item() / world_size / window_steps, summed[1].item() > 0
            earliest_bad = earliest_bad.item()
            now = time.perf_counter()
            train_time += now - t0
            t0 = now
            if math.isfinite(earliest_bad):
                diverged, step = True, int(earliest_bad)  # the steps completed before it; the rest were skipped
                break

            if log_now:
                if master:
                    window_time = max(train_time - window_start, 1e-9)
                    tokens_per_s = window_steps * tokens_per_step / window_time
                    record = {
                        "step": step, "split": "train", "loss": window_mean, "lr": lr,
                        "grad_norm": grad_norm.item(), "tokens_per_s": tokens_per_s,
                        "mfu": step_flops * window_steps / window_time / peak if peak else None,
                        "peak_mem_mb": peak_memory_mb(device), "train_time_s": train_time,
                        "tokens": step * tokens_per_step,
                        "layer_grad_norm": layer_grads,
                        # untimed: an extra no-grad forward of the last micro-batch at the updated weights
                        **layer_stats(raw_model, x, mixed_precision),
                    }
                    tracker.log(record)
                    pbar.set_postfix(loss=f"{window_mean:.3f}", lr=f"{lr:.1e}", tok_s=f"{tokens_per_s:.0f}")
                window_loss, window_steps, window_start = torch.zeros((), device=device), 0, train_time
            if eval_now:
                last_val = run_eval()
            if save_now or stop_requested:
                save()
            if stop_requested:
                break
            t0 = time.perf_counter()  # evaluation and saving do not count as training time
    finally:
        pbar.close()
        stop.restore()

    # Every rank returns the outcome (the same on all, it was all-reduced); rank 0 adds the numbers and writes them.
    summary = {"step": step, "max_steps": args.max_steps, "diverged": diverged, "interrupted": stop_requested}
    if master:
        records = read_metrics(out_dir / "metrics.jsonl")
        train_records = [r for r in records if r["split"] == "train"]
        # A resumed run that evaluated nothing since (or only finished its summary) reports the last evaluation.
        last_val = last_val or next((r for r in reversed(records) if r["split"] == "val"), None)
        if train_records:
            figure = out_dir / "layers.png"
            plot_layer_profiles({tracker.run.name if tracker.run else out_dir.name: records}, figure)
            tracker.log_figure("layers", figure, step)
        summary.update({
            "train_loss": train_records[-1]["loss"] if train_records else None,
            "val_loss": last_val["loss"] if last_val else None, "val_bpb": last_val["bpb"] if last_val else None,
            "tokens_per_s": step * tokens_per_step / train_time if train_time else None,
            "s_per_step": train_time / step if step else None, "train_time_s": train_time,
            "num_params": num_params, "norm_params": norm_params, "num_norms": num_norms,
            "norm": cfg.norm_type, "norm_position": cfg.norm_position, "variant": norm_variant(cfg), "hidden_size": cfg.hidden_size,
            "seed": args.seed, "out_dir": str(out_dir), "args": vars(args), "data": fingerprint,
        })
        try:
            write_file_atomically(out_dir / "summary.json", lambda f: f.write(json.dumps(summary, indent=1).encode()))
        except OSError as err:
            raise UserError(f"cannot write {out_dir / 'summary.json'} ({err.strerror}); the checkpoint is saved: free "
                            "some space, then run the same command with --resume to write it") from None
        tracker.close()
    return summary


def main() -> None:
    args = parse_args()
    summary = train(args)
    if dist.is_initialized():
        dist.destroy_process_group()
    if summary["diverged"]:
        raise UserError(
            f"loss or gradient became non-finite at step {summary['step'] + 1}; the last checkpoint in {args.out_dir} "
            "is kept. Lower --learning_rate, raise --warmup_steps or set --grad_clip"
        )


if __name__ == "__main__":
    run_cli(main)
