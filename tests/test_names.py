"""model/names.py on configs beyond the catalogue (whose names test_variants.py and test_args.py read back): a
config's variant name, the same fields read back from it, and the recipe a name stands for."""

import pytest

from model import MiniMindConfig, MiniMindForCausalLM, norm_variant, variant_fields, variant_problem
from tests.tiny import TINY

NAMES = {"rezero+qk_head-rmsnorm": {"norm_position": "rezero", "qk_norm": "head"},
         "pre+softcap0.5-rmsnorm": {"logit_softcap": 0.5},
         "peri+qkv+sub-layernorm": {"norm_position": "peri", "qk_norm": "head", "v_norm": "head",
                                    "sub_norm": True, "norm_type": "layernorm"},
         "pre+qk_proj+v_head-rmsnorm": {"qk_norm": "proj", "v_norm": "head"},
         "mix0.5+depth-layernorm": {"norm_position": "mix", "mix_ln_fraction": 0.5, "norm_scaling": "depth",
                                    "norm_type": "layernorm"}}


@pytest.mark.parametrize("name", NAMES)
def test_a_config_is_named_by_what_it_changes_and_the_name_reads_back(name):
    config = MiniMindConfig(**TINY, **NAMES[name])
    assert norm_variant(config) == name
    assert {field: getattr(config, field) for field in variant_fields(name)} == variant_fields(name)


def test_nanochat_is_its_recipe():
    """Parameter-free RMSNorm before each sublayer, per head on q and k, after the embedding lookup and before
    lm_head, with the logits soft-capped at 15; the model calls itself by the recipe's name."""
    config = MiniMindConfig(**TINY, **variant_fields("nanochat"))
    assert (config.norm_type, config.norm_position, config.qk_norm, config.embed_norm,
            config.logit_softcap) == ("rmsnorm_noparam", "pre", "head", "norm", 15.0)
    assert norm_variant(config) == "nanochat"
    assert not [n for n, _ in MiniMindForCausalLM(config).named_parameters() if "norm" in n]  # no gains


def test_variant_problem_answers_for_any_name_and_a_saved_duplicate_still_loads():
    """A name that is no variant, one that makes no model, one that makes another name's model: each
    answered in words, none raised; the last still builds (a checkpoint saved under it loads)."""
    assert variant_problem("pre-rmsnorm") is None and variant_problem("deepnorm-none") is None
    assert variant_problem("nanochta").startswith("variant 'nanochta': 'nanochta' is not a norm position")
    assert variant_problem("pre+sub-none") == "sub_norm adds norms, but norm_type is none"
    assert variant_problem("post-none") == ("norm_position post with norm_type none is the model of "
                                            "norm_position pre: use pre")
    assert MiniMindConfig(**variant_fields("post-none")).norm_position == "post"
