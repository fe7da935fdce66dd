"""Process setup around a training job: which device and rank this process is, and how it answers signals."""

import atexit
import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from common.cli import UserError
from trainer.device import pick_device

# gloo reports a collective that waited past the timeout, or whose peer went away, as a plain RuntimeError (NCCL in
# blocking-wait mode as a DistBackendError); only the message tells which.
TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
PEER_GONE = re.compile(r"connection closed by peer|connection reset by peer|broken pipe", re.IGNORECASE)


def setup_distributed(device_name: str, timeout_min: float) -> tuple[int, int, torch.device]:
    """(rank, world_size, device) as torchrun's RANK/WORLD_SIZE/LOCAL_RANK say; NCCL on CUDA, gloo on CPU. A rank
    that waits on a collective past timeout_min minutes (a peer died or hangs) fails rather than hold its devices."""
    device = pick_device(device_name)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and device.type == "cuda":
        device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}")
    if device.type == "cuda" and device.index is not None:
        # The current device is what CUDA calls without an explicit device use (RNG state at saves, bf16 support,
        # pinned memory): --device cuda:1 must not also open a context on GPU 0.
        torch.cuda.set_device(device)
    if world_size == 1:
        return 0, 1, device
    if not dist.is_initialized():
        # device_id binds NCCL's communicator to this rank's GPU at once (no "best-guess GPU" at the first barrier)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=timeout_min),
                                device_id=device if device.type == "cuda" else None)
        # Torn down before the interpreter exits, whoever called train(): a gloo group still alive at exit can abort
        # the process ("terminate called without an active exception") after a run that went well.
        atexit.register(destroy_process_group)
    return dist.get_rank(), world_size, device


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextmanager
def peer_failures_in_one_line(rank: int, timeout_min: float) -> Iterator[None]:
    """Under torchrun, a collective that waited past --dist_timeout, or lost the rank it waited for, ends in one
    line on each rank instead of pages of gloo's trace. The process group is torn down first: gloo aborts the
    process at exit otherwise, while a peer is still connected."""
    try:
        yield
    except RuntimeError as err:
        text = str(err)
        if not dist.is_initialized() or not (isinstance(err, dist.DistError) or "gloo" in text):
            raise
        if TIMED_OUT.search(text):
            message = (f"rank {rank} waited {timeout_min * 60:g} s for another rank (--dist_timeout {timeout_min:g} "
                       "minutes) and gave up: that rank is still busy (local rank 0 tokenizes a corpus on its first "
                       "use while the others wait) or hangs; raise --dist_timeout, or find what holds it up")
        elif PEER_GONE.search(text):
            message = (f"rank {rank} lost another rank, which exited (its own error line says why; a rank that "
                       "waited past --dist_timeout exits too); fix what stopped it, or raise --dist_timeout")
        else:
            raise
        # gloo's worker thread releases the failed collective's tensors only once it holds the GIL; were the group
        # torn down (or the interpreter finalized) while it waits for it, both would wait forever. A moment
        # without the GIL lets it finish.
        time.sleep(1)
        destroy_process_group()
        raise UserError(message) from None


class SignalHandler:
    """Handles SIGTERM and SIGINT with the subclass's _handle while it exists; restore() puts the previous back."""

    def __init__(self):
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

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
