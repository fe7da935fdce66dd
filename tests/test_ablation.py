"""The ablation runner in-process at tiny sizes: variants by name, seeds, depths, the grid, reuse and refusals."""

import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from data import load_tokenizer, prepare_split
from model import NORM_POSITIONS, NORM_TYPES, norm_variant
from scripts import run_ablation
from trainer import args as trainer_args
from trainer.args import build_parser
from trainer.cli import UserError
from trainer.tracking import read_metrics
from trainer.train_pretrain import model_config

TINY = ["--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2", "--num_key_value_heads", "1",
        "--max_seq_len", "32", "--batch_size", "4", "--eval_steps", "2", "--num_proc", "1", "--log_interval", "2"]


@pytest.fixture
def study(tmp_path, tiny_corpus, tiny_tokenizer_dir, monkeypatch):
    """Run the runner's main() on the tiny corpus with the given flags; returns the study folder."""
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "study"

    def run(*flags: str) -> Path:
        run_ablation.main(["--out_dir", str(out), "--data_path", tiny_corpus, "--tokenizer_path", tiny_tokenizer_dir,
                           *TINY, *flags])
        return out
    return run


def test_variants_are_looked_up_not_split():
    assert run_ablation.VARIANTS["pre-rmsnorm"] == {"norm_position": "pre", "norm_scaling": "none",
                                                    "qk_norm": "none", "v_norm": "none", "norm": "rmsnorm"}
    assert run_ablation.VARIANTS["reorder+qk_proj-rmsnorm_noparam"] == {
        "norm_position": "reorder", "norm_scaling": "none", "qk_norm": "proj", "v_norm": "none",
        "norm": "rmsnorm_noparam"}
    assert run_ablation.VARIANTS["peri+qkv-ssnorm"] == {
        "norm_position": "peri", "norm_scaling": "none", "qk_norm": "head", "v_norm": "head", "norm": "ssnorm"}
    assert run_ablation.VARIANTS["mix+depth-dyt"]["norm_scaling"] == "depth"
    # every position is a placement of its own, and every placement pairs with every norm type
    assert set(NORM_POSITIONS) <= set(run_ablation.PLACEMENTS)
    assert len(run_ablation.VARIANTS) == len(run_ablation.PLACEMENTS) * len(NORM_TYPES)
    study, _ = run_ablation.parse_args(["--variants", "all"])
    assert study.variants == list(run_ablation.VARIANTS) and "pre+qk_head-batchnorm" in study.variants


def test_device_defaults_fill_unset_flags_in_trainer_and_runner(tmp_path, monkeypatch):
    """The CPU preset and the GPU default have their own batch, steps and peak learning rate; a given flag wins."""
    out = ["--out_dir", str(tmp_path / "run")]
    cpu, cuda = trainer_args.DEVICE_DEFAULTS["cpu"], trainer_args.DEVICE_DEFAULTS["cuda"]
    args = trainer_args.parse_args(out)
    assert (args.batch_size, args.max_steps, args.learning_rate) == (cpu["batch_size"], cpu["max_steps"],
                                                                      cpu["learning_rate"])
    assert args.hidden_size is None  # the width is the model config's to fill, as in runs recorded before the table
    study, base = run_ablation.parse_args(out)
    assert study.learning_rates == [cpu["learning_rate"]] and base.max_steps == cpu["max_steps"]
    given = trainer_args.parse_args([*out, "--learning_rate", "3e-4", "--batch_size", "3", "--max_steps", "7"])
    assert (given.learning_rate, given.batch_size, given.max_steps) == (3e-4, 3, 7)
    monkeypatch.setattr(trainer_args, "pick_device", lambda name: torch.device("cuda"))
    args = trainer_args.parse_args(out)
    assert (args.batch_size, args.max_steps, args.learning_rate) == (cuda["batch_size"], cuda["max_steps"],
                                                                      cuda["learning_rate"])
    assert cpu != cuda


def test_variant_names_are_the_models_own_names_for_them(tiny_tokenizer):
    """Each variant's flags build a model that calls itself by the variant's name (model.norm_variant)."""
    for name, fields in run_ablation.VARIANTS.items():
        if (fields["qk_norm"], fields["v_norm"]) != ("none", "none") and fields["norm"] == "none":
            continue  # QK-/V-norm needs a norm type; the trainer refuses this pair (next test)
        args = build_parser().parse_args([])
        vars(args).update(fields)
        assert norm_variant(model_config(args, tiny_tokenizer, torch.device("cpu"))) == name


def test_placement_flags_reach_the_config_and_bad_pairs_name_the_flags(tiny_tokenizer):
    args = build_parser().parse_args(["--norm_position", "mix", "--norm_scaling", "depth", "--qk_norm", "proj",
                                      "--mix_ln_fraction", "0.5", "--norm", "dyt", "--dyt_alpha_init", "0.7",
                                      "--dyt_alpha_init_attn", "0.8", "--dyt_alpha_init_mlp", "0.2",
                                      "--dyt_alpha_init_final", "0.1"])
    config = model_config(args, tiny_tokenizer, torch.device("cpu"))
    assert (config.norm_position, config.norm_scaling, config.qk_norm, config.mix_ln_fraction, config.norm_type) == (
        "mix", "depth", "proj", 0.5, "dyt")
    assert (config.dyt_alpha_init, config.dyt_alpha_init_attn, config.dyt_alpha_init_mlp,
            config.dyt_alpha_init_final) == (0.7, 0.8, 0.2, 0.1)
    for flags, named in ((["--norm_position", "post", "--norm_scaling", "depth"], ("--norm_scaling", "--norm_position")),
                         (["--qk_norm", "head", "--norm", "none"], ("--qk_norm",)),
                         (["--v_norm", "head", "--norm", "none"], ("--v_norm",)),
                         (["--mix_ln_fraction", "1.5"], ("--mix_ln_fraction",))):
        with pytest.raises(UserError) as err:
            model_config(build_parser().parse_args(flags), tiny_tokenizer, torch.device("cpu"))
        assert all(flag in str(err.value) for flag in named) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize(("flags", "message"), [
    (["--variants", "pre-rmsnorm", "sideways-rmsnorm"], "unknown variant 'sideways-rmsnorm'"),
    (["--variants", "pre+qk-rmsnorm"], "unknown variant 'pre+qk-rmsnorm'"),
    (["--qk_norm", "head"], "are set per run by the study"),
    (["--norm=layernorm"], "are set per run by the study"),
    (["--depths", "8", "0"], "--depths must be positive integers"),
])
def test_bad_study_flags_are_one_line_errors(flags, message):
    with pytest.raises(UserError, match=re.escape(message)):
        run_ablation.parse_args(flags)


@pytest.mark.slow  # four runs, a rerun and their figures: 20-50 s on 2 busy cores
def test_two_variant_two_seed_study_writes_plots_and_table(study, capsys):
    out = study("--variants", "pre-rmsnorm", "post-layernorm", "--seeds", "0", "1", "--max_steps", "4",
                "--eval_interval", "4")
    for name in ("loss_curves.png", "layers.png", "results.md", "results.json"):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "depth.png").exists()  # one depth: no depth figure
    runs = json.loads((out / "results.json").read_text())
    assert sorted((r["variant"], r["norm_position"], r["norm"], r["seed"], r["depth"]) for r in runs) == [
        ("post-layernorm", "post", "layernorm", 0, 2), ("post-layernorm", "post", "layernorm", 1, 2),
        ("pre-rmsnorm", "pre", "rmsnorm", 0, 2), ("pre-rmsnorm", "pre", "rmsnorm", 1, 2)]
    assert all(r["step"] == 4 and not r["diverged"] for r in runs)
    table = (out / "results.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| pre-") or line.startswith("| post-")]
    assert len(rows) == 2 and all(row.startswith(("| pre-rmsnorm | 2 |", "| post-layernorm | 2 |")) and " ± " in row
                                  and "| 0/2 |" in row for row in rows)
    # LayerNorm carries a bias as well as a gain; Post-Norm has no final norm (4 norms at 2 layers, not 5)
    norm_params = {r["norm"]: r["norm_params"] for r in runs}
    assert norm_params == {"rmsnorm": 5 * 32, "layernorm": 4 * 2 * 32}
    for r in runs:
        assert (Path(r["out_dir"]) / "metrics.jsonl").is_file()

    # re-running the finished study reuses the runs instead of training again
    capsys.readouterr()
    study("--variants", "pre-rmsnorm", "post-layernorm", "--seeds", "0", "1", "--max_steps", "4",
          "--eval_interval", "4")
    assert "model:" not in capsys.readouterr().out
    # ... but refuses to mix in runs made with other settings
    with pytest.raises(UserError, match="other values of --weight_decay"):
        study("--variants", "pre-rmsnorm", "--max_steps", "4", "--eval_interval", "4", "--weight_decay", "0.5")


def test_depths_give_one_run_per_depth_with_that_many_layers(study):
    out = study("--variants", "mix+depth-rmsnorm", "--depths", "1", "4", "--max_steps", "2", "--eval_interval", "2",
                "--learning_rate", "2e-3", "--warmup_steps", "50")
    runs = json.loads((out / "results.json").read_text())
    assert sorted(r["depth"] for r in runs) == [1, 4]
    for r in runs:
        assert Path(r["out_dir"]).name == f"mix+depth-rmsnorm-L{r['depth']}-lr0.002-wu50-s0"
        config = json.loads((Path(r["out_dir"]) / "checkpoint" / "config.json").read_text())
        assert config["num_hidden_layers"] == r["args"]["num_hidden_layers"] == r["depth"]
        assert (config["norm_position"], config["norm_scaling"], config["qk_norm"]) == ("mix", "depth", "none")
        last = [m for m in read_metrics(Path(r["out_dir"]) / "metrics.jsonl") if m["split"] == "train"][-1]
        assert len(last["residual_rms"]) == len(last["block_cosine"]) == r["depth"]
        assert r["num_norms"] == 2 * r["depth"] + 1  # floor(L / 4) Post blocks, the rest Pre, a final norm
    table = (out / "results.md").read_text()
    assert "| mix+depth-rmsnorm | 1 |" in table and "| mix+depth-rmsnorm | 4 |" in table
    assert (out / "depth.png").stat().st_size > 0 and "![depth](depth.png)" in table


def test_diverged_run_is_recorded_not_fatal(study):
    out = study("--variants", "pre-none", "--seeds", "0", "--learning_rates", "1e-3", "1e6", "--warmup_steps", "0",
                "--grad_clip", "0", "--max_steps", "30", "--eval_interval", "10")
    runs = {Path(r["out_dir"]).name: r for r in json.loads((out / "results.json").read_text())}
    assert not runs["pre-none-L2-lr0.001-wu0-s0"]["diverged"]
    assert runs["pre-none-L2-lr1e+06-wu0-s0"]["diverged"]
    assert not runs["pre-none-L2-lr1e+06-wu0-s0"]["plateaued"]  # diverged is its own outcome
    table = (out / "results.md").read_text()
    assert "| pre-none | 2 | 1e+06 | 0 | — | — | — | — | 0 | 1/1 | 0/1 |" in table
    assert (out / "grid-pre-none-L2.png").stat().st_size > 0


def test_plateau_rule():
    evals = [{"split": "val", "loss": 5.0}, {"split": "train", "loss": 4.0}, {"split": "val", "loss": 4.0}]
    run = {"diverged": False, "val_loss": 4.0}
    assert not run_ablation.plateaued(run, evals, unigram=5.0)
    assert run_ablation.plateaued(run, evals, unigram=4.04)  # within 0.05 nats of the unigram model
    assert run_ablation.plateaued({**run, "val_loss": 5.0}, evals, unigram=6.0)  # no lower than the first eval
    assert not run_ablation.plateaued(run, evals[1:], unigram=6.0)  # one evaluation: nothing to compare with
    assert not run_ablation.plateaued({"diverged": True, "val_loss": None}, evals, unigram=6.0)


def test_unigram_loss_is_the_smoothed_frequency_model(tmp_path, tiny_corpus, tiny_tokenizer_dir, monkeypatch):
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path / "cache"))
    _, base = run_ablation.parse_args(["--data_path", tiny_corpus, "--tokenizer_path", tiny_tokenizer_dir,
                                       "--num_proc", "1"])
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    train, val = (prepare_split(tiny_corpus, split, tokenizer, num_proc=1).tokens.tolist()
                  for split in ("train", "validation"))
    counts = Counter(train)
    expected = -sum(math.log((counts[t] + 1) / (len(train) + len(tokenizer))) for t in val) / len(val)
    assert run_ablation.unigram_loss(base) == pytest.approx(expected, rel=1e-9)
