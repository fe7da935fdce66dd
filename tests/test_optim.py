"""trainer/optim.py: weight decay on norm gains; --optimizer muon: which parameters Muon gets, the skipped step, the
schedule, exact resume and DDP; the trainer-level divergence and float16 tests run with both optimizers in
test_train_loop.py."""

import re

import pytest
import torch

from study.variants import VARIANTS, variant_fields, variant_problem
from tests import test_trainer
from tests.test_trainer import (
    assert_same_run,
    refused,
    straight_and_in_halves,
    train_in_process,
    train_two_ranks,
)
from tests.tiny import ids, tiny_model
from trainer.optim import MuonWithAdamW, build_optimizer, step_unless

env, tiny_args = test_trainer.env, test_trainer.tiny_args  # the training tests' fixtures, shared

MUON_NAME = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight")


@pytest.mark.parametrize("norm_type", ["rmsnorm", "ssnorm", "layernorm"])
def test_norm_weight_decay_pulls_a_gain_to_zero_and_a_one_plus_w_gain_to_one(norm_type):
    """One AdamW step with a zero gradient: only the decay moves anything, and only with --norm_weight_decay."""
    lr, decay = 0.1, 0.5
    for norm_gain, on, expected in (("w", False, 1.0), ("w", True, 1 - lr * decay), ("one_plus_w", True, 1.0)):
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


# every kind of parameter a variant can have: each norm type's (under pre), each placement's and switch's (with
# RMSNorm), and those of the setups named whole
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
    # decay: the tied embedding, norms and scalars (sinks, ReZero's scales, DyT's alpha) are not decayed
    decayed = {id(p) for group in adamw if group["weight_decay"] for p in group["params"]}
    assert not decayed  # with a tied lm_head, every decayed matrix is Muon's


def test_an_untied_lm_head_and_norm_gains_with_decay_stay_with_adamw():
    model = tiny_model(tie_word_embeddings=False)
    muon, adamw = split(model, norm_weight_decay=True)
    decayed = {id(p) for group in adamw if group["weight_decay"] == 0.1 for p in group["params"]}
    assert id(model.lm_head.weight) in decayed and "lm_head.weight" not in muon
    assert id(model.model.layers[0].input_layernorm.weight) in decayed
    assert id(model.model.embed_tokens.weight) not in decayed


def test_rezero_scales_join_adamw_without_decay():
    model = tiny_model(norm_position="rezero")
    _, adamw = split(model)
    undecayed = {id(p) for group in adamw if group["weight_decay"] == 0 for p in group["params"]}
    scales = [layer.attn_residual_scale for layer in model.model.layers] + [
        layer.mlp_residual_scale for layer in model.model.layers]
    assert all(id(p) in undecayed for p in scales)


def test_adamw_is_the_default_and_unchanged():
    model = tiny_model()
    default, named = build_optimizer(model, 1e-3, 0.1), build_optimizer(model, 1e-3, 0.1, False, "adamw")
    assert type(default) is type(named) is torch.optim.AdamW
    assert [[id(p) for p in g["params"]] for g in default.param_groups] == [
        [id(p) for p in g["params"]] for g in named.param_groups]


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


def gradients(model, poison: bool = False) -> None:
    model.zero_grad()
    x = ids(seq=16)
    model(x[:, :-1], shift_labels=x[:, 1:]).loss.backward()
    if poison:  # a non-finite gradient in a Muon matrix and in an AdamW parameter
        model.model.layers[0].self_attn.q_proj.weight.grad[0, 0] = float("nan")
        model.model.embed_tokens.weight.grad[0, 0] = float("inf")


def snapshot(model, optimizer) -> tuple[list, list, list]:
    return ([p.detach().clone() for p in model.parameters()],
            [b.clone() for b in optimizer.muon_tensors()[len(optimizer.muon_params()):]],
            [{k: v.clone() for k, v in s.items()} for s in optimizer.adamw.state.values()])


def assert_equal(a, b):
    for x, y in zip(a[0] + a[1], b[0] + b[1], strict=True):
        assert torch.equal(x, y)
    for x, y in zip(a[2], b[2], strict=True):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_a_skipped_step_changes_nothing_and_a_taken_one_is_plain_muon_and_adamw():
    model = tiny_model().train()
    optimizer = build_optimizer(model, 1e-2, 0.1, optimizer="muon")
    gradients(model)
    step_unless(optimizer, torch.tensor(False))  # a first step, so that the moments and momenta are not zero
    before = snapshot(model, optimizer)
    gradients(model, poison=True)
    step_unless(optimizer, torch.tensor(True))
    assert_equal(snapshot(model, optimizer), before)  # weights, momenta and AdamW's moments and step count

    # a step that is not skipped is the two optimizers' own steps, bit for bit
    reference = tiny_model().train()
    plain = build_optimizer(reference, 1e-2, 0.1, optimizer="muon")
    for _ in range(2):
        gradients(reference)
        plain.step()
    gradients(model)
    step_unless(optimizer, torch.tensor(False))
    assert_equal(snapshot(model, optimizer), snapshot(reference, plain))


def test_exact_resume_with_muon(tmp_path, tiny_args, capsys):
    """8 steps straight, and 4 then a --resume to 8: the same losses and weights, bit for bit, so both
    optimizers' states (AdamW's moments, Muon's momenta) come back from the checkpoint."""
    muon = [*tiny_args, "--optimizer", "muon"]
    common, straight, halves = straight_and_in_halves(tmp_path, muon, train_in_process)
    assert_same_run(straight, halves)
    state = torch.load(halves / "checkpoint" / "training_state.pt", weights_only=False)
    assert set(state["optimizer"]) == {"adamw", "muon"} and len(state["optimizer"]["muon"]["state"]) == 7 * 2
    # the other optimizer would not continue the same run: refused in one line, checkpoint untouched
    status, lines = refused([*common, "--out_dir", halves, "--max_steps", 12, "--resume", "--optimizer", "adamw"],
                            capsys)
    assert status == 2 and lines[-1].startswith("error: --resume: the checkpoint was trained with --optimizer muon")
    assert (halves / "checkpoint").resolve().name == "step-000008"


@pytest.mark.slow  # torchrun and two trainer processes
def test_ddp_ranks_hold_the_same_weights_after_muon_steps(tmp_path, env, tiny_args):
    r0, r1 = train_two_ranks(tmp_path, env, [*tiny_args, "--max_steps", "4", "--optimizer", "muon"])
    assert all(a != b for a, b in zip(r0["seen"], r1["seen"], strict=True))  # different data per rank
    assert all(torch.equal(r0["state"][k], r1["state"][k]) for k in r0["state"])  # identical weights
    saved = torch.load(tmp_path / "run" / "checkpoint" / "training_state.pt", weights_only=False)["optimizer"]
    assert all(s["momentum_buffer"].abs().sum() > 0 for s in saved["muon"]["state"].values())  # Muon stepped
