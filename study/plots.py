"""The study's figures, drawn by scripts/run_ablation.py's report: loss curves, stability grids, depth and
learning-rate sensitivity (and the loss curves of scripts/plot_runs.py)."""

from pathlib import Path

import numpy as np

from common.fs import replaced
from trainer.plots import line_style, plain_ticks, pyplot


def save(fig, path: Path, rect=None, **savefig) -> None:
    fig.tight_layout(rect=rect)
    with replaced(path) as tmp:  # a link planted at path is replaced, never written through
        fig.savefig(tmp, dpi=110, format="png", **savefig)
    pyplot().close(fig)


def _band(ax, runs: list[list[dict]], split: str, x_key: str, label: str, style: dict) -> None:
    """At each step, the mean over the seeds that logged it, with a min-max band: a seed that
    stopped early (diverged) leaves the mean there, and the others' curves go on."""
    at_step = {}
    for records in runs:
        for r in records:
            if r["split"] == split and np.isfinite(r["loss"]):
                at_step.setdefault(r["step"], []).append((r[x_key], r["loss"]))
    if not at_step:
        return
    points = [np.array(at_step[step]) for step in sorted(at_step)]
    x = [p[:, 0].mean() for p in points]
    ax.plot(x, [p[:, 1].mean() for p in points], label=label,
            marker="o" if len(points) == 1 else None, **style)  # a single point shows too
    if len(runs) > 1:
        ax.fill_between(x, [p[:, 1].min() for p in points], [p[:, 1].max() for p in points],
                        color=style["color"], alpha=0.2)


def plot_loss_curves(variants: dict[str, list[list[dict]]], path: Path,
                     title: str = "mean over seeds, band = min..max") -> None:
    """Train and validation loss against step and against training wall-clock time, one line per variant."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey="row")
    for row, split in zip(axes, ("train", "val"), strict=True):
        losses = [r["loss"] for runs in variants.values() for records in runs for r in records
                  if r["split"] == split and np.isfinite(r["loss"]) and r["loss"] > 0]
        # a loss spike in one variant (no norm: 1e4) would flatten every other curve: log then
        if losses and max(losses) > 10 * min(losses):
            row[0].set_yscale("log")
            plain_ticks(row[0])
        for ax, x_key in zip(row, ("step", "train_time_s"), strict=True):
            for index, (name, runs) in enumerate(variants.items()):
                _band(ax, runs, split, x_key, name, line_style(index))
            ax.set(xlabel="step" if x_key == "step" else "training time (s)", ylabel=f"{split} loss")
            ax.grid(alpha=0.3)
    # Beside the panels, not in one: a study of dozens of runs has a legend taller than a panel.
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="center left", bbox_to_anchor=(1, 0.5),
               fontsize=8)
    fig.suptitle(title)
    save(fig, path, bbox_inches="tight")


def plot_grid(cells: list[list[float | None]], rows: list, cols: list, path: Path, title: str) -> None:
    """Heatmap of final validation loss over a learning-rate x warmup grid, one cell per pair: NaN
    (a seed diverged) is an X in the worst colour, None (nothing trained there) a blank cell."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.4 + 1.2 * len(cols), 1.0 + 0.6 * len(rows)))
    values = np.array([[np.nan if v is None else v for v in row] for row in cells], dtype=float)
    worst = np.nanmax(values) if np.isfinite(values).any() else 0
    untrained = np.array([[v is None for v in row] for row in cells])
    ax.imshow(np.ma.masked_array(np.nan_to_num(values, nan=worst), mask=untrained),
              cmap="viridis_r", aspect="auto")
    for i, row in enumerate(cells):
        for j, value in enumerate(row):
            if value is None:
                continue
            diverged = np.isnan(value)
            ax.text(j, i, "X" if diverged else f"{value:.2f}", ha="center", va="center",
                    color="red" if diverged else "white", fontsize=9)
    ax.set(xticks=range(len(cols)), xticklabels=cols, yticks=range(len(rows)), yticklabels=rows,
           title=title)
    save(fig, path)


def plot_depth(lines: dict[str, list[tuple[int, list[dict]]]], path: Path, unigram: float | None = None):
    """Final validation loss against depth: per line (a variant), the mean over seeds with min..max bars, from
    summaries with val_loss, diverged and plateaued. A diverged seed is left out of the mean and draws an x at
    the top edge; a plateaued one a ring around the mean. unigram draws the loss of a context-free model."""
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
        ax.errorbar([d for d, _, _ in kept], mean, yerr=[mean - low, high - mean], marker="o", capsize=3,
                    label=name, **style)
        for (d, _, runs), m in zip(kept, mean, strict=True):
            if any(r["plateaued"] for r in runs):
                ax.plot(d, m, marker="o", ms=15, mfc="none", mew=1.5, color=style["color"])
        # two lines' x marks at one depth stay apart (x is log-scaled)
        shift = 1.04 ** (index - (len(lines) - 1) / 2)
        for d, _, runs in finite:
            if any(r["diverged"] for r in runs):
                ax.plot(d * shift, 0.98, marker="x", ms=10, mew=2, color=style["color"], transform=top,
                        clip_on=False)
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


def plot_lr_sensitivity(tuning: list[dict], path: Path, title: str = "") -> None:
    """Final validation loss against peak lr (tuning.json records of run_ablation.py --tune_lr), one panel per
    depth, one line per variant through the mean over the tune seeds, with each seed as a dot and the min..max
    as a bar. A star marks the chosen lr, a hollow ring an lr where a seed plateaued, an x at the top one
    where a seed diverged. The y-range is the band near the best losses, where the contested differences
    live."""
    depths = sorted({t["depth"] for t in tuning})
    plt = pyplot()
    fig, axes = plt.subplots(1, len(depths), figsize=(6.5 * len(depths) + 3, 5), squeeze=False)
    finite = [v for t in tuning for seeds in t.get("seed_losses") or [t["val_losses"]] for v in seeds
              if v is not None]
    low = min(finite, default=0.0)
    for ax, depth in zip(axes[0], depths, strict=True):
        top = ax.get_xaxis_transform()
        for index, t in enumerate(t for t in tuning if t["depth"] == depth):
            style, lrs = line_style(index), np.array(t["learning_rates"])
            seeds = t.get("seed_losses") or [[v] for v in t["val_losses"]]  # older folders: one tune seed
            y = np.array([np.mean(s) if None not in s else np.nan for s in seeds])
            ax.plot(lrs, y, marker="o", label=t["variant"], **style)
            for lr, values, usable in zip(lrs, seeds, t["usable"], strict=True):
                kept = [v for v in values if v is not None]
                ax.plot([lr] * len(kept), kept, ".", color=style["color"], alpha=0.6)
                if len(kept) > 1:
                    ax.vlines(lr, min(kept), max(kept), color=style["color"], alpha=0.6)
                if len(kept) < len(values):
                    ax.plot(lr, 0.98, marker="x", ms=9, mew=2, color=style["color"], transform=top,
                            clip_on=False)
                elif not usable:
                    ax.plot(lr, np.mean(kept), marker="o", ms=11, mfc="none", color=style["color"])
            if t["chosen_lr"] is not None:
                ax.plot(t["chosen_lr"], y[list(lrs).index(t["chosen_lr"])], marker="*", ms=16, mec="black",
                        color=style["color"])
        ax.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss",
               title=f"{title} {depth} layers".strip(), ylim=(low - 0.03, low + 0.5))
        ax.grid(alpha=0.3)
    legend = axes[0][-1]
    legend.plot([], [], "k*", ms=12, label="chosen lr (mean of the tune seeds)")
    legend.plot([], [], "ko", mfc="none", label="a seed plateaued (cannot win)")
    legend.plot([], [], "kx", label="x at top: a seed diverged (cannot win)")
    legend.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, path)


VERDICT_COLOURS = {"behind": "tab:red", "ahead": "tab:green", "closes": "tab:blue", "grows": "tab:red",
                   "shrinks": "tab:green", "holds": "tab:blue", "open": "tab:gray",
                   "does not train": "black", "interim": "tab:olive"}


def plot_forest(rows: list[dict], path: Path) -> None:
    """Every claim row of scripts/write_claims.py: Δ (variant − baseline) with its CI, one line per
    claim and folder, coloured by its verdict; a primary folder's row filled and in bold, any other
    row hollow and grey (it gives no verdict). Speed rows' Δ is a log time ratio."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(12, 0.25 * len(rows) + 1.5))
    shown = list(reversed(rows))  # the first claim at the top
    for y, row in enumerate(shown):
        stats = row["val"]
        colour = VERDICT_COLOURS.get(row["verdict"], "tab:gray")
        if stats.mean is None:
            continue
        if stats.ci_low is not None:
            ax.hlines(y, stats.ci_low, stats.ci_high, color=colour, lw=2 if row["primary"] else 1)
        ax.plot(stats.mean, y, "o", color=colour, mfc=colour if row["primary"] else "none")
    ax.set_yticks(range(len(shown)), [f"{r['claim']} [{r['folder']}]" for r in shown], fontsize=7)
    for label, row in zip(ax.get_yticklabels(), shown, strict=True):
        label.set_fontweight("bold" if row["primary"] else "normal")
    ax.axvline(0, color="black", lw=0.8)
    for bound in (-0.02, 0.02):
        ax.axvline(bound, color="tab:blue", lw=0.6, ls="--")
    ax.set_xscale("symlog", linthresh=0.02)  # the contested differences live within ±0.1
    ticks = [-1, -0.1, -0.02, 0, 0.02, 0.1, 1]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set(xlim=(-2, 2), ylim=(-1, len(rows)),
           xlabel="Δ val loss, nats (speed: log time ratio); logarithmic beyond ±0.02")
    for verdict, colour in VERDICT_COLOURS.items():
        ax.plot([], [], "o", color=colour, label=verdict)
    ax.plot([], [], "o", color="tab:gray", mfc="none", label="not primary: no verdict")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3, axis="x")
    save(fig, path, bbox_inches="tight")
