"""eval_llm.py in-process: loading a run or checkpoint, generation (streamed, seeded, with and without the KV
cache), held-out evaluation, --compare, exported families, and bad input."""

import io
import math
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import eval_llm
from common.cli import UserError, run_cli
from data import DEFAULT_TOKENIZER_DIR, bits_per_byte, load_tokenizer, prepare_split
from eval_llm import Sampling, compare, evaluate_split, generate_text, load, main
from model import MiniMindConfig, MiniMindForCausalLM
from scripts import convert_to_hf

TINY = {"vocab_size": 400, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1}
GREEDY = Sampling(temperature=0, max_new_tokens=16)
PROMPT = "**PROSPERO**  \nThou"


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    """A private token cache for this module's evaluations."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINIMIND_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def run_dir(trained_run) -> Path:
    """The trainer's --out_dir after a short real run (conftest.py): checkpoint -> step-000040/, named rms-pre."""
    assert (trained_run / "checkpoint").resolve().name == "step-000040" and trained_run.name == "rms-pre"
    return trained_run


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


def reference_greedy(lm, tokenizer, prompt: str, max_new_tokens: int) -> str:
    """model.generate's greedy continuation of bos + prompt, the encoding eval_llm documents."""
    ids = torch.tensor([[tokenizer.bos_token_id] + tokenizer.encode(prompt, add_special_tokens=False)])
    out = lm.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_out_dir_and_checkpoint_dir_load_the_same_model(run_dir):
    a, _ = load(run_dir)
    b, _ = load(run_dir / "checkpoint")
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not a.training
    assert eval_llm.display_name(run_dir) == eval_llm.display_name(run_dir / "checkpoint") == "rms-pre"


def test_generation_is_deterministic(run_dir, capsys):
    lm, tokenizer = load(run_dir)
    sampled = Sampling(temperature=1.0, top_p=0.95, top_k=50, seed=3, max_new_tokens=24)
    for sampling in (GREEDY, sampled):
        first = generate_text(lm, tokenizer, PROMPT, sampling)
        assert first and generate_text(lm, tokenizer, PROMPT, sampling) == first
    # The seed is what fixes the sample: another seed draws another text.
    assert generate_text(lm, tokenizer, PROMPT, Sampling(**{**vars(sampled), "seed": 4})) != first
    # Streaming prints exactly the text it returns.
    capsys.readouterr()
    assert generate_text(lm, tokenizer, PROMPT, sampled, stream=True) == first
    assert capsys.readouterr().out == first + "\n"


@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_greedy_equals_model_generate(which, run_dir, post_dir, capsys):
    path = run_dir if which == "trained" else post_dir
    lm, tokenizer = load(path)
    expected = reference_greedy(lm, tokenizer, PROMPT, GREEDY.max_new_tokens)
    assert generate_text(lm, tokenizer, PROMPT, GREEDY) == expected
    # The CLI prints the prompt, then the streamed continuation.
    main(["--device", "cpu", "--model_path", str(path), "--prompt", PROMPT, "--temperature", "0",
          "--max_new_tokens", "16"])
    assert capsys.readouterr().out == PROMPT + expected + "\n\n"


@pytest.mark.parametrize("sampling", [["--temperature", "0"], ["--temperature", "0.9", "--seed", "3"]],
                         ids=["greedy", "sampled"])
def test_the_same_continuation_with_and_without_the_kv_cache(run_dir, capsys, sampling):
    argv = ["--device", "cpu", "--model_path", str(run_dir), "--prompt", PROMPT, "--max_new_tokens", "24", *sampling]
    capsys.readouterr()
    main(argv)
    cached = capsys.readouterr().out
    main([*argv, "--no_kv_cache"])
    assert cached.startswith(PROMPT) and len(cached) > len(PROMPT) + 10 and capsys.readouterr().out == cached


def test_long_prompt_is_cut_from_the_left(tiny_tokenizer, capsys):
    torch.manual_seed(0)
    lm = MiniMindForCausalLM(MiniMindConfig(**TINY, max_position_embeddings=24)).eval()
    prompt = "Full fathom five thy father lies; of his bones are coral made. " * 3
    ids = [tiny_tokenizer.bos_token_id] + tiny_tokenizer.encode(prompt, add_special_tokens=False)
    assert len(ids) > 16
    text = generate_text(lm, tiny_tokenizer, prompt, Sampling(temperature=0, max_new_tokens=8))
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: prompt of") and "last 16" in warnings[0]
    kept = torch.tensor([ids[-16:]])
    out = lm.generate(kept, attention_mask=torch.ones_like(kept), do_sample=False, max_new_tokens=8)
    assert text == tiny_tokenizer.decode(out[0, 16:], skip_special_tokens=True)
    with pytest.raises(UserError, match="no room for a prompt"):
        generate_text(lm, tiny_tokenizer, prompt, Sampling(temperature=0, max_new_tokens=24))


def test_evaluate_split_equals_direct_cross_entropy(run_dir, tiny_corpus):
    lm, tokenizer = load(run_dir)
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


def test_compare_uses_one_seed_and_prints_every_checkpoint(run_dir, post_dir, tiny_corpus, capsys):
    prompts = [PROMPT, "**ARIEL**  \n"]
    sampled, greedy = Sampling(temperature=1.0, seed=7, max_new_tokens=12), Sampling(temperature=0, max_new_tokens=12)
    results = compare([run_dir, post_dir], prompts, sampled)
    expected_greedy = {}
    for path, result in zip([run_dir, post_dir], results, strict=True):
        lm, tokenizer = load(path)
        assert result.continuations == [generate_text(lm, tokenizer, p, sampled) for p in prompts]
        expected_greedy[path.name] = [generate_text(lm, tokenizer, p, greedy) for p in prompts]

    main(["--device", "cpu", "--model_path", str(run_dir), "--compare", str(post_dir),
          *(a for p in prompts for a in ("--prompt", p)), "--temperature", "0", "--max_new_tokens", "12", "--eval_data", tiny_corpus, "--seq_len", "16"])
    out = capsys.readouterr().out
    blocks = out.split("=== prompt ")[1:]
    assert len(blocks) == len(prompts)
    for i, block in enumerate(blocks):
        assert block.startswith(f"{i + 1} ===\n{prompts[i]}\n")
        assert f"--- rms-pre (pre-rmsnorm) ---\n{expected_greedy['rms-pre'][i]}\n" in block
        assert f"--- ln-post (post-layernorm) ---\n{expected_greedy['ln-post'][i]}\n" in block
    header, trained, untrained = (line.split() for line in out.strip().splitlines()[-3:])
    assert header == ["checkpoint", "variant", "loss", "ppl", "bpb"]
    assert trained[:2] == ["rms-pre", "pre-rmsnorm"] and untrained[:2] == ["ln-post", "post-layernorm"]
    # The trained checkpoint predicts the held-out text better than the untrained one.
    assert float(trained[2]) < float(untrained[2])


@pytest.mark.parametrize("argv,message", [
    (["--temperature", "-1"], "--temperature must be a finite number >= 0 (0 = greedy), got -1"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0 = greedy), got nan"),
    (["--temperature", "inf"], "--temperature must be a finite number >= 0 (0 = greedy), got inf"),
    (["--top_p", "0"], "--top_p must be in (0, 1], got 0"), (["--top_p", "nan"], "--top_p must be in (0, 1], got nan"),
    (["--top_k", "-2"], "--top_k"), (["--max_new_tokens", "0"], "--max_new_tokens"),
    (["--eval_batches", "0"], "--eval_batches"), (["--seq_len", "-3"], "--seq_len"),
    (["--repetition_penalty", "0"], "--repetition_penalty must be a finite number > 0 (1 = off), got 0"),
    (["--repetition_penalty", "inf"], "--repetition_penalty must be a finite number > 0 (1 = off), got inf"),
    (["--repetition_penalty", "nan"], "--repetition_penalty must be a finite number > 0 (1 = off), got nan"),
])
def test_a_bad_flag_is_refused_in_one_line_naming_it(argv, message):
    with pytest.raises(UserError) as err:
        eval_llm.parse_args(["--model_path", "x", *argv])
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_a_model_is_required():
    with pytest.raises(UserError, match="--model_path"):
        eval_llm.parse_args(["--prompt", "Hi"])


@pytest.fixture(scope="module")
def weightless_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("weightless")
    MiniMindConfig(**TINY).save_pretrained(path)
    return path


def bad_input_cases(run_dir, weightless_dir, tmp_path) -> dict:
    return {
        "missing": (["--model_path", tmp_path / "nope"], "no such directory"),
        "no weights": (["--model_path", weightless_dir], "no weights"),
        "tokenizer too big": (["--model_path", run_dir, "--tokenizer_path", DEFAULT_TOKENIZER_DIR],
                              f"has {len(load_tokenizer(DEFAULT_TOKENIZER_DIR))} tokens but the model's "
                              "vocabulary has 400"),
    }


@pytest.mark.parametrize("case", ["missing", "no weights", "tokenizer too big"])
def test_bad_input_is_one_error_line(case, run_dir, weightless_dir, cache_env, tmp_path, capsys):
    args, expected = bad_input_cases(run_dir, weightless_dir, tmp_path)[case]
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: main([*map(str, args), "--prompt", "Hi"]))
    out, err = capsys.readouterr()
    assert stopped.value.code == 2
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], err
    assert "Traceback" not in err and out == ""


def test_tokenizer_smaller_than_a_minimind_vocabulary_is_refused(tmp_path, tiny_tokenizer_dir):
    MiniMindForCausalLM(MiniMindConfig(**{**TINY, "vocab_size": 512})).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="has 400 tokens but the model's vocabulary has 512"):
        load(tmp_path, tokenizer_path=tiny_tokenizer_dir)


@pytest.mark.parametrize("family, model_type, overrides", [
    ("LlamaForCausalLM", "llama", {}), ("Qwen3ForCausalLM", "qwen3", {"qk_norm": "head"}),
    ("Olmo2ForCausalLM", "olmo2", {"norm_position": "reorder", "qk_norm": "proj"})])
def test_held_out_evaluation_of_every_exported_family(family, model_type, overrides, tiny_tokenizer, tiny_corpus, tmp_path,
                                                      cache_env, capsys):
    """eval_llm.py loads an export as its transformers class and generates what the checkpoint does; plain
    transformers classes take no shift_labels, so evaluation must not depend on the model computing a loss."""
    torch.manual_seed(0)
    config = MiniMindConfig(**TINY, **overrides, initializer_range=0.2)  # wide weights: choices that depend on the prompt
    MiniMindForCausalLM(config).save_pretrained(tmp_path / "minimind")
    tiny_tokenizer.save_pretrained(tmp_path / "minimind")
    assert convert_to_hf.convert(tmp_path / "minimind", tmp_path / "export") == family
    (lm, tokenizer), (minimind_lm, _) = load(tmp_path / "export"), load(tmp_path / "minimind")
    assert type(lm).__name__ == family and eval_llm.variant_of(lm.config) == eval_llm.HF_VARIANTS[model_type]
    assert generate_text(lm, tokenizer, PROMPT, GREEDY) == generate_text(minimind_lm, tokenizer, PROMPT, GREEDY)
    flags = {"batch_size": 4, "seq_len": 16, "max_batches": 2}
    minimind = evaluate_split(minimind_lm, tokenizer, tiny_corpus, **flags)
    exported = evaluate_split(lm, tokenizer, tiny_corpus, **flags)
    assert exported["loss"] == pytest.approx(minimind["loss"], rel=1e-5) and exported["tokens"] == 2 * 4 * 16

    capsys.readouterr()
    main(["--device", "cpu", "--model_path", str(tmp_path / "export"), "--eval_data", tiny_corpus, "--seq_len", "16",
          "--batch_size", "4", "--eval_batches", "2"])
    header, row = capsys.readouterr().out.strip().splitlines()
    assert row.split()[:3] == ["export", eval_llm.HF_VARIANTS[model_type], f"{exported['loss']:.4f}"]


def test_a_diverged_model_has_infinite_perplexity(tiny_tokenizer, tiny_corpus, cache_env):
    torch.manual_seed(0)
    lm = MiniMindForCausalLM(MiniMindConfig(**TINY, tie_word_embeddings=False)).eval()
    with torch.no_grad():
        lm.lm_head.weight.mul_(1e4)  # logits in the thousands: a loss whose exp overflows a float
    metrics = evaluate_split(lm, tiny_tokenizer, tiny_corpus, batch_size=4, seq_len=16, max_batches=1)
    assert metrics["loss"] > 710 and metrics["ppl"] == math.inf and math.isfinite(metrics["bpb"])
    row = eval_llm.format_metrics_table([eval_llm.Result("diverged", "pre-rmsnorm", [], metrics)]).splitlines()[1]
    assert row.split()[3] == "inf"


def test_compare_leaves_out_a_run_without_a_checkpoint_and_prints_the_others(run_dir, post_dir, tiny_corpus,
                                                                            cache_env, tmp_path, capsys):
    """A study's run that diverged before its first save: its folder has records but no checkpoint."""
    diverged = tmp_path / "diverged"
    diverged.mkdir()
    (diverged / "metrics.jsonl").write_text("")
    flags = ["--device", "cpu", "--prompt", PROMPT, "--temperature", "0", "--max_new_tokens", "4",
             "--eval_data", tiny_corpus, "--seq_len", "16", "--eval_batches", "1"]
    capsys.readouterr()
    main([*flags, "--compare", str(run_dir), str(diverged), str(post_dir)])
    out, err = capsys.readouterr()
    assert "--- rms-pre (pre-rmsnorm) ---" in out and "--- ln-post (post-layernorm) ---" in out
    assert "--- diverged" not in out
    header, trained, skipped, untrained = (line.split() for line in out.strip().splitlines()[-4:])
    assert header == ["checkpoint", "variant", "loss", "ppl", "bpb"] and skipped == ["diverged", "not", "loaded", "—",
                                                                                     "—", "—"]
    assert trained[:2] == ["rms-pre", "pre-rmsnorm"] and untrained[:2] == ["ln-post", "post-layernorm"]
    assert float(trained[2]) < float(untrained[2])
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: left out of the comparison: {diverged}: not a model directory (no config.json, "
                        "no checkpoint or step-* folders); has the run saved a checkpoint?"]
    # nothing to compare: one error line and exit status 2
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: main([*flags, "--compare", str(diverged)]))
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == ""
    assert err.splitlines()[-1] == ("error: nothing to compare: no model directory could be loaded (the warnings "
                                    "above say why); pass at least one that holds a checkpoint")
    assert [line for line in err.splitlines() if line.startswith("error:")] == err.splitlines()[-1:]


def test_a_prompt_that_is_not_utf8_is_read_with_replacement_characters(run_dir, capsys, monkeypatch):
    lm, tokenizer = load(run_dir)
    expected = "To be \ufffd" + generate_text(lm, tokenizer, "To be \ufffd", Sampling(temperature=0, max_new_tokens=4))
    warning = "warning: prompt 'To be \ufffd' is not valid UTF-8; its undecodable bytes are read as U+FFFD"
    flags = ["--device", "cpu", "--model_path", str(run_dir), "--temperature", "0", "--max_new_tokens", "4"]
    capsys.readouterr()
    main([*flags, "--prompt", os.fsdecode(b"To be \xff")])  # as $'To be \xff' reaches sys.argv
    out, err = capsys.readouterr()
    assert out == expected + "\n\n" and err.splitlines() == [warning]

    class Terminal(io.TextIOWrapper):  # typed at the prompt, read strictly as UTF-8 (the default outside UTF-8 mode)
        def isatty(self):
            return True
    monkeypatch.setattr(sys, "stdin", Terminal(io.BytesIO(b"To be \xff\n\n"), encoding="utf-8"))
    main(flags)
    out, err = capsys.readouterr()
    assert out == "prompt> " + expected + "\n\nprompt> " and err.splitlines() == [warning]
