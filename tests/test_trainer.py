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
from common.cli import run_cli
from trainer.args import parse_args
from trainer.optim import OPTIMIZERS
from trainer.tracking import compact, read_metrics

REPO = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(REPO / "trainer" / "train_pretrain.py")]


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    """Subprocess environment: a private token cache, and no wandb credentials or mode from the host."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    e["MINIMIND_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    e["HOME"] = str(tmp_path_factory.mktemp("home"))  # no ~/.netrc with a wandb key
    return e


@pytest.fixture
def tiny_args(tiny_flags, env, monkeypatch):
    """The tiny model's flags; the token cache of the subprocesses serves the in-process runs too."""
    monkeypatch.setenv("MINIMIND_CACHE", env["MINIMIND_CACHE"])
    return tiny_flags


def run(args, env, **kw):
    """The trainer's command line in a fresh process."""
    return subprocess.run(TRAIN + [str(a) for a in args], env=env, capture_output=True, text=True, cwd=REPO, **kw)


def refused(args, capsys) -> tuple[int, list[str]]:
    """The trainer's command line in this process, for a run that must stop with an error: the exit status and
    the lines written to stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: tp.main([str(a) for a in args]))
    return stopped.value.code, capsys.readouterr().err.strip().splitlines()


def train_in_process(args) -> dict:
    return tp.train(parse_args([str(a) for a in args]))


def losses(out_dir, split="train"):
    return [r["loss"] for r in read_metrics(Path(out_dir) / "metrics.jsonl") if r["split"] == split]


def test_a_run_prints_each_evaluation_and_ends_in_one_line_saying_what_to_run_next(tmp_path, tiny_args, capsys):
    out = tmp_path / "run"
    summary = train_in_process([*tiny_args, "--out_dir", out, "--max_steps", 8, "--eval_interval", 4])
    printed = capsys.readouterr().out.strip().splitlines()
    val = [r for r in read_metrics(out / "metrics.jsonl") if r["split"] == "val"]
    evals = [line for line in printed if line.startswith("step ")]
    assert [line.split(" | ")[:2] for line in evals] == [
        [f"step {r['step']}/8: val loss {r['loss']:.3f}, {r['bpb']:.3f} bits/byte", f"{r['tokens']:,} tokens"]
        for r in val] and val[-1]["tokens"] == 8 * 4 * 32
    closing = printed[-1]
    assert closing.startswith(f"done: step 8/8, val loss {summary['val_loss']:.3f}, {summary['val_bpb']:.3f} "
                              f"bits/byte, {summary['tokens_per_s']:,.0f} tokens/s, ")
    assert f"| checkpoint {out / 'checkpoint'} | next: " in closing
    # the next commands are eval_llm.py command lines that parse, on this run and its corpus
    commands = [shlex.split(command) for command in closing.split(" | next: ")[1].split(" ; ")]
    assert [command[:2] for command in commands] == [["python", "eval_llm.py"]] * 2
    generate, evaluate = (eval_llm.parse_args(command[2:]) for command in commands)
    assert generate.model_path == evaluate.model_path == str(out) and generate.prompt
    assert evaluate.eval_data == tiny_args[tiny_args.index("--data_path") + 1]


def test_metrics_keep_per_layer_arrays_to_five_digits_and_every_scalar_exact(trained_run):
    assert compact({"step": 3, "split": "train", "loss": 1.23456789, "mfu": None,
                    "layers": [0.123456789, 98765.4321, None, 7, [2.4681357e-7]]}) == {
        "step": 3, "split": "train", "loss": 1.23456789, "mfu": None, "layers": [0.12346, 98765.0, None, 7, [2.4681e-7]]}
    records = read_metrics(trained_run / "metrics.jsonl")
    arrays = [v for r in records for value in r.values() if isinstance(value, list) for v in value]
    assert arrays and all(v == float(f"{v:.5g}") for v in arrays)
    assert any(r["loss"] != float(f"{r['loss']:.5g}") for r in records)  # the losses keep all their digits
    summary = json.loads((trained_run / "summary.json").read_text())
    assert summary["val_loss"] == [r["loss"] for r in records if r["split"] == "val"][-1]


def test_a_corpus_the_tokenizer_covers_poorly_gets_one_warning(tmp_path, tiny_args, capsys):
    chinese = tmp_path / "zh.jsonl"  # a tokenizer trained on The Tempest spells Chinese out byte by byte
    poem = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
    chinese.write_text("".join(json.dumps({"text": poem * (3 + i % 5)}, ensure_ascii=False) + "\n"
                               for i in range(120)), encoding="utf-8")
    train_in_process([*tiny_args, "--data_path", chinese, "--out_dir", tmp_path / "run", "--max_steps", 1])
    warnings = [line for line in capsys.readouterr().err.splitlines() if "covers this corpus poorly" in line]
    assert len(warnings) == 1 and "scripts/train_tokenizer.py" in warnings[0] and "--tokenizer_path" in warnings[0]
    train_in_process([*tiny_args, "--out_dir", tmp_path / "english", "--max_steps", 1])  # the corpus it was made for
    assert "covers this corpus poorly" not in capsys.readouterr().err


def test_short_run_loss_falls_and_checkpoint_loads(trained_run):
    out = trained_run  # 40 steps, logged every 5, evaluated every 20
    train, val = losses(out), losses(out, "val")
    assert len(train) == 8 and len(val) == 2
    assert train[-1] < train[0] - 0.5 and val[-1] < val[0]
    records = read_metrics(out / "metrics.jsonl")
    last = [r for r in records if r["split"] == "train"][-1]
    assert len(last["residual_rms"]) == 2 and len(last["layer_grad_norm"]) == 2
    assert all(v > 0 for v in last["residual_rms"] + last["layer_grad_norm"])
    assert last["tokens_per_s"] > 0 and last["peak_mem_mb"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 40 and not summary["diverged"] and summary["val_bpb"] > 0
    loaded = AutoModelForCausalLM.from_pretrained(out / "checkpoint")
    assert loaded.config.hidden_size == 32
    assert (out / "checkpoint" / "tokenizer.json").is_file()
    assert not (out / "layers.png").exists()  # --no_layers_plot (the tiny flags); test_diagnostics draws one


def straight_and_in_halves(tmp_path, tiny_args, resume) -> tuple[list, Path, Path]:
    """8 steps straight, and 4 steps then a --resume to 8 on the same schedule, the resume run by resume(flags)."""
    common = [*tiny_args, "--log_interval", 1, "--eval_interval", 100, "--save_interval", 100,
              "--learning_rate", 3e-3, "--warmup_steps", 2]
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    train_in_process([*common, "--out_dir", straight, "--max_steps", 8])
    train_in_process([*common, "--out_dir", halves, "--max_steps", 4, "--lr_decay_steps", 8])
    resume([*common, "--out_dir", halves, "--max_steps", 8, "--lr_decay_steps", 8, "--resume"])
    return common, straight, halves


def assert_same_run(straight, halves):
    assert len(losses(straight)) == 8
    assert losses(halves) == losses(straight)  # bit-identical, step by step
    a = load_file(straight / "checkpoint" / "model.safetensors")
    b = load_file(halves / "checkpoint" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("optimizer, change, refusal", [
    ("adamw", ["--batch_size", 2], "--batch_size"),
    ("muon", ["--optimizer", "adamw"], "--resume: the checkpoint was trained with --optimizer muon"),
])
def test_exact_resume(tmp_path, tiny_args, capsys, optimizer, change, refusal):
    """Bit for bit, so every optimizer state (AdamW's moments, Muon's momenta) comes back from the checkpoint."""
    flags = [*tiny_args, "--optimizer", optimizer]
    common, straight, halves = straight_and_in_halves(tmp_path, flags, train_in_process)
    assert_same_run(straight, halves)
    assert sorted(p.name for p in halves.iterdir() if p.name.startswith("step-")) == ["step-000004", "step-000008"]
    saved = torch.load(halves / "checkpoint" / "training_state.pt", weights_only=False)["optimizer"]
    if optimizer == "muon":  # both states, Muon's with a momentum for each of the 7 matrices of the 2 blocks
        assert set(saved) == {"adamw", "muon"} and len(saved["muon"]["state"]) == 7 * 2

    # a flag that would not continue the same run: refused in one line, checkpoint untouched
    status, lines = refused([*common, "--out_dir", halves, "--max_steps", 12, "--resume", *change], capsys)
    assert status == 2 and lines[-1].startswith("error: ") and refusal in lines[-1]
    assert (halves / "checkpoint").resolve().name == "step-000008"


def test_a_real_divergence_stops_in_one_line_and_keeps_the_last_finite_checkpoint(tmp_path, tiny_args, capsys):
    """An lr of 1e6 without a norm or clipping: the loss really goes non-finite (nothing patched)."""
    out = tmp_path / "run"
    status, lines = refused([*tiny_args, "--out_dir", out, "--max_steps", 60, "--save_interval", 1,
                             "--log_interval", 1, "--learning_rate", 1e6, "--warmup_steps", 3, "--grad_clip", 0,
                             "--norm", "none"], capsys)
    assert status == 2 and lines[-1].startswith("error: the loss, gradient or weights became non-finite")
    assert "learning_rate" in lines[-1] and "the last checkpoint (step-" in lines[-1] and "--resume" in lines[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["diverged"] and 1 <= summary["step"] < 60
    state = torch.load(out / "checkpoint" / "training_state.pt", weights_only=False)
    assert state["step"] == summary["step"]  # the last completed step; the failing one never touched the weights
    assert all(torch.isfinite(t).all() for t in load_file(out / "checkpoint" / "model.safetensors").values())


@pytest.mark.slow  # a fresh interpreter for the second half
def test_exact_resume_in_a_fresh_process(tmp_path, env, tiny_args):
    """The same, with the second half in another process: only what the checkpoint holds carries over."""
    def in_a_fresh_process(flags):
        result = run(flags, env)
        assert result.returncode == 0, result.stderr[-2000:]

    _, straight, halves = straight_and_in_halves(tmp_path, tiny_args, in_a_fresh_process)
    assert_same_run(straight, halves)


@pytest.mark.slow  # an inductor compile
def test_compiled_model_trains_like_eager(tmp_path, tiny_args, fresh_dynamo):
    common = [*tiny_args, "--max_steps", 3, "--log_interval", 1, "--eval_interval", 3, "--warmup_steps", 1]
    train_in_process([*common, "--out_dir", tmp_path / "eager"])
    train_in_process([*common, "--out_dir", tmp_path / "compiled", "--compile"])
    assert losses(tmp_path / "compiled") == pytest.approx(losses(tmp_path / "eager"), abs=1e-4)


@pytest.mark.slow  # a fresh process (test_run_faults stops a run with SIGTERM in-process)
def test_sigterm_saves_checkpoint_and_exits_zero(tmp_path, env, tiny_args):
    out = tmp_path / "run"
    proc = subprocess.Popen(TRAIN + [str(a) for a in [*tiny_args, "--out_dir", out, "--max_steps", 100000,
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
    loaded = AutoModelForCausalLM.from_pretrained(out / "checkpoint")
    state = torch.load(out / "checkpoint" / "training_state.pt", weights_only=False)
    assert state["step"] == summary["step"] and loaded.config.num_hidden_layers == 2


def wandb_records(path: Path) -> list:
    """The records of an offline run's .wandb file: a LevelDB-style log (32 KiB blocks; each chunk a 7-byte header,
    crc32c, length and type: whole, first, middle or last piece of a record) after a 7-byte file header, each record
    a wandb_internal_pb2.Record."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, records, pieces, pos = path.read_bytes(), [], b"", 7
    while pos + 7 <= len(data):
        left_in_block = 32 * 1024 - pos % (32 * 1024)
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if left_in_block < 7 or kind == 0:  # block padding
            pos += left_in_block
            continue
        pieces = (b"" if kind in (1, 2) else pieces) + data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(Record.FromString(pieces))
    return records


@pytest.mark.slow  # a fresh interpreter and wandb's own service process
def test_metrics_file_and_offline_wandb_run(tmp_path, env, tiny_flags_drawing_layers):
    out = tmp_path / "run"
    result = run([*tiny_flags_drawing_layers, "--out_dir", out, "--max_steps", 6, "--log_interval", 2, "--eval_interval", 3,
                  "--use_wandb", "--wandb_group", "g1", "--wandb_run_name", "probe", "--wandb_job", "grid",
                  "--norm_position", "peri", "--qk_norm", "head"], env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(losses(out)) == 3 and len(losses(out, "val")) == 2
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    records = wandb_records(next(runs[0].glob("*.wandb")))
    run_record = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run_record.run_group, run_record.display_name) == ("g1", "probe")
    assert {"variant=peri+qk_head-rmsnorm", "job=grid", "layers=2", "norm_type=rmsnorm", "norm_position=peri",
            "qk_norm=head", "v_norm=none", "sub_norm=False"} <= set(run_record.tags)
    # every key we logged (train, per-layer, validation), each under its split
    logged = {item.nested_key[0] if item.nested_key else item.key
              for r in records if r.WhichOneof("record_type") == "history" for item in r.history.item}
    assert {"train/loss", "train/grad_norm", "train/tokens_per_s", "train/residual_rms/01",
            "train/layer_grad_norm/00", "val/loss", "val/bpb"} <= logged, logged
    # the run's summary keeps the lowest validation loss, whichever evaluation it came from
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update({tuple(u.nested_key) or (u.key,): json.loads(u.value_json) for u in r.summary.update})
    assert summary[("val/loss",)] == {"min": pytest.approx(min(losses(out, "val")))}
    assert list(runs[0].glob("files/media/images/layers_*.png"))  # the per-layer figure, as a wandb.Image


@pytest.mark.parametrize("flags,needle", [
    (["--max_steps", "-5"], "--max_steps"),
    (["--norm", "groupnorm"], "--norm"),
    (["--batch_size", "0"], "--batch_size"),
    (["--num_attention_heads", "3"], "--num_attention_heads"),
])
def test_bad_flags_one_line(tmp_path, tiny_args, flags, needle, capsys):
    out = tmp_path / "never"
    status, lines = refused([*tiny_args, "--out_dir", out, *flags], capsys)
    assert status == 2
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
    assert not out.exists()


def test_unwritable_out_dir(tmp_path, tiny_args, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    status, lines = refused([*tiny_args, "--out_dir", blocker / "run"], capsys)
    assert status == 2 and len(lines) == 1 and "not writable" in lines[0]


DDP_PROBE = """
import os, sys, torch
sys.path.insert(0, {repo!r})
import trainer.train_pretrain as tp
from data import BatchSampler

seen, built = [], []
draw = BatchSampler.__next__
def spy(self):
    x, y = draw(self)
    if not self.sequential:
        seen.append(x.tolist())
    return x, y
BatchSampler.__next__ = spy
build = tp.build_model
tp.build_model = lambda *a: built.append(build(*a)) or built[-1]
tp.train(tp.parse_args(sys.argv[1:]))
torch.save({{"seen": seen, "state": built[0].state_dict()}}, os.path.join({out!r}, f"rank{{os.environ['RANK']}}.pt"))
"""


@pytest.mark.slow  # torchrun and two trainer processes
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_ddp_two_processes_gloo(tmp_path, env, tiny_args, optimizer):
    """A run under torchrun with 2 gloo ranks (DDP_PROBE records each rank's batches and final weights)."""
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(DDP_PROBE.format(repo=str(REPO), out=str(tmp_path))))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(probe),
           *tiny_args, "--max_steps", "4", "--accumulation_steps", "2", "--optimizer", optimizer,
           "--out_dir", str(tmp_path / "run"), "--device", "cpu"]
    result = subprocess.run(cmd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, cwd=REPO,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{i}.pt", weights_only=False) for i in (0, 1))
    assert len(r0["seen"]) == len(r1["seen"]) == 9  # 4 steps x 2 micro-batches, and the next one drawn ahead
    assert all(a != b for a, b in zip(r0["seen"], r1["seen"], strict=True))  # different data per rank
    assert all(torch.equal(r0["state"][k], r1["state"][k]) for k in r0["state"])  # identical weights
    assert not (tmp_path / "run" / "metrics.jsonl").read_text().count('"step": 4') > 2  # only rank 0 logged
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").is_file()
    saved = torch.load(tmp_path / "run" / "checkpoint" / "training_state.pt", weights_only=False)["optimizer"]
    if optimizer == "muon":  # Muon stepped
        assert all(s["momentum_buffer"].abs().sum() > 0 for s in saved["muon"]["state"].values())


def test_a_cpu_run_computes_without_subnormal_floats(trained_run):
    # A model stuck at a plateau (DyT or Derf at this size) fills its activations with subnormals, which CPUs
    # compute ~7x slower; the trainer flushes them to zero on CPU (healthy runs are bit-identical either way).
    assert (torch.tensor([1e-30]) * 1e-10).item() == 0.0  # 1e-40 is subnormal in float32
