"""Which device and which autocast precision: one answer for the trainer, eval_llm.py and the scripts."""

from contextlib import nullcontext

import torch

from trainer.cli import UserError


def pick_device(name: str = "auto") -> torch.device:
    """auto = cuda when available, else cpu; a device that is not there is a UserError, not a crash later."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available here; use --device cpu")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto = bf16 on CUDA (fp16 where the GPU lacks bf16), fp32 on CPU: bf16 autocast on a CPU without bf16
    matmul units trains ~40x slower (measured: 16 vs 613 tokens/s on a 2-core AVX2 machine)."""
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if name == "float16" and device.type != "cuda":
        raise UserError("--dtype float16 needs CUDA (it relies on a GradScaler); use float32 or bfloat16 on CPU")
    return getattr(torch, name)


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision over fp32 weights, or nothing at all for fp32."""
    return nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)


def cpu_has_bf16_matmul() -> bool:
    """Intel AMX tiles: the CPU feature that makes bf16 autocast faster than fp32 (1.9x for the 26M model on
    such a machine, scripts/bench_train.py) rather than far slower, as on CPUs without bf16 units."""
    return getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
