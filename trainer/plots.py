"""Figures from metrics.jsonl records: per-layer profiles (trainer and study) and loss curves (study)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_layer_profiles(runs: dict[str, list[dict]], path: Path) -> None:
    """Residual-stream RMS entering each block, and each block's gradient norm, at the last logged step."""
    fig, (ax_rms, ax_grad) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, records in runs.items():
        last = [r for r in records if r["split"] == "train"][-1]
        layers = np.arange(len(last["residual_rms"]))
        ax_rms.plot(layers, last["residual_rms"], marker="o", label=name)
        ax_grad.plot(layers, last["layer_grad_norm"], marker="o", label=name)
    ax_rms.set(title="residual stream RMS entering block", xlabel="block", yscale="log")
    ax_grad.set(title="gradient norm of block parameters", xlabel="block", yscale="log")
    ax_rms.legend(fontsize=8)
    for ax in (ax_rms, ax_grad):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _band(ax, runs: list[list[dict]], split: str, x_key: str, label: str) -> None:
    """Mean over seeds with a min-max band; runs are aligned on step (same schedule), x from the first seed."""
    curves = [[r for r in recs if r["split"] == split and np.isfinite(r["loss"])] for recs in runs]
    n = min(len(c) for c in curves)
    if n == 0:
        return
    losses = np.array([[r["loss"] for r in c[:n]] for c in curves])
    x = np.mean([[r[x_key] for r in c[:n]] for c in curves], axis=0)
    (line,) = ax.plot(x, losses.mean(0), label=label)
    if len(curves) > 1:
        ax.fill_between(x, losses.min(0), losses.max(0), color=line.get_color(), alpha=0.2)


def plot_loss_curves(variants: dict[str, list[list[dict]]], path: Path) -> None:
    """Train and validation loss against step and against training wall-clock time, one line per variant."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey="row")
    for (row, split), (col, x_key) in ((rs, xc) for rs in enumerate(("train", "val"))
                                       for xc in enumerate(("step", "train_time_s"))):
        ax = axes[row][col]
        for name, runs in variants.items():
            _band(ax, runs, split, x_key, name)
        ax.set(xlabel="step" if x_key == "step" else "training time (s)", ylabel=f"{split} loss")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("mean over seeds, band = min..max")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_grid(values: np.ndarray, rows: list, cols: list, path: Path, title: str) -> None:
    """Heatmap of final validation loss (NaN = diverged, drawn as an X) over a learning-rate x warmup grid."""
    fig, ax = plt.subplots(figsize=(1.4 + 1.2 * len(cols), 1.0 + 0.6 * len(rows)))
    ax.imshow(np.nan_to_num(values, nan=np.nanmax(values) if np.isfinite(values).any() else 0), cmap="viridis_r",
              aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            ax.text(j, i, "X" if np.isnan(values[i, j]) else f"{values[i, j]:.2f}", ha="center", va="center",
                    color="red" if np.isnan(values[i, j]) else "white", fontsize=9)
    ax.set(xticks=range(len(cols)), xticklabels=cols, yticks=range(len(rows)), yticklabels=rows, title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
