"""trainer/device.py and the CUDA path's other choices that can be checked without a GPU: the device preset, which
GPU is made current, and the note when a CUDA build finds no usable GPU. tests/test_cuda.py runs on one."""

import pytest
import torch

from trainer import device as device_module
from trainer import process
from trainer.args import DEVICE_DEFAULTS


def test_cuda_preset_fills_a_gpu_and_the_cpu_preset_is_unchanged():
    cuda, cpu = DEVICE_DEFAULTS["cuda"], DEVICE_DEFAULTS["cpu"]
    max_seq_len = 256  # the trainer's default, the same on every device
    assert cuda["batch_size"] * max_seq_len >= 32768
    assert cuda["diag_interval"] >= 100 and cuda["warmup_steps"] < cuda["max_steps"]
    assert cpu == {"hidden_size": 128, "batch_size": 8, "max_steps": 760, "learning_rate": 6e-3, "warmup_steps": 100,
                   "diag_interval": None}


def test_cuda_n_becomes_the_current_device(monkeypatch):
    current = []
    monkeypatch.setattr(process, "pick_device", torch.device)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert process.setup_distributed("cuda:1", 1) == (0, 1, torch.device("cuda:1"))
    assert current == [torch.device("cuda:1")]
    process.setup_distributed("cpu", 1)
    assert current == [torch.device("cuda:1")]


@pytest.mark.parametrize("gpu_present", [True, False])
def test_auto_on_a_cuda_build_with_an_unusable_gpu_says_so_once(gpu_present, tmp_path, monkeypatch, capsys):
    node = tmp_path / "nvidia0"
    if gpu_present:
        node.touch()
    monkeypatch.setattr(device_module, "NVIDIA_DEVICE_FILES", (str(node),))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device_module.note_unusable_gpu.cache_clear()
    assert device_module.pick_device("auto") == device_module.pick_device("auto") == torch.device("cpu")
    device_module.note_unusable_gpu.cache_clear()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == (1 if gpu_present else 0)
    assert all(line.startswith("note: --device auto:") and "training on the CPU" in line for line in lines)
