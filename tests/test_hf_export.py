"""model/hf_export.py: a config no Hugging Face family computes exactly is refused in one line naming what stands in
the way, and the Gemma 2 export carries the logit soft-cap (test_variants.py exports the catalogue's variants)."""

import pytest
import torch
from transformers import Gemma2ForCausalLM

from model import MiniMindConfig
from model.hf_export import hf_family
from scripts import convert_to_hf
from tests.tiny import TINY, ids, placed, tiny_model

GEMMA2 = {"norm_position": "peri", "norm_gain": "one_plus_w", "embed_norm": "scale"}
# a config -> a word its refusal must contain
REFUSED = {
    "layernorm": ({"norm_type": "layernorm"}, "norm_type"), "dyt": ({"norm_type": "dyt"}, "norm_type"),
    "batchnorm": ({"norm_type": "batchnorm"}, "norm_type"), "no norm": ({"norm_type": "none"}, "norm_type"),
    "derf": ({"norm_type": "derf"}, "erf"), "seednorm": ({"norm_type": "seednorm"}, "SeeDNorm"),
    "post": ({"norm_position": "post"}, "norm_position"), "peri": ({"norm_position": "peri"}, "norm_position"),
    "deepnorm": ({"norm_position": "deepnorm"}, "norm_position"), "mix": ({"norm_position": "mix"}, "norm_position"),
    "reorder without qk_norm": ({"norm_position": "reorder"}, "norm_position"),
    "pre with proj qk_norm": ({"qk_norm": "proj"}, "qk_norm"),
    "depth scaling": ({"norm_scaling": "depth"}, "norm_scaling"), "rezero": ({"norm_position": "rezero"}, "rezero"),
    "rezero without norms": ({"norm_position": "rezero", "norm_type": "none"}, "rezero"),
    "hybrid": (placed("hybrid"), "v_norm"), "v_norm": ({"qk_norm": "head", "v_norm": "head"}, "v_norm"),
    "gate": ({"attn_gate": "elementwise"}, "attn_gate and attn_sinks"),
    "sinks": ({"attn_sinks": True}, "attn_gate and attn_sinks"),
    "sub_norm": ({"sub_norm": True}, "sub_norm"), "embed_norm": ({"embed_norm": "norm"}, "embed_norm"),
    "embed scale alone": ({"embed_norm": "scale"}, "embed_norm"),
    "one_plus_w alone": ({"norm_gain": "one_plus_w"}, "norm_gain"),
    "gemma2 without embed scale": ({**GEMMA2, "embed_norm": "none"}, "embed_norm"),
    "gemma2 without one_plus_w": ({**GEMMA2, "norm_gain": "w"}, "norm_gain"),
    "gemma2 of ssnorm": ({**GEMMA2, "norm_type": "ssnorm"}, "norm_type"),
    "gemma3 with proj qk_norm": ({**GEMMA2, "qk_norm": "proj"}, "qk_norm"),
    "llama with softcap": ({"logit_softcap": 15.0}, "logit_softcap"),
    "qwen3 with softcap": ({"qk_norm": "head", "logit_softcap": 30.0}, "qwen3"),
}


@pytest.mark.parametrize("overrides,word", REFUSED.values(), ids=list(REFUSED))
def test_what_no_family_computes_is_refused_in_one_line_naming_why(overrides, word):
    with pytest.raises(ValueError) as err:
        hf_family(MiniMindConfig(**TINY, **overrides))
    assert word in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_gemma2_export_carries_the_logit_softcap(tmp_path):
    model = tiny_model(**GEMMA2, logit_softcap=0.05)  # a cap far below the logits, so it shapes every one
    model.save_pretrained(tmp_path / "src")
    assert convert_to_hf.convert(tmp_path / "src", tmp_path / "dst") == "Gemma2ForCausalLM"
    exported = Gemma2ForCausalLM.from_pretrained(tmp_path / "dst").eval()
    with torch.no_grad():
        assert (exported(ids()).logits - model(ids()).logits).abs().max().item() <= 1e-4
