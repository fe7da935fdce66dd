"""The CUDA path on a real GPU (skipped without one): the trainer in bf16, eager and compiled, never waiting
on the GPU between log steps, and resuming; RMSNorm against float64; the attention call taking a fused kernel;
the MFU peak of this very device. extras/bench/gpu_check.py runs this file first on a lent GPU."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import trainer.train_pretrain as tp
from model.model_minimind import RMSNorm
from trainer.args import parse_args
from trainer.diagnostics import peak_flops
from trainer.tracking import read_metrics

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# the tiny model on the GPU in bf16, a little wider and longer than on the CPU (a flag given again overrides)
ON_CUDA = ["--device", "cuda", "--dtype", "bfloat16", "--hidden_size", "64", "--max_seq_len", "64",
           "--batch_size", "8", "--learning_rate", "3e-3", "--warmup_steps", "2"]
LOG = 4  # --log_interval, and every evaluation and save falls on a log step


@pytest.fixture
def train_args(tmp_path, tiny_flags):
    def make(*flags, out: str = "run", log: int = LOG):
        flags = ["--log_interval", log, "--eval_interval", 2 * log, "--save_interval", 2 * log, *flags]
        return parse_args([*tiny_flags, *ON_CUDA, "--out_dir", str(tmp_path / out), *map(str, flags)])
    return make


def synchronizations(args) -> tuple[dict, int]:
    """A run's summary and how often the host waited on the GPU (the sync debug mode's warnings); Dynamo is
    reset first, so that with --compile every run compiles and warms up alike."""
    torch._dynamo.reset()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summary = tp.train(args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return summary, sum("synchronizing CUDA operation" in str(w.message) for w in caught)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_bf16_training_never_waits_on_the_gpu_between_log_steps(compiled, train_args, fresh_dynamo):
    """Two runs with the same log, eval and save steps (two of each), one with 3x the steps between them: had
    a step doing none of these waited on the GPU, the longer run would wait more. Compiling waits too, less
    once Inductor's caches hold the graphs (an H200 gave 146 waits for the first compiled run, 115 for the
    second), so with --compile a first run fills the caches and the longer run may wait less, never more."""
    flags = ["--compile"] if compiled else []
    if compiled:
        synchronizations(train_args("--max_steps", 2 * LOG, *flags, out="warm"))
    short, short_syncs = synchronizations(train_args("--max_steps", 2 * LOG, *flags, out="short"))
    args = train_args("--max_steps", 6 * LOG, *flags, log=3 * LOG)
    summary, syncs = synchronizations(args)
    assert short_syncs > 0 and (syncs <= short_syncs if compiled else syncs == short_syncs)  # the count sees
    assert summary["step"] == 6 * LOG and not summary["diverged"] and math.isfinite(summary["val_loss"])
    assert summary["tokens_per_s"] > 0 and not short["diverged"]
    train = [r for r in read_metrics(args.out_dir + "/metrics.jsonl") if r["split"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"] and all(r["peak_mem_mb"] > 0 for r in train)


def test_bf16_resume_continues_the_run(train_args):
    """Bit-exact resume is a CPU property (tests/test_trainer.py); on a GPU the attention backward may sum in
    another order, so the resumed run must only stay close to the straight one."""
    straight = tp.train(train_args("--max_steps", 2 * LOG, "--lr_decay_steps", 2 * LOG, out="straight"))
    tp.train(train_args("--max_steps", LOG, "--lr_decay_steps", 2 * LOG, out="halves"))
    resumed = tp.train(train_args("--max_steps", 2 * LOG, "--lr_decay_steps", 2 * LOG, "--resume",
                                  out="halves"))
    assert resumed["step"] == straight["step"] == 2 * LOG
    assert resumed["val_loss"] == pytest.approx(straight["val_loss"], rel=2e-2)


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_on_cuda_matches_the_formula(x_dtype):
    """The model's RMSNorm on this GPU against the formula in float64, for the dtypes training feeds it: fp32
    (the residual stream under autocast) and bf16 (QK-norm's input)."""
    torch.manual_seed(0)
    norm = RMSNorm(512).cuda()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = (torch.randn(16, 64, 512, device="cuda") * 3).to(x_dtype).requires_grad_()
    y = norm(x)
    x64, w64 = x.detach().double().requires_grad_(), norm.weight.detach().double().requires_grad_()
    ref = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + norm.eps)) * w64
    tol = 1e-5 if x_dtype == torch.float32 else 2 * torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, norm.weight], dy)
    want = torch.autograd.grad(ref, [x64, w64], dy.double())
    for a, b in zip(got, want, strict=True):  # norm-wise: the weight's gradient sums 1,024 rounded terms
        assert (a.double() - b).norm() <= tol * b.norm()


def test_training_attention_takes_a_fused_kernel():
    """The trainer's SDPA call (bf16, causal, grouped-query, head_dim 64) runs on flash or cuDNN attention:
    with only those allowed, a fallback to the math kernel would raise."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(8, 8, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(8, 2, 256, 64, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(2))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()


def test_mfu_peak_of_this_device():
    """This GPU's name is looked up as such: a known datacenter or listed GeForce card gets its peak, a MIG
    slice none. A failure here names a device the table should learn (trainer/diagnostics.py PEAK_FLOPS)."""
    name = torch.cuda.get_device_name()
    peak = peak_flops(torch.device("cuda"), torch.bfloat16)
    assert peak == peak_flops(torch.device("cuda"), torch.bfloat16, name)
    known = any(family in name for family in ("H100", "H200", "A100", "L4", "L40S", "RTX 4090", "RTX 3090"))
    if "MIG" in name:
        assert peak is None, name
    elif known:
        assert peak is not None, f"{name!r} is not in PEAK_FLOPS"


def test_peak_memory_is_each_runs_own(train_args):
    """Runs in one process (as the ablation runner trains them): a small run after a large one reports its own
    peak, not the large one's."""
    large = tp.train(train_args("--max_steps", 2, "--batch_size", 64, "--log_interval", 2, out="large"))
    small = tp.train(train_args("--max_steps", 2, "--batch_size", 2, "--log_interval", 2, out="small"))

    def peak(summary):
        return max(r["peak_mem_mb"] for r in read_metrics(summary["out_dir"] + "/metrics.jsonl")
                   if r["split"] == "train")
    assert peak(small) < peak(large)
