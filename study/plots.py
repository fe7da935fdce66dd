"""The study's figures: loss curves, stability grids, depth and learning-rate sensitivity (scripts/run_ablation.py's
report), signal propagation at initialization (scripts/signal_propagation.py)."""

from pathlib import Path

import numpy as np

from trainer.plots import LAYER_PANELS, line_style, pyplot


def save(fig, path: Path, rect=None, **savefig) -> None:
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110, **savefig)
    pyplot().close(fig)


def _band(ax, runs: list[list[dict]], split: str, x_key: str, label: str, style: dict) -> None:
    """Mean over seeds with a min-max band; runs are aligned on step (same schedule), x from the first seed."""
    curves = [[r for r in recs if r["split"] == split and np.isfinite(r["loss"])] for recs in runs]
    n = min(len(c) for c in curves)
    if n == 0:
        return
    losses = np.array([[r["loss"] for r in c[:n]] for c in curves])
    x = np.mean([[r[x_key] for r in c[:n]] for c in curves], axis=0)
    ax.plot(x, losses.mean(0), label=label, **style)
    if len(curves) > 1:
        ax.fill_between(x, losses.min(0), losses.max(0), color=style["color"], alpha=0.2)


def plot_loss_curves(variants: dict[str, list[list[dict]]], path: Path) -> None:
    """Train and validation loss against step and against training wall-clock time, one line per variant."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey="row")
    for row, split in zip(axes, ("train", "val"), strict=True):
        row[0].set_yscale("log")  # a loss spike in one variant (no norm: 1e4) would flatten every other curve
        for ax, x_key in zip(row, ("step", "train_time_s"), strict=True):
            for index, (name, runs) in enumerate(variants.items()):
                _band(ax, runs, split, x_key, name, line_style(index))
            ax.set(xlabel="step" if x_key == "step" else "training time (s)", ylabel=f"{split} loss")
            ax.grid(alpha=0.3)
    # Beside the panels, not in one: a study of dozens of runs has a legend taller than a panel.
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="center left", bbox_to_anchor=(1, 0.5), fontsize=8)
    fig.suptitle("mean over seeds, band = min..max")
    save(fig, path, bbox_inches="tight")


def plot_grid(values: np.ndarray, rows: list, cols: list, path: Path, title: str) -> None:
    """Heatmap of final validation loss (NaN = diverged, drawn as an X) over a learning-rate x warmup grid."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.4 + 1.2 * len(cols), 1.0 + 0.6 * len(rows)))
    ax.imshow(np.nan_to_num(values, nan=np.nanmax(values) if np.isfinite(values).any() else 0), cmap="viridis_r",
              aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            ax.text(j, i, "X" if np.isnan(values[i, j]) else f"{values[i, j]:.2f}", ha="center", va="center",
                    color="red" if np.isnan(values[i, j]) else "white", fontsize=9)
    ax.set(xticks=range(len(cols)), xticklabels=cols, yticks=range(len(rows)), yticklabels=rows, title=title)
    save(fig, path)


def plot_depth(lines: dict[str, list[tuple[int, list[dict]]]], path: Path, unigram: float | None = None) -> None:
    """Final validation loss against depth: per line (a variant), the mean over seeds with min..max bars, from
    summaries with val_loss, diverged and plateaued. A diverged seed is left out of the mean and draws an x at the
    top edge; a plateaued one a ring around the mean. unigram draws the loss of a context-free model."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    top = ax.get_xaxis_transform()  # x in data, y in axes fraction
    depths = sorted({depth for points in lines.values() for depth, _ in points})
    for index, (name, points) in enumerate(lines.items()):
        finite = [(d, [r["val_loss"] for r in runs if not r["diverged"] and r["val_loss"] is not None], runs)
                  for d, runs in sorted(points, key=lambda p: p[0])]
        kept = [(d, np.array(v), runs) for d, v, runs in finite if v]
        mean = np.array([v.mean() for _, v, _ in kept])
        low, high = np.array([v.min() for _, v, _ in kept]), np.array([v.max() for _, v, _ in kept])
        style = line_style(index)
        ax.errorbar([d for d, _, _ in kept], mean, yerr=[mean - low, high - mean], marker="o", capsize=3, label=name,
                    **style)
        for (d, _, runs), m in zip(kept, mean, strict=True):
            if any(r["plateaued"] for r in runs):
                ax.plot(d, m, marker="o", ms=15, mfc="none", mew=1.5, color=style["color"])
        shift = 1.04 ** (index - (len(lines) - 1) / 2)  # two lines' x marks at one depth stay apart (x is log-scaled)
        for d, _, runs in finite:
            if any(r["diverged"] for r in runs):
                ax.plot(d * shift, 0.98, marker="x", ms=10, mew=2, color=style["color"], transform=top, clip_on=False)
    if unigram is not None:
        ax.axhline(unigram, color="gray", ls=":", label=f"unigram model ({unigram:.2f})")
    ax.plot([], [], "kx", label="x at top: a seed diverged")
    ax.plot([], [], "ko", mfc="none", ms=12, label="ring: a seed plateaued")
    ax.set(xscale="log", xlabel="blocks (depth)", ylabel="final validation loss",
           title="final val loss vs depth (mean, bars = min..max over seeds)")
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside the axes: no point hidden
    save(fig, path)


def plot_lr_sensitivity(tuning: list[dict], path: Path) -> None:
    """Final validation loss (first seed) against peak learning rate, one panel per depth, one line per variant
    (tuning records of scripts/run_ablation.py --tune_lr). A star marks the chosen lr, a hollow marker a run that
    plateaued, an x at the top edge one that diverged."""
    depths = sorted({t["depth"] for t in tuning})
    plt = pyplot()
    fig, axes = plt.subplots(1, len(depths), figsize=(6.5 * len(depths) + 3, 4.5), squeeze=False)
    for ax, depth in zip(axes[0], depths, strict=True):
        top = ax.get_xaxis_transform()
        for index, t in enumerate(t for t in tuning if t["depth"] == depth):
            lrs, losses = np.array(t["learning_rates"]), t["val_losses"]
            finite = np.array([v is not None for v in losses])
            y = np.array([np.nan if v is None else v for v in losses])
            style = line_style(index)
            color = style["color"]
            ax.plot(lrs[finite], y[finite], marker="o", label=t["variant"], **style)
            for lr, loss, usable in zip(lrs, y, t["usable"], strict=True):
                if np.isnan(loss):
                    ax.plot(lr, 0.98, marker="x", ms=9, mew=2, color=color, transform=top, clip_on=False)
                elif not usable:
                    ax.plot(lr, loss, marker="o", ms=11, mfc="white", color=color)
            if t["chosen_lr"] is not None:
                ax.plot(t["chosen_lr"], y[list(lrs).index(t["chosen_lr"])], marker="*", ms=16, color=color,
                        mec="black")
        ax.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss (first seed)",
               title=f"{depth} layers")
        ax.grid(alpha=0.3)
    legend = axes[0][-1]
    legend.plot([], [], "k*", ms=12, label="chosen lr")
    legend.plot([], [], "ko", mfc="white", label="plateaued (cannot win)")
    legend.plot([], [], "kx", label="x at top: diverged")
    legend.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, path)


def plot_signal_propagation(results: list[dict], path: Path) -> None:
    """Per-block statistics at initialization (scripts/signal_propagation.py), one line per variant: against the
    block index at the largest depth measured (top row) and against depth (bottom row)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(17, 8))
    deep = max(r["depth"] for r in results)
    for index, variant in enumerate(dict.fromkeys(r["variant"] for r in results)):
        style = {"label": variant, "ls": ("-", "--", "-.", ":")[index % 4]}  # coinciding lines stay visible
        runs = sorted((r for r in results if r["variant"] == variant), key=lambda r: r["depth"])
        if runs[-1]["depth"] == deep:
            for ax, (key, _, _) in zip(axes[0], LAYER_PANELS, strict=False):  # the first three: residual_rms, ...
                ax.plot(np.arange(deep), runs[-1][key], **style)
        per_depth = ([r["residual_rms"][-1] for r in runs], [r["layer_grad_norm"][0] for r in runs],
                     [r["gradient_spread"] for r in runs])
        for ax, values in zip(axes[1], per_depth, strict=True):
            ax.plot([r["depth"] for r in runs], values, marker="o", **style)
    for ax, (_, title, scale) in zip(axes[0], LAYER_PANELS, strict=False):
        ax.set(title=f"{title} (L={deep})", xlabel="block", yscale=scale)
    depths = sorted({r["depth"] for r in results})
    for ax, title in zip(axes[1], ("residual RMS entering the last block", "gradient norm of the first block",
                                   "block gradient norm max / min"), strict=True):
        ax.set(title=title, xlabel="blocks (depth)", xscale="log", yscale="log")
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.minorticks_off()
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.legend(*axes[1][0].get_legend_handles_labels(), loc="center right", fontsize=9)
    fig.suptitle("signal propagation at initialization, one forward and backward of the LM loss")
    save(fig, path, rect=(0, 0, 0.86, 1))
