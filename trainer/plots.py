"""Every run's per-layer figure (layers.png) and the helpers study/plots.py shares."""

from pathlib import Path

import numpy as np

from common.fs import replaced

# Per-layer statistics the trainer logs (trainer/diagnostics.py):
# record key, panel title, y scale.
LAYER_PANELS = (
    ("residual_rms", "residual stream RMS entering block", "log"),
    ("layer_grad_norm", "gradient norm of block parameters", "log"),
    ("block_cosine", "cosine(block input, block output)", "linear"),
    ("max_attn_logit", "largest attention logit q.k/sqrt(d)", "linear"),
    ("massive_activation", "max|x| / median|x| entering block", "log"),
    ("excess_kurtosis", "excess kurtosis of the stream entering block", "symlog"),
    ("attn_first_token", "attention probability on token 0", "linear"),
)


def line_style(index: int) -> dict:
    """The ten default colours, then dashed, dotted, ...: no two of 17 variants alike."""
    return {"color": f"C{index % 10}", "ls": ("-", "--", ":", "-.")[index // 10 % 4]}


def pyplot():
    """matplotlib's pyplot, imported on the first figure (it takes seconds),
    drawing to files."""
    import matplotlib

    matplotlib.use("Agg")  # never needs a display
    import matplotlib.pyplot as plt

    return plt


def plain_ticks(ax) -> None:
    """A log or symlog y-axis labelled in plain numbers (5, 0.02, 10000), not 5×10⁰."""
    from matplotlib import ticker

    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    if ax.get_yscale() == "log":  # minor ticks labelled only where a decade shows few
        ax.yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False,
                                                         minor_thresholds=(2, 0.5)))


def plot_layer_profiles(runs: dict[str, list[dict]], path: Path) -> None:
    """Each per-layer statistic against block index at the last step that recorded it,
    one line per run (a run that never logged a statistic is left out of its panel)."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    for ax, (key, title, scale) in zip(axes.flat, LAYER_PANELS, strict=False):
        for index, (name, records) in enumerate(runs.items()):
            logged = [r[key] for r in records
                      if r["split"] == "train" and r.get(key) is not None]
            if logged:
                last = logged[-1]
                ax.plot(np.arange(len(last)), last, marker="o", label=name,
                        **line_style(index))
        shown = np.concatenate([line.get_ydata() for line in ax.get_lines()] or [[]])
        # nan or 0 only (a diverged run): nothing to log
        if scale == "log" and not (shown > 0).any():
            scale = "linear"
        ax.set(title=title, xlabel="block", yscale=scale)
        if scale != "linear":
            plain_ticks(ax)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    legend = axes.flat[-1]  # the eighth cell holds the legend
    legend.axis("off")
    legend.legend(*axes.flat[0].get_legend_handles_labels(), loc="center", fontsize=8)
    fig.tight_layout()
    # a link planted at path is replaced, never written through
    with replaced(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
