"""Provenance: what environment() records, with and without git."""

import os
import subprocess
from datetime import datetime, timedelta, timezone

import datasets
import pytest
import torch

import common.environment as provenance
from common.environment import describe, environment, usable_cores
from data import prepare_split


def git(repo, *command):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *command],
                   check=True, capture_output=True)


def test_the_libraries_machine_threads_and_date():
    env = environment(torch.device("cpu"))
    assert env["torch"] == torch.__version__ and env["threads"] == torch.get_num_threads()
    assert env["transformers"][0].isdigit() and env["datasets"][0].isdigit()
    assert env["device"] == env["cpu"] == provenance.cpu_model()
    assert env["cpu_isa"] == [torch.backends.cpu.get_cpu_capability()]
    date = datetime.fromisoformat(env["date"])
    assert date.utcoffset() == timedelta(0) and abs(datetime.now(timezone.utc) - date) < timedelta(hours=1)
    assert describe(env).startswith(f"Produced {env['date']} by commit ")


def test_the_commit_and_whether_the_files_differ(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git(tmp_path, "add", "code.py")
    git(tmp_path, "commit", "-qm", "first")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout
    env = environment()
    assert env["git_commit"] == head.strip() and env["git_dirty"] is False
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "summary.json").write_text("{}\n")  # a study's own output
    assert environment()["git_dirty"] is False
    (tmp_path / "helper.py").write_text("y = 1\n")  # untracked, yet code a run may import
    assert environment()["git_dirty"] is True
    (tmp_path / "helper.py").unlink()
    (tmp_path / "code.py").write_text("x = 2\n")
    env = environment()
    assert env["git_dirty"] is True and f"commit {head[:12]} (dirty)" in describe(env)


def test_git_is_optional(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # git must not find a checkout above
    monkeypatch.setattr(provenance, "REPO", tmp_path)  # not a git checkout (a release tarball, say)
    env = environment()
    assert env["git_commit"] is None and env["git_dirty"] is None and "by commit unknown" in describe(env)
    monkeypatch.setenv("PATH", str(tmp_path))  # no git program at all
    monkeypatch.setattr(provenance, "REPO", provenance.Path(__file__).resolve().parents[1])
    env = environment()
    assert env["git_commit"] is None and env["git_dirty"] is None and env["torch"] == torch.__version__


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs CPU affinity masks and two cores to restrict")
def test_tokenizing_uses_the_cores_the_process_may_use(tmp_path, tiny_corpus, tiny_tokenizer, capsys,
                                                       monkeypatch):
    monkeypatch.setattr(datasets.fingerprint, "_CACHING_ENABLED", False)  # else a map done before is reused
    before = os.sched_getaffinity(0)
    try:
        for cores in (1, 2):
            os.sched_setaffinity(0, set(sorted(before)[:cores]))
            assert usable_cores() == cores
            prepare_split(tiny_corpus, "train", tiny_tokenizer, cache_dir=tmp_path / str(cores))
            # datasets names its worker count in the progress bar when it starts more than one
            assert ("num_proc=2" in capsys.readouterr().err) == (cores == 2)
        prepare_split(tiny_corpus, "train", tiny_tokenizer, cache_dir=tmp_path / "flag", num_proc=1)  # wins
        assert "num_proc=" not in capsys.readouterr().err
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.parametrize("cpuinfo, model", [
    ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n\nmodel name\t: other\n",
     "Intel(R) Xeon(R) Processor"),  # the first processor's entry
    (None, None),  # no /proc (macOS)
])
def test_the_cpu_model_comes_from_the_kernel(tmp_path, cpuinfo, model):
    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(cpuinfo)
    fallback = provenance.platform.processor() or provenance.platform.machine()
    assert provenance.cpu_model(path) == (model or fallback)
