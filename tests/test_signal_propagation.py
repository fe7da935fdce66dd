"""scripts/signal_propagation.py in-process at tiny sizes, against a direct computation, and its theory checks."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from common.cli import UserError
from data import load_tokenizer, prepare_split
from model import MiniMindConfig, MiniMindForCausalLM
from scripts import signal_propagation

TINY = ["--hidden_size", "32", "--num_attention_heads", "2", "--num_key_value_heads", "1", "--batch_size", "2",
        "--seq_len", "16"]


def test_tiny_run_matches_a_direct_computation(tmp_path, tiny_corpus, tiny_tokenizer_dir, monkeypatch, capsys):
    """Every variant by its catalogue name measures; SeeDNorm computes pre-rmsnorm's function at init and
    ReZero's blocks hand on their input unchanged; pre-rmsnorm's numbers are those of a direct computation."""
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path / "cache"))
    variants = ["pre-rmsnorm", "post-rmsnorm", "pre-seednorm", "pre-derf", "rezero", "nanochat"]
    signal_propagation.main([*TINY, "--variants", *variants, "--depths", "3", "2", "--data_path", tiny_corpus,
                             "--tokenizer_path", tiny_tokenizer_dir, "--out_dir", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "out" / "signal_propagation.json").read_text())
    assert (tmp_path / "out" / "signal_propagation.png").stat().st_size > 0
    assert data["environment"]["torch"] == torch.__version__
    assert [(r["variant"], r["depth"]) for r in data["results"]] == [(v, d) for v in variants for d in (2, 3)]
    assert sum(line.startswith(tuple(f"{v} " for v in variants)) for line in printed.splitlines()) == 12
    checks = {t["variant"]: t["agrees"] for t in data["theory"] if t["variant"] in ("pre-seednorm", "rezero")}
    assert checks == {"pre-seednorm": True, "rezero": True}
    measured = data["results"][1]

    # The same measurement by hand: the first 2 windows of 16 held-out tokens, a pre-norm model of 3 blocks
    # seeded like the trainer's, one forward and backward of the mean next-token cross-entropy.
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    tokens = torch.from_numpy(prepare_split(tiny_corpus, "validation", tokenizer).tokens[:33].astype("int64"))
    x, y = torch.stack([tokens[:16], tokens[16:32]]), torch.stack([tokens[1:17], tokens[17:33]])
    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1))
    out = model(input_ids=x, output_hidden_states=True)
    loss = F.cross_entropy(out.logits.flatten(0, 1), y.flatten())
    loss.backward()
    assert measured["loss"] == pytest.approx(loss.item(), rel=1e-5)
    hidden = out.hidden_states
    rope = model.model.rotary_emb(torch.arange(16)[None], torch.float32)
    with torch.no_grad():
        outputs = [*hidden[1:3], model.model.layers[2](hidden[2], rope, None)]  # the last block's own output
    for i, block in enumerate(model.model.layers):
        grad = math.sqrt(sum(p.grad.pow(2).sum().item() for p in block.parameters()))
        assert measured["layer_grad_norm"][i] == pytest.approx(grad, rel=1e-4)
        assert measured["residual_rms"][i] == pytest.approx(hidden[i].pow(2).mean().sqrt().item(), rel=1e-5)
        cosine = F.cosine_similarity(hidden[i], outputs[i], dim=-1).mean().item()
        assert measured["block_cosine"][i] == pytest.approx(cosine, rel=1e-5)
    grads = measured["layer_grad_norm"]
    assert measured["gradient_spread"] == pytest.approx(max(grads) / min(grads))


def synthetic(variant: str, depth: int, **fields) -> dict:
    grads = fields.get("layer_grad_norm", [1.0] * depth)
    return {"variant": variant, "depth": depth, "loss": 1.0, "residual_rms": [1.0] * depth, "layer_grad_norm": grads,
            "gradient_spread": max(grads) / min(grads), "block_cosine": [0.5] * depth,
            "max_attn_logit": [1.0] * depth, **fields}


def by_rms(rms: dict[str, list[float]]) -> list[dict]:
    return [synthetic(variant, len(values), residual_rms=values) for variant, values in rms.items()]


LINEAR = [0.02] + [math.sqrt(0.01 * n) for n in range(1, 16)]  # variance grows by 0.01 per block
QUADRATIC = [0.02] + [0.1 * n for n in range(1, 16)]  # variance ~ l^2
PRE = [0.02] + [0.05] * 7
MORE_RECENT = ["hybrid-rmsnorm", "hybrid_star-rmsnorm", "pre+one_plus_w-rmsnorm", "pre+sub-rmsnorm",
               "pre+embed_scale-rmsnorm", "pre+embed_norm-rmsnorm"]
# (variants whose every check must agree on the first results and differ on the second, the results, hidden_size)
THEORY_CASES = {
    "depth": (["pre-rmsnorm", "post-rmsnorm"], [
        synthetic("pre-rmsnorm", 16, residual_rms=LINEAR, layer_grad_norm=[1.0 - 0.05 * i for i in range(16)]),
        synthetic("post-rmsnorm", 4), synthetic("post-rmsnorm", 16, layer_grad_norm=[0.25] * 16)], [
        synthetic("pre-rmsnorm", 16, residual_rms=QUADRATIC),
        synthetic("post-rmsnorm", 4, layer_grad_norm=[0.25] * 4), synthetic("post-rmsnorm", 16)], None),
    "qk_norm": (["pre+qk_head-rmsnorm"], [synthetic("pre+qk_head-rmsnorm", 4, max_attn_logit=[3.9, 4.0, 1.0, 1.0])],
                [synthetic("pre+qk_head-rmsnorm", 4, max_attn_logit=[3.9, 4.2, 1.0, 1.0])], None),  # sqrt(16) = 4
    "more_recent": (MORE_RECENT, by_rms(dict(zip(["pre-rmsnorm", *MORE_RECENT], [
        PRE, [0.02] + [1.0] * 7, [0.02, 0.08] + [1.0] * 6, PRE, [0.02] + [0.9] * 7, [0.16] + [0.2] * 7, [0.99] * 8],
        strict=True))), by_rms(dict(zip(["pre-rmsnorm", *MORE_RECENT], [
            PRE, [0.02] + [1.3] * 7, [0.02, 0.08] + [0.5] * 6, [0.02] + [0.06] * 7, [0.02] + [0.04] * 7, [0.02] * 8,
            [0.5] * 8], strict=True))), 64),
    "same_function_and_identity": (["pre-seednorm", "rezero"], [
        synthetic("pre-rmsnorm", 4), synthetic("pre-seednorm", 4),
        synthetic("rezero", 4, residual_rms=[0.02] * 4, block_cosine=[1.0] * 4)], [
        synthetic("pre-rmsnorm", 4), {**synthetic("pre-seednorm", 4), "loss": 1.01},
        synthetic("rezero", 4, residual_rms=[0.02, 0.03, 0.04, 0.05], block_cosine=[0.9] * 4)], None),
}


@pytest.mark.parametrize("variants,agreeing,differing,hidden_size", THEORY_CASES.values(), ids=THEORY_CASES)
def test_theory_checks_agree_and_differ_when_they_should(variants, agreeing, differing, hidden_size):
    for results, expected in ((agreeing, True), (differing, False)):
        verdicts = {}
        for variant, _, _, agrees in signal_propagation.theory(results, 16, 0.25, hidden_size):
            verdicts.setdefault(variant, []).append(agrees)
        assert {v: verdicts[v] for v in variants} == {v: [expected] * len(verdicts[v]) for v in variants}


def test_bad_flags_are_one_line_errors():
    with pytest.raises(UserError, match="unknown variant 'sideways-rmsnorm'"):
        signal_propagation.main(["--variants", "sideways-rmsnorm"])
    with pytest.raises(UserError, match="--depths must be positive"):
        signal_propagation.main(["--depths", "4", "-1"])
    with pytest.raises(UserError, match="--seq_len must be a positive integer"):
        signal_propagation.main(["--seq_len", "0"])

