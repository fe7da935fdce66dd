"""The tiny model the model-level tests share, the config fields of a placement, token ids, and the first
release's checkpoints with how their logits are compared. The training tests' tiny model is in conftest.py."""

from pathlib import Path

import torch

from model import MiniMindConfig, MiniMindForCausalLM
from model.model_minimind import QKV_PLACEMENTS

TINY = dict(vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4)


def tiny_model(seed=0, perturb=True, **overrides) -> MiniMindForCausalLM:
    """A tiny model in eval mode. perturbed: every parameter off its initial value (norm gains by 0.2, the
    rest by 0.01), so a misplaced or ignored weight would show."""
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(MiniMindConfig(**{**TINY, **overrides})).eval()
    if perturb:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.add_(torch.randn_like(p) * (0.2 if "norm" in name else 0.01))
    return model


def with_weights_of(source: MiniMindForCausalLM, **overrides) -> MiniMindForCausalLM:
    """A model of another config (TINY with overrides) holding source's weights, strictly (names, shapes)."""
    target = MiniMindForCausalLM(MiniMindConfig(**{**TINY, **overrides})).eval()
    target.load_state_dict(source.state_dict())
    return target


def placed(position, **overrides) -> dict:
    """Config fields for a placement, HybridNorm's with the per-head q, k and v norms they require."""
    qkv = {"qk_norm": "head", "v_norm": "head"} if position in QKV_PLACEMENTS else {}
    return {"norm_position": position, **overrides, **qkv}


def ids(batch=2, seq=12, seed=1) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(seed))


# Checkpoints saved by the model's first release (pre/post x every norm type), each with its logits then.
FIXTURES = Path(__file__).parent / "fixtures" / "checkpoints_v1"


def assert_saved_logits(actual: torch.Tensor, saved: torch.Tensor) -> None:
    """The logits a fixture recorded, up to the rounding of the CPU the test runs on. Other matmul kernels
    (AVX2, AVX-512, AMX) differ from the recording CPU's by up to 5e-7 on these logits (|x| <= 2), while a
    real change to the model, even dividing RMSNorm's or LayerNorm's eps by 10, moves them by 5e-5 or more."""
    torch.testing.assert_close(actual, saved, rtol=2e-6, atol=1e-6)
