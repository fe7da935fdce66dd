"""Every trainer flag has one declared role, and the resume checks, the runner's reuse and the model config
follow it."""

import pytest
import torch

from common.cli import UserError
from model import MiniMindConfig, norm_variant
from scripts import run_ablation
from trainer import resume
from trainer.args import ARCH, FLAG_ROLES, build_parser, config_fields, flags_with, parse_args
from trainer.run_dir import recorded_value
from trainer.train_pretrain import model_config

# The sets the code held before the role table, as runs and checkpoints were recorded under them: a finished run
# must still be reused by the runner, and a --resume refused no less than before.
RUNNER_IGNORED_BEFORE = {"out_dir", "resume", "overwrite", "keep_checkpoints", "use_wandb", "wandb_project",
                         "wandb_run_name", "wandb_group", "num_proc", "dist_timeout"}
RESUME_MUST_MATCH_BEFORE = {"max_seq_len", "batch_size", "accumulation_steps", "seed", "weight_decay"}


def flags_without_role(parser) -> list[str]:
    return sorted({action.dest for action in parser._actions if action.dest != "help"} - set(FLAG_ROLES))


def test_every_parser_flag_has_a_role_and_every_role_a_flag():
    parser = build_parser()
    assert flags_without_role(parser) == []
    assert set(FLAG_ROLES) <= {action.dest for action in parser._actions}
    parser.add_argument("--new_flag", help="added without a role")
    assert flags_without_role(parser) == ["new_flag"]


def test_the_checks_derive_from_the_roles_and_keep_what_they_checked():
    assert set(flags_with("bookkeeping")) == run_ablation.BOOKKEEPING
    # A role may only grow its set: what was ignored stays ignored, what had to match still must.
    assert RUNNER_IGNORED_BEFORE <= run_ablation.BOOKKEEPING
    assert set(resume.RESUME_MUST_MATCH) >= RESUME_MUST_MATCH_BEFORE
    assert set(resume.ARCHITECTURE) == set(flags_with(ARCH)) and resume.ARCHITECTURE["norm"] == "norm_type"
    assert set(resume.DATA_FLAGS) == {"data_path", "text_field", "tokenizer_path"}


def test_model_config_sets_every_architecture_flag(tmp_path, tiny_tokenizer):
    args = parse_args(["--out_dir", str(tmp_path), "--hidden_size", "48", "--num_hidden_layers", "3",
                       "--num_attention_heads", "4", "--num_key_value_heads", "1", "--norm", "dyt",
                       "--norm_position", "mix", "--mix_ln_fraction", "0.5", "--norm_scaling", "depth",
                       "--qk_norm", "head", "--v_norm", "head", "--attn_gate", "headwise", "--attn_sinks",
                       "--sub_norm", "--embed_norm", "norm", "--norm_gain", "one_plus_w",
                       "--dyt_alpha_init", "0.3", "--dyt_alpha_init_attn", "0.8",
                       "--dyt_alpha_init_mlp", "0.2", "--dyt_alpha_init_final", "0.1", "--logit_softcap", "30"])
    config = model_config(args, tiny_tokenizer, torch.device("cpu"))
    defaults = MiniMindConfig()
    for flag, field in config_fields().items():
        assert getattr(config, field) == getattr(args, flag) != getattr(defaults, field), flag


@pytest.mark.parametrize("flags, message", [
    (["--norm_position", "post", "--norm_scaling", "depth"],
     "^--norm_scaling='depth' scales .* allowed with --norm_position 'pre' or 'mix', got 'post'$"),
    (["--norm", "none", "--qk_norm", "head"], "^--qk_norm='head' needs .* allowed with any --norm but 'none'"),
    (["--dyt_alpha_init_mlp", "0"], "^--dyt_alpha_init_mlp must be > 0"),
    (["--dyt_alpha_init", "-0.5"], "^--dyt_alpha_init must be > 0"),
])
def test_a_bad_architecture_names_the_flags_not_the_config_fields(flags, message, tmp_path, tiny_tokenizer):
    with pytest.raises(UserError, match=message):
        model_config(parse_args(["--out_dir", str(tmp_path), *flags]), tiny_tokenizer, torch.device("cpu"))


@pytest.mark.parametrize("position", ["hybrid", "hybrid_star"])
def test_hybridnorm_alone_implies_its_qkv_norm_and_a_contradiction_names_both_flags(position, tmp_path,
                                                                                     tiny_tokenizer):
    def config(*flags):
        return model_config(parse_args(["--out_dir", str(tmp_path), *flags]), tiny_tokenizer, torch.device("cpu"))

    hybrid = config("--norm_position", position)
    assert (hybrid.qk_norm, hybrid.v_norm) == ("head", "head")
    assert norm_variant(hybrid) == f"{position}-rmsnorm"
    assert (config().qk_norm, config().v_norm) == ("none", "none")  # every other placement implies neither
    with pytest.raises(UserError, match=f"^--norm_position='{position}' .* implies --v_norm='head'; got "
                                        "--v_norm='none'"):
        config("--norm_position", position, "--v_norm", "none")


def test_a_flag_missing_from_a_recorded_run_reads_as_the_behaviour_it_had():
    saved = {"grad_clip": 0.5, "log_interval": 7}
    assert recorded_value(saved, "grad_clip") == 0.5  # recorded: taken as is
    assert recorded_value(saved, "norm_weight_decay") is False  # added later: its default, the old behaviour
    assert recorded_value(saved, "diag_interval") == 7  # added later, defaulting to another flag's value
    # qk_norm and v_norm now default to what the placement implies; runs recorded before v_norm had none,
    # HybridNorm's runs had both set
    assert recorded_value({"norm_position": "pre"}, "v_norm") == recorded_value({}, "qk_norm") == "none"
    assert recorded_value({"norm_position": "hybrid"}, "v_norm") == "head"
