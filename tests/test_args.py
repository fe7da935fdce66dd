"""trainer/args.py: the trainer's flags (a frozen list), each bad value one line before anything is loaded or
written, and the architecture from --preset, then --variant, then the flags given, in the flags' own words."""

import re

import pytest

from common.cli import UserError
from model import PRESETS, SWITCHES, MiniMindConfig, norm_variant, variant_fields, variant_problem
from study.variants import VARIANTS
from trainer.args import BOOKKEEPING, MUST_MATCH, build_parser, final_lr, parse_args
from trainer.runtime import setup_distributed

# Every flag the trainer accepts. A flag added or removed fails this test on purpose: a new flag is a new
# promise to users (and to the runs they resume), so it is added here by hand, with its role in args.py.
FLAGS = {
    "--accumulation_steps", "--batch_size", "--compile", "--data_path", "--deepnorm_alpha", "--deepnorm_beta",
    "--device", "--diag_interval", "--dist_timeout", "--dtype", "--dyt_alpha_init", "--embed_norm",
    "--eval_interval", "--eval_steps", "--grad_clip", "--help", "--hidden_size", "--intermediate_size",
    "--keep_checkpoints", "--learning_rate", "--log_interval", "--logit_softcap", "--lr_decay_steps",
    "--max_seq_len", "--max_steps", "--min_lr", "--min_lr_ratio", "--mix_ln_fraction", "--no_layers_plot",
    "--norm", "--norm_gain", "--norm_position", "--norm_scaling", "--norm_type", "--norm_weight_decay",
    "--num_attention_heads", "--num_hidden_layers", "--num_key_value_heads", "--num_proc", "--optimizer",
    "--out_dir", "--overwrite", "--preset", "--qk_norm", "--resume", "--rms_norm_eps", "--save_interval",
    "--seed", "--streaming", "--sub_norm", "--text_field", "--tokenizer_path", "--use_wandb", "--v_norm",
    "--variant", "--wandb_group", "--wandb_job", "--wandb_project", "--wandb_run_name", "--warmup_steps",
    "--weight_decay", "-h",
}

# One value away from its default for every switch, all valid together: a switch declared without one here
# fails test_every_architecture_flag_reaches_the_config, so each new switch is shown to reach the config.
NON_DEFAULT = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
               "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "norm_type": "dyt", "norm_position": "mix",
               "mix_ln_fraction": 0.5, "norm_scaling": "depth", "qk_norm": "head", "v_norm": "head",
               "sub_norm": True, "embed_norm": "norm", "norm_gain": "one_plus_w", "logit_softcap": 30.0,
               "dyt_alpha_init": 0.3, "deepnorm_alpha": 2.0, "deepnorm_beta": 0.5}
FLAG_OF = {switch.name: switch.flag_name for switch in SWITCHES}


def config_of(*flags) -> MiniMindConfig:
    """The model config a command line gives on the CPU."""
    return MiniMindConfig(**parse_args(["--device", "cpu", *flags]).arch)


def as_flags(fields: dict) -> list[str]:
    return [arg for field, value in fields.items()
            for arg in ([f"--{FLAG_OF[field]}"] if value is True else [f"--{FLAG_OF[field]}", str(value)])]


def test_the_trainers_flags_are_these():
    parser = build_parser()
    assert {option for action in parser._actions for option in action.option_strings} == FLAGS
    dests = set(vars(parser.parse_args([])))  # each flag's, and what set_defaults adds
    assert set(MUST_MATCH) <= dests and set(BOOKKEEPING) <= dests and not set(MUST_MATCH) & set(BOOKKEEPING)


def test_help_gives_each_default_once():
    """A default stated in the help (one per device, say) is not followed by argparse's "(default: None)"."""
    text = " ".join(build_parser().format_help().split())
    assert re.findall(r"\(default: [^)]*\) \(default: [^)]*\)", text) == []
    assert re.findall(r"\(default(?!:)", text) == []  # HelpFormatter knows a help's own default by the colon
    assert "on weight matrices only (default: 0.1)" in text  # argparse's own, where the help states none


@pytest.mark.parametrize("flags, message", [
    # positive_int
    (["--max_steps", "0"], "argument --max_steps: invalid positive_int value: '0'"),
    (["--batch_size", "2.5"], "argument --batch_size: invalid positive_int value: '2.5'"),
    (["--max_seq_len", "x"], "argument --max_seq_len: invalid positive_int value: 'x'"),
    # non_negative
    (["--learning_rate=-1e-3"], "argument --learning_rate: invalid non_negative value: '-1e-3'"),
    (["--seed", "-1"], "argument --seed: invalid count value: '-1'"),
    (["--seed", "1.5"], "argument --seed: invalid count value: '1.5'"),  # numpy seeds with integers only
    (["--seed", "1e3"], "argument --seed: invalid count value: '1e3'"),
    (["--warmup_steps", "nan"], "argument --warmup_steps: invalid count value: 'nan'"),
    (["--grad_clip", "inf"], "argument --grad_clip: invalid non_negative value: 'inf'"),
    # finite_float
    (["--dist_timeout", "nan"], "argument --dist_timeout: invalid finite_float value: 'nan'"),
    (["--dist_timeout=-inf"], "argument --dist_timeout: invalid finite_float value: '-inf'"),
    # argparse's own
    (["--norm", "groupnorm"], "argument --norm_type/--norm: invalid choice: 'groupnorm' (choose from "
     "'rmsnorm', 'rmsnorm_noparam', 'ssnorm', 'layernorm', 'dyt', 'derf', 'seednorm', 'none')"),
    (["--resume", "--overwrite"], "argument --overwrite: not allowed with argument --resume"),
    (["--norm_pos", "post"], "unrecognized arguments: --norm_pos post"),  # never an abbreviation
])
def test_a_bad_value_is_argparses_one_line(flags, message):
    with pytest.raises(UserError) as err:
        parse_args(flags)
    assert str(err.value) == f"{message} (see --help)"


@pytest.mark.parametrize("flags, message", [
    # the cosine schedule would climb from --learning_rate instead of decaying
    (["--learning_rate", "1e-3", "--min_lr", "0.5"], "the decay would end at 0.5, not in [0, --learning_rate "
     "0.001]; set --min_lr_ratio in [0, 1], or --min_lr at most --learning_rate"),
    (["--learning_rate", "6e-3", "--min_lr_ratio", "1.5"], "the decay would end at 0.009, not in [0, "
     "--learning_rate 0.006]; set --min_lr_ratio in [0, 1], or --min_lr at most --learning_rate"),
    (["--variant", "pre+qk_head+qk_proj-rmsnorm"],
     "--variant 'pre+qk_head+qk_proj-rmsnorm': 'qk_proj' sets qk_norm a second time"),
    (["--variant", "pre"], "--variant 'pre' names no norm type; name one: pre-rmsnorm, pre-layernorm, ... "
     "(pre-none has no norms)"),
    # a name's own mistakes in its own words, not those of flags never typed
    (["--variant", "rezero+qk_head"], "--variant 'rezero+qk_head' names no norm type; name one: "
     "rezero+qk_head-rmsnorm, rezero+qk_head-layernorm, ..."),
    # post-none is refused (Pre-Norm's model again): not offered
    (["--variant", "post"], "--variant 'post' names no norm type; name one: post-rmsnorm, post-layernorm, "
     "..."),
    (["--variant", "rezero+one_plus_w"], "--variant 'rezero+one_plus_w' makes no model (norm_gain one_plus_w "
     "needs a norm's gain, and norm_position rezero has no norms)"),
    (["--variant", "mix0.5.5-rmsnorm"], "--variant 'mix0.5.5-rmsnorm': '0.5.5' is not a number"),
    (["--variant", "pre+softcap-1-rmsnorm"], "--variant 'pre+softcap-1-rmsnorm' makes no model "
     "(logit_softcap must be a finite number >= 0, got -1.0)"),
    # ReZero without a switch that adds norms has no gain to store
    (["--norm_position", "rezero", "--norm_gain", "one_plus_w"],
     "--norm_gain one_plus_w needs a norm's gain, and --norm_position rezero has no norms"),
    (["--variant", "pro-rmsnorm"], "--variant 'pro-rmsnorm': 'pro' is not a norm position; allowed: ['pre', "
     "'post', 'peri', 'reorder', 'deepnorm', 'mix', 'hybrid', 'hybrid_star', 'rezero'], or a whole name: "
     "['nanochat']"),
    (["--variant", "pre+qk_hed-rmsnorm"], "--variant 'pre+qk_hed-rmsnorm': 'qk_hed' is not a part of a "
     "variant name; allowed: ['depth', 'embed_norm', 'embed_scale', 'one_plus_w', 'qk_head', 'qk_proj', "
     "'qkv', 'sub', 'v_head'] and softcap<C>"),
    (["--hidden_size", "36", "--num_attention_heads", "4"], "--hidden_size (36) must be "
     "--num_attention_heads (4) times an even head size (rotary embeddings rotate pairs)"),
    (["--norm_position", "post", "--norm_scaling", "depth"],
     "--norm_scaling scales Pre-Norm blocks' input norms: use --norm_position pre or mix"),
    (["--norm", "none", "--qk_norm", "head"], "--qk_norm adds norms, but --norm is none"),
    (["--norm", "none", "--norm_position", "hybrid"],
     "--norm_position hybrid normalizes q, k and v, but --norm is none"),
    (["--norm", "none", "--norm_position", "peri"],
     "--norm_position peri with --norm none is the model of --norm_position pre: use pre"),
    (["--logit_softcap", "-1"], "--logit_softcap must be a finite number >= 0, got -1.0"),
    (["--dyt_alpha_init", "0"], "--dyt_alpha_init must be > 0, got 0.0"),
])
def test_what_argparse_cannot_check_is_one_line_in_the_flags_words(flags, message):
    with pytest.raises(UserError) as err:
        parse_args(["--device", "cpu", *flags])
    assert str(err.value) == message


@pytest.mark.parametrize("device, message", [
    ("mps", "--device mps: runs on cpu or cuda only"),
    ("cuda:7", "--device cuda:7: no such GPU here (the last is cuda:0)"),
    ("gpu", "--device gpu: not a device; use auto, cpu, cuda or cuda:N"),
])
def test_a_device_the_code_cannot_use_is_one_line(monkeypatch, device, message):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # as on a machine with one GPU
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    with pytest.raises(UserError) as err:
        parse_args(["--device", device])
    assert str(err.value) == message


def test_a_path_flag_given_with_an_equals_sign_expands_its_tilde(monkeypatch, tmp_path):
    """The shell expands --out_dir ~/run but not --out_dir=~/run: a folder named ~ would appear here."""
    import eval_llm
    from scripts import run_ablation

    monkeypatch.setenv("HOME", str(tmp_path))
    run = parse_args(["--device", "cpu", "--out_dir=~/run", "--tokenizer_path=~/tok",
                      "--data_path=~/d.jsonl"])
    assert (run.out_dir, run.tokenizer_path, run.data_path) == tuple(
        str(tmp_path / name) for name in ("run", "tok", "d.jsonl"))
    sampled = eval_llm.parse_args(["--model_path=~/run", "--compare", "~/a", "--eval_data=~/v.jsonl"])
    assert (sampled.model_path, sampled.compare, sampled.eval_data) == (
        str(tmp_path / "run"), [str(tmp_path / "a")], str(tmp_path / "v.jsonl"))
    assert run_ablation.parse_args(["--out_dir=~/study"])[0].out_dir == str(tmp_path / "study")
    (tmp_path / "tuned").mkdir()  # --lr_from reads the study's tuning.json while its flags are parsed
    (tmp_path / "tuned" / "tuning.json").write_text(
        '[{"variant": "pre-rmsnorm", "depth": 8, "chosen_lr": 0.004, "tune_seeds": [0, 1]}]')
    copied = run_ablation.parse_args(["--variants", "pre-rmsnorm", "--lr_from=~/tuned"])[0].lr_from
    assert copied[("pre-rmsnorm", 8)]["lr_from"] == str(tmp_path / "tuned")


def test_more_ranks_on_a_node_than_gpus_is_one_line(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # torchrun --nproc_per_node 2, one GPU
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(UserError) as err:
        setup_distributed("cuda", timeout_min=1)
    assert str(err.value) == ("2 ranks on this node but 1 GPUs: start torchrun with --nproc_per_node at most "
                              "the number of GPUs")


def test_the_flags_are_resolved_once_and_read_only():
    args = parse_args(["--device", "cpu", "--norm_position", "hybrid"])
    assert (args.max_steps, args.hidden_size, args.qk_norm) == (760, 128, "head")
    with pytest.raises(AttributeError, match="resolved once"):
        args.max_steps = 1


def test_the_decay_ends_at_a_fraction_of_the_peak_unless_min_lr_is_given():
    def end(*flags):
        return final_lr(parse_args(["--device", "cpu", *flags]))
    assert end("--learning_rate", "8e-3") == pytest.approx(8e-4)  # 10% of every peak
    assert end("--learning_rate", "1e-3", "--min_lr_ratio", "0") == 0
    assert end("--learning_rate", "1e-3", "--min_lr", "2e-4") == 2e-4  # an absolute end, as the old studies


def test_every_architecture_flag_reaches_the_config():
    assert set(NON_DEFAULT) == {switch.name for switch in SWITCHES}
    config, defaults = config_of(*as_flags(NON_DEFAULT)), MiniMindConfig()
    for field, value in NON_DEFAULT.items():
        assert getattr(config, field) == value != getattr(defaults, field), field
    assert config_of("--norm", "layernorm").norm_type == config_of("--norm_type", "layernorm").norm_type


@pytest.mark.parametrize("position", ["hybrid", "hybrid_star"])
def test_hybridnorm_alone_implies_its_qkv_norm_and_a_contradiction_names_both_flags(position):
    hybrid = config_of("--norm_position", position)
    assert (hybrid.qk_norm, hybrid.v_norm, norm_variant(hybrid)) == ("head", "head", f"{position}-rmsnorm")
    assert (config_of().qk_norm, config_of().v_norm) == ("none", "none")
    with pytest.raises(UserError, match=f"^--norm_position {position} .* leave --qk_norm and --v_norm unset"):
        config_of("--norm_position", position, "--v_norm", "none")


@pytest.mark.parametrize("name", [name for name in VARIANTS if variant_problem(name) is None])
def test_variant_gives_the_fields_its_name_spells(name):
    by_name = parse_args(["--device", "cpu", "--variant", name]).arch
    spelled = as_flags({field: value for field, value in variant_fields(name).items() if value is not False})
    assert by_name == parse_args(["--device", "cpu", *spelled]).arch
    assert norm_variant(MiniMindConfig(**by_name)) == name


def test_a_flag_given_beside_variant_and_preset_wins():
    config = config_of("--preset", "minimind3", "--variant", "peri+qkv-rmsnorm", "--num_hidden_layers", "2",
                       "--v_norm", "none")
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (768, 2432, 2)
    assert (config.norm_position, config.qk_norm, config.v_norm) == ("peri", "head", "none")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_sets_its_fields(preset):
    config = config_of("--preset", preset)
    assert {field: getattr(config, field) for field in PRESETS[preset]} == PRESETS[preset]


def test_minimind3_preset_is_the_model_its_repository_ships():
    config = config_of("--preset", "minimind3")
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads) == (768, 8, 8, 4)
    assert (config.qk_norm, config.rms_norm_eps, config.tie_word_embeddings) == ("head", 1e-6, True)
    assert config.intermediate_size == 2432 == -(-3.141592653589793 * 768 // 64) * 64
