"""The property of tests/test_variants.py's matrix that needs extras/interop: every variant of the catalogue
that a Hugging Face family computes exports, as the class the table says, to a model with the same logits."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from extras.interop import convert_to_hf
from extras.interop.hf_export import hf_family
from model import MiniMindConfig, variant_fields, variant_problem
from study.variants import VARIANTS
from tests.tiny import ids, tiny_model

# The variants a Hugging Face family computes exactly, and the class each exports as
EXPORTS = {"pre-rmsnorm": "LlamaForCausalLM", "pre-rmsnorm_noparam": "LlamaForCausalLM",
           "pre+qk_head-rmsnorm": "Qwen3ForCausalLM", "pre+qk_head-rmsnorm_noparam": "Qwen3ForCausalLM",
           "reorder+qk_proj-rmsnorm": "Olmo2ForCausalLM",
           "reorder+qk_proj-rmsnorm_noparam": "Olmo2ForCausalLM",
           "peri+embed_scale+one_plus_w-rmsnorm": "Gemma2ForCausalLM",
           "peri+qk_head+embed_scale+one_plus_w-rmsnorm": "Gemma3ForCausalLM"}


def exportable(name: str) -> bool:
    try:
        hf_family(MiniMindConfig(**variant_fields(name)))
    except ValueError:
        return False
    return True


def test_the_catalogue_exports_as_the_table_says():
    catalogue = [name for name in VARIANTS if not variant_problem(name)]
    assert [name for name in catalogue if exportable(name)] == [name for name in catalogue if name in EXPORTS]
    assert set(EXPORTS) <= set(catalogue)


@pytest.mark.parametrize("variant", sorted(EXPORTS))
def test_export_computes_the_same_logits(variant, tmp_path):
    model = tiny_model(**variant_fields(variant))
    model.save_pretrained(tmp_path / "src")
    assert convert_to_hf.convert(tmp_path / "src", tmp_path / "dst") == EXPORTS[variant]
    # transformers 4.x reads theta from here (5.x from rope_parameters); without it 4.x would use 10000
    assert json.loads((tmp_path / "dst" / "config.json").read_text())["rope_theta"] == model.config.rope_theta
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "dst").eval()
    assert type(exported).__name__ == EXPORTS[variant]
    with torch.no_grad():
        assert (exported(ids()).logits - model(ids()).logits).abs().max().item() <= 1e-4
