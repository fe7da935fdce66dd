"""Pretrain a MiniMind decoder: one process, or many under torchrun (DDP). The loop lives in train(args), which
the ablation runner calls too; the README's quick tour shows the command lines."""

import argparse
import json
import math
import os
import shlex
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

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
from transformers.utils import logging as hf_logging

from common.cli import UserError, cannot_write, run_cli
from common.environment import environment
from common.fs import write_file_atomically
from data import (
    DEFAULT_PROMPTS,
    HOLDOUT_EVERY,
    BatchSampler,
    PackedTokens,
    bits_per_byte,
    load_tokenizer,
    prepare_split,
)
from model import MiniMindConfig, MiniMindForCausalLM, count_norms, norm_variant
from model.names import VARIANT_SWITCHES
from model.norms import NORM_MODULES
from trainer import run_dir
from trainer.args import arch_fields, final_lr, parse_args
from trainer.device import Prefetcher, autocast, cpu_has_bf16_matmul, resolve_dtype
from trainer.diagnostics import block_grad_norms, flops_per_token, layer_stats, peak_flops, peak_memory_mb
from trainer.evaluation import evaluate, learned_nothing, plateaued, unigram_loss
from trainer.memory import require_model_fits, require_step_fits
from trainer.optim import MuonWithAdamW, build_optimizer, lr_at, step_unless
from trainer.plots import plot_layer_profiles
from trainer.process import InterruptGuard, StopFlag, barrier, peer_failures_in_one_line, setup_distributed
from trainer.tracking import Tracker, read_metrics


def model_config(args, tokenizer, device: torch.device) -> MiniMindConfig:
    """The architecture the flags ask for; checked before any data is touched, so a bad flag fails at once."""
    # max_position_embeddings: the context it is trained for, which eval_llm.py respects
    config = MiniMindConfig(**arch_fields(args, device), vocab_size=len(tokenizer),
                            max_position_embeddings=args.max_seq_len, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    require_model_fits(config, device)  # before any weight is allocated (or a run directory claimed)
    return config


def build_model(config: MiniMindConfig, seed: int) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    return MiniMindForCausalLM(config)


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


# Fewer bytes per token means a tokenizer learned on other text (the shipped one: Shakespeare 2.95, Chinese 1.0).
FEW_BYTES_PER_TOKEN = 1.5

# A run can diverge with finite numbers: the loss climbs to thousands of nats, or falls back to no better than a
# unigram model once the logits ignore the input. A blow-up is measured from the larger of ln V and the run's first
# loss (deepnorm without a norm starts near 3,200 nats and trains down). Only evaluations decide: runs come back
# from a training spike, which is reported, not fatal (docs/training.md, docs/results/study.md).
BLOW_UP = 2  # a loss above BLOW_UP x that: far worse than where it started


def blown_up(loss: float, start: float, vocab_size: int) -> str | None:
    """'more than 2x <reference>' when a finite loss is far above where the run started; None otherwise."""
    uniform = math.log(vocab_size)
    if loss <= BLOW_UP * max(start, uniform):
        return None
    return f"more than {BLOW_UP}x " + (f"its first loss ({start:.4g})" if start > uniform else
                                       f"the loss of a uniform guess (ln {vocab_size} = {uniform:.3f})")


def val_divergence(loss: float, step: int, start: float, lowest: float, unigram: float,
                   vocab_size: int) -> str | None:
    """How a validation loss shows the run diverged, in words; None while it is healthy. `lowest` is the lowest
    validation loss before it."""
    if not math.isfinite(loss):  # finite weights whose forward overflows
        return f"the validation loss was {loss} at step {step}"
    if reference := blown_up(loss, start, vocab_size):
        return f"the validation loss blew up to {loss:.4g} at step {step}, {reference}"
    if learned_nothing(loss, unigram) and not learned_nothing(lowest, unigram):
        return (f"the validation loss collapsed to {loss:.4f} at step {step}, no better than a unigram model's "
                f"({unigram:.3f}), after it had been down to {lowest:.3f}")
    return None


def train(args) -> dict:
    """Run one training job and return its summary: the outcome on every rank, all the numbers on rank 0 (which
    writes them to out_dir/summary.json and owns out_dir meanwhile)."""
    rank, world_size, device = setup_distributed(args.device, args.dist_timeout)
    if device.type == "cpu":  # subnormals (a run stuck at a plateau) compute ~7x slower; docs/training.md
        torch.set_flush_denormal(True)
    hf_logging.disable_progress_bar()  # save_pretrained's per-save "Writing model shards" bar would bury the log
    interrupts = InterruptGuard()
    try:
        tokenizer = load_tokenizer(args.tokenizer_path)
        config = None if args.resume else model_config(args, tokenizer, device)
        with (run_dir.claim_run_dir(Path(args.out_dir), args.resume, args.overwrite) if rank == 0
              else nullcontext(), peer_failures_in_one_line(rank, args.dist_timeout)):
            return run_training(args, rank, world_size, device, tokenizer, config)
    except BaseException:
        if interrupts.signal is None:
            raise
        # Whatever became of the KeyboardInterrupt (datasets' worker pool turns it into an error of its own).
        raise UserError(f"interrupted by {interrupts.signal}; nothing half-written was left behind: run the same "
                        "command again (with --resume if a checkpoint was saved)") from None
    finally:
        interrupts.restore()


# The run in phases: run_training() calls them in order; each reads the Job and moves the TrainState on.


@dataclass
class Job:
    """What holds for the whole run: the flags, this process's place in the job, its device and precision."""
    args: argparse.Namespace
    rank: int
    world_size: int
    device: torch.device
    dtype: torch.dtype
    tokenizer: object
    out_dir: Path
    started: float = field(default_factory=time.perf_counter)  # for the elapsed time the printed lines give

    @property
    def master(self) -> bool:
        return self.rank == 0

    @property
    def mixed_precision(self):
        return autocast(self.device, self.dtype)


class Splits(NamedTuple):
    train: PackedTokens
    val: PackedTokens
    fingerprint: dict  # see data_fingerprint
    unigram: float  # the validation loss of a context-free model: a run no better learned nothing


@dataclass
class Accounting:
    """Sizes and costs of one step, fixed once the model is built: for the banner, the logs and the summary."""
    num_params: int
    norm_params: int
    num_norms: int
    tokens_per_step: int
    step_flops: float
    peak_flops: float | None  # of all the devices together; None where unknown


@dataclass
class Window:
    """The steps since the last train record: their loss summed on the device, their count, the untimed warm-up
    steps among them, train_time at its start. Checkpointed: a --resume's first record averages the same steps."""
    loss: torch.Tensor
    steps: int = 0
    untimed: int = 0
    start: float = 0.0


@dataclass
class TrainState:
    """What the loop advances and a checkpoint records, and how the loop ended."""
    raw_model: MiniMindForCausalLM
    model: torch.nn.Module  # raw_model as it trains: compiled and/or wrapped in DDP
    optimizer: torch.optim.Optimizer | MuonWithAdamW
    scaler: torch.amp.GradScaler
    sampler: Prefetcher
    window: Window
    step: int = 0
    train_time: float = 0.0  # seconds of training, without the warm-up steps (below), evaluations and saves
    compile_time: float = 0.0  # seconds of the warm-up steps: the first step of each process, which compiles
    untimed_steps: int = 0  # how many warm-up steps there were (one per start: the first run and each resume)
    run_id: str | None = None  # the wandb run a resumed run continues
    start_loss: float | None = None  # the first step's (all ranks' mean), known after the first host read
    lowest_loss: float = math.inf  # of every evaluation so far (see val_divergence)
    spiked: bool = False  # a training window blew up (see val_divergence)
    diverged: bool = False
    divergence: str | None = None  # how it diverged, in words
    interrupted: bool = False
    last_val: dict | None = None  # the last evaluation record of this process


# The TrainState fields a checkpoint carries under their own names.
RESUMED = ("step", "train_time", "compile_time", "untimed_steps", "start_loss", "lowest_loss", "spiked")


def run_training(args, rank: int, world_size: int, device: torch.device, tokenizer, config) -> dict:
    job = Job(args, rank, world_size, device, resolve_dtype(args.dtype, device), tokenizer, Path(args.out_dir))
    splits = load_splits(job)
    state = start_or_resume(job, config, splits)
    if state.step >= args.max_steps and (job.out_dir / "summary.json").is_file():
        # a resumed run with nothing left to train: its summary stays as it is
        if job.master:
            return json.loads((job.out_dir / "summary.json").read_text())
        return {"step": state.step, "max_steps": args.max_steps, "diverged": False, "interrupted": False}
    costs = account(job, state.raw_model)
    tracker = open_tracking(job, splits, state, costs) if job.master else None
    with tracker or nullcontext():
        train_loop(job, splits, state, costs, tracker)
        return write_summary(job, splits, state, costs, tracker)


def load_splits(job: Job) -> Splits:
    """Tokenized train and validation splits, each long enough for a sequence, and their fingerprint."""
    args = job.args
    # One process per machine tokenizes (and caches) first; the others then read its finished cache.
    local_master = int(os.environ.get("LOCAL_RANK", "0")) == 0
    if not local_master:
        barrier()
    splits = [prepare_split(args.data_path, split, job.tokenizer, args.text_field, num_proc=args.num_proc,
                            streaming=args.streaming) for split in ("train", "validation")]
    if local_master:
        barrier()
    for split_data in splits:
        require_window(split_data, args)
    return Splits(*splits, run_dir.data_fingerprint(job.tokenizer, *splits),
                  unigram_loss(splits[0].tokens, splits[1].tokens, len(job.tokenizer)))


def start_or_resume(job: Job, config: MiniMindConfig | None, splits: Splits) -> TrainState:
    """A fresh model, optimizer and sampler; or, with --resume, those of the newest checkpoint that loads, with the
    sampler and the RNGs where the run stopped."""
    args = job.args
    sampler = Prefetcher(BatchSampler(splits.train.tokens, args.batch_size, args.max_seq_len, seed=args.seed,
                                      rank=job.rank, world_size=job.world_size), job.device)
    if args.resume:
        raw_model, saved = run_dir.load_checkpoint(job.out_dir, repair=job.master)
        run_dir.check_resumable(saved, raw_model.config, args, splits.fingerprint, job.world_size)
        if saved["step"] >= args.max_steps and job.master:
            print(f"{job.out_dir}: the run is already at step {saved['step']} of --max_steps {args.max_steps}; "
                  "nothing to train (raise --max_steps to train further)")
    else:
        raw_model, saved = build_model(config, args.seed), None
    raw_model.to(job.device).train()
    optimizer = build_optimizer(raw_model, args.learning_rate, args.weight_decay, args.norm_weight_decay,
                                args.optimizer)
    scaler = torch.amp.GradScaler(job.device.type, enabled=job.dtype == torch.float16)
    state = TrainState(raw_model, raw_model, optimizer, scaler, sampler, Window(torch.zeros((), device=job.device)))
    if saved is not None:
        optimizer.load_state_dict(saved["optimizer"])
        if scaler.is_enabled() and not saved["scaler"]:  # bf16 and fp32 runs have no loss scale to carry over
            if job.master:
                print("note: --resume: the checkpoint was trained without float16's loss scaling; float16 starts "
                      "from a fresh GradScaler", file=sys.stderr)
        else:  # a disabled scaler ignores a saved state (an fp16 checkpoint resumed in bf16 or fp32)
            scaler.load_state_dict(saved["scaler"])
        sampler.load_state_dict(saved["sampler"][job.rank])
        for name in RESUMED:
            setattr(state, name, saved[name])
        state.run_id, window = saved["wandb_run_id"], saved["window"]
        state.window = Window(torch.tensor(window["loss_sums"][job.rank], device=job.device), window["steps"],
                              window["untimed"], window["start"])
        run_dir.set_rng_state(saved["rng"])

    if args.compile:
        state.model = torch.compile(raw_model)
    if job.world_size > 1:
        state.model = DistributedDataParallel(state.model,
                                              device_ids=[job.device.index] if job.device.type == "cuda" else None)
    return state


def account(job: Job, raw_model: MiniMindForCausalLM) -> Accounting:
    """Count the model and price its step; refuse a step that cannot fit in the device's memory."""
    args, cfg = job.args, raw_model.config
    if job.device.type == "cuda":  # peak_mem_mb is this run's, also when a process trains many (the ablation runner)
        torch.cuda.reset_peak_memory_stats(job.device)
    num_params = sum(p.numel() for p in raw_model.parameters())
    require_step_fits(cfg, num_params, args.batch_size, args.max_seq_len, job.dtype, job.device)
    norm_params = sum(p.numel() for m in raw_model.modules() if isinstance(m, NORM_MODULES) for p in m.parameters())
    tokens_per_step = args.batch_size * args.max_seq_len * args.accumulation_steps * job.world_size
    step_flops = flops_per_token(num_params, cfg.num_hidden_layers, cfg.hidden_size, args.max_seq_len) * tokens_per_step
    peak = peak_flops(job.device, job.dtype)
    return Accounting(num_params, norm_params, count_norms(raw_model), tokens_per_step, step_flops,
                      peak * job.world_size if peak else peak)  # utilization of all the devices together


def open_tracking(job: Job, splits: Splits, state: TrainState, costs: Accounting) -> Tracker:
    """Rank 0 only: prepare out_dir's metrics for this run, start the tracker and print what is trained where."""
    args, cfg, device, dtype = job.args, state.raw_model.config, job.device, job.dtype
    if args.resume:
        run_dir.keep_metrics_up_to(job.out_dir / "metrics.jsonl", state.step)
    elif args.overwrite:
        run_dir.discard_run(job.out_dir)
    dtype_name = str(dtype).removeprefix("torch.")
    run_name = args.wandb_run_name or f"{norm_variant(cfg)}-s{args.seed}"
    run_config = {**vars(args), "num_params": costs.num_params, "norm_params": costs.norm_params,
                  "num_norms": costs.num_norms, "hidden_size": cfg.hidden_size, "world_size": job.world_size,
                  "device": str(device), "dtype": dtype_name, "data": splits.fingerprint}
    # Tags to filter a study by in wandb: the variant, each of its fields, the depth and what the run is to its study.
    tags = [f"variant={norm_variant(cfg)}", f"layers={cfg.num_hidden_layers}", f"job={args.wandb_job}",
            *(f"{field}={getattr(cfg, field)}" for field in VARIANT_SWITCHES)]
    tracker = Tracker(job.out_dir, args.use_wandb, run_config, args.wandb_project, run_name, args.wandb_group,
                      state.run_id, tags)
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
    if splits.train.bytes_per_token < FEW_BYTES_PER_TOKEN:
        print(f"warning: the tokenizer covers this corpus poorly ({splits.train.bytes_per_token:.2f} bytes per token; "
              "English text gets about 3): the model spends its capacity spelling out bytes. Train a tokenizer on "
              "the corpus with scripts/train_tokenizer.py and pass it with --tokenizer_path", file=sys.stderr)
    print(f"model: {costs.num_params / 1e6:.2f}M parameters, {costs.num_norms} norms ({norm_variant(cfg)}), "
          f"hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers | {device} {dtype_name} x{job.world_size} | "
          f"train {splits.train.num_tokens:,} tokens, "
          f"val {splits.val.num_tokens:,} tokens ({splits.val.bytes_per_token:.2f} bytes/token)")
    return tracker


def save(job: Job, splits: Splits, state: TrainState, tracker: Tracker | None) -> None:
    """A checkpoint at state.step; called on every rank, each sending its sampler's position and window loss."""
    own = (state.sampler.state_dict(), state.window.loss.item())
    ranks = [own] * job.world_size  # every rank's, so that each draws its own batches after a resume
    if job.world_size > 1:
        dist.all_gather_object(ranks, own)
    window = state.window
    if job.master:
        run_dir.save_checkpoint(job.out_dir, state.raw_model, job.tokenizer, {
            **{name: getattr(state, name) for name in RESUMED}, "optimizer": state.optimizer.state_dict(),
            "scaler": state.scaler.state_dict(), "sampler": [sampler for sampler, _ in ranks],
            "window": {"loss_sums": [loss for _, loss in ranks], "steps": window.steps, "untimed": window.untimed,
                       "start": window.start},
            "wandb_run_id": tracker.run_id, "args": vars(job.args), "data": splits.fingerprint,
        }, job.args.keep_checkpoints)


def run_eval(job: Job, splits: Splits, state: TrainState, costs: Accounting, tracker: Tracker | None) -> dict:
    """On every rank, each evaluating its share; rank 0 logs the loss and prints it above the progress bar."""
    args = job.args
    loss = evaluate(state.raw_model, splits.val.tokens, args.batch_size, args.max_seq_len, args.eval_steps,
                    job.device, job.mixed_precision, rank=job.rank, world_size=job.world_size)
    record = {"step": state.step, "split": "val", "loss": loss, "bpb": bits_per_byte(loss, splits.val.bytes_per_token),
              "train_time_s": state.train_time, "tokens": state.step * costs.tokens_per_step}
    if job.master:
        tracker.log(record)
        tqdm.write(f"step {state.step}/{args.max_steps}: val loss {loss:.3f}, {record['bpb']:.3f} bits/byte | "
                   f"{record['tokens']:,} tokens | {duration(time.perf_counter() - job.started)}")
    return record


def train_loop(job: Job, splits: Splits, state: TrainState, costs: Accounting, tracker: Tracker | None) -> None:
    """Train from state.step to --max_steps, logging, evaluating and saving on their intervals; stop early, after
    saving, when asked to (SIGTERM, Ctrl-C) or when a step diverges (state.step is then the last good one; after
    a finite blow-up, the step that showed it, unsaved)."""
    args, device, raw_model, model, optimizer, scaler, sampler = (
        job.args, job.device, state.raw_model, state.model, state.optimizer, state.scaler, state.sampler)
    mixed_precision, world_size, master = job.mixed_precision, job.world_size, job.master
    stop = StopFlag()
    warming_up, vocab_size = True, raw_model.config.vocab_size
    # The host reads the device only on steps that log, evaluate or save (or stop), so in between it queues work
    # without waiting for the GPU. Until then the loss sums up on the device, and so does the first step whose
    # loss or gradient was non-finite (inf while none): every update from it on is skipped on the device.
    first_bad = torch.full((), math.inf, device=device)
    first_loss = torch.full((), math.nan, device=device)  # of a fresh run's first step, read at the first sync
    pbar = tqdm(total=args.max_steps, initial=state.step, disable=not master, desc="train", dynamic_ncols=True)

    def due(interval: int) -> bool:  # alike on every rank: all take part in the reductions of these steps
        return (state.step + 1) % interval == 0 or state.step + 1 == args.max_steps

    t0 = time.perf_counter()
    try:
        while state.step < args.max_steps:
            lr = lr_at(state.step, args.lr_decay_steps or args.max_steps, args.learning_rate, final_lr(args),
                       args.warmup_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            diag_step = due(args.diag_interval)  # per-block diagnostics, also logged
            log_now, diag_now = due(args.log_interval) or diag_step, diag_step and master
            eval_now, save_now = due(args.eval_interval), due(args.save_interval)
            loss_sum = torch.zeros((), device=device)
            for micro in range(args.accumulation_steps):
                x, y = next(sampler)
                # gradients are all-reduced only on the last micro-step; the others accumulate locally
                last_micro = micro == args.accumulation_steps - 1
                sync = nullcontext() if last_micro or world_size == 1 else model.no_sync()
                with sync, mixed_precision:  # the logits are not kept: freed before the backward needs its memory
                    loss = model(input_ids=x, shift_labels=y).loss / args.accumulation_steps
                scaler.scale(loss).backward()
                loss_sum += loss.detach()
            scaler.unscale_(optimizer)
            layer_grads = block_grad_norms(raw_model.model.layers) if diag_now else None  # before clipping, on the device
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), args.grad_clip or math.inf)
            # Divergence is a non-finite loss, or a non-finite gradient unless fp16's GradScaler is on: there an
            # overflowing gradient is routine, the step is skipped and the scale lowered.
            finite_grads = torch.isfinite(grad_norm)
            bad = ~torch.isfinite(loss_sum) if scaler.is_enabled() else ~(torch.isfinite(loss_sum) & finite_grads)
            first_bad = torch.where(bad & first_bad.isinf(), state.step, first_bad)
            step_unless(optimizer, first_bad.isfinite() | ~finite_grads)
            if save_now or stop.requested:
                # An update can overflow the weights from a finite gradient (a huge --learning_rate); the loss
                # shows it only a step later, so before a save the weights themselves are checked.
                weights_bad = ~torch.stack([p.isfinite().all() for p in raw_model.parameters()]).all()
                first_bad = torch.where(weights_bad & first_bad.isinf(), state.step, first_bad)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if state.step == 0:
                first_loss = loss_sum
            state.window.loss += loss_sum
            state.window.steps += 1
            state.step += 1
            pbar.update(1)
            if warming_up:
                # The first step of a process compiles (--compile) and warms the device up (cuBLAS and attention
                # plans, the allocator): timed apart, so that train_time and tokens/s measure training alone.
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                now = time.perf_counter()
                state.compile_time += now - t0
                state.untimed_steps += 1
                state.window.untimed += 1
                t0, warming_up = now, False
            if not (log_now or eval_now or save_now or (world_size == 1 and stop.requested)):
                continue

            # One small all-reduce of each kind, so all ranks agree on when to stop (a rank that stopped alone
            # would hang the others): the loss and any rank's stop request summed, the first bad step's minimum.
            window = state.window
            summed = torch.stack([window.loss, torch.full((), float(stop.requested), device=device), first_loss])
            earliest_bad = first_bad.clone()
            if world_size > 1:
                dist.all_reduce(summed)
                dist.all_reduce(earliest_bad, op=dist.ReduceOp.MIN)
            window_sum, stops, first_sum = summed.tolist()
            window_mean, state.interrupted = window_sum / world_size / window.steps, stops > 0
            if state.start_loss is None:
                state.start_loss = first_sum / world_size
            earliest_bad = earliest_bad.item()
            now = time.perf_counter()
            state.train_time += now - t0
            t0 = now
            if math.isfinite(earliest_bad):  # the steps before it were completed, the rest skipped
                state.diverged, state.step = True, int(earliest_bad)
                state.divergence = f"the loss, gradient or weights became non-finite at step {state.step + 1}"
                break
            spike = blown_up(window_mean, state.start_loss, vocab_size)
            if spike and not state.spiked and master:
                print(f"warning: the training loss spiked to {window_mean:.4g} at step {state.step}, {spike}; the "
                      "run goes on, and stops as diverged if a validation loss blows up or collapses to ln V",
                      file=sys.stderr)
            state.spiked = state.spiked or bool(spike)

            if log_now:
                if master:
                    # speed over the window's timed steps (a window holding only the warm-up step has none)
                    timed, window_time = window.steps - window.untimed, state.train_time - window.start
                    tokens_per_s = timed * costs.tokens_per_step / window_time if timed and window_time else None
                    peak = costs.peak_flops
                    record = {
                        "step": state.step, "split": "train", "loss": window_mean, "lr": lr,
                        "grad_norm": grad_norm.item(), "tokens_per_s": tokens_per_s,
                        "mfu": tokens_per_s * costs.step_flops / costs.tokens_per_step / peak
                        if peak and tokens_per_s else None,
                        "peak_mem_mb": peak_memory_mb(device), "train_time_s": state.train_time,
                        "compile_time_s": state.compile_time, "tokens": state.step * costs.tokens_per_step,
                    }
                    if diag_now:
                        record["layer_grad_norm"] = layer_grads.tolist()
                        # untimed: an extra no-grad forward of the last micro-batch at the updated weights
                        record.update(layer_stats(raw_model, x, mixed_precision))
                    tracker.log(record)
                    pbar.set_postfix(loss=f"{window_mean:.3f}", lr=f"{lr:.1e}",
                                     tok_s=f"{tokens_per_s:.0f}" if tokens_per_s else "-")
                state.window = Window(torch.zeros((), device=device), start=state.train_time)
            if eval_now:
                state.last_val = run_eval(job, splits, state, costs, tracker)
                val_loss = state.last_val["loss"]
                state.divergence = val_divergence(val_loss, state.step, state.start_loss, state.lowest_loss,
                                                  splits.unigram, vocab_size)
                state.lowest_loss = min(state.lowest_loss, val_loss)
                if state.divergence:  # finite, but no longer a model worth a checkpoint
                    state.diverged = True
                    break
            if save_now or state.interrupted:
                save(job, splits, state, tracker)
            if state.interrupted:
                break
            t0 = time.perf_counter()  # evaluation and saving do not count as training time
    finally:
        pbar.close()
        stop.restore()


def write_summary(job: Job, splits: Splits, state: TrainState, costs: Accounting, tracker: Tracker | None) -> dict:
    """Every rank returns the outcome (all-reduced, so the same on all); rank 0 adds the numbers, writes them to
    summary.json and plots the layer profiles."""
    args, out_dir, cfg, step, train_time = job.args, job.out_dir, state.raw_model.config, state.step, state.train_time
    timed = max(step - state.untimed_steps, 0)  # (a run that diverged in its first step has none)
    summary = {"step": step, "max_steps": args.max_steps, "diverged": state.diverged, "divergence": state.divergence,
               "interrupted": state.interrupted}
    if not job.master:
        return summary
    records = read_metrics(out_dir / "metrics.jsonl")
    train_records = [r for r in records if r["split"] == "train"]
    # A resumed run that evaluated nothing since (or only finished its summary) reports the last evaluation.
    last_val = state.last_val or next((r for r in reversed(records) if r["split"] == "val"), None)
    if train_records and not args.no_layers_plot:
        figure = out_dir / "layers.png"
        plot_layer_profiles({tracker.run.name if tracker.run else out_dir.name: records}, figure)
        tracker.log_figure("layers", figure, step)
    summary.update({
        "train_loss": train_records[-1]["loss"] if train_records else None,
        "val_loss": last_val["loss"] if last_val else None, "val_bpb": last_val["bpb"] if last_val else None,
        "unigram_loss": splits.unigram, "plateaued": not state.diverged and plateaued(
            [r["loss"] for r in records if r["split"] == "val"], splits.unigram),
        # over the timed steps: the warm-up step of each start is in compile_time_s instead
        "tokens_per_s": timed * costs.tokens_per_step / train_time if timed and train_time else None,
        "s_per_step": train_time / timed if timed else None, "train_time_s": train_time,
        "compile_time_s": state.compile_time, "world_size": job.world_size,
        "num_params": costs.num_params, "norm_params": costs.norm_params, "num_norms": costs.num_norms,
        "norm": cfg.norm_type, "norm_position": cfg.norm_position, "variant": norm_variant(cfg),
        "hidden_size": cfg.hidden_size, "seed": args.seed, "out_dir": str(out_dir), "args": vars(args),
        "data": splits.fingerprint, "environment": environment(job.device),
    })
    try:
        write_file_atomically(out_dir / "summary.json", lambda f: f.write(json.dumps(summary, indent=1).encode()))
    except OSError as err:
        raise cannot_write(out_dir / "summary.json", err, "the checkpoint is saved: free some space, then run the "
                           "same command with --resume to write it") from None
    tracker.close()
    if not state.diverged:  # a diverged run ends in the error line that says what to change
        print(closing_line(summary, time.perf_counter() - job.started))
    return summary


def duration(seconds: float) -> str:
    """'42s', '8m 14s', '2h 05m'."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def closing_line(summary: dict, wall_time: float) -> str:
    """What a finished (or interrupted) run produced, where its checkpoint is and what to run next."""
    args, out = summary["args"], shlex.quote(summary["out_dir"])
    val = (f"val loss {summary['val_loss']:.3f}, {summary['val_bpb']:.3f} bits/byte" if summary["val_loss"] is not None
           else "no evaluation")
    speed = f"{summary['tokens_per_s']:,.0f} tokens/s" if summary["tokens_per_s"] else "tokens/s not measured"
    line = (f"{'stopped' if summary['interrupted'] else 'done'}: step {summary['step']}/{summary['max_steps']}, "
            f"{val}, {speed}, {duration(wall_time)} | checkpoint {Path(summary['out_dir']) / run_dir.LINK} "
            "| next: ")
    if summary["interrupted"]:
        return line + "the same command with --resume continues the run"
    if args["data_path"] is None:
        prompt, eval_data = DEFAULT_PROMPTS[0], ""
    else:
        prompt, eval_data = "...", " " + shlex.quote(args["data_path"])
    return line + (f"python eval_llm.py --model_path {out} --prompt {bash_word(prompt)} ; "
                   f"python eval_llm.py --model_path {out} --eval_data{eval_data}")


def bash_word(text: str) -> str:
    """text as one bash word: $'...' where it holds a newline, which plain quotes cannot carry on one line."""
    if "\n" not in text:
        return shlex.quote(text)
    return "$'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    summary = train(args)
    if summary["diverged"]:
        what = summary.get("divergence") or f"the run diverged after step {summary['step']}"  # (older summaries)
        fix = "lower --learning_rate, raise --warmup_steps or set --grad_clip"
        checkpoints = run_dir.find_checkpoints(Path(args.out_dir))
        if checkpoints:
            raise UserError(f"{what}; nothing after it was saved, and the last checkpoint ({checkpoints[0].name}) is "
                            f"kept: {fix}, then continue from it with --resume (or start over with --overwrite)")
        raise UserError(f"{what}, before the run saved any checkpoint: {fix}, and start over with --overwrite "
                        "(or in a new --out_dir)")


if __name__ == "__main__":
    run_cli(main)
