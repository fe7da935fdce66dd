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
    figure = tmp_path / "figures" / "curves.png"  # its folder made
    plot_runs.main([str(step), str(killed), "--out", str(figure)])
    assert drawn == [["rms-pre (pre-rmsnorm)", "killed"]]
    assert figure.stat().st_size > 10_000
    assert capsys.readouterr().out == f"wrote {figure}\n"
    # two runs of one name (a/rms-pre, b/rms-pre): told apart by their paths
    twin = tmp_path / "b" / "rms-pre"
    shutil.copytree(trained_run, twin)
    monkeypatch.chdir(tmp_path)
    plot_runs.main([str(trained_run), str(twin), "--out", str(figure)])
    assert drawn[-1][1] == "b/rms-pre (pre-rmsnorm)" and drawn[-1][0].endswith("/rms-pre (pre-rmsnorm)")


@pytest.mark.parametrize("case", ["no records", "no finite loss", "given twice", "not a png",
                                  "no such folder", "a file"])
def test_what_cannot_be_drawn_is_one_line(case, trained_run, tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": NaN}\n' * 3)
    argv, message = {
        "no records": ([tmp_path / "empty"], f"^{tmp_path / 'empty'}: no metrics.jsonl; pass a run folder"),
        "no finite loss": ([tmp_path], f"^{tmp_path}: no finite training loss in its metrics.jsonl yet "
                           "\\(a run that diverged, or has not logged a step\\)$"),
        "given twice": ([trained_run, next(trained_run.glob("step-*"))], "a run is given twice"),
        "not a png": ([trained_run, "--out", tmp_path / "c.pdf"], "the figure is a PNG; name it"),
        "no such folder": ([trained_run, tmp_path / "nope"], f"^{tmp_path / 'nope'}: no such folder$"),
        "a file": ([trained_run / "metrics.jsonl"], "metrics.jsonl: not a folder; pass a run folder"),
    }[case]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=message):
        plot_runs.main([*map(str, argv), *([] if "--out" in argv else ["--out", str(tmp_path / "c.png")])])
    assert not (tmp_path / "c.png").exists()


def test_a_folder_named_as_the_figure_is_kept(trained_run, tmp_path):
    """--out naming an existing folder: writing the figure in its place would delete what it holds."""
    kept = tmp_path / "curves.png"
    (kept / "sub").mkdir(parents=True)
    (kept / "sub" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=f"^{kept} is a folder: give a file's path$"):
        plot_runs.main([str(trained_run), "--out", str(kept)])
    assert (kept / "sub" / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]  # no temporary file left
