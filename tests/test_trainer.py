"""The trainer as users run it: what a run prints and records, exact resume, divergence, stopping by signal,
compile, wandb and DDP (the last ones in fresh processes, slow)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import eval_llm
import model  # noqa: F401  (registers MiniMind with the Auto classes)
import trainer.train_pretrain as tp
from trainer.args import parse_args
from trainer.optim import OPTIMIZERS
from trainer.tracking import compact, read_metrics

REPO = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(REPO / "trainer" / "train_pretrain.py")]


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    """Subprocess environment: conftest's token cache, and no wandb credentials or mode from the host."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    e["HOME"] = str(tmp_path_factory.mktemp("home"))  # no ~/.netrc with a wandb key
    return e


def train_in_process(args) -> dict:
    return tp.train(parse_args([str(a) for a in args]))


def losses(out_dir, split="train"):
    return [r["loss"] for r in read_metrics(Path(out_dir) / "metrics.jsonl") if r["split"] == split]


def test_a_corpus_the_tokenizer_covers_poorly_gets_one_warning(tmp_path, tiny_flags, capsys):
    chinese = tmp_path / "zh.jsonl"  # a tokenizer trained on English plays spells Chinese out byte by byte
    poem = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
    chinese.write_text("".join(json.dumps({"text": poem * (3 + i % 5)}, ensure_ascii=False) + "\n"
                               for i in range(120)), encoding="utf-8")
    train_in_process([*tiny_flags, "--data_path", chinese, "--out_dir", tmp_path / "zh", "--max_steps", 1])
    warnings = [line for line in capsys.readouterr().err.splitlines() if "covers this corpus poorly" in line]
    assert len(warnings) == 1 and "scripts/train_tokenizer.py" in warnings[0]
    train_in_process([*tiny_flags, "--out_dir", tmp_path / "en", "--max_steps", 1])  # the corpus made for it
    assert "covers this corpus poorly" not in capsys.readouterr().err


def test_a_validation_split_too_short_for_a_window_is_named_as_such(tmp_path, tiny_flags):
    """Document 0 of a file is held out (every 100th is): one short line leaves validation a few tokens."""
    data = tmp_path / "short-validation.jsonl"
    lines = ["Hi."] + [f"Line {i} of the plays, long enough to fill the window." * 4 for i in range(1, 60)]
    data.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines), encoding="utf-8")
    with pytest.raises(tp.UserError, match="^the validation split has [0-9]+ tokens, fewer than seq_len"):
        train_in_process([*tiny_flags, "--data_path", data, "--out_dir", tmp_path / "run", "--max_steps", 1])


def test_a_run_shorter_than_its_warmup_gets_one_warning(tmp_path, tiny_flags, capsys):
    train_in_process([*tiny_flags, "--out_dir", tmp_path / "short", "--max_steps", 2, "--warmup_steps", 8])
    warnings = [line for line in capsys.readouterr().err.splitlines() if "--warmup_steps" in line]
    assert warnings == ["warning: --warmup_steps 8 is longer than the run (--max_steps 2): the lr rises to "
                        "25% of --learning_rate and never decays; set --warmup_steps at most --max_steps"]
    train_in_process([*tiny_flags, "--out_dir", tmp_path / "full", "--max_steps", 2, "--warmup_steps", 2])
    # a first part of a longer schedule, to --resume
    train_in_process([*tiny_flags, "--out_dir", tmp_path / "part", "--max_steps", 2, "--warmup_steps", 8,
                      "--lr_decay_steps", 16])
    assert "--warmup_steps" not in capsys.readouterr().err


def test_a_run_prints_each_evaluation_and_ends_in_one_line_saying_what_to_run_next(tmp_path, tiny_flags,
                                                                                    capsys):
    out = tmp_path / "run"
    summary = train_in_process([*tiny_flags, "--out_dir", out, "--max_steps", 8, "--eval_interval", 4])
    printed = capsys.readouterr().out.strip().splitlines()
    val = [r for r in read_metrics(out / "metrics.jsonl") if r["split"] == "val"]
    evals = [line for line in printed if line.startswith("step ")]
    assert [line.split(" | ")[:2] for line in evals] == [
        [f"step {r['step']}/8: val loss {r['loss']:.3f}, {r['bpb']:.3f} bits/byte", f"{r['tokens']:,} tokens"]
        for r in val] and val[-1]["tokens"] == 8 * 4 * 32
    closing = printed[-1]
    assert closing.startswith(f"done: step 8/8, val loss {summary['val_loss']:.3f}, {summary['val_bpb']:.3f} "
                              f"bits/byte, {summary['tokens_per_s']:,.0f} tokens/s, ")
    assert f"| checkpoint {out / 'step-000008'} | next: " in closing
    # the next command is an eval_llm.py command line that parses, on this run and its corpus
    command = shlex.split(closing.split(" | next: ")[1])
    assert command[:2] == ["python", "eval_llm.py"]
    evaluate = eval_llm.parse_args(command[2:])
    assert evaluate.model_path == str(out)
    assert evaluate.eval_data == tiny_flags[tiny_flags.index("--data_path") + 1]
    # ... with the corpus's text field where it is not "text" (eval_llm reads the field it is told)
    corpus = Path(evaluate.eval_data).read_text().splitlines()
    content = tmp_path / "content.jsonl"
    content.write_text("".join(json.dumps({"content": json.loads(line)["text"]}) + "\n" for line in corpus))
    train_in_process([*tiny_flags, "--data_path", content, "--text_field", "content", "--out_dir",
                      tmp_path / "content", "--max_steps", 1])
    command = shlex.split(capsys.readouterr().out.strip().splitlines()[-1].split(" | next: ")[1])
    assert eval_llm.parse_args(command[2:]).text_field == "content"


def test_metrics_keep_per_layer_arrays_to_five_digits_and_every_scalar_exact(trained_run):
    assert compact([0.123456789, 98765.4321, [2.4681357e-7]]) == [0.12346, 98765.0, [2.4681e-7]]
    assert compact(1.23456789) == 1.23456789
    records = read_metrics(trained_run / "metrics.jsonl")
    arrays = [v for r in records for value in r.values() if isinstance(value, list) for v in value]
    assert arrays and all(v == float(f"{v:.5g}") for v in arrays)
    assert any(r["loss"] != float(f"{r['loss']:.5g}") for r in records)  # the losses keep all their digits
    summary = json.loads((trained_run / "summary.json").read_text())
    assert summary["val_loss"] == [r["loss"] for r in records if r["split"] == "val"][-1]


def test_short_run_loss_falls_and_checkpoint_loads(trained_run):
    out = trained_run  # 40 steps, logged every 5, evaluated every 20
    train, val = losses(out), losses(out, "val")
    assert len(train) == 8 and len(val) == 2
    assert train[-1] < train[0] - 0.5 and val[-1] < val[0]
    records = read_metrics(out / "metrics.jsonl")
    last = [r for r in records if r["split"] == "train"][-1]
    assert last["tokens_per_s"] > 0 and last["peak_mem_mb"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 40 and not summary["diverged"] and summary["val_bpb"] > 0
    loaded = AutoModelForCausalLM.from_pretrained(out / "step-000040")
    assert loaded.config.hidden_size == 32
    assert (out / "step-000040" / "tokenizer.json").is_file()
    assert not (out / "layers.png").exists()  # --no_layers_plot (the tiny flags); test_diagnostics draws one


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_exact_resume(tmp_path, tiny_flags, optimizer):
    """Bit for bit: every optimizer state (AdamW's moments, Muon's momenta) comes back from the checkpoint."""
    common = [*tiny_flags, "--optimizer", optimizer, "--log_interval", 1, "--eval_interval", 100,
              "--save_interval", 100, "--learning_rate", 3e-3, "--warmup_steps", 2]
    straight, halves = tmp_path / "straight", tmp_path / "halves"  # 8 steps, and 4 then a --resume to 8
    train_in_process([*common, "--out_dir", straight, "--max_steps", 8])
    train_in_process([*common, "--out_dir", halves, "--max_steps", 4, "--lr_decay_steps", 8])
    train_in_process([*common, "--out_dir", halves, "--max_steps", 8, "--lr_decay_steps", 8, "--resume"])
    assert len(losses(straight)) == 8 and losses(halves) == losses(straight)  # bit-identical, step by step
    a, b = (load_file(out / "step-000008" / "model.safetensors") for out in (straight, halves))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert sorted(p.name for p in halves.glob("step-*")) == ["step-000004", "step-000008"]
    saved = torch.load(halves / "step-000008" / "training_state.pt", weights_only=True)["optimizer"]
    if optimizer == "muon":  # both states, Muon's with a momentum for each of the 7 matrices of the 2 blocks
        assert set(saved) == {"adamw", "muon"} and len(saved["muon"]["state"]) == 7 * 2


@pytest.mark.slow  # three inductor compiles
def test_runs_in_one_process_each_compile_afresh(tmp_path, tiny_flags, fresh_dynamo):
    """A study trains its runs in one process: Dynamo's cache of the forward, kept from run to run, would
    pass its recompile limit (8) at the ninth model and leave it eager, with a log line only. Here the limit
    is 2 and hitting it fails, so that three models of three depths show it."""
    import torch._dynamo

    # (torch's own patch: monkeypatch's undo would leave the config module's entries hidden)
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        for depth in (1, 2, 3):
            train_in_process([*tiny_flags, "--out_dir", tmp_path / f"L{depth}", "--num_hidden_layers", depth,
                              "--max_steps", 2, "--eval_interval", 2, "--compile"])


def test_a_run_records_its_order_and_epochs_and_refuses_to_resume_an_older_order(tmp_path, tiny_flags):
    out = tmp_path / "run"
    flags = [*tiny_flags, "--out_dir", out, "--save_interval", 3, "--eval_interval", 3]
    summary = train_in_process([*flags, "--max_steps", 3])
    windows = (summary["data"]["train"]["num_tokens"] - 1) // 32  # the tiny flags: 32-token windows
    assert summary["sampler"] == "epochs" and summary["epochs"] == pytest.approx(3 * 4 / windows)
    state_file = out / "step-000003" / tp.checkpoint.STATE_FILE
    state = torch.load(state_file, weights_only=True)
    state["sampler"] = [{"rng": {}, "position": 12}]  # what an older version's random windows saved
    torch.save(state, state_file)
    with pytest.raises(tp.UserError, match="random windows"):
        train_in_process([*flags, "--max_steps", 6, "--resume"])



@pytest.mark.slow  # an inductor compile
def test_compiled_model_trains_like_eager(tmp_path, tiny_flags, fresh_dynamo):
    common = [*tiny_flags, "--max_steps", 3, "--log_interval", 1, "--eval_interval", 3, "--warmup_steps", 1]
    train_in_process([*common, "--out_dir", tmp_path / "eager"])
    train_in_process([*common, "--out_dir", tmp_path / "compiled", "--compile"])
    assert losses(tmp_path / "compiled") == pytest.approx(losses(tmp_path / "eager"), abs=1e-4)


# a run started with --overwrite is told to resume without it (the two flags exclude each other)
@pytest.mark.parametrize("signum, first", [(signal.SIGTERM, []), (signal.SIGINT, ["--overwrite"])],
                         ids=["sigterm", "ctrl-c after --overwrite"])
def test_sigterm_or_ctrl_c_saves_the_step_and_resume_finishes_the_run(signum, first, tmp_path, tiny_flags,
                                                                      monkeypatch, capsys):
    out = tmp_path / "run"
    argv = [str(a) for a in [*tiny_flags, "--out_dir", out, "--max_steps", 8, "--log_interval", 4,
                             "--eval_interval", 100, "--save_interval", 100]]
    lr_at, handlers = tp.lr_at, (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))

    def signalled(step, *rest):
        if step == 4:  # the signal arrives during step 5
            os.kill(os.getpid(), signum)
        return lr_at(step, *rest)
    monkeypatch.setattr(tp, "lr_at", signalled)
    tp.main([*argv, *first])  # returns: stopping on request is no error
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    assert closing.startswith("stopped: step 5/8, ") and f"| checkpoint {out / 'step-000005'} |" in closing
    told = "--resume in place of --overwrite" if first else "--resume"
    assert closing.endswith(f"| next: the same command with {told} continues it")
    stopped = json.loads((out / "summary.json").read_text())
    assert stopped["interrupted"] and stopped["plateaued"] is None  # judged when it finishes
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers
    monkeypatch.setattr(tp, "lr_at", lr_at)
    tp.main([*argv, "--resume"])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("done: step 8/8, ")


@pytest.mark.slow  # a fresh process, stopped by a real SIGTERM from outside
def test_sigterm_saves_checkpoint_and_exits_zero(tmp_path, env, tiny_flags):
    out = tmp_path / "run"
    proc = subprocess.Popen(TRAIN + [str(a) for a in [*tiny_flags, "--out_dir", out, "--max_steps", 100000,
                                                        "--log_interval", 1, "--save_interval", 100000]],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() or not losses(out):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and 0 < summary["step"] < 100000
    step = out / f"step-{summary['step']:06d}"
    assert AutoModelForCausalLM.from_pretrained(step).config.num_hidden_layers == 2
    assert torch.load(step / "training_state.pt", weights_only=True)["step"] == summary["step"]


DDP_PROBE = """
import os, sys, torch
sys.path.insert(0, {repo!r})
import trainer.train_pretrain as tp
from data import BatchSampler

seen, built = [], []
draw = BatchSampler.__next__
def spy(self):
    x, y = draw(self)
    if self.shuffle:  # training batches, not evaluation
        seen.append(x.tolist())
    return x, y
BatchSampler.__next__ = spy
finish = tp.finish
tp.finish = lambda job, state, tracker: built.append(state.raw_model) or finish(job, state, tracker)
tp.train(tp.parse_args(sys.argv[1:]))
rank = os.environ["RANK"]
torch.save({{"seen": seen, "state": built[0].state_dict()}}, os.path.join({out!r}, f"rank{{rank}}.pt"))
"""


@pytest.mark.slow  # torchrun and two trainer processes
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_ddp_two_processes_gloo(tmp_path, env, tiny_flags, optimizer):
    """A run under torchrun with 2 gloo ranks (DDP_PROBE records each rank's batches and final weights)."""
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(DDP_PROBE.format(repo=str(REPO), out=str(tmp_path))))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(probe),
           *tiny_flags, "--max_steps", "4", "--accumulation_steps", "2", "--optimizer", optimizer,
           "--out_dir", str(tmp_path / "run"), "--device", "cpu"]
    result = subprocess.run(cmd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                            cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{i}.pt", weights_only=False) for i in (0, 1))
    assert len(r0["seen"]) == len(r1["seen"]) == 8  # 4 steps x 2 micro-batches
    assert all(a != b for a, b in zip(r0["seen"], r1["seen"], strict=True))  # different data per rank
    assert all(torch.equal(r0["state"][k], r1["state"][k]) for k in r0["state"])  # identical weights
    assert not (tmp_path / "run" / "metrics.jsonl").read_text().count('"step": 4') > 2  # only rank 0 logged
    assert (tmp_path / "run" / "step-000004" / "model.safetensors").is_file()
    saved = torch.load(tmp_path / "run" / "step-000004" / "training_state.pt", weights_only=True)["optimizer"]
    if optimizer == "muon":  # Muon stepped
        assert all(s["momentum_buffer"].abs().sum() > 0 for s in saved["muon"]["state"].values())


@pytest.mark.slow  # torchrun and two trainer processes
def test_ddp_an_out_dir_in_use_or_unwritable_is_one_line(tmp_path, env, tiny_flags):
    """Rank 0 holds the folder: its refusal is the run's one line, not rank 1's traceback at a broken
    barrier."""
    used = tmp_path / "run"
    used.mkdir()
    (used / "notes.txt").write_text("an earlier run's, or the user's")
    (tmp_path / "file").write_text("a file where a folder goes")
    for out, refusal in ((used, f"error: --out_dir {used} is not empty (an earlier run?); continue it"),
                         (tmp_path / "file" / "run", f"error: cannot write {tmp_path / 'file' / 'run'}")):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               *TRAIN[1:], *tiny_flags, "--max_steps", "2", "--out_dir", str(out)]
        result = subprocess.run(cmd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                                cwd=REPO, timeout=300)
        assert result.returncode != 0 and result.stderr.count(refusal) == 1, result.stderr[-3000:]
        assert "[rank1]" not in result.stderr and "[rank0]" not in result.stderr, result.stderr[-3000:]
    assert sorted(p.name for p in used.iterdir()) == ["notes.txt"]


@pytest.mark.slow  # wandb's online start times out (20 s) before the offline one
def test_wandb_that_cannot_start_online_logs_offline_and_the_run_trains(tmp_path, env, tiny_flags):
    """A key and no reachable server: one warning, then the same run id offline, with the sync command."""
    out = tmp_path / "run"
    offline_env = {**env, "WANDB_API_KEY": "0" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"}
    proc = subprocess.run(TRAIN + [str(a) for a in [*tiny_flags, "--out_dir", out, "--max_steps", 2,
                                                     "--eval_interval", 2, "--use_wandb"]],
                          env=offline_env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = (out / ".lock").read_text().split()[-1]
    (offline,) = (out / "wandb").glob(f"offline-run-*-{run_id}")
    assert "warning: wandb could not start online" in proc.stderr
    every_start = out / "wandb" / f"offline-run-*-{run_id}"  # a --resume adds one
    assert f"wandb: logging offline; upload with `wandb sync {every_start}`" in proc.stderr
    assert offline.exists()
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["split"] == "val"] == [2]


def test_after_one_failed_online_start_a_studys_later_runs_go_offline_at_once(tmp_path, monkeypatch):
    """Each online start waits up to 20 s: a study of many runs in one process pays it once."""
    import wandb

    from trainer.tracking import Tracker

    class OfflineRun:
        offline, id = True, "runid"
        dir = str(tmp_path / "wandb" / "offline-run-1-runid" / "files")

        def define_metric(self, *args, **kwargs):
            pass

        def finish(self, **kwargs):
            pass

    modes = []

    def init(mode, **kwargs):
        modes.append(mode)
        if mode == "online":
            raise TimeoutError("no network")
        return OfflineRun()
    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.setattr(wandb, "teardown", lambda: None)
    monkeypatch.setattr(Tracker, "online_failed", False)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        Tracker(tmp_path / run, True, {}, "p", run, None, "runid").close()
    assert modes == ["online", "offline", "offline"]
