"""scripts/plot_runs.py: the loss curves of runs one flag apart, side by side."""

import shutil

import pytest

from common.cli import UserError
from scripts import plot_runs


def test_runs_are_drawn_under_their_names_and_variants_and_a_killed_one_draws_what_it_logged(
        trained_run, tmp_path, monkeypatch, capsys):
    from study import plots
    killed = tmp_path / "killed"  # no summary.json: it never ended
    killed.mkdir()
    shutil.copy(trained_run / "metrics.jsonl", killed)
    drawn = []

    def save(fig, path, **kwargs):
        drawn.append([text.get_text() for legend in fig.legends for text in legend.get_texts()])
        real_save(fig, path, **kwargs)
    real_save = plots.save
    monkeypatch.setattr(plots, "save", save)
    step = next(trained_run.glob("step-*"))
    plot_runs.main([str(step), str(killed), "--out", str(tmp_path / "curves.png")])
    assert drawn == [["rms-pre (pre-rmsnorm)", "killed"]]
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    assert capsys.readouterr().out == f"wrote {tmp_path / 'curves.png'}\n"


def test_a_folder_without_records_is_named(tmp_path):
    with pytest.raises(UserError, match=f"^{tmp_path}: no training records .*pass a run folder"):
        plot_runs.main([str(tmp_path), "--out", str(tmp_path / "curves.png")])
