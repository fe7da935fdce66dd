"""Generation as users run it: `generate()` with the KV cache equals `generate()` without it and a loop of full
forwards, for every variant of the catalogue; eval_llm.py prints the same continuation either way; an imported
MiniMind-3 checkpoint too. The transformers release the suite runs on decides how generate() hands the cache to the
model (past_key_values up to 5.23, cache from 5.24), which is what these tests guard."""

import pytest
import torch

import eval_llm
from model.model_minimind import CACHE_FIELD
from scripts import convert_from_minimind
from study.variants import VARIANTS, variant_fields, variant_problem
from tests.test_minimind_import import minimind_model, save_pth
from tests.tiny import ids, tiny_model

NEW_TOKENS = 8


# every name that makes a model: the catalogue crosses every placement with every norm, and e.g. QK-norm with norm
# "none" makes none
CATALOGUE = [name for name in VARIANTS if not variant_problem(name)]


def greedy_by_full_forwards(model, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    out = prompt
    with torch.no_grad():
        for _ in range(steps):
            out = torch.cat([out, model(out).logits[:, -1:].argmax(-1)], 1)
    return out


def generate(model, prompt, use_cache: bool, **sampling) -> list[int]:
    return generate_with_logits(model, prompt, use_cache, **sampling)[0]


def generate_with_logits(model, prompt, use_cache: bool, **sampling) -> tuple[list[int], torch.Tensor]:
    """The tokens generate() returns and the logits it chose each new one from, with the same random numbers."""
    torch.manual_seed(0)
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, eos_token_id=None, use_cache=use_cache,
                         output_logits=True, return_dict_in_generate=True, **sampling)
    return out.sequences[0].tolist(), torch.cat(out.logits)


def test_the_catalogue_is_covered():
    # every placement and every norm type appears at least once among the variants generated from
    covered = [VARIANTS[name] for name in CATALOGUE]
    assert len(covered) > 100
    for field in ("norm", "norm_position"):
        assert {flags[field] for flags in covered} == {flags[field] for flags in VARIANTS.values()}, field


@pytest.mark.parametrize("variant", CATALOGUE)
def test_cached_generation_equals_uncached_and_full_forwards(variant):
    model = tiny_model(num_hidden_layers=2, **variant_fields(variant))
    prompt = ids(batch=1, seq=5)
    greedy, logits = generate_with_logits(model, prompt, use_cache=True, do_sample=False)
    uncached, full_logits = generate_with_logits(model, prompt, use_cache=False, do_sample=False)
    assert greedy == uncached
    torch.testing.assert_close(logits, full_logits, atol=1e-5, rtol=1e-5)  # every step's logits, not just the argmax
    assert greedy == greedy_by_full_forwards(model, prompt, NEW_TOKENS)[0].tolist()
    sampling = {"do_sample": True, "temperature": 1.5, "top_k": 50}
    sampled = generate(model, prompt, use_cache=True, **sampling)
    assert sampled == generate(model, prompt, use_cache=False, **sampling)
    assert len(sampled) == 5 + NEW_TOKENS


def test_the_cache_is_returned_under_the_name_generate_reads():
    model = tiny_model()
    x = ids(batch=1, seq=6)
    with torch.no_grad():
        out = model(x, use_cache=True)
        cache = getattr(out, CACHE_FIELD)
        assert cache is not None and cache.get_seq_length() == 6
        # generate() of transformers >= 5.24 passes the cache as `cache`; older ones as `past_key_values`
        step = model(x[:, -1:], use_cache=True, cache=cache)
    assert getattr(step, CACHE_FIELD).get_seq_length() == 7


@pytest.mark.parametrize("sampling", [["--temperature", "0"], ["--temperature", "0.9", "--seed", "3"]])
def test_eval_llm_prints_the_same_continuation_with_and_without_the_cache(trained_run, capsys, sampling):
    prompt = "Ariel sings"
    argv = ["--model_path", str(trained_run), "--prompt", prompt, "--max_new_tokens", "24", *sampling]
    eval_llm.main(argv)
    cached = capsys.readouterr().out
    eval_llm.main([*argv, "--no_kv_cache"])
    uncached = capsys.readouterr().out
    assert cached.startswith(prompt) and len(cached) > len(prompt) + 10
    assert cached == uncached


def test_imported_minimind3_generates_the_same_tokens_with_and_without_the_cache(tmp_path, tiny_tokenizer_dir,
                                                                                  tiny_tokenizer):
    source = minimind_model(tiny_tokenizer, "3")
    save_pth(source, tmp_path / "pretrain_768.pth", torch.float32)
    convert_from_minimind.convert(tmp_path / "pretrain_768.pth", tiny_tokenizer_dir, tmp_path / "out")
    imported, _ = eval_llm.load(tmp_path / "out")
    prompt = torch.tensor([[tiny_tokenizer.bos_token_id, *tiny_tokenizer.encode("Full fathom five")]])
    cached = generate(imported, prompt, use_cache=True, do_sample=False)
    assert cached == generate(imported, prompt, use_cache=False, do_sample=False)
    assert cached == greedy_by_full_forwards(imported, prompt, NEW_TOKENS)[0].tolist()
