"""trainer/args.py: every trainer flag has one declared role; the model flags, --variant and --preset follow the
model config's declaration (SWITCHES), and a bad architecture is one line in the flags' own words."""

import re

import pytest
import torch

from common.cli import UserError
from model import PRESETS, SWITCHES, MiniMindConfig, norm_variant, variant_problem
from study.variants import VARIANTS
from trainer.args import ARCH, FLAG_ROLES, arch_fields, build_parser, config_fields, flags_with, parse_args
from trainer.train_pretrain import model_config

# One value away from its default for every switch, all valid together: a switch declared without one here fails
# test_model_config_sets_every_architecture_flag, so each new switch is shown to reach the config.
NON_DEFAULT = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
               "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "norm_type": "dyt", "norm_position": "mix",
               "mix_ln_fraction": 0.5, "norm_scaling": "depth", "qk_norm": "head", "v_norm": "head",
               "sub_norm": True, "embed_norm": "norm", "norm_gain": "one_plus_w", "attn_gate": "headwise",
               "attn_sinks": True, "logit_softcap": 30.0, "dyt_alpha_init": 0.3, "dyt_alpha_init_attn": 0.8,
               "dyt_alpha_init_mlp": 0.2, "dyt_alpha_init_final": 0.1, "deepnorm_alpha": 2.0, "deepnorm_beta": 0.5}


def config_of(tmp_path, tokenizer, *flags) -> MiniMindConfig:
    return model_config(parse_args(["--out_dir", str(tmp_path), *flags]), tokenizer, torch.device("cpu"))


def as_flags(fields: dict) -> list[str]:
    flag_of = {field: flag for flag, field in config_fields().items()}
    argv = []
    for field, value in fields.items():
        argv += [f"--{flag_of[field]}"] if value is True else [f"--{flag_of[field]}", str(value)]
    return argv


def test_every_parser_flag_has_a_role_and_every_switch_is_an_architecture_flag():
    assert {action.dest for action in build_parser()._actions if action.dest != "help"} == set(FLAG_ROLES)
    assert set(flags_with(ARCH)) == {switch.flag_name for switch in SWITCHES}


def test_model_config_sets_every_architecture_flag(tmp_path, tiny_tokenizer):
    assert set(NON_DEFAULT) == {switch.name for switch in SWITCHES}
    config = config_of(tmp_path, tiny_tokenizer, *as_flags(NON_DEFAULT))
    defaults = MiniMindConfig()
    for field, value in NON_DEFAULT.items():
        assert getattr(config, field) == value != getattr(defaults, field), field


def test_norm_is_an_alias_of_norm_type(tmp_path, tiny_tokenizer):
    assert config_of(tmp_path, tiny_tokenizer, "--norm", "layernorm").norm_type == "layernorm"
    assert config_of(tmp_path, tiny_tokenizer, "--norm_type", "layernorm").norm_type == "layernorm"


@pytest.mark.parametrize("flags, message", [
    (["--norm_position", "post", "--norm_scaling", "depth"],
     "^--norm_scaling='depth' scales .* allowed with --norm_position 'pre' or 'mix', got 'post'$"),
    (["--norm", "none", "--qk_norm", "head"], "^--qk_norm='head' needs a norm to apply; allowed with any --norm but 'none'"),
    (["--dyt_alpha_init_mlp", "0"], "^--dyt_alpha_init_mlp must be > 0"),
    (["--dyt_alpha_init", "-0.5"], "^--dyt_alpha_init must be > 0"),
    (["--hidden_size", "36", "--num_attention_heads", "4"], r"^--hidden_size / --num_attention_heads must be even"),
    (["--logit_softcap", "-1"], "^--logit_softcap must be a finite number >= 0, got -1"),
])
def test_a_bad_architecture_names_the_flags_not_the_config_fields(flags, message, tmp_path, tiny_tokenizer):
    with pytest.raises(UserError, match=message):
        config_of(tmp_path, tiny_tokenizer, *flags)


@pytest.mark.parametrize("position", ["hybrid", "hybrid_star"])
def test_hybridnorm_alone_implies_its_qkv_norm_and_a_contradiction_names_both_flags(position, tmp_path,
                                                                                     tiny_tokenizer):
    hybrid = config_of(tmp_path, tiny_tokenizer, "--norm_position", position)
    assert (hybrid.qk_norm, hybrid.v_norm) == ("head", "head")
    assert norm_variant(hybrid) == f"{position}-rmsnorm"
    plain = config_of(tmp_path, tiny_tokenizer)
    assert (plain.qk_norm, plain.v_norm) == ("none", "none")
    with pytest.raises(UserError, match=f"^--norm_position='{position}' .* implies --v_norm='head'; got "
                                        "--v_norm='none'"):
        config_of(tmp_path, tiny_tokenizer, "--norm_position", position, "--v_norm", "none")


@pytest.mark.parametrize("name", [name for name in VARIANTS if variant_problem(name) is None])
def test_variant_gives_the_fields_the_runner_passes_for_that_name(name, tmp_path):
    def fields(*flags):
        return arch_fields(parse_args(["--out_dir", str(tmp_path), *flags]), torch.device("cpu"))

    by_name = fields("--variant", name)
    assert by_name == fields(*as_flags({config_fields()[flag]: value for flag, value in VARIANTS[name].items()
                                        if value is not False}))
    assert norm_variant(MiniMindConfig(**by_name)) == name


def test_a_flag_given_beside_variant_and_preset_wins(tmp_path, tiny_tokenizer):
    config = config_of(tmp_path, tiny_tokenizer, "--preset", "minimind3", "--variant", "peri+qkv-rmsnorm",
                       "--num_hidden_layers", "2", "--v_norm", "none")
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (768, 2432, 2)
    assert (config.norm_position, config.qk_norm, config.v_norm) == ("peri", "head", "none")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_sets_its_fields(preset, tmp_path, tiny_tokenizer):
    config = config_of(tmp_path, tiny_tokenizer, "--preset", preset)
    assert {field: getattr(config, field) for field in PRESETS[preset]} == PRESETS[preset]


def test_minimind3_preset_is_the_model_its_repository_ships(tmp_path, tiny_tokenizer):
    config = config_of(tmp_path, tiny_tokenizer, "--preset", "minimind3")
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads) == (768, 8, 8, 4)
    assert (config.qk_norm, config.rms_norm_eps, config.tie_word_embeddings) == ("head", 1e-6, True)
    assert config.intermediate_size == 2432 == -(-3.141592653589793 * 768 // 64) * 64


@pytest.mark.parametrize("name, message", [
    ("pre-rmsnrom", "'rmsnrom' is not a norm type"),
    ("pro-rmsnorm", "'pro' is not a norm position"),
    ("pre+qk_hed-rmsnorm", "'qk_hed' is not a part of a variant name"),
])
def test_a_bad_variant_name_is_one_line_naming_the_part(name, message, tmp_path):
    with pytest.raises(UserError, match=f"^--variant {re.escape(repr(name))}: {message}"):
        parse_args(["--out_dir", str(tmp_path), "--variant", name])
