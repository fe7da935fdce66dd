"""trainer/optim.py: the schedule, the decay split, --optimizer muon: which parameters Muon gets, the skipped
step; exact resume, DDP, divergence and float16 run with both optimizers in test_trainer.py and
test_train_loop.py."""

import re

import pytest
import torch

from study.variants import VARIANTS, variant_fields, variant_problem
from tests.tiny import tiny_model
from trainer.optim import MuonWithAdamW, build_optimizer, lr_at

MUON_NAME = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight")


@pytest.mark.parametrize("norm_type", ["rmsnorm", "ssnorm", "layernorm"])
def test_norm_weight_decay_pulls_a_gain_to_zero_and_a_one_plus_w_gain_to_one(norm_type):
    """One AdamW step with a zero gradient: only the decay moves anything, and only with
    --norm_weight_decay."""
    lr, decay = 0.1, 0.5
    for norm_gain, on, expected in (("w", False, 1), ("w", True, 1 - lr * decay), ("one_plus_w", True, 1)):
        model = tiny_model(perturb=False, norm_type=norm_type, norm_gain=norm_gain)
        optimizer = build_optimizer(model, lr=lr, weight_decay=decay, norm_weight_decay=on)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        weight = model.model.layers[0].input_layernorm.weight.detach()
        gain = 1 + weight if norm_gain == "one_plus_w" else weight
        torch.testing.assert_close(gain, torch.full_like(gain, expected), rtol=0, atol=1e-7)


def split(model, **kw) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Muon's parameters by name, and AdamW's groups."""
    optimizer = build_optimizer(model, 1e-3, 0.1, optimizer="muon", **kw)
    assert isinstance(optimizer, MuonWithAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)]: p for group in optimizer.muon.param_groups for p in group["params"]}
    return muon, optimizer.adamw.param_groups


# every kind of parameter a variant can have: each norm type's (under pre), each placement's and switch's
# (with RMSNorm), and those of the setups named whole
KINDS_OF_PARAMETERS = [name for name in VARIANTS if not variant_problem(name)
                       and (name.startswith("pre-") or name.endswith("-rmsnorm") or "-" not in name)]


@pytest.mark.parametrize("variant", KINDS_OF_PARAMETERS)
def test_muon_gets_the_block_matrices_and_adamw_everything_else(variant):
    model = tiny_model(perturb=False, num_hidden_layers=2, **variant_fields(variant))
    muon, adamw = split(model)
    # exactly the seven projections of every block, all matrices
    assert sorted(muon) == sorted(n for n, _ in model.named_parameters() if MUON_NAME.fullmatch(n))
    assert len(muon) == 7 * 2 and all(p.ndim == 2 for p in muon.values())
    # AdamW: every other parameter, once; nothing left over, nothing twice
    in_adamw = [p for group in adamw for p in group["params"]]
    everything = list(model.parameters())
    assert len(in_adamw) + len(muon) == len(everything)
    assert {id(p) for p in in_adamw} | {id(p) for p in muon.values()} == {id(p) for p in everything}
    assert not {id(p) for p in in_adamw} & {id(p) for p in muon.values()}
    # decay: the tied embedding, norms and scalars (ReZero's scales, DyT's alpha) are not decayed
    decayed = {id(p) for group in adamw if group["weight_decay"] for p in group["params"]}
    assert not decayed  # with a tied lm_head, every decayed matrix is Muon's


def test_an_untied_lm_head_and_norm_gains_with_decay_stay_with_adamw():
    model = tiny_model(tie_word_embeddings=False)
    muon, adamw = split(model, norm_weight_decay=True)
    decayed = {id(p) for group in adamw if group["weight_decay"] == 0.1 for p in group["params"]}
    assert id(model.lm_head.weight) in decayed and "lm_head.weight" not in muon
    assert id(model.model.layers[0].input_layernorm.weight) in decayed
    assert id(model.model.embed_tokens.weight) not in decayed


def test_lr_schedule_warms_up_then_decays_to_min_lr():
    assert lr_at(0, 100, 1.0, 0.1, 10) == pytest.approx(0.1)
    assert lr_at(9, 100, 1.0, 0.1, 10) == pytest.approx(1.0)
    assert lr_at(100, 100, 1.0, 0.1, 10) == pytest.approx(0.1)
    assert lr_at(55, 100, 1.0, 0.1, 10) == pytest.approx(0.55)


def test_adamw_is_the_default_and_decays_only_the_matrices():
    model = tiny_model(norm_type="layernorm")
    default, named = build_optimizer(model, 1e-3, 0.1), build_optimizer(model, 1e-3, 0.1, False, "adamw")
    assert type(default) is type(named) is torch.optim.AdamW
    assert [[id(p) for p in g["params"]] for g in default.param_groups] == [
        [id(p) for p in g["params"]] for g in named.param_groups]
    decay, no_decay = default.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"])
    assert any(p is model.model.embed_tokens.weight for p in no_decay["params"])
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == model.num_parameters()


def test_one_learning_rate_drives_both_optimizers():
    """The loop sets group['lr'] on param_groups; Muon scales it to AdamW's update size itself."""
    optimizer = build_optimizer(tiny_model(), 1e-3, 0.1, optimizer="muon")
    for group in optimizer.param_groups:
        group["lr"] = 0.25
    assert [g["lr"] for g in optimizer.adamw.param_groups + optimizer.muon.param_groups] == [0.25] * 2
    assert optimizer.muon.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"
    assert optimizer.muon.param_groups[0]["weight_decay"] == 0.1
    # after a load_state_dict the optimizers hold new group dicts; param_groups must reach those
    optimizer.load_state_dict(optimizer.state_dict())
    for group in optimizer.param_groups:
        group["lr"] = 0.5
    assert [g["lr"] for g in optimizer.adamw.param_groups + optimizer.muon.param_groups] == [0.5] * 2
