"""Which device and which autocast precision: one answer for the trainer, eval_llm.py and the scripts."""

import functools
import os
import sys
from contextlib import nullcontext

import torch

from common.cli import UserError

# Device files the NVIDIA driver creates: a GPU is there, whether or not this torch can use it.
NVIDIA_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl")


@functools.cache
def note_unusable_gpu() -> None:
    """One line (once per process) when --device auto falls back to the CPU beside an NVIDIA GPU and a CUDA build
    of torch: usually a driver older than the build needs, which would otherwise go unseen."""
    if torch.version.cuda and any(os.path.exists(f) for f in NVIDIA_DEVICE_FILES):
        print(f"note: --device auto: an NVIDIA GPU is present and this torch is built for CUDA {torch.version.cuda}, "
              "but CUDA is not usable (a driver older than the build needs?); training on the CPU "
              "(--device cuda says why)", file=sys.stderr)


def pick_device(name: str = "auto") -> torch.device:
    """auto = cuda when available, else cpu; a device that is not there is a UserError, not a crash later."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
        if name == "cpu":
            note_unusable_gpu()
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available here; use --device cpu")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto = bf16 on a GPU that computes it natively (Ampere and later), else fp16 (the trainer adds a
    GradScaler; bf16 emulated in fp32 would be slower than fp16); fp32 on CPU: bf16 autocast on a CPU without
    bf16 matmul units trains ~40x slower (measured: 16 vs 613 tokens/s on a 2-core AVX2 machine)."""
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return getattr(torch, name)


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision over fp32 weights, or nothing at all for fp32."""
    return nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)


def cpu_has_bf16_matmul() -> bool:
    """Intel AMX tiles, which make bf16 autocast faster than fp32 (1.9x for the 26M model, scripts/bench_train.py)."""
    return getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()


class Prefetcher:
    """A sampler's batches, already on the device, the next one sent while the current one trains. On CUDA each
    is pinned first, so its copy is queued like a kernel instead of making the host wait. state_dict() is the
    sampler's state before the batch held ahead: a checkpoint resumes with the batch this would return next."""

    def __init__(self, sampler, device: torch.device):
        self.sampler, self.device = sampler, device
        self.ahead = None  # (sampler state before it, the batch on the device)

    def _draw(self) -> tuple[dict, tuple[torch.Tensor, ...]]:
        state = self.sampler.state_dict()
        pin = self.device.type == "cuda"
        batch = tuple((t.pin_memory() if pin else t).to(self.device, non_blocking=True) for t in next(self.sampler))
        return state, batch

    def __next__(self) -> tuple[torch.Tensor, ...]:
        _, batch = self.ahead or self._draw()
        self.ahead = self._draw()
        return batch

    def state_dict(self) -> dict:
        return self.ahead[0] if self.ahead else self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)
        self.ahead = None
