"""eval_llm.py in-process: loading a run or checkpoint, generation (streamed, seeded, with and without the KV
cache), held-out evaluation, --compare, and bad input (exported families: extras/tests/)."""

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import eval_llm
from common.cli import UserError, run_cli
from data import DEFAULT_TOKENIZER_DIR, bits_per_byte, load_tokenizer, prepare_split
from eval_llm import DEFAULT_PROMPTS, Sampling, compare, evaluate_split, generate_text, load, main
from model import MiniMindConfig, MiniMindForCausalLM

TINY = {"vocab_size": 400, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1}
GREEDY = Sampling(temperature=0, max_new_tokens=16)
PROMPT = "**PROSPERO**  \nThou"
TABLE_HEADER = ["checkpoint", "variant", "loss", "ppl", "bpb"]


@pytest.fixture(scope="module")
def post_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """An untrained Post-LayerNorm checkpoint: a second norm variant to compare with. Its weights are drawn
    10x wider than usual so that its greedy choices depend on every prompt token, as a trained model's do."""
    path = tmp_path_factory.mktemp("runs") / "ln-post"
    torch.manual_seed(0)
    config = MiniMindConfig(**TINY, norm_type="layernorm", norm_position="post", initializer_range=0.2)
    MiniMindForCausalLM(config).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


def greedy_by_generate(lm, ids: list[int], max_new: int, tokenizer) -> str:
    """model.generate's own greedy continuation of ids."""
    ids = torch.tensor([ids])
    out = lm.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_greedy_equals_model_generate_after_bos(post_dir):
    """On post_dir, whose greedy continuation changes without the bos (the trained run's does not)."""
    lm, tokenizer = load(post_dir)
    ids = [tokenizer.bos_token_id] + tokenizer.encode(PROMPT, add_special_tokens=False)
    assert generate_text(lm, tokenizer, PROMPT, GREEDY) == greedy_by_generate(lm, ids, 16, tokenizer)


@pytest.mark.parametrize("sampling", [
    Sampling(temperature=0, max_new_tokens=24),
    Sampling(temperature=0.9, top_p=0.95, top_k=50, seed=3, max_new_tokens=24),
], ids=["greedy", "sampled"])
def test_the_cli_prints_the_seeded_continuation_the_same_with_and_without_the_kv_cache(trained_run, capsys,
                                                                                       sampling):
    lm, tokenizer = load(trained_run)
    expected = generate_text(lm, tokenizer, PROMPT, sampling)
    assert len(expected) > 10 and generate_text(lm, tokenizer, PROMPT, sampling) == expected
    if sampling.temperature:
        greedy = generate_text(lm, tokenizer, PROMPT, replace(sampling, temperature=0))
        assert expected != greedy
        assert generate_text(lm, tokenizer, PROMPT, replace(sampling, seed=4)) != expected  # seeded
        assert generate_text(lm, tokenizer, PROMPT, replace(sampling, top_k=1)) == greedy  # the likeliest
    flags = [arg for name in ("temperature", "top_p", "top_k", "seed")
             for arg in (f"--{name}", str(getattr(sampling, name)))]
    argv = ["--device", "cpu", "--model_path", str(trained_run), "--prompt", PROMPT, "--max_new_tokens", "24",
            *flags]
    capsys.readouterr()
    for kv_cache in ([], ["--no_kv_cache"]):
        main([*argv, *kv_cache])  # the prompt, then the continuation as it is streamed
        assert capsys.readouterr().out == PROMPT + expected + "\n\n"


def test_long_prompt_is_cut_from_the_left(tiny_tokenizer, capsys):
    torch.manual_seed(0)
    lm = MiniMindForCausalLM(MiniMindConfig(**TINY, max_position_embeddings=24)).eval()
    prompt = "Full fathom five thy father lies; of his bones are coral made. " * 3
    ids = [tiny_tokenizer.bos_token_id] + tiny_tokenizer.encode(prompt, add_special_tokens=False)
    assert len(ids) > 16
    text = generate_text(lm, tiny_tokenizer, prompt, Sampling(temperature=0, max_new_tokens=8))
    warnings = capsys.readouterr().err.splitlines()
    cut = (f"warning: prompt of {len(ids) - 1} tokens cut to its last 15: the model's context is 24 "
           "tokens, one is bos")
    assert len(warnings) == 1 and warnings[0].startswith(cut)
    # bos, then the prompt's end
    assert text == greedy_by_generate(lm, ids[:1] + ids[-15:], 8, tiny_tokenizer)
    # echoed as the model saw it, not as given
    generate_text(lm, tiny_tokenizer, prompt, Sampling(temperature=0, max_new_tokens=8), stream=True)
    assert capsys.readouterr().out == "…" + tiny_tokenizer.decode(ids[-15:]) + text + "\n"
    # room for bos alone would cut the prompt to nothing: refused, naming the most that fits
    for max_new_tokens in (23, 24):
        with pytest.raises(UserError, match="no room for the prompt in the model's context of 24 "
                                            r"tokens \(one is bos\): pass at most 22$"):
            generate_text(lm, tiny_tokenizer, prompt, Sampling(temperature=0, max_new_tokens=max_new_tokens))
    # an empty prompt needs bos alone
    generate_text(lm, tiny_tokenizer, "", Sampling(temperature=0, max_new_tokens=23))


def test_evaluate_split_equals_direct_cross_entropy(trained_run, tiny_corpus):
    lm, tokenizer = load(trained_run)
    seq_len, batch_size = 16, 3
    split = prepare_split(tiny_corpus, "validation", tokenizer)
    tokens = torch.from_numpy(split.tokens.astype("int64"))
    windows = (len(tokens) - 1) // seq_len
    assert windows % batch_size, "the last batch should be a partial one"
    with torch.no_grad():
        nll = [F.cross_entropy(lm(input_ids=tokens[None, k * seq_len : (k + 1) * seq_len]).logits[0],
                               tokens[k * seq_len + 1 : (k + 1) * seq_len + 1], reduction="sum").item()
               for k in range(windows)]
    expected = sum(nll) / (windows * seq_len)

    metrics = evaluate_split(lm, tokenizer, tiny_corpus, batch_size=batch_size, seq_len=seq_len)
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["ppl"] == pytest.approx(math.exp(expected), rel=1e-5)
    assert metrics["bpb"] == pytest.approx(bits_per_byte(expected, split.bytes_per_token), rel=1e-5)
    assert metrics["tokens"] == windows * seq_len
    first = evaluate_split(lm, tokenizer, tiny_corpus, batch_size=batch_size, seq_len=seq_len, max_batches=1)
    assert first["loss"] == pytest.approx(sum(nll[:batch_size]) / (batch_size * seq_len), rel=1e-5)
    assert first["tokens"] == batch_size * seq_len
    # A limit beyond the split's end means the whole split, never a window twice.
    assert evaluate_split(lm, tokenizer, tiny_corpus, batch_size=batch_size, seq_len=seq_len,
                          max_batches=1000)["loss"] == pytest.approx(expected, rel=1e-5)


def test_compare_uses_one_seed_and_leaves_out_a_run_without_a_checkpoint(trained_run, post_dir, tiny_corpus,
                                                                         tmp_path, capsys):
    """A study's run that diverged before its first save has records but no checkpoint: it is named in a
    warning and left out, and the others are compared; when none loads, one error line and exit status 2."""
    prompts = [PROMPT, "**ARIEL**  \n"]
    sampled, greedy = Sampling(temperature=1.0, seed=7, max_new_tokens=12), replace(GREEDY, max_new_tokens=12)
    results = compare([trained_run, post_dir], prompts, sampled)
    expected_greedy = {}
    for path, result in zip([trained_run, post_dir], results, strict=True):
        lm, tokenizer = load(path)
        assert result.continuations == [generate_text(lm, tokenizer, p, sampled) for p in prompts]
        expected_greedy[path.name] = [generate_text(lm, tokenizer, p, greedy) for p in prompts]

    diverged = tmp_path / "diverged"
    diverged.mkdir()
    (diverged / "metrics.jsonl").write_text("")
    flags = ["--device", "cpu", *(a for p in prompts for a in ("--prompt", p)), "--temperature", "0",
             "--max_new_tokens", "12", "--eval_data", tiny_corpus, "--seq_len", "16"]
    capsys.readouterr()
    main([*flags, "--model_path", str(trained_run), "--compare", str(diverged), str(post_dir)])
    out, err = capsys.readouterr()
    blocks = out.split("=== prompt ")[1:]
    assert len(blocks) == len(prompts) and "--- diverged" not in out
    for i, block in enumerate(blocks):
        assert block.startswith(f"{i + 1} ===\n{prompts[i]}\n")
        assert f"--- rms-pre (pre-rmsnorm) ---\n{expected_greedy['rms-pre'][i]}\n" in block
        assert f"--- ln-post (post-layernorm) ---\n{expected_greedy['ln-post'][i]}\n" in block
    header, trained, skipped, untrained = (line.split() for line in out.strip().splitlines()[-4:])
    assert header == TABLE_HEADER and skipped == ["diverged", "not", "loaded", "—", "—", "—"]
    assert trained[:2] == ["rms-pre", "pre-rmsnorm"] and untrained[:2] == ["ln-post", "post-layernorm"]
    # The trained checkpoint predicts the held-out text better than the untrained one.
    assert float(trained[2]) < float(untrained[2])
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [
        f"warning: left out of the comparison: {diverged}: no checkpoint (no config.json, no step-N folder); "
        "has the run saved one?"]

    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: main([*flags, "--compare", str(diverged)]))
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == ""
    assert [line for line in err.splitlines() if line.startswith("error:")] == err.splitlines()[-1:] == [
        "error: nothing to compare: no model could be loaded and run (the warnings above say why)"]


def test_eval_data_alone_on_a_run_of_other_data_warns_that_it_measures_the_plays(
        trained_run, post_dir, tiny_corpus, tmp_path, capsys):
    step = next(p for p in trained_run.iterdir() if p.name.startswith("step-"))
    assert eval_llm.trained_on(trained_run) == eval_llm.trained_on(step) == tiny_corpus
    assert eval_llm.trained_on(post_dir) is None  # a model folder: no run's record
    # a run of another field: eval_llm reads the field it is told, not the run's
    summary = json.loads((trained_run / "summary.json").read_text())
    summary["args"]["text_field"] = "body"
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert eval_llm.trained_on(tmp_path) == f"{tiny_corpus} --text_field body"
    # a run still training, or killed, has no summary yet: its newest step's state that loads
    killed = tmp_path / "killed"
    shutil.copytree(step, killed / step.name)
    (killed / "step-000060").mkdir()
    (killed / "step-000060" / "training_state.pt").write_bytes(b"PK\x03\x04 cut short")
    (killed / "summary.json").write_text(json.dumps({"args": None}))  # not the trainer's
    assert eval_llm.trained_on(killed) == tiny_corpus
    capsys.readouterr()
    main(["--device", "cpu", "--model_path", str(step), "--eval_data", "--eval_batches", "1"])
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")] == [
        f"warning: rms-pre was trained on {tiny_corpus}; --eval_data alone measures the held-out plays "
        f"(--eval_data {tiny_corpus}: its own)"]
    main(["--device", "cpu", "--model_path", str(step), "--eval_data", tiny_corpus, "--eval_batches", "1"])
    assert "warning:" not in capsys.readouterr().err


def test_eval_data_on_a_run_gives_the_val_loss_it_printed_over_its_own_windows(
        trained_run, post_dir, tiny_corpus, monkeypatch, capsys):
    """A run's windows may be longer than another model's default (a GPU run at --max_seq_len 512):
    by default eval_llm reads the run's, and its loss is the trainer's last val loss."""
    monkeypatch.setattr(eval_llm, "DEFAULT_SEQ_LEN", 16)  # below the run's 32
    summary = json.loads((trained_run / "summary.json").read_text())
    capsys.readouterr()
    main(["--device", "cpu", "--model_path", str(trained_run), "--eval_data", tiny_corpus])
    loss = capsys.readouterr().out.splitlines()[-1].split()[2]
    assert float(loss) == pytest.approx(summary["val_loss"], abs=5e-5)
    assert summary["args"]["max_seq_len"] == 32
    # a model no run recorded: the default, at most its context
    assert eval_llm.with_windows_of(post_dir, {"seq_len": None})["seq_len"] is None


def test_compare_leaves_out_a_model_too_short_for_the_windows_and_warns_of_unequal_ones(
        trained_run, tiny_tokenizer, tiny_corpus, tmp_path, capsys):
    longer = tmp_path / "context64"
    MiniMindForCausalLM(MiniMindConfig(**TINY, max_position_embeddings=64)).save_pretrained(longer)
    tiny_tokenizer.save_pretrained(longer)
    flags = ["--device", "cpu", "--prompt", PROMPT, "--max_new_tokens", "4", "--eval_data", tiny_corpus,
             "--eval_batches", "1", "--compare", str(trained_run), str(longer)]
    capsys.readouterr()
    main(flags)  # by default, windows as long as each context allows: the run's 32, 64 for the other
    assert "warning: the losses are over windows of different lengths (rms-pre 32, context64 64 tokens), " \
        "and a longer window's tokens see more context: pass one --seq_len" in capsys.readouterr().err
    main([*flags, "--seq_len", "48"])  # longer than the run's context: it is left out, the other compared
    out, err = capsys.readouterr()
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [
        "warning: left out of the comparison: --seq_len 48 is longer than the model's context of 32 tokens"]
    left_out, compared = (line.split() for line in out.strip().splitlines()[-2:])
    assert left_out == ["rms-pre", "pre-rmsnorm", "—", "—", "—"]
    assert compared[:2] == ["context64", "pre-rmsnorm"] and compared[2] != "—"


@pytest.mark.parametrize("flags, message", [
    (["--temperature=-1"], "argument --temperature: invalid non_negative value: '-1' (see --help)"),
    (["--temperature", "nan"], "argument --temperature: invalid non_negative value: 'nan' (see --help)"),
    (["--top_p", "nan"], "argument --top_p: invalid probability value: 'nan' (see --help)"),
    (["--top_p", "2"], "argument --top_p: invalid probability value: '2' (see --help)"),
    (["--top_p", "0"], "argument --top_p: invalid probability value: '0' (see --help)"),
    (["--top_k=-2"], "argument --top_k: invalid count value: '-2' (see --help)"),
    (["--top_k", "2.5"], "argument --top_k: invalid count value: '2.5' (see --help)"),  # transformers: ints
    (["--repetition_penalty", "inf"],
     "argument --repetition_penalty: invalid positive_float value: 'inf' (see --help)"),
    (["--repetition_penalty", "0"],  # transformers' generate raises on it, deep in a traceback
     "argument --repetition_penalty: invalid positive_float value: '0' (see --help)"),
    (["--max_new_tokens", "0"], "argument --max_new_tokens: invalid positive_int value: '0' (see --help)"),
    (["--eval_batches", "0"], "argument --eval_batches: invalid positive_int value: '0' (see --help)"),
    (["--seq_len=-3"], "argument --seq_len: invalid positive_int value: '-3' (see --help)"),
    ([], "give --model_path DIR, or --compare DIR [DIR ...] (see --help)"),
    (["--text_field", "body", "--seq_len", "64"],
     "--text_field, --seq_len set the held-out evaluation: add --eval_data [PATH]"),
])
def test_a_bad_flag_is_refused_in_one_line(flags, message):
    with pytest.raises(UserError) as err:
        eval_llm.parse_args([*(["--model_path", "x"] if flags else ["--prompt", "Hi"]), *flags])
    assert str(err.value) == message


@pytest.mark.parametrize("case", ["missing", "a file", "a .pth", "MiniMind's out", "no weights",
                                  "tokenizer too big", "tokenizer too small", "no room", "the runs' folder"])
def test_bad_input_is_one_error_line(case, trained_run, tiny_tokenizer_dir, tmp_path, capsys):
    """A tokenizer of another size than the vocabulary is the wrong one (the trainer sizes them alike)."""
    MiniMindConfig(**TINY).save_pretrained(tmp_path / "weightless")
    (tmp_path / "minimind-out").mkdir()
    torch.save({}, tmp_path / "minimind-out" / "pretrain_512.pth")  # what MiniMind's trainers save
    importer = (".pth weights without a config.json (what MiniMind's trainers save); import them into a "
                "model folder with extras/interop/convert_from_minimind.py first")
    MiniMindForCausalLM(MiniMindConfig(**{**TINY, "vocab_size": 512})).save_pretrained(tmp_path / "vocab512")
    args, expected = {
        "missing": (["--model_path", tmp_path / "nope"], "no such folder"),
        "a file": (["--model_path", tmp_path / "weightless" / "config.json"], "a file, not a folder"),
        "a .pth": (["--model_path", tmp_path / "minimind-out" / "pretrain_512.pth"], importer),
        "MiniMind's out": (["--model_path", tmp_path / "minimind-out"], importer),
        "no weights": (["--model_path", tmp_path / "weightless", "--tokenizer_path", tiny_tokenizer_dir],
                       "no checkpoint loads (weightless: "),
        "tokenizer too big": (["--model_path", trained_run, "--tokenizer_path", DEFAULT_TOKENIZER_DIR],
                              f"has {len(load_tokenizer(DEFAULT_TOKENIZER_DIR))} tokens but the model's "
                              "vocabulary has 400; leave --tokenizer_path out to use the model folder's own"),
        # the model folder has no tokenizer of its own: leaving the flag out is no advice
        "tokenizer too small": (["--model_path", tmp_path / "vocab512", "--tokenizer_path",
                                 tiny_tokenizer_dir], "has 400 tokens but the model's vocabulary has 512; "
                                                      "pass the tokenizer it was trained with"),
        # 100 new tokens in a 32-token context: refused before the prompt is echoed
        "no room": (["--model_path", trained_run, "--max_new_tokens", 100],
                    "--max_new_tokens 100 leaves no room for the prompt"),
        # the --out_dir's parent, e.g. `out`, given for a run in it
        "the runs' folder": (["--model_path", tmp_path / "runs"], "runs: holds runs, not a checkpoint; "
                             f"pass one of them ({tmp_path / 'runs' / 'a'})"),
    }[case]
    (tmp_path / "runs" / "a" / "step-000040").mkdir(parents=True)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: main([*map(str, args), "--device", "cpu", "--prompt", "Hi"]))
    out, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert stopped.value.code == 2 and out == "" and line.startswith("error: ") and expected in line, err


def test_the_default_generation_fits_a_short_context(trained_run, tiny_corpus, monkeypatch, capsys):
    """--max_new_tokens left out: 100, or half the model's context where that is less (16 of this run's 32).
    A fixed 100 refused every prompt here, and --compare then left the model out of its --eval_data table."""
    asked = []
    monkeypatch.setattr(MiniMindForCausalLM, "generate", lambda self, ids, **options: (
        asked.append(options["max_new_tokens"]) or torch.cat([ids, ids[:, -1:]], 1)))
    main(["--device", "cpu", "--compare", str(trained_run), "--eval_data", tiny_corpus, "--seq_len", "16"])
    out, err = capsys.readouterr()
    assert asked == [16] * len(DEFAULT_PROMPTS) and "left out" not in err  # (long prompts are cut)
    assert out.strip().splitlines()[-1].split()[:2] == ["rms-pre", "pre-rmsnorm"]


def test_a_tokenizer_of_the_same_size_but_other_content_is_refused(trained_run, tiny_tokenizer_dir,
                                                                    other_tokenizer_dir):
    """Its size matches the vocabulary, so only its content tells: it would split text otherwise."""
    with pytest.raises(UserError, match=r"^\S+step-000040: the tokenizer \(fingerprint \w+\) is not the one "
                                        r"its model was trained with \(\w+\); pass that one with"):
        eval_llm.load(trained_run, other_tokenizer_dir)
    assert eval_llm.load(trained_run, tiny_tokenizer_dir)[1] is not None  # the same content, elsewhere


def test_a_diverged_model_has_infinite_perplexity(tiny_tokenizer, tiny_corpus):
    torch.manual_seed(0)
    lm = MiniMindForCausalLM(MiniMindConfig(**TINY, tie_word_embeddings=False)).eval()
    with torch.no_grad():
        lm.lm_head.weight.mul_(1e4)  # logits in the thousands: a loss whose exp overflows a float
    metrics = evaluate_split(lm, tiny_tokenizer, tiny_corpus, batch_size=4, seq_len=16, max_batches=1)
    assert metrics["loss"] > 710 and metrics["ppl"] == math.inf and math.isfinite(metrics["bpb"])
    table = eval_llm.format_metrics_table([eval_llm.Result("diverged", "pre-rmsnorm", [], metrics)])
    row = table.splitlines()[1]
    assert row.split()[3] == "inf"
