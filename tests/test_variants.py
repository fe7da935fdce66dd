"""The property matrix: every variant of the catalogue (study/variants.py: each name that makes a model)
through the properties every model must keep (the list: tests/README.md; the export to Hugging Face classes:
extras/tests/test_export_property.py). A variant joins by being in the catalogue."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from model import (
    NORM_POSITIONS,
    NORM_TYPES,
    MiniMindForCausalLM,
    norm_variant,
    variant_fields,
    variant_problem,
)
from study.variants import VARIANTS
from tests.tiny import FIXTURES, TINY, assert_saved_logits, ids, tiny_model

CATALOGUE = [name for name in VARIANTS if not variant_problem(name)]
NEW_TOKENS = 8


def test_the_catalogue_covers_every_norm_type_and_placement():
    fields = [variant_fields(name) for name in CATALOGUE]
    assert {f["norm_type"] for f in fields} == set(NORM_TYPES)
    assert {f["norm_position"] for f in fields} == set(NORM_POSITIONS)


@pytest.fixture(scope="module", params=CATALOGUE)
def variant(request) -> str:
    """Module-scoped, so pytest runs every test of one variant before the next variant's."""
    return request.param


@pytest.fixture(scope="module")
def model(variant):
    """The variant's tiny model in eval mode, built once and shared by its tests: a test that changes it (the
    mode, gradients) puts it back or works on a copy."""
    return tiny_model(**variant_fields(variant))


def test_generation_with_the_kv_cache_equals_full_forwards_without_it(model):
    """Greedy generate() against an argmax loop of full forwards: the same tokens, and at every step the same
    logits, not just the same argmax. (generate() without the cache: test_eval_llm.py, --no_kv_cache.)"""
    prompt = ids(batch=1, seq=5)
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                         use_cache=True, output_logits=True, return_dict_in_generate=True)
    looped, step_logits = prompt, []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            step_logits.append(model(looped).logits[:, -1])
            looped = torch.cat([looped, step_logits[-1].argmax(-1, keepdim=True)], 1)
    assert out.sequences.tolist() == looped.tolist()
    torch.testing.assert_close(torch.cat(out.logits), torch.cat(step_logits), atol=1e-5, rtol=1e-5)


def test_save_and_load_give_the_same_function(variant, model, tmp_path):
    model.save_pretrained(tmp_path)
    loaded = MiniMindForCausalLM.from_pretrained(tmp_path).eval()
    assert norm_variant(loaded.config) == variant
    assert {**loaded.config.to_dict(), "_name_or_path": ""} == {**model.config.to_dict(), "_name_or_path": ""}
    with torch.no_grad():
        assert torch.equal(loaded(ids()).logits, model(ids()).logits)


def test_bf16_autocast_forward_is_finite_and_close_to_float32_and_trains(model):
    model = copy.deepcopy(model).train()
    x = ids(seq=16)
    with torch.no_grad():
        full = model(x).logits
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x, labels=x)
    # bf16 keeps 8 bits of mantissa; through 4 blocks the logits drift by up to 6% of the largest one
    assert (out.logits.float() - full).abs().max() <= 0.1 * full.abs().max()
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_later_token_never_changes_an_earlier_logit(variant, model):
    x = ids(batch=4, seq=16)
    changed = x.clone()
    changed[:, 9:] = (changed[:, 9:] + 7) % TINY["vocab_size"]
    for mode in ("train", "eval"):  # ending in eval mode, as the model was
        model.train(mode == "train")
        with torch.no_grad():
            a, b = model(x).logits, model(changed).logits
        assert torch.equal(a[:, :9], b[:, :9]), mode
        assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-4, mode


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir()))
def test_a_checkpoint_of_the_first_release_loads_with_the_logits_it_gave(name):
    """Saved before most switches existed (pre/post x every norm type of then): each switch takes the value
    that computes the old model, so the variant is the one it was saved as, with the same logits and init."""
    expected = torch.load(FIXTURES / name / "expected.pt")
    model = AutoModelForCausalLM.from_pretrained(FIXTURES / name).eval()
    assert norm_variant(model.config) == name
    with torch.no_grad():
        assert_saved_logits(model(expected["input_ids"]).logits, expected["logits"])
        torch.manual_seed(1)
        fresh = MiniMindForCausalLM(model.config).eval()
        assert_saved_logits(fresh(expected["input_ids"]).logits, expected["fresh_logits"])
