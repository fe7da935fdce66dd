"""Pretrain a MiniMind decoder: one process, or many under torchrun (DDP).

Top to bottom: the run's state, then train() (which the ablation runner calls too)
and the phases it calls in order:
load the data, start or resume, open the metrics, the loop, the summary."""

import json
import math
import os
import pickle
import shlex
import statistics
import sys
import time
import zipfile
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm
from transformers.utils import logging as hf_logging

from common.cli import UserError, run_cli
from common.environment import environment
from common.fs import write_atomically
from data import BatchSampler, PackedTokens, bits_per_byte, load_tokenizer, prepare_split
from data.token_stream import ORDER
from data.tokenizer import tokenizer_fingerprint
from model import (
    SWITCHES,
    MiniMindConfig,
    MiniMindForCausalLM,
    count_norms,
    norm_variant,
)
from model.names import VARIANT_SWITCHES
from model.norms import Norm
from trainer import checkpoint, runtime
from trainer.args import (
    DATA_FLAGS,
    MAY_CHANGE,
    MUST_MATCH,
    RunConfig,
    build_parser,
    final_lr,
    parse_args,
)
from trainer.diagnostics import (
    block_grad_norms,
    flops_per_token,
    layer_stats,
    peak_flops,
    peak_memory_mb,
)
from trainer.evaluation import (
    blown_up,
    evaluate,
    plateaued,
    unigram_loss,
    val_divergence,
)
from trainer.optim import MuonWithAdamW, build_optimizer, lr_at
from trainer.plots import plot_layer_profiles
from trainer.runtime import (
    StopFlag,
    autocast,
    resolve_dtype,
    setup_distributed,
    to_device,
)
from trainer.tracking import Tracker, keep_records_up_to, read_metrics


@dataclass
class Job:
    """What holds for the whole run: the resolved flags, this process's place,
    its device and precision, the data,
    and the model's sizes and cost per step (set once it is built)."""
    args: RunConfig
    rank: int
    world_size: int
    device: torch.device
    dtype: torch.dtype
    tokenizer: object
    environment: dict  # code, libraries, machine: read at the start, as the run began
    train: PackedTokens | None = None
    val: PackedTokens | None = None
    # the tokenizer's and splits' checksums: --resume compares them
    fingerprint: dict | None = None
    # validation loss of the unigram model (token frequencies, no context): a run
    # not PLATEAU_MARGIN below it at the end has learned nothing
    unigram: float = math.inf
    num_params: int = 0
    tokens_per_step: int = 0
    flops_per_token: float = 0.0
    # of all the devices together; None where unknown (no MFU then)
    peak_flops: float | None = None
    # time.perf_counter() at the start, for the elapsed times printed
    started: float = 0.0
    # what the closing line of a stopped run says to run next
    resumed_by: str = "the same command with --resume"

    @property
    def master(self) -> bool:
        return self.rank == 0

    @property
    def out_dir(self) -> Path:
        return Path(self.args.out_dir)

    # model FLOPs utilization, where known
    def mfu(self, tokens_per_s: float) -> float | None:
        return (None if self.peak_flops is None
                else tokens_per_s * self.flops_per_token / self.peak_flops)

    def elapsed(self) -> str:  # h:mm:ss since the start
        return str(timedelta(seconds=round(time.perf_counter() - self.started)))

    @property
    def mixed_precision(self):
        return autocast(self.device, self.dtype)


@dataclass
class TrainState:
    """What the loop advances and a checkpoint records, and how the loop ended."""
    raw_model: MiniMindForCausalLM
    model: torch.nn.Module  # raw_model as it trains: compiled and/or wrapped in DDP
    optimizer: torch.optim.Optimizer | MuonWithAdamW
    scaler: torch.amp.GradScaler
    sampler: BatchSampler
    step: int = 0
    train_time: float = 0.0  # seconds of training steps, without evaluations and saves
    # the first step's loss (all ranks' mean), read at a sync
    start_loss: float | None = None
    # the lowest validation loss so far (see val_divergence)
    lowest_val: float = math.inf
    # the wandb run: the one a resumed run continues, else the run's id
    run_id: str | None = None
    # how the run diverged, in words; None while it has not
    divergence: str | None = None
    interrupted: bool = False
    last_val: dict | None = None


# the TrainState fields a checkpoint saves and --resume restores
RESUMED = ("step", "train_time", "start_loss", "lowest_val")
STATE_KEYS = (*RESUMED, "optimizer", "scaler", "sampler",
              "wandb_run_id", "args", "data", "rng")


def train(args, resumed_by: str = Job.resumed_by) -> dict:
    """Run one training job and return its summary: the outcome on every rank,
    all the numbers on rank 0,
    which writes them to out_dir/summary.json and holds out_dir meanwhile.
    resumed_by: what continues it if stopped (a study: the study's command)."""
    rank, world_size, device = setup_distributed(args.device, args.dist_timeout)
    if device.type == "cpu":
        # subnormals (a plateaued run) compute ~7x slower; docs/training.md
        torch.set_flush_denormal(True)
    else:
        # on CUDA peak_mem_mb is this run's, also when one process trains many
        # (the ablation runner); on the CPU it is the process's peak so far
        torch.cuda.reset_peak_memory_stats(device)
    # save_pretrained's "Writing model shards" would bury the log
    hf_logging.disable_progress_bar()
    if args.overwrite and resumed_by == Job.resumed_by:  # the two flags exclude each other
        resumed_by += " in place of --overwrite"
    job = Job(args, rank, world_size, device, resolve_dtype(args.dtype, device),
              load_tokenizer(args.tokenizer_path), environment(device),
              started=time.perf_counter(), resumed_by=resumed_by)
    lock = runtime.on_rank_zero(rank, world_size, lambda: checkpoint.claim(
        job.out_dir, args.resume, args.overwrite))
    try:
        with runtime.out_of_memory_in_one_line():
            load_data(job)
            state = start_or_resume(job)
            # only now that it can start does a fresh run delete the last one
            if lock is not None:
                run_id = checkpoint.start(job.out_dir, lock, args.resume)
                state.run_id = state.run_id or run_id
            tracker = open_tracking(job, state) if job.master else None
            with tracker or nullcontext():
                train_loop(job, state, tracker)
                return finish(job, state, tracker)
    finally:
        if lock is not None:
            os.close(lock)


def load_data(job: Job) -> None:
    """The tokenized splits (one process per machine tokenizes and caches first,
    the others then read its cache), their fingerprint and the unigram loss."""
    args = job.args
    first = job.world_size == 1 or int(os.environ["LOCAL_RANK"]) == 0
    if not first:
        dist.barrier()
    job.train = prepare_split(args.data_path, "train", job.tokenizer, args.text_field,
                              num_proc=args.num_proc, streaming=args.streaming)
    job.val = prepare_split(args.data_path, "validation", job.tokenizer, args.text_field,
                            num_proc=args.num_proc, streaming=args.streaming)
    if first and job.world_size > 1:
        dist.barrier()
    # a split too short for one window fails now, not later
    for split in (job.train, job.val):
        BatchSampler(split.tokens, 1, args.max_seq_len, shuffle=split.split == "train")
    splits = {s.split: {"num_tokens": s.num_tokens, "sha256": s.sha256}
              for s in (job.train, job.val)}
    job.fingerprint = {"tokenizer": tokenizer_fingerprint(job.tokenizer), **splits}
    job.unigram = unigram_loss(job.train.tokens, job.val.tokens, len(job.tokenizer))


def start_or_resume(job: Job) -> TrainState:
    """A fresh model, optimizer and sampler;
    with --resume, the newest loadable checkpoint's."""
    args = job.args
    sampler = BatchSampler(job.train.tokens, args.batch_size, args.max_seq_len,
                           seed=args.seed, rank=job.rank, world_size=job.world_size)
    if args.resume:
        _, (raw_model, saved) = checkpoint.load_newest(job.out_dir, load_step)
        check_resumable(job, saved, raw_model.config)
    else:
        torch.manual_seed(args.seed)
        saved = None
        tok = job.tokenizer
        raw_model = MiniMindForCausalLM(MiniMindConfig(
            **args.arch, vocab_size=len(tok), max_position_embeddings=args.max_seq_len,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id))
    raw_model.to(job.device).train()
    optimizer = build_optimizer(raw_model, args.learning_rate, args.weight_decay,
                                args.norm_weight_decay, args.optimizer)
    scaler = torch.amp.GradScaler(job.device.type, enabled=job.dtype == torch.float16)
    state = TrainState(raw_model, raw_model, optimizer, scaler, sampler)
    if saved is not None:
        optimizer.load_state_dict(saved["optimizer"])
        # (one saved by a disabled scaler, in bf16 or fp32, is empty)
        if saved["scaler"]:
            scaler.load_state_dict(saved["scaler"])
        sampler.load_state_dict(saved["sampler"][job.rank])
        for name in RESUMED:
            setattr(state, name, saved[name])
        state.run_id = saved["wandb_run_id"]
        runtime.restore_rng(saved["rng"])
    if args.compile:
        # a study trains many models in one process: past Dynamo's recompile limit
        # (8 per function) the next ones would silently run eager
        torch._dynamo.reset()
        state.model = torch.compile(raw_model)
    if job.world_size > 1:
        gpu = [job.device.index] if job.device.type == "cuda" else None
        state.model = DistributedDataParallel(state.model, device_ids=gpu)
    job.num_params = sum(p.numel() for p in raw_model.parameters())
    job.tokens_per_step = (args.batch_size * args.max_seq_len * args.accumulation_steps
                           * job.world_size)
    job.flops_per_token = flops_per_token(job.num_params,
                                          raw_model.config.num_hidden_layers,
                                          raw_model.config.hidden_size, args.max_seq_len)
    peak = peak_flops(job.device, job.dtype)
    job.peak_flops = None if peak is None else peak * job.world_size
    return state


def load_step(folder: Path) -> tuple[MiniMindForCausalLM, dict]:
    """--resume's reader of one step folder: the model (float32) and the training state,
    which is read with weights_only,
    so that a state that would run code when unpickled is refused."""
    model = MiniMindForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                local_files_only=True)
    path = folder / checkpoint.STATE_FILE
    # torch.save writes a zip archive: other bytes are damage, and a damaged file must
    # raise a plain error so that load_newest falls back to the step before (torch's
    # older-format reader could meet an UnpicklingError, which below means a refusal)
    if path.is_file() and not zipfile.is_zipfile(path):
        raise ValueError(f"{path.name} is damaged (not the archive torch.save writes)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # weights_only refuses what would run code
        state = {}
    if not set(STATE_KEYS) <= state.keys():
        raise UserError(f"--resume: {folder} holds a training state "
                        "this trainer does not read "
                        "(an older version's, or one that would run code); "
                        "eval_llm.py reads its weights, "
                        "and a new --out_dir starts a new run")
    return model, state


def not_given(name: str, saved, given) -> str:
    """'--name saved, not given'; for an on/off flag, which takes no value,
    '--name, not without it' or 'no --name, not with it'."""
    if isinstance(saved, bool):
        return f"--{name}, not without it" if saved else f"no --{name}, not with it"
    if saved is None:  # derived from the other switches (DeepNorm's scales)
        return f"no --{name} (derived), not {given}"
    return f"--{name} {saved}, not {given}"


def check_resumable(job: Job, saved: dict, config: MiniMindConfig) -> None:
    """Refuse, in one line, a --resume that would not continue the checkpoint's run:
    one whose resolved flags give another value of a MUST_MATCH flag or switch,
    other data or tokenizer, other number of ranks; warn of MAY_CHANGE flags changed."""
    for name in MUST_MATCH:
        given = getattr(job.args, name)
        if saved["args"][name] != given:
            raise UserError("--resume: the checkpoint was trained with "
                            f"{not_given(name, saved['args'][name], given)}; "
                            "pass the same, or start a new --out_dir")
    arch = job.args.arch
    # None: derived from the other switches, as the checkpoint's was
    for switch in SWITCHES:
        if (arch[switch.name] is not None
                and arch[switch.name] != getattr(config, switch.name)):
            had = not_given(switch.flag_name, getattr(config, switch.name), arch[switch.name])
            raise UserError(f"--resume: the checkpoint's model has {had}; "
                            "pass the same, or start a new --out_dir")
    for part in ("tokenizer", "train", "validation"):
        if saved["data"][part] != job.fingerprint[part]:
            what = part if part == "tokenizer" else f"{part} split"
            parser = build_parser()
            flags = " ".join(f"--{name} {shlex.quote(str(saved['args'][name]))}"
                             for name in DATA_FLAGS
                             if saved["args"][name] != parser.get_default(name))
            again = ("pass those flags, with the data as it was then" if flags
                     else "leave the data flags out, with the data as it was then")
            raise UserError(f"--resume: the {what} is not the checkpoint's "
                            f"(trained with {flags or 'the default data'}); "
                            f"{again}, or start a new --out_dir")
    if saved["sampler"][0].get("order") != ORDER:
        raise UserError("--resume: the checkpoint was trained by an older version, "
                        "which drew random windows; "
                        "this one reads each window once per epoch, "
                        "so it cannot continue that run: start a new --out_dir")
    if saved["step"] > job.args.max_steps:
        raise UserError(f"--resume: the checkpoint is at step {saved['step']}, "
                        f"past --max_steps {job.args.max_steps}; "
                        "pass a larger --max_steps to train on")
    if len(saved["sampler"]) != job.world_size:
        raise UserError("--resume: the checkpoint was written by "
                        f"{len(saved['sampler'])} processes, not {job.world_size}; "
                        "resume with the same number of processes")
    # allowed, to train further; but a flag left out takes its default, not the run's value
    changed = [f"--{name} {getattr(job.args, name)} (was {saved['args'][name]})"
               for name in MAY_CHANGE if saved["args"][name] != getattr(job.args, name)]
    if changed and job.master:
        print(f"warning: --resume changes {', '.join(changed)}; to continue the run "
              "as it was, repeat its flags", file=sys.stderr)


def open_tracking(job: Job, state: TrainState) -> Tracker:
    """Rank 0: the metrics file (on --resume without the records past the checkpoint)
    and wandb, tagged with the variant and its fields;
    and the line saying what trains where."""
    args = job.args
    cfg = state.raw_model.config
    if args.resume:
        keep_records_up_to(job.out_dir / "metrics.jsonl", state.step)
    variant = norm_variant(cfg)
    dtype = str(job.dtype).removeprefix("torch.")
    # the variant as its name, also for a run built from flags (--variant unset)
    config = vars(args) | {"variant": variant, "num_params": job.num_params,
                           "world_size": job.world_size, "dtype": dtype,
                           "data": job.fingerprint}
    tags = [f"variant={variant}", f"layers={cfg.num_hidden_layers}",
            f"job={args.wandb_job}",
            *(f"{field}={getattr(cfg, field)}" for field in VARIANT_SWITCHES)]
    tracker = Tracker(job.out_dir, args.use_wandb, config, args.wandb_project,
                      args.wandb_run_name or f"{variant}-s{args.seed}", args.wandb_group,
                      state.run_id, tags)
    windows_per_step = job.tokens_per_step // args.max_seq_len
    epoch_steps = state.sampler.num_windows / windows_per_step
    print(f"model: {job.num_params / 1e6:.2f}M parameters, "
          f"{count_norms(state.raw_model)} norms ({variant}), "
          f"hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers "
          f"| {job.device} {dtype} x{job.world_size} "
          f"| train {job.train.num_tokens:,} tokens "
          f"(one epoch: {epoch_steps:,.0f} steps), "
          f"val {job.val.num_tokens:,} tokens "
          f"({job.val.bytes_per_token:.2f} bytes/token)")
    # bytes per token: about 3 for English with the default tokenizer (trained on
    # English plays), about 1 for e.g. Chinese text, which it spells out byte by byte
    if job.train.bytes_per_token < 1.5:
        print("warning: the tokenizer covers this corpus poorly "
              "(the model spends its capacity spelling out bytes); "
              "pass one trained on it, from scripts/train_tokenizer.py", file=sys.stderr)
    # e.g. --max_steps 20 on CPU, whose default warmup is 100 steps
    # (with --lr_decay_steps the schedule is meant to go on after a --resume)
    if args.lr_decay_steps is None and args.warmup_steps > args.max_steps:
        print(f"warning: --warmup_steps {args.warmup_steps} is longer than the run "
              f"(--max_steps {args.max_steps}): the lr rises to "
              f"{args.max_steps / args.warmup_steps:.0%} of --learning_rate and never decays; "
              "set --warmup_steps at most --max_steps", file=sys.stderr)
    return tracker


def train_loop(job: Job, state: TrainState, tracker: Tracker | None) -> None:
    """Train to --max_steps, logging, evaluating and saving on their intervals.
    Only on those steps does the host read the device (fp16 with Muon aside: its
    GradScaler checks every step). A loss or weight that is not finite stops the run
    unsaved, and so does an evaluation that shows it diverged; a stop request
    (SIGTERM, Ctrl-C) evaluates, saves, then stops."""
    args = job.args
    raw = state.raw_model
    stop = StopFlag()
    t0 = time.perf_counter()
    # the losses sum up on the device between the steps that read them:
    # the host never waits
    window_loss = torch.zeros((), device=job.device)
    window_steps = 0
    window_start = state.train_time
    first_loss = torch.full((), math.nan, device=job.device)
    pbar = tqdm(total=args.max_steps, initial=state.step, disable=not job.master,
                desc="train")

    # alike on every rank: all take part in these steps' reductions
    def due(interval: int) -> bool:
        return (state.step + 1) % interval == 0 or state.step + 1 == args.max_steps

    try:
        while state.step < args.max_steps:
            lr = lr_at(state.step, args.lr_decay_steps or args.max_steps,
                       args.learning_rate, final_lr(args), args.warmup_steps)
            for group in state.optimizer.param_groups:
                group["lr"] = lr
            diag_now = due(args.diag_interval)
            log_now = due(args.log_interval) or diag_now
            save_now = due(args.save_interval)
            # only a step that evaluates sane is saved
            eval_now = due(args.eval_interval) or save_now
            step_loss, last_batch = micro_steps(job, state)
            state.scaler.unscale_(state.optimizer)
            layer_grads = (block_grad_norms(raw.model.layers) if diag_now and job.master
                           else None)
            grad_norm = torch.nn.utils.clip_grad_norm_(raw.parameters(),
                                                       args.grad_clip or math.inf)
            # in fp16, skipped where the gradients overflowed
            state.scaler.step(state.optimizer)
            state.scaler.update()
            state.optimizer.zero_grad(set_to_none=True)
            if state.step == 0:
                first_loss = step_loss
            window_loss += step_loss
            window_steps += 1
            state.step += 1
            pbar.update(1)
            # the host reads the device only on log, eval and save steps; a single process
            # stops at once when asked, while DDP ranks stop together at the next such step
            if not (log_now or eval_now or save_now
                    or (job.world_size == 1 and stop.requested)):
                continue
            # the one sync: the ranks' losses, stop requests and weights' finiteness
            mean_loss = agree(job, state, window_loss, window_steps, first_loss, stop)
            # read only now: agree waited for the device, whose queued steps count too (CUDA)
            state.train_time += time.perf_counter() - t0
            if state.divergence:
                break
            if log_now and job.master:
                tokens_per_s = (window_steps * job.tokens_per_step
                                / (state.train_time - window_start))
                tracker.log({
                    "step": state.step, "split": "train", "loss": mean_loss, "lr": lr,
                    "grad_norm": grad_norm.item(), "tokens_per_s": tokens_per_s,
                    "mfu": job.mfu(tokens_per_s),
                    "peak_mem_mb": peak_memory_mb(job.device),
                    "train_time_s": state.train_time,
                    "tokens": state.step * job.tokens_per_step,
                    # untimed: a no-grad forward of the last micro-batch, updated weights
                    **(layer_stats(raw, last_batch, job.mixed_precision, layer_grads)
                       if diag_now else {})})
                pbar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.1e}",
                                 tok_s=f"{tokens_per_s:.0f}")
            if log_now:
                window_loss = torch.zeros((), device=job.device)
                window_steps = 0
                window_start = state.train_time
            if eval_now or state.interrupted:
                state.last_val = run_eval(job, state, tracker)
                state.divergence = val_divergence(state.last_val["loss"], state.step,
                                                  state.start_loss, state.lowest_val,
                                                  job.unigram, raw.config.vocab_size)
                state.lowest_val = min(state.lowest_val, state.last_val["loss"])
                if state.divergence:  # finite, but no longer a model worth a checkpoint
                    break
            if save_now or state.interrupted:
                save(job, state, tracker)
            if state.interrupted:
                break
            t0 = time.perf_counter()  # evaluating and saving are not training time
    finally:
        pbar.close()
        stop.restore()


def micro_steps(job: Job, state: TrainState) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward over --accumulation_steps micro-batches:
    the step's loss (their mean: each is divided by the count), on the device,
    and the last micro-batch's inputs (for the per-block diagnostics)."""
    steps = job.args.accumulation_steps
    step_loss = torch.zeros((), device=job.device)
    for micro in range(steps):
        x, y = to_device(next(state.sampler), job.device)
        # DDP all-reduces the gradients on the last micro-step only;
        # the others accumulate locally
        sync = (state.model.no_sync() if job.world_size > 1 and micro < steps - 1
                else nullcontext())
        with sync, job.mixed_precision:
            loss = state.model(input_ids=x, shift_labels=y).loss / steps
        state.scaler.scale(loss).backward()
        step_loss += loss.detach()
    return step_loss, x


def agree(job: Job, state: TrainState, window_loss: torch.Tensor, window_steps: int,
          first_loss: torch.Tensor, stop: StopFlag) -> float:
    """One all-reduce where the host reads the device,
    so that all ranks stop at the same step:
    the losses, stop requests and non-finite weights.
    Sets state.interrupted, start_loss, divergence."""
    weights_bad = ~torch.stack([p.isfinite().all()
                                for p in state.raw_model.parameters()]).all()
    requested = torch.tensor(float(stop.requested), device=job.device)
    summed = torch.stack([window_loss, first_loss, requested, weights_bad.float()])
    if job.world_size > 1:
        dist.all_reduce(summed)
    window_sum, first_sum, stops, bad = summed.tolist()
    mean_loss = window_sum / job.world_size / window_steps
    state.interrupted = stops > 0
    if state.start_loss is None:
        state.start_loss = first_sum / job.world_size
    if bad or not math.isfinite(mean_loss):
        state.divergence = ("the loss or the weights became non-finite "
                            f"by step {state.step}")
        return mean_loss
    spike = blown_up(mean_loss, state.start_loss, state.raw_model.config.vocab_size)
    if spike and job.master:
        tqdm.write(f"warning: the training loss spiked to {mean_loss:.4g} "
                   f"at step {state.step}, {spike}; "
                   "the run goes on (only an evaluation can stop it)",
                   file=sys.stderr)
    return mean_loss


def run_eval(job: Job, state: TrainState, tracker: Tracker | None) -> dict:
    """On every rank, each evaluating its share; rank 0 logs the loss and prints it."""
    args = job.args
    loss = evaluate(state.raw_model, job.val.tokens, args.batch_size, args.max_seq_len,
                    args.eval_steps, job.device, job.mixed_precision,
                    rank=job.rank, world_size=job.world_size)
    record = {"step": state.step, "split": "val", "loss": loss,
              "bpb": bits_per_byte(loss, job.val.bytes_per_token),
              "train_time_s": state.train_time,
              "tokens": state.step * job.tokens_per_step}
    if job.master:
        tracker.log(record)
        tqdm.write(f"step {state.step}/{args.max_steps}: val loss {loss:.3f}, "
                   f"{record['bpb']:.3f} bits/byte "
                   f"| {record['tokens']:,} tokens | {job.elapsed()}")
    return record


def save(job: Job, state: TrainState, tracker: Tracker | None) -> None:
    """A checkpoint at state.step: the model folder and the training state,
    with every rank's sampler position so that each draws its own batches on."""
    samplers = [state.sampler.state_dict()] * job.world_size
    if job.world_size > 1:
        dist.all_gather_object(samplers, state.sampler.state_dict())
    if not job.master:
        return
    training_state = {name: getattr(state, name) for name in RESUMED} | {
        "optimizer": state.optimizer.state_dict(), "scaler": state.scaler.state_dict(),
        "sampler": samplers, "wandb_run_id": tracker.run_id, "args": vars(job.args),
        "data": job.fingerprint, "rng": runtime.rng_state()}

    def write(folder: Path) -> None:
        state.raw_model.save_pretrained(folder)
        job.tokenizer.save_pretrained(folder)
        torch.save(training_state, folder / checkpoint.STATE_FILE)

    checkpoint.save(job.out_dir, state.step, write, job.args.keep_checkpoints)


def finish(job: Job, state: TrainState, tracker: Tracker | None) -> dict:
    """Every rank returns the outcome; rank 0 adds the numbers, writes summary.json,
    draws the per-layer figure and prints the closing line."""
    args = job.args
    cfg = state.raw_model.config
    summary = {"step": state.step, "max_steps": args.max_steps,
               "diverged": state.divergence is not None,
               "divergence": state.divergence, "interrupted": state.interrupted}
    if not job.master:
        return summary
    records = read_metrics(job.out_dir / "metrics.jsonl")
    vals = [r["loss"] for r in records if r["split"] == "val" and r.get("loss")]
    speeds = [r["tokens_per_s"] for r in records
              if r["split"] == "train" and r.get("tokens_per_s")]
    last_val = state.last_val or next(
        (r for r in reversed(records) if r["split"] == "val"), None)
    if speeds and not args.no_layers_plot:
        plot_layer_profiles({job.out_dir.name: records}, job.out_dir / "layers.png")
    # the median, so that the first window (compiling, warming up) does not skew it
    tokens_per_s = statistics.median(speeds) if speeds else None
    summary |= {
        "train_loss": next(
            (r["loss"] for r in reversed(records) if r["split"] == "train"), None),
        "val_loss": last_val["loss"] if last_val else None,
        "val_bpb": last_val["bpb"] if last_val else None,
        "unigram_loss": job.unigram,
        # judged at the end: a stopped run has not had its chance to learn
        "plateaued": (None if state.interrupted
                      else not summary["diverged"] and plateaued(vals, job.unigram)),
        "tokens_per_s": tokens_per_s,
        "s_per_step": job.tokens_per_step / tokens_per_s if speeds else None,
        "train_time_s": state.train_time,
        "world_size": job.world_size,
        "num_params": job.num_params,
        "norm_params": sum(p.numel() for m in state.raw_model.modules()
                           if isinstance(m, Norm) for p in m.parameters()),
        "num_norms": count_norms(state.raw_model),
        "norm": cfg.norm_type,
        "norm_position": cfg.norm_position,
        "variant": norm_variant(cfg), "hidden_size": cfg.hidden_size, "seed": args.seed,
        "out_dir": str(job.out_dir), "args": vars(args), "data": job.fingerprint,
        "sampler": ORDER, "epochs": state.sampler.epochs,
        "environment": job.environment,
    }
    write_atomically(job.out_dir / "summary.json", json.dumps(summary, indent=1))
    tracker.close(failed=summary["diverged"])
    if summary["diverged"]:  # main() and the runner say what to change
        return summary
    saved = checkpoint.newest_up_to(job.out_dir, state.step)
    where = f"checkpoint {saved}" if saved else "no checkpoint"
    val = (f"val loss {last_val['loss']:.3f}, {last_val['bpb']:.3f} bits/byte"
           if last_val else "no evaluation")
    data = f" {shlex.quote(args.data_path)}" if args.data_path else ""
    if args.text_field != "text":  # eval_llm reads the field it is told, not the run's
        data += f" --text_field {shlex.quote(args.text_field)}"
    then = (f"{job.resumed_by} continues it" if state.interrupted
            else f"python eval_llm.py --model_path {shlex.quote(str(job.out_dir))} "
                 f"--eval_data{data}")
    # no speed before the first timed window (the first steps warm up, or compile)
    speed = f"{tokens_per_s:,.0f} tokens/s, " if tokens_per_s else ""
    elapsed = job.elapsed()
    print(f"{'stopped' if state.interrupted else 'done'}: "
          f"step {state.step}/{args.max_steps}, {val}, "
          f"{speed}{elapsed} | {where} | next: {then}")
    return summary


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    summary = train(args)
    if summary["diverged"]:
        kept = checkpoint.newest_up_to(Path(args.out_dir), summary["step"])
        resume = "--resume in place of --overwrite" if args.overwrite else "--resume"
        then = (f"nothing after {kept.name} was saved, and {resume} continues from it"
                if kept else "no checkpoint was saved: start over with --overwrite")
        clip = "lower --grad_clip" if args.grad_clip else "set --grad_clip (0 is off)"
        raise UserError(f"{summary['divergence']}: lower --learning_rate, "
                        f"raise --warmup_steps or {clip}; {then}")


if __name__ == "__main__":
    run_cli(main)
