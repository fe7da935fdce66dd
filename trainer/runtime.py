"""Where a run computes: the device and autocast precision,
the data-parallel process group,
and the stop flag that turns SIGTERM or Ctrl-C into a save and a clean exit."""

import atexit
import os
import signal
import sys
from contextlib import contextmanager, nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist

from common.cli import UserError, first_line


def pick_device(name: str = "auto") -> torch.device:
    """auto = cuda when available, else cpu;
    a device that is not there is one line, not a crash."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: not a device; "
                        "use auto, cpu, cuda or cuda:N") from None
    # the code is written and tested for these two (no mps: fused AdamW, NCCL, ...)
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device {name}: runs on cpu or cuda only")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available here; use --device cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"--device {name}: no such GPU here "
                        f"(the last is cuda:{torch.cuda.device_count() - 1})")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto = bf16 on a GPU that computes it natively, else fp16 (with a GradScaler);
    fp32 on CPU, where bf16 autocast without bf16 matrix units trains ~40x slower
    (16 vs 613 tokens/s, AVX2)."""
    if name != "auto":
        return getattr(torch, name)
    if device.type != "cuda":
        return torch.float32
    return (torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False)
            else torch.float16)


# mixed precision over fp32 weights
def autocast(device: torch.device, dtype: torch.dtype):
    return (nullcontext() if dtype == torch.float32
            else torch.autocast(device.type, dtype=dtype))


def setup_distributed(device_name: str,
                      timeout_min: float) -> tuple[int, int, torch.device]:
    """(rank, world_size, device) as torchrun's RANK, WORLD_SIZE and LOCAL_RANK say;
    NCCL on CUDA, gloo on CPU.
    A rank that waits on a collective over timeout_min minutes (a peer died) fails."""
    device = pick_device(device_name)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and device.type == "cuda":
        device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}")
        if device.index >= torch.cuda.device_count():
            ranks = os.environ.get("LOCAL_WORLD_SIZE", world_size)
            raise UserError(f"{ranks} ranks on this node but "
                            f"{torch.cuda.device_count()} GPUs: start torchrun with "
                            "--nproc_per_node at most the number of GPUs")
    if device.type == "cuda" and device.index is not None:
        # else CUDA calls without a device (RNG state, pinning) open one on GPU 0
        torch.cuda.set_device(device)
    if world_size == 1:
        return 0, 1, device
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=timeout_min),
                                device_id=device if device.type == "cuda" else None)
        # torn down before the interpreter exits, whoever called train():
        # gloo can abort a process that exits with its group alive,
        # after a run that went well
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    return dist.get_rank(), world_size, device


def on_rank_zero(rank: int, world_size: int, action):
    """action()'s result on rank 0, None on the others.
    Under DDP, when it fails, rank 0 raises its error (one line, if the user's)
    and the others exit 2 without a word: else they would wait for rank 0
    at their next collective and die there in a traceback."""
    result = None
    failed = [rank == 0]  # until action() returns; broadcast_object_list fills in the others'
    try:
        if rank == 0:
            result = action()
            failed = [False]
    finally:
        if world_size > 1:
            dist.broadcast_object_list(failed, src=0)
    if failed[0]:
        sys.exit(2)  # rank 0 says why
    return result


class StopFlag:
    """While it exists, SIGTERM and SIGINT (Ctrl-C) set `requested`
    instead of killing the process: the loop saves a checkpoint
    and exits at the next step all ranks agree on (restore() undoes)."""

    def __init__(self):
        self.requested = False
        self.previous = {s: signal.signal(s, self.handle)
                         for s in (signal.SIGTERM, signal.SIGINT)}

    def handle(self, signum, frame) -> None:
        self.requested = True

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def rng_state() -> dict:
    """The RNG states a checkpoint carries
    (CUDA's once CUDA is in use), for an exact resume."""
    cuda = {"cuda": torch.cuda.get_rng_state()} if torch.cuda.is_initialized() else {}
    return {"torch": torch.get_rng_state()} | cuda


def restore_rng(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def to_device(batch: tuple[torch.Tensor, ...],
              device: torch.device) -> tuple[torch.Tensor, ...]:
    """A batch on the device;
    on CUDA pinned first, so that its copy is queued like a kernel."""
    pin = device.type == "cuda"
    return tuple((t.pin_memory() if pin else t).to(device, non_blocking=True)
                 for t in batch)


@contextmanager
def out_of_memory_in_one_line():
    """torch's own allocator errors
    (CUDA's OutOfMemoryError, the CPU allocator's) as one line."""
    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if (not isinstance(err, torch.OutOfMemoryError)
                and "can't allocate memory" not in str(err)):
            raise
        raise UserError(
            "the model or a training step does not fit in memory "
            f"({first_line(err)}); lower --batch_size "
            "(raising --accumulation_steps keeps the tokens per step), "
            "--hidden_size or --num_hidden_layers") from None
