"""The ablation runner in-process at tiny sizes: variants by name, seeds, depths, the grid, reuse and
refusals."""

import json
import math
import os
import re
import shutil
import signal
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from common.cli import UserError, run_cli
from data import load_tokenizer, prepare_split
from model import NORM_POSITIONS, NORM_TYPES
from scripts import run_ablation
from study import lr_tuning, report, runner
from study.parallel import Worker
from study.plots import plot_loss_curves, plot_lr_sensitivity
from study.report import results_table
from study.variants import NAMED, PLACEMENTS, VARIANTS, variant_fields, variant_problem
from trainer import args as trainer_args
from trainer import evaluation
from trainer import train_pretrain as tp
from trainer.checkpoint import step_folders
from trainer.tracking import read_metrics


@pytest.fixture
def study(tmp_path, tiny_flags, monkeypatch):
    """Run the runner's main() on the tiny corpus with the given flags; returns the study folder."""
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "study"

    def run(*flags: str) -> Path:
        run_ablation.main(["--out_dir", str(out), *tiny_flags, "--log_interval", "2", *flags])
        return out
    return run


def test_device_defaults_fill_unset_flags_in_trainer_and_runner(tmp_path, monkeypatch):
    """The CPU preset and the GPU default have their own width, batch, steps and peak learning rate; a given
    flag wins."""
    out = ["--out_dir", str(tmp_path / "run")]
    keys = ("hidden_size", "batch_size", "max_steps", "learning_rate")
    defaults = trainer_args.DEVICE_DEFAULTS
    cpu, cuda = ({key: defaults[device][key] for key in keys} for device in ("cpu", "cuda"))
    args = trainer_args.parse_args(out)
    assert {key: getattr(args, key) for key in keys} == cpu
    study, base = run_ablation.parse_args(out)
    assert study.learning_rates == [cpu["learning_rate"]] and base.max_steps == cpu["max_steps"]
    given = trainer_args.parse_args([*out, "--learning_rate", "3e-4", "--batch_size", "3", "--max_steps",
                                     "7"])
    assert (given.learning_rate, given.batch_size, given.max_steps) == (3e-4, 3, 7)
    monkeypatch.setattr(trainer_args, "pick_device", lambda name: torch.device("cuda"))
    assert {key: getattr(trainer_args.parse_args(out), key) for key in keys} == cuda != cpu


def refused(capsys, monkeypatch, tmp_path, *flags: str) -> str:
    """The runner's command line on flags, which must stop with exit status 2 before anything trains or is
    written; returns its one line on stderr."""
    def no_training(args, **_):
        raise AssertionError(f"trained {args.out_dir}")
    monkeypatch.setattr(runner, "train", no_training)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: run_ablation.main(["--out_dir", str(tmp_path / "study"), *flags]))
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == "" and not (tmp_path / "study").exists()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err.strip()


@pytest.mark.parametrize(("flags", "message"), [
    (["--variants", "pre-rmsnorm", "sideways-rmsnorm"], "error: --variants: variant 'sideways-rmsnorm': "
     "'sideways' is not a norm position; allowed: ['pre', 'post', 'peri', 'reorder', 'deepnorm', 'mix', "
     "'hybrid', 'hybrid_star', 'rezero'], or a whole name: ['nanochat']"),
    # the name the trainer's --variant refuses too: two parts that set one field
    (["--variants", "pre+qk_head+qk_proj-rmsnorm"], "sets qk_norm a second time"),
    (["--qk_norm", "head"], "error: --qk_norm: set per run by the study; use --seeds and --variants"),
    (["--norm=layernorm"], "--norm: set per run by the study"),
    (["--norm_type", "layernorm"], "--norm_type: set per run by the study"),
    (["--variant", "post-rmsnorm", "--seed", "1"], "--seed, --variant: set per run by the study"),
    (["--mix_ln_fraction", "0.5"], "--mix_ln_fraction: set per run by the study"),  # mix0.5-rmsnorm
    (["--resume"], "error: --resume: run the study's command again, as it was; it reuses the finished runs "
     "and continues a stopped one"),
    (["--overwrite"], "error: --overwrite: a study never overwrites its runs; give it a new --out_dir"),
    (["--depths", "8", "0"], "argument --depths: invalid positive_int value: '0'"),
    (["--variants", "pre-rmsnorm", "hybrid-none"], "error: variant 'hybrid-none' makes no model "
     "(norm_position hybrid normalizes q, k and v, but norm_type is none)"),
    (["--variants", "pre-none", "post-none"], "error: variant 'post-none' makes no model (norm_position post "
     "with norm_type none is the model of norm_position pre: use pre)"),
    (["--seeds", "0", "-1"], "argument --seeds: invalid count value: '-1'"),
    # ReZero has no norm for the type to go in: rezero-layernorm would train rezero again
    (["--variants", "rezero", "rezero-layernorm"], "error: variant 'rezero-layernorm' is the model its runs "
     "record as 'rezero': use that name"),
    (["--variants", "pre+qk_head+depth-rmsnorm"], "record as 'pre+depth+qk_head-rmsnorm': use that name"),
    (["--report_only", "--out_dir", "typo"], "error: --report_only: typo holds no runs; is it the study's "
     "--out_dir?"),
    (["--tune_lr", "1e-3", "2e-3", "--learning_rates", "1e-3"], "drop --learning_rates"),
    (["--tune_lr", "1e-3", "2e-3", "--warmup_steps", "0", "10"], "give one --warmup_steps"),
    (["--tune_lr_for", "pre-rmsnorm=1e-3"], "go with --tune_lr"),
    (["--tune_lr", "1e-3", "2e-3", "--tune_lr_for", "peri-rmsnorm=1e-3,2e-3"],
     "--tune_lr_for peri-rmsnorm: not one of"),
    # one lr is no choice
    (["--tune_lr", "1e-3"],
     "error: --tune_lr: give two or more lrs to choose among (one lr: --learning_rates)"),
    (["--tune_lr", "1e-3", "2e-3", "--tune_lr_for", "pre-rmsnorm=1e-3,1e-3"],
     "--tune_lr_for pre-rmsnorm: give two or more lrs"),
    # argparse would keep only the last list of a list flag given twice
    (["--seeds", "0", "--seeds", "1"], "error: argument --seeds: given twice; list all its values after one "
     "--seeds (see --help)"),
    (["--lr_from", "x", "--learning_rates", "1e-3"], "error: --lr_from picks each variant's lr itself: drop "
     "--learning_rates, and give one --warmup_steps"),
    (["--baseline", "pre-rmsnrm"], "--baseline pre-rmsnrm: not one of --variants, and "),
    *((["--tune_lr", "1e-3", bad], "argument --tune_lr: invalid positive_float value") for bad in ("0",
                                                                                                   "nan")),
    (["--learning_rates", "1e-3", "inf"], "argument --learning_rates: invalid positive_float value: 'inf'"),
    # the CPU's default warmup (100 steps) in a quick study
    (["--max_steps", "20", "--tune_lr", "1e-3", "2e-3"], "error: --tune_lr: --warmup_steps 100 is longer "
     "than each run (--max_steps 20), so no run would reach its lr; set --warmup_steps at most --max_steps"),
])
def test_bad_study_flags_are_one_line_refused_before_anything_trains(flags, message, capsys, monkeypatch,
                                                                     tmp_path):
    err = refused(capsys, monkeypatch, tmp_path, *flags)
    assert err == message if message.startswith("error: ") else message in err, err


def test_a_training_runs_folder_is_refused_as_a_studys(capsys, monkeypatch, tmp_path):
    """Its figure and the report would land among the run's files."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text("{}")
    err = refused(capsys, monkeypatch, tmp_path, "--out_dir", str(tmp_path / "run"))
    assert err == (f"error: --out_dir {tmp_path / 'run'} is a training run's folder; "
                   "give the study one of its own")
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["summary.json"]


def test_runs_side_by_side_refuse_a_gpu_index_that_would_put_every_rank_on_one_gpu(capsys, monkeypatch,
                                                                                    tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun, on a machine with two GPUs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert refused(capsys, monkeypatch, tmp_path, "--device", "cuda:1") == (
        "error: --parallel runs trains each rank on its own GPU: give --device cuda, not cuda:1")


def test_study_flags_are_completed_from_the_trainers_and_all_is_every_variant_that_makes_a_model():
    # every position is a placement of its own, and every placement pairs with every norm type
    assert set(NORM_POSITIONS) <= set(PLACEMENTS) | {"rezero"}
    assert len(VARIANTS) == len(PLACEMENTS) * len(NORM_TYPES) + len(NAMED)
    study, _ = run_ablation.parse_args(["--variants", "all", "--seeds", "0", str(2**40)])
    # norms of no type where the placement adds norms, or where it only places norms (Pre-Norm's model
    # again: DeepNorm's scales, ReZero's and LayerNorm Scaling's stay), a (1 + w) gain on a norm with no
    # gain: no model
    fields = {name: variant_fields(name) for name in VARIANTS}
    only_places = ("post", "peri", "reorder", "mix")
    invalid = [name for name, f in fields.items()
               if f["norm_type"] == "none" and ((f["qk_norm"], f["v_norm"]) != ("none", "none")
                                                or f["sub_norm"] or f["embed_norm"] == "norm"
                                                or f["norm_position"] in only_places
                                                and f["norm_scaling"] == "none")
               or f["norm_gain"] != "w" and not NORM_TYPES[f["norm_type"]].gain]
    assert invalid == [name for name in VARIANTS if variant_problem(name)] and "hybrid-none" in invalid
    assert "post-none" in invalid and "deepnorm-none" not in invalid and "mix+depth-none" not in invalid
    assert study.variants == [v for v in VARIANTS if v not in invalid] and "pre-none" in study.variants
    assert study.seeds == [0, 2**40]
    study, _ = run_ablation.parse_args(["--variants", "post-rmsnorm", "--tune_lr", "4e-3", "1e-3", "4e-3"])
    assert study.baseline == "pre-rmsnorm" and study.tune_lr == [1e-3, 4e-3]  # sorted, duplicates dropped


@pytest.fixture
def fake_runs(monkeypatch) -> tuple[list, set]:
    """Stand-in runs, best at lr 2e-3: (the (variant, lr, seed) of each run trained, in order; the variants
    whose every run is to be unusable, to add to)."""
    trained, collapsing = [], set()

    def fake_run(base, study, variant, depth, lr, warmup, seed, job):
        trained.append((variant, lr, seed))
        # what the run is to the study, its wandb tag job=...
        tuned = study.tune_lr is not None and seed in study.tune_seeds
        assert job == ("grid" if tuned else "seed" if study.tune_lr or study.lr_from else "run")
        return {"variant": variant, "seed": seed, "diverged": False, "plateaued": False, "val_bpb": 1.0,
                "val_loss": 4.0 + seed / 100 + abs(math.log2(lr / 2e-3)), "tokens_per_s": None,
                "s_per_step": None, "norm_params": 10}
    monkeypatch.setattr(runner, "run_one", fake_run)
    monkeypatch.setattr(runner, "tuning_point", lambda lr, run: lr_tuning.Point(
        lr, run["val_loss"], run["variant"] not in collapsing))
    return trained, collapsing


def test_repeated_seeds_and_variants_run_and_count_once(fake_runs):
    trained, _ = fake_runs
    study, base = run_ablation.parse_args(["--variants", "pre-rmsnorm", "post-rmsnorm", "pre-rmsnorm",
                                           "--seeds", "1", "0", "1", "1", "--learning_rates", "2e-3"])
    assert (study.variants, study.seeds) == (["pre-rmsnorm", "post-rmsnorm"], [1, 0])
    groups = runner.train_study(study, base, Worker()).groups
    assert sorted(trained) == sorted({*trained}) and len(trained) == 4
    assert [len(runs) for runs in groups.values()] == [2, 2]
    assert "| 4.005 ± 0.007 | 1.000 ± 0.000 | — | — | 10 | 0/2 | 0/2 |" in results_table(groups, False)
    # ... and in the fair study, where the first two seeds tune and each other seed trains once at the choice
    trained.clear()
    study, base = run_ablation.parse_args(["--variants", "pre-rmsnorm", "--seeds", "0", "1", "2", "0", "2",
                                           "--tune_lr", "1e-3", "2e-3", "4e-3"])
    groups = runner.train_study(study, base, Worker()).groups
    assert trained == [("pre-rmsnorm", lr, seed) for lr in (1e-3, 2e-3, 4e-3) for seed in (0, 1)] + [
        ("pre-rmsnorm", 2e-3, 2)]
    assert [[r["seed"] for r in runs] for runs in groups.values()] == [[0, 1, 2]]


def test_a_finished_run_is_reused_and_a_study_folder_holds_one_setting(study, tmp_path, tiny_corpus,
                                                                      monkeypatch, capsys):
    corpus = tmp_path / "corpus.jsonl"  # a copy, to change under the same name
    plays = Path(tiny_corpus).read_text()
    corpus.write_text(plays)
    # (a --min_lr above the run's lr: each run's end of the decay is capped at its peak)
    flags = ("--data_path", str(corpus), "--variants", "pre-rmsnorm", "--max_steps", "2",
             "--eval_interval", "2", "--learning_rates", "1e-3", "--min_lr", "2e-3")
    out = study(*flags)
    run = next((out / "runs").iterdir())

    def no_training(args, **_):
        raise AssertionError(f"trained {args.out_dir} again")
    monkeypatch.setattr(runner, "train", no_training)
    # The same command reuses the run, also as an older trainer recorded it: the width null (the
    # device's default), no --min_lr_ratio; read as its model and what it has.
    summary = json.loads((run / "summary.json").read_text())
    del summary["args"]["min_lr_ratio"]
    summary["args"]["hidden_size"] = None
    (run / "summary.json").write_text(json.dumps(summary))
    study(*flags)
    # the same file under another spelling of its path is the same data
    study(*flags, "--data_path", f"{tmp_path}/./corpus.jsonl")

    def refusal(*more: str, variant: str = "pre-rmsnorm") -> str:
        """The one line that refuses the study's command with more flags (after the progress bars
        of tokenizing a corpus to compare it)."""
        capsys.readouterr()
        with pytest.raises(SystemExit) as stopped:
            run_cli(lambda: study(*(variant if f == "pre-rmsnorm" else f for f in flags), *more))
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert stopped.value.code == 2 and len(errors) == 1 and err.endswith(f"{errors[0]}\n"), err
        return errors[0]
    # another setting, in any run of the folder (another variant's too)
    setting = "use a new --out_dir for a different setting"
    for variant in ("pre-rmsnorm", "post-rmsnorm"):
        assert refusal("--max_steps", "3", variant=variant) == (f"error: {out} holds runs trained with "
                                                      f"--max_steps 2, not 3; {setting}")
    # a report of the folder: its runs are named by the study's own flags
    assert refusal("--max_steps", "3", "--report_only") == (
        f"error: {out} holds runs trained with --max_steps 2, not 3; repeat the study's own flags")
    assert refusal("--grad_clip", "0.5", "--max_steps", "3") == (
        f"error: {out} holds runs trained with --max_steps 2 and --grad_clip 1.0, not 3 and 0.5; "
        f"{setting}")
    other = tmp_path / "other.jsonl"
    lines = plays.splitlines(keepends=True)
    other.write_text("".join(lines[: len(lines) // 2]))
    assert refusal("--data_path", str(other)) == (f"error: {out} holds runs trained with --data_path "
                                                  f"{corpus}, not {other}; {setting}")
    corpus.write_text(plays.replace("Prospero", "Propsero"))  # the same --data_path, other text
    assert refusal() == (f"error: {out} holds runs trained on other data or tokenizer than --data_path "
                         f"and --tokenizer_path give now; {setting}")
    corpus.write_text(plays)
    # batches of another number of data-parallel ranks
    (run / "summary.json").write_text(json.dumps(summary | {"world_size": 2}))
    assert refusal().startswith(f"error: {run} was trained on 2 data-parallel ranks, this study trains")
    # a run of an older version (random windows): nothing trains beside it, its report still runs
    assert summary.pop("sampler") == "epochs"
    (run / "summary.json").write_text(json.dumps(summary))
    assert refusal().startswith(f"error: {out} holds runs of an older version, which drew random windows")
    study(*flags, "--report_only")
    summary["sampler"] = "epochs"
    (run / "summary.json").write_text(json.dumps(summary))
    # a finished run without its metrics is one error, not a crash
    report = (out / "results.md").read_text()
    (run / "metrics.jsonl").unlink()
    assert refusal() == (f"error: {run} is finished but its metrics.jsonl is missing; restore it, or "
                         "delete the run's folder to train it again")
    assert (out / "results.md").read_text() == report and (run / "summary.json").is_file()
    # a summary cut short is one line naming it, with what to do
    (run / "summary.json").write_text(json.dumps(summary)[:40])
    assert refusal().startswith(f"error: {run / 'summary.json'} is damaged (")
    assert refusal().endswith("; delete its run's folder to train the run again")
    # a run killed midway (kill -9) has no summary yet: its newest step's training state is its record
    (run / "summary.json").unlink()
    assert [p.name for p in run.iterdir() if p.name.startswith("step-")] == ["step-000002"]
    assert refusal("--max_steps", "3") == (f"error: {out} holds runs trained with --max_steps 2, not 3; "
                                           f"{setting}")


def test_a_preset_study_trains_the_presets_shape_under_each_variants_norms(tmp_path, tiny_corpus,
                                                                        tiny_tokenizer_dir):
    """Each run is resolved as the trainer resolves its command line: MiniMind-3's shape from
    --preset, the variant's fields over it (post-layernorm has no QK-norm), the run's depth over
    both."""
    data = ["--data_path", tiny_corpus, "--tokenizer_path", tiny_tokenizer_dir, "--num_proc", "1"]
    small = ["--device", "cpu", "--max_seq_len", "32", "--batch_size", "2", "--eval_steps", "1",
             "--max_steps", "1", "--no_layers_plot"]
    study, base = run_ablation.parse_args([
        "--out_dir", str(tmp_path / "study"), *data, *small, "--preset", "minimind3",
        "--variants", "post-layernorm", "--depths", "1"])
    # one run, and no report: its figures would take longer than the run
    ((run,),) = runner.train_study(study, base, Worker()).groups.values()
    minimind3 = {"hidden_size": 768, "num_attention_heads": 8, "num_key_value_heads": 4,
                 "intermediate_size": 2432, "rms_norm_eps": 1e-6}
    variant = {"norm_position": "post", "qk_norm": "none", "num_hidden_layers": 1}
    model = {**minimind3, **variant, "norm_type": "layernorm"}
    config = json.loads((step_folders(Path(run["out_dir"]))[0] / "config.json").read_text())
    assert {k: config[k] for k in model} == model
    recorded = {**minimind3, **variant, "norm": "layernorm", "preset": "minimind3",
                "variant": "post-layernorm"}
    assert {k: run["args"][k] for k in recorded} == recorded


@pytest.mark.slow  # four runs and their figures: 15-40 s on 2 busy cores
def test_two_variant_two_seed_study_writes_plots_and_table(study, monkeypatch):
    profiles = []

    def layer_profiles(runs, path):
        profiles.append(sorted(runs))
        Path(path).write_bytes(b"png")
    monkeypatch.setattr(report, "plot_layer_profiles", layer_profiles)
    out = study("--variants", "pre-rmsnorm", "post-layernorm", "--seeds", "0", "1", "--max_steps", "4",
                "--eval_interval", "4")
    # the layer profile draws one run of each variant, and says which
    assert profiles[-1] == ["post-layernorm (seed 0)", "pre-rmsnorm (seed 0)"]
    for name in ("loss_curves.png", "layers.png", "results.md", "results.json"):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "depth.png").exists()  # one depth: no depth figure
    runs = json.loads((out / "results.json").read_text())
    assert sorted((r["variant"], r["norm_position"], r["norm"], r["seed"], r["depth"]) for r in runs) == [
        ("post-layernorm", "post", "layernorm", 0, 2), ("post-layernorm", "post", "layernorm", 1, 2),
        ("pre-rmsnorm", "pre", "rmsnorm", 0, 2), ("pre-rmsnorm", "pre", "rmsnorm", 1, 2)]
    assert all(r["step"] == 4 and not r["diverged"] for r in runs)
    # each run's own, from its summary
    assert all(r["environment"]["torch"] == torch.__version__ for r in runs)
    table = (out / "results.md").read_text()
    produced = table.splitlines()[2]
    assert produced.startswith("Produced ") and f"torch {torch.__version__}" in produced
    rows = [line for line in table.splitlines() if line.startswith("| pre-") or line.startswith("| post-")]
    # 4 steps stay at the unigram loss: the plateaued runs are counted in their column, and their losses,
    # all there is, show marked
    assert all(r["plateaued"] for r in runs)
    rule = (f"plateaued when its final validation loss is not at least {evaluation.PLATEAU_MARGIN} nats "
            f"below a unigram model's ({runs[0]['unigram_loss']:.3f}), or no lower than its first.")
    assert rule in " ".join(table.split())
    marked = re.compile(r"^\| (pre-rmsnorm|post-layernorm) \| 2 \| [\d.]+ ± [\d.]+ \(plateaued\) \|")
    assert len(rows) == 2 and all(marked.match(row) and row.endswith("| 0/2 | 2/2 |") for row in rows)
    # LayerNorm carries a bias as well as a gain; Post-Norm has no final norm (4 norms at 2 layers, not 5)
    norm_params = {r["norm"]: r["norm_params"] for r in runs}
    assert norm_params == {"rmsnorm": 5 * 32, "layernorm": 4 * 2 * 32}
    assert all((Path(r["out_dir"]) / "metrics.jsonl").is_file() for r in runs)


def test_a_damaged_or_foreign_report_is_one_line_and_a_deleted_run_leaves_the_report(study, capsys):
    flags = ["--seeds", "0", "1", "--max_steps", "2", "--eval_interval", "2"]
    out = study("--variants", "pre-rmsnorm", "post-layernorm", *flags)
    gone = next((out / "runs").glob("post-layernorm-*-s1"))
    shutil.rmtree(gone)
    capsys.readouterr()
    study("--variants", "pre-rmsnorm", *flags)  # reports the earlier command's runs too, but for the gone one
    assert f"warning: {gone} is gone" in capsys.readouterr().err
    names = {Path(r["out_dir"]).name for r in json.loads((out / "results.json").read_text())}
    assert len(names) == 3 and gone.name not in names
    report = out / "results.json"
    for damaged in (report.read_text()[:50], '{"a user\'s": "file"}'):
        report.write_text(damaged)
        with pytest.raises(UserError, match=f"{re.escape(str(report))} is not a study's report"):
            study("--variants", "pre-rmsnorm", *flags)


def test_depths_give_one_run_per_depth_with_that_many_layers(study):
    out = study("--variants", "mix+depth-rmsnorm", "--depths", "1", "4", "--max_steps", "2",
                "--eval_interval", "2", "--learning_rate", "2e-3", "--warmup_steps", "50")
    runs = json.loads((out / "results.json").read_text())
    assert sorted(r["depth"] for r in runs) == [1, 4]
    for r in runs:
        assert Path(r["out_dir"]).name == f"mix+depth-rmsnorm-L{r['depth']}-lr0.002-wu50-s0"
        config = json.loads((step_folders(Path(r["out_dir"]))[0] / "config.json").read_text())
        assert config["num_hidden_layers"] == r["args"]["num_hidden_layers"] == r["depth"]
        assert (config["norm_position"], config["norm_scaling"], config["qk_norm"]) == ("mix", "depth",
                                                                                        "none")
        last = [m for m in read_metrics(Path(r["out_dir"]) / "metrics.jsonl") if m["split"] == "train"][-1]
        assert len(last["residual_rms"]) == len(last["block_cosine"]) == r["depth"]
        assert r["num_norms"] == 2 * r["depth"] + 1  # floor(L / 4) Post blocks, the rest Pre, a final norm
    table = (out / "results.md").read_text()
    assert "| mix+depth-rmsnorm | 1 |" in table and "| mix+depth-rmsnorm | 4 |" in table
    assert (out / "depth.png").stat().st_size > 0 and "![depth](depth.png)" in table


def test_diverged_run_is_recorded_not_fatal_and_each_run_ends_in_one_line(study, capsys):
    out = study("--variants", "pre-none", "--seeds", "0", "--learning_rates", "1e-3", "1e6",
                "--warmup_steps", "0", "--grad_clip", "0", "--max_steps", "30", "--eval_interval", "10")
    printed = capsys.readouterr().out.split("\n=== ")[1:]
    assert [run.splitlines()[0] for run in printed] == ["pre-none-L2-lr0.001-wu0-s0",
                                                        "pre-none-L2-lr1e+06-wu0-s0"]
    closing = [[line for line in run.splitlines() if line.startswith(("done:",
                                                                      "diverged:"))] for run in printed]
    assert [len(lines) for lines in closing] == [1, 1]
    assert closing[0][0].startswith("done: step 30/30, val loss ")
    assert closing[1][0].startswith("diverged: the loss or the weights became non-finite")
    runs = {Path(r["out_dir"]).name: r for r in json.loads((out / "results.json").read_text())}
    fine, blown = runs["pre-none-L2-lr0.001-wu0-s0"], runs["pre-none-L2-lr1e+06-wu0-s0"]
    # diverged is its own outcome
    assert not fine["diverged"] and blown["diverged"] and not blown["plateaued"]
    table = (out / "results.md").read_text()
    assert "| pre-none | 2 | 1e+06 | 0 | — | — | — | — | 0 | 1/1 | 0/1 |" in table
    assert "![pre-none-L2](grid-pre-none-L2.png)" in table
    assert (out / "grid-pre-none-L2.png").stat().st_size > 0
    # a second command adds a warmup at one lr: the grid's cell of the other lr at it has no run
    study("--variants", "pre-none", "--seeds", "0", "--learning_rates", "1e-3", "--warmup_steps", "5",
          "--grad_clip", "0", "--max_steps", "30", "--eval_interval", "10")
    table = (out / "results.md").read_text()
    assert "| pre-none | 2 | 0.001 | 5 |" in table and "![pre-none-L2](grid-pre-none-L2.png)" in table


@pytest.mark.parametrize("during", [5, 8])  # a step of the run, or its last
def test_a_study_stopped_by_a_signal_says_to_run_its_command_again_and_that_command_finishes_it(
        study, capsys, monkeypatch, during):
    lr_at = tp.lr_at

    def signalled(step, *rest):
        if step == during - 1:  # the signal arrives during that step
            os.kill(os.getpid(), signal.SIGTERM)
        return lr_at(step, *rest)
    monkeypatch.setattr(tp, "lr_at", signalled)
    flags = ("--variants", "pre-rmsnorm", "--seeds", "0", "--max_steps", "8", "--eval_interval", "100")
    out = study(*flags)
    printed = capsys.readouterr().out.strip().splitlines()
    # the run's own line speaks of the study's command, not of the trainer's --resume
    assert printed[-2].startswith(f"stopped: step {during}/8, ")
    assert printed[-2].endswith("| next: the study's command, run again, continues it")
    assert printed[-1] == "study interrupted; run the same command again to continue where it stopped"
    stopped = json.loads(next(out.glob("runs/*/summary.json")).read_text())
    assert stopped["interrupted"] and stopped["plateaued"] is None
    monkeypatch.setattr(tp, "lr_at", lr_at)
    study(*flags)
    finished = json.loads((out / "results.json").read_text())
    assert [(r["step"], r["interrupted"], r["plateaued"] is None) for r in finished] == [(8, False, False)]


def test_plateau_rule():
    assert not evaluation.plateaued([5.0, 4.0], unigram=5.0)
    assert evaluation.plateaued([5.0, 4.0], unigram=4.04)  # not 0.05 nats below the unigram model
    assert evaluation.plateaued([7.8, 7.2], unigram=6.2)  # lower than its first, but above the unigram model
    assert evaluation.plateaued([5.0, 5.0], unigram=6.0)  # no lower than the first
    assert not evaluation.plateaued([4.0], unigram=6.0)  # one evaluation: nothing to compare with
    assert not evaluation.plateaued([], unigram=6.0)


def test_unigram_loss_is_the_smoothed_frequency_model(tmp_path, tiny_corpus, tiny_tokenizer_dir, monkeypatch):
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path / "cache"))
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    train, val = (prepare_split(tiny_corpus, split, tokenizer, num_proc=1).tokens
                  for split in ("train", "validation"))
    counts = Counter(train.tolist())
    total = len(train) + len(tokenizer)
    expected = -sum(math.log((counts[t] + 1) / total) for t in val.tolist()) / len(val)
    assert evaluation.unigram_loss(train, val, len(tokenizer)) == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow  # ten tiny runs and a rerun: ~17 s on 2 busy cores
def test_tuned_study_picks_per_variant_trains_other_seeds_at_the_choice_and_reruns_nothing(study,
                                                                                           monkeypatch):
    # Runs of a few steps learn too little to beat a unigram model; judged on loss alone, none counts as
    # plateaued.
    monkeypatch.setattr(tp, "unigram_loss", lambda *splits: math.inf)
    flags = ("--variants", "pre-rmsnorm", "post-rmsnorm", "--seeds", "0", "1", "--tune_seeds", "0",
             "--tune_lr", "1e-3", "3e-2",
             "--max_steps", "3", "--eval_interval", "3", "--warmup_steps", "0", "--log_interval", "3")
    out = study(*flags)
    tuning = json.loads((out / "tuning.json").read_text())
    assert [(t["variant"], t["depth"]) for t in tuning] == [("pre-rmsnorm", 2), ("post-rmsnorm", 2)]
    runs = sorted(p.name for p in (out / "runs").iterdir())
    for t in tuning:
        lrs, losses = t["learning_rates"], t["val_losses"]
        assert len(lrs) == len(losses) == len(t["usable"]) and lrs == sorted(lrs)
        assert {1e-3, 3e-2} <= set(lrs) and len(lrs) <= 4  # the grid, plus at most two edge extensions
        finite = {lr: v for lr, v in zip(lrs, losses, strict=True) if v is not None}
        assert t["chosen_lr"] == min(finite, key=finite.get)
        grown = [lr for lr in lrs if lr not in (1e-3, 3e-2)]
        assert all(lr in (5e-4, 2.5e-4, 6e-2, 1.2e-1) for lr in grown)
        # seed 0 at every grid point, seed 1 only at the chosen lr
        mine = [r for r in runs if r.startswith(t["variant"] + "-")]
        assert len([r for r in mine if r.endswith("-s0")]) == len(lrs)
        assert [r for r in mine if r.endswith("-s1")] == [runner.run_name(t["variant"], 2, t["chosen_lr"],
                                                                          0, 1)]
    results = json.loads((out / "results.json").read_text())
    assert sorted((r["variant"], r["seed"]) for r in results) == [
        ("post-rmsnorm", 0), ("post-rmsnorm", 1), ("pre-rmsnorm", 0), ("pre-rmsnorm", 1)]
    chosen = {t["variant"]: t["chosen_lr"] for t in tuning}
    assert all(r["args"]["learning_rate"] == chosen[r["variant"]] for r in results)
    assert all(r["args"]["wandb_job"] == ("grid" if r["seed"] == 0 else "seed") for r in results)
    # a folder outside the repository: its last two names, never the whole (home) path
    assert all(r["args"]["wandb_group"] == "/".join(out.resolve().parts[-2:]) for r in results)
    assert runner.wandb_group(runner.REPO / "docs/results/epochs/L8") == "docs/results/epochs/L8"
    table = (out / "results.md").read_text()
    assert "## Each variant at its own best learning rate" in table
    assert (out / "lr_sensitivity.png").stat().st_size
    post = next(line for line in table.splitlines() if line.startswith("| post-rmsnorm | 2 | "))
    # paired against pre-rmsnorm on seed 1 alone: seed 0 chose the lr; one seed gives no CI and no p
    number = r"[+-]\d\.\d{3}"
    assert re.search(rf"\| \d\.\d{{3}} \(1\) \| {number} \| 1 \(0\) \| {number} \| \d/\d \|", post), post
    assert "| open |" not in post  # a report gives statistics; only claims.md gives verdicts
    grid = {t["variant"]: t for t in tuning}["post-rmsnorm"]  # the grid beside the choice, every lr
    assert post.startswith(f"| post-rmsnorm | 2 | {report.lr_grid_cell(grid)} | {grid['chosen_lr']:g}")
    assert all(f"{lr:g}: " in post for lr in grid["learning_rates"])
    assert "tune seeds [0]" in table
    assert "Each variant trains at the lr of its grid (0.001 0.03), grown" in table
    assert re.search(r"\d+ of \d+ runs were trained from a modified tree", table)

    # a rerun reuses every run: nothing trains
    def no_training(args, **_):
        raise AssertionError(f"trained {args.out_dir} again")
    monkeypatch.setattr(runner, "train", no_training)
    study(*flags)
    assert json.loads((out / "tuning.json").read_text()) == tuning
    # the folder's choices stand: other tune seeds would count seed 0 as fresh, and a command that
    # chooses no lr would report a stability grid over them
    report_before = (out / "results.md").read_text()
    other_seeds = [*flags, "--report_only"]
    other_seeds[other_seeds.index("--tune_seeds") + 1] = "1"
    with pytest.raises(UserError, match=f"^{re.escape(str(out))} chose pre-rmsnorm L2's lr on tune seeds 0, "
                       "not 1: give --tune_seeds 0, or use a new --out_dir$"):
        study(*other_seeds)
    fixed = ["--variants", "pre-rmsnorm", "--seeds", "1", "--learning_rates", "1e-3", *flags[-8:]]
    with pytest.raises(UserError, match=r"holds a study that chose its lrs \(tuning.json\): give its "):
        study(*fixed, "--report_only")
    assert json.loads((out / "tuning.json").read_text()) == tuning
    assert (out / "results.md").read_text() == report_before


def test_the_report_names_the_grid_each_variant_started_from():
    def grids(*flags):
        study, _ = run_ablation.parse_args(["--variants", "pre-rmsnorm", "post-rmsnorm",
                                            "--tune_lr", "1e-3", "2e-3", *flags])
        return report.starting_grids(study)
    assert grids() == "0.001 0.002"
    assert grids("--tune_lr_for", "post-rmsnorm=1e-3,5e-4") == "0.001 0.002; post-rmsnorm: 0.0005 0.001"
    assert grids("--tune_lr_for", "post-rmsnorm=5e-4,1e-3") == "0.001 0.002; post-rmsnorm: 0.0005 0.001"
    assert grids("--tune_lr_for", "post-rmsnorm=5e-4,1e-3", "pre-rmsnorm=4e-3,8e-3") == \
        "post-rmsnorm: 0.0005 0.001; pre-rmsnorm: 0.004 0.008"


def test_a_baseline_given_is_one_of_the_variants_or_trained_in_the_folder_at_each_depth(tmp_path):
    out = tmp_path / "study"
    flags = ["--out_dir", str(out), "--variants", "post-rmsnorm", "--baseline", "pre-rmsnorm",
             "--tune_lr", "1e-3", "2e-3"]
    untrained = f"--baseline pre-rmsnorm: not one of --variants, and {out} holds no run of it to compare with"
    with pytest.raises(UserError, match=f"^{re.escape(untrained)}$"):
        run_ablation.parse_args(flags)
    earlier = out / "runs" / runner.run_name("pre-rmsnorm", 8, 6e-3, 100, 0)  # an earlier command's, at L8
    earlier.mkdir(parents=True)
    (earlier / "summary.json").write_text("{}")
    assert run_ablation.parse_args(flags)[0].baseline == "pre-rmsnorm"
    with pytest.raises(UserError, match=f"^{re.escape(untrained)}$"):  # none at 24 layers
        run_ablation.parse_args([*flags, "--depths", "8", "24"])


def test_a_folder_that_chose_its_lrs_takes_commands_that_choose_them_the_same_way(tmp_path, monkeypatch):
    source = tmp_path / "source"
    records = [{"variant": "pre-rmsnorm", "depth": 8, "chosen_lr": 2e-3, "tune_seeds": [0, 1]},
               {"variant": "post-rmsnorm", "depth": 8, "chosen_lr": 1e-3, "lr_from": str(source)}]
    (tmp_path / "tuning.json").write_text(json.dumps(records))

    def check(**command) -> str | None:
        study = SimpleNamespace(**{"variants": ["pre-rmsnorm"], "depths": [8], "tune_lr": [1e-3, 2e-3],
                                   "tune_seeds": [0, 1], "lr_from": {}} | command)
        try:
            runner.check_choices(tmp_path, study, "ADVICE")
        except UserError as err:
            return str(err)
        return None
    copied = {("post-rmsnorm", 8): {"lr_from": str(source)}}
    monkeypatch.chdir(tmp_path)
    assert check() is None
    assert check(tune_seeds=[1, 0]) is None  # the same seeds, in another order
    assert check(variants=["pre-layernorm"], tune_seeds=[2, 3]) is None  # a variant it has not tuned
    assert check(variants=["post-rmsnorm"], tune_lr=None, lr_from=copied) is None
    assert check(variants=["post-rmsnorm"], tune_lr=None,  # the same study, spelled relative to here
                 lr_from={("post-rmsnorm", 8): {"lr_from": "source"}}) is None
    assert check(depths=[24], tune_seeds=[2, 3]) is None  # chosen at another depth
    assert check(tune_lr=None) == (f"{tmp_path} holds a study that chose its lrs (tuning.json): give its "
                                   "--tune_lr (or --lr_from) again; ADVICE")
    assert check(tune_seeds=[1, 2]) == (f"{tmp_path} chose pre-rmsnorm L8's lr on tune seeds 0 1, not 1 2: "
                                        "give --tune_seeds 0 1, or use a new --out_dir")
    assert check(variants=["post-rmsnorm"]) == (f"{tmp_path} copied post-rmsnorm L8's lr from {source}: give "
                                                f"--lr_from {source} again, or use a new --out_dir")
    assert check(variants=["post-rmsnorm"], tune_lr=None, lr_from={("post-rmsnorm", 8): {
        "lr_from": "elsewhere"}}).startswith(f"{tmp_path} copied post-rmsnorm L8's lr from {source}")
    assert check(tune_lr=None, lr_from={("pre-rmsnorm", 8): {"lr_from": str(source)}}) == (
        f"{tmp_path} chose pre-rmsnorm L8's lr by --tune_lr: give its --tune_lr again, or use a new "
        "--out_dir")


def test_study_cost_counts_modified_trees_apart_from_runs_that_recorded_no_commit(tmp_path):
    answers = {"clean": {"git_dirty": False}, "modified": {"git_dirty": True}, "older": None}
    for name, environment in answers.items():
        (tmp_path / "runs" / name).mkdir(parents=True)
        summary = {"train_time_s": 1800.0} | ({"environment": environment} if environment else {})
        (tmp_path / "runs" / name / "summary.json").write_text(json.dumps(summary))
    assert report.study_cost(tmp_path).endswith(
        "1.5 hours of training (evaluation and start-up not counted); 1 of 3 runs were trained "
        "from a modified tree, and 1 recorded no commit.")
    shutil.rmtree(tmp_path / "runs" / "older")
    assert report.study_cost(tmp_path).endswith("1 of 2 runs were trained from a modified tree.")


def test_speed_columns_leave_out_runs_without_a_timed_step():
    """A one-step run's only step is its warm-up (timed apart as compile time), so it has no tokens/s."""
    run = {"diverged": False, "val_loss": 2.0, "val_bpb": 1.0, "norm_params": 10, "plateaued": False}
    runs = [{**run, "tokens_per_s": None, "s_per_step": None}, {**run, "tokens_per_s": 100.0,
                                                                "s_per_step": 0.5}]
    table = results_table({("pre-rmsnorm", 2, 1e-3, 10): runs}, grid=False)
    assert "| 100 | 0.500 |" in table
    assert "| — | — |" in results_table({("pre-rmsnorm", 2, 1e-3, 10): runs[:1]}, grid=False)


def test_a_variant_that_trains_at_no_lr_grows_its_grid_both_ways_and_trains_no_other_seed(
        fake_runs, capsys, monkeypatch, tmp_path):
    """The tuning loop on stand-in runs: every run of post-rmsnorm collapses, pre-rmsnorm's best is inside;
    its own grid (--tune_lr_for) is post-rmsnorm's start."""
    trained, collapsing = fake_runs
    collapsing.add("post-rmsnorm")
    fake = runner.run_one
    study, base = run_ablation.parse_args(["--variants", "pre-rmsnorm", "post-rmsnorm", "--seeds", "0", "1",
                                           "2", "--tune_lr", "1e-3", "2e-3", "4e-3",
                                           "--tune_lr_for", "post-rmsnorm=2e-3,4e-3"])
    plan = runner.train_study(study, base, Worker())
    pre, post = plan.tuning
    assert pre["chosen_lr"] == 2e-3 and pre["learning_rates"] == [1e-3, 2e-3, 4e-3] and not pre["at_edge"]
    assert pre["seed_losses"][1] == [4.0, 4.01] and pre["val_losses"][1] == pytest.approx(4.005)
    assert post["chosen_lr"] is None and not post["at_edge"]
    assert post["learning_rates"] == [5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]  # two rounds each way, no more
    assert [lr for v, lr, s in trained if v == "post-rmsnorm" and s == 1] == [2e-3, 4e-3, 1e-3, 8e-3, 5e-4,
                                                                              1.6e-2]
    assert [(v, lr) for v, lr, s in trained if s == 2] == [("pre-rmsnorm", 2e-3)]
    assert list(plan.groups) == [("pre-rmsnorm", 8, 2e-3, study.warmup_steps[0])]
    out = capsys.readouterr().out
    assert ("post-rmsnorm L8: no lr of the grid trained on every tune seed without diverging or plateauing; "
            "adding 0.001 and 0.008 (extension 1 of 2)") in out
    assert "still at the grid's edge" not in out
    # --report_only plans from the finished runs and trains nothing: here all but pre-rmsnorm's fresh seed
    monkeypatch.setattr(runner, "run_one", lambda *run: pytest.fail("trained"))

    def finished_run(base, study, *run):
        return None if (run[0], run[-1]) == ("pre-rmsnorm", 2) else fake(base, study, *run, "grid")
    monkeypatch.setattr(runner, "finished_run", finished_run)
    study.report_only = True
    study.out_dir = str(tmp_path)
    plan = runner.train_study(study, base, Worker())
    assert list(plan.pending) == [("pre-rmsnorm", 8, 2e-3, study.warmup_steps[0], 2)] and not plan.groups
    told = capsys.readouterr().out.splitlines()[-1]
    assert told == "--report_only: 1 runs the study asks for are not trained"
    # a folder whose runs are all of other depths: the study's --depths left out
    other_depths = f"; the runs in {tmp_path} have 1 layers: give the study's own --depths"
    for depth, hint in ((8, ""), (1, other_depths)):
        stray = tmp_path / "runs" / runner.run_name("peri-rmsnorm", depth, 2e-3, study.warmup_steps[0], 0)
        stray.mkdir(parents=True)
        (stray / "summary.json").write_text(json.dumps({"args": {"num_hidden_layers": depth}}))
        runner.train_study(study, base, Worker())
        assert capsys.readouterr().out.splitlines()[-1] == told + hint
        shutil.rmtree(stray.parent)
    # no variant has all its seeds: the report gives the lr choices, and says so of the seeds
    report.report(study, plan.groups, plan.tuning)
    assert [t["chosen_lr"] for t in json.loads((tmp_path / "tuning.json").read_text())] == [2e-3, None]
    page = (tmp_path / "results.md").read_text()
    assert "Seeds: none finished yet." in page and "nan" not in page and "unigram model's, or no" in page
    # one table, the lr choices': none of headers alone
    assert "\nRuns shown: none finished yet.\n" in page and page.count("| variant | layers |") == 1
    post = next(line for line in page.splitlines() if line.startswith("| post-rmsnorm |"))
    assert post.endswith("| — | — |")  # no seed trains at no lr: its grid's column says why
    # a study where no grid has an lr that trains says so, not that its seeds are still to come
    study.out_dir = str(tmp_path / "failed")
    (tmp_path / "failed").mkdir()
    report.report(study, {}, plan.tuning[1:])
    page = (tmp_path / "failed" / "results.md").read_text()
    assert "Seeds: none: no lr of any grid trained on its tune seeds." in page
    assert "\nRuns shown: none: no lr of any grid trained on its tune seeds.\n" in page


def test_lr_from_trains_only_fresh_seeds_at_another_studys_choice(fake_runs, tmp_path):
    """A longer rung at the lrs a shorter one chose: no grid, each variant's seeds at its recorded lr, and the
    record (with its tune seeds, which the report leaves out as not fresh) carried into the new study."""
    trained, _ = fake_runs
    records = [{"variant": "pre-rmsnorm", "depth": 8, "chosen_lr": 8e-3, "tune_seeds": [0, 1]},
               {"variant": "post-rmsnorm", "depth": 8, "chosen_lr": None, "tune_seeds": [0, 1]}]
    (tmp_path / "tuning.json").write_text(json.dumps(records))
    study, base = run_ablation.parse_args(["--variants", "pre-rmsnorm", "--seeds", "2", "3",
                                           "--lr_from", str(tmp_path)])
    plan = runner.train_study(study, base, Worker())
    assert trained == [("pre-rmsnorm", 8e-3, 2), ("pre-rmsnorm", 8e-3, 3)]
    assert plan.tuning == [{**records[0], "lr_from": str(tmp_path)}] and not plan.pending
    with pytest.raises(UserError, match="chose no lr for post-rmsnorm L8"):
        run_ablation.parse_args(["--variants", "post-rmsnorm", "--lr_from", str(tmp_path)])
    with pytest.raises(UserError, match="drop --tune_lr"):
        run_ablation.parse_args(["--lr_from", str(tmp_path), "--tune_lr", "1e-3", "2e-3"])
    with pytest.raises(UserError, match="no tuning.json"):
        run_ablation.parse_args(["--lr_from", str(tmp_path / "none")])
    by_file = ["--variants", "pre-rmsnorm", "--lr_from", str(tmp_path / "tuning.json")]
    study, _ = run_ablation.parse_args(by_file)
    assert study.lr_from[("pre-rmsnorm", 8)]["chosen_lr"] == 8e-3  # the file itself names the study too
    for text, problem in ((json.dumps(records)[:40], "is damaged"),
                          ('{"a user\'s": "file"}', "is not a study's tuning.json")):
        (tmp_path / "tuning.json").write_text(text)
        with pytest.raises(UserError, match=f"tuning.json {problem}.*; restore it from the study that"):
            run_ablation.parse_args(["--variants", "pre-rmsnorm", "--lr_from", str(tmp_path)])


def test_a_study_of_many_variants_draws_no_two_lines_alike(tmp_path, monkeypatch):
    """17 variants (the fair study at 8 layers) are more than matplotlib's ten colours: colour and dash
    together tell every line apart, in the lr-sensitivity figure and the loss curves."""
    from matplotlib.figure import Figure
    styles = []

    def record(fig, path, **kwargs):
        styles.append({(line.get_label(), line.get_color(), line.get_linestyle())
                       for ax in fig.axes for line in ax.get_lines() if not line.get_label().startswith("_")})
        Path(path).write_bytes(b"")
    monkeypatch.setattr(Figure, "savefig", record)
    names = [f"variant{i}" for i in range(17)]
    tuning = [{"variant": name, "depth": 8, "learning_rates": [1e-3, 2e-3], "val_losses": [4.0, None],
               "usable": [True, False], "chosen_lr": 1e-3} for name in names]
    plot_lr_sensitivity(tuning, tmp_path / "lr.png")
    curve = [{"split": split, "step": step, "train_time_s": step, "loss": 5.0 - step}
             for step in (1, 2) for split in ("train", "val")]
    plot_loss_curves({name: [curve] for name in names}, tmp_path / "loss.png")
    assert len(styles) == 2
    for drawn in styles:
        variants = {(color, ls) for label, color, ls in drawn if label in names}
        assert len(variants) == len(names), drawn


def drawn_figure(monkeypatch) -> list:
    """The figures study.plots saves, kept (and not written) for a test to look at."""
    from study import plots
    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path, **kwargs: figures.append(fig))
    return figures


def test_a_seed_that_stopped_early_leaves_the_others_curves_whole(monkeypatch):
    """The mean at each step is over the seeds that logged it: a diverged seed does not cut its variant's
    line to its own few steps (a one-point line would not show at all)."""
    figures = drawn_figure(monkeypatch)
    whole = [{"split": "train", "step": step, "train_time_s": step, "loss": 6.0 - step} for step in (1, 2, 3)]
    plot_loss_curves({"post": [whole, whole[:1]], "alone": [whole[:1]]}, Path("loss.png"))
    steps_panel = figures[0].axes[0]
    lines = {line.get_label(): line for line in steps_panel.get_lines()}
    assert list(lines["post"].get_xdata()) == [1, 2, 3] and list(lines["post"].get_ydata()) == [5, 4, 3]
    assert lines["alone"].get_marker() == "o"


@pytest.mark.parametrize("spike, scale", [(4.6, "linear"), (1e4, "log")])
def test_the_loss_axis_is_logarithmic_only_for_a_spike_and_reads_plainly(spike, scale, monkeypatch):
    figures = drawn_figure(monkeypatch)
    curve = [{"split": split, "step": step, "train_time_s": step, "loss": loss}
             for step, loss in ((1, 4.2), (2, spike)) for split in ("train", "val")]
    plot_loss_curves({"pre": [curve]}, Path("loss.png"))
    ax = figures[0].axes[0]
    figures[0].canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True) if t.get_text()]
    # plain numbers: each label reads as one (matplotlib's own log labels are TeX, 10^{1}, 5\times10^{0})
    assert ax.get_yscale() == scale and labels
    assert all(float(text.replace("\N{MINUS SIGN}", "-")) >= 0 for text in labels), labels
