"""extras/interop/hf_export.py: a config no Hugging Face family computes exactly is refused in one line naming
what stands in the way (test_convert_to_hf.py exports what it accepts)."""

import pytest

from extras.interop.hf_export import ALLOWED, hf_family
from model import MiniMindConfig
from tests.tiny import TINY, placed

GEMMA2 = {"norm_position": "peri", "norm_gain": "one_plus_w", "embed_norm": "scale"}
# a config -> a word its refusal must contain
REFUSED = {
    "layernorm": ({"norm_type": "layernorm"}, "norm_type"), "dyt": ({"norm_type": "dyt"}, "norm_type"),
    "no norm": ({"norm_type": "none"}, "norm_type"),
    "derf": ({"norm_type": "derf"}, "erf"), "seednorm": ({"norm_type": "seednorm"}, "SeeDNorm"),
    **{where: ({"norm_position": where}, "norm_position") for where in ("post", "peri", "deepnorm", "mix")},
    "reorder without qk_norm": ({"norm_position": "reorder"}, "norm_position"),
    "pre with proj qk_norm": ({"qk_norm": "proj"}, "qk_norm"),
    "depth scaling": ({"norm_scaling": "depth"}, "norm_scaling"),
    "rezero": ({"norm_position": "rezero"}, "rezero"),
    "rezero without norms": ({"norm_position": "rezero", "norm_type": "none"}, "rezero"),
    "hybrid": (placed("hybrid"), "v_norm"), "v_norm": ({"qk_norm": "head", "v_norm": "head"}, "v_norm"),
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
    """And what is exportable: a user who fixes the one reason named would otherwise retrain into the next."""
    with pytest.raises(ValueError) as err:
        hf_family(MiniMindConfig(**TINY, **overrides))
    assert word in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert str(err.value).endswith(f"; exportable: {ALLOWED}")

