"""The figure every training run draws (layers.png: per-layer profiles, which the study's report draws too) and
the drawing helpers study/plots.py shares."""

from pathlib import Path

import numpy as np

# Per-layer statistics the trainer logs (trainer/diagnostics.py): record key, panel title, y scale.
LAYER_PANELS = (
    ("residual_rms", "residual stream RMS entering block", "log"),
    ("layer_grad_norm", "gradient norm of block parameters", "log"),
    ("block_cosine", "cosine(block input, block output)", "linear"),
    ("max_attn_logit", "largest attention logit q.k/sqrt(d)", "linear"),
    ("massive_activation", "max|x| / median|x| entering block", "log"),
    ("excess_kurtosis", "excess kurtosis of the stream entering block", "symlog"),
    ("attn_first_token", "attention probability on token 0", "linear"),
    ("attn_sink_share", "attention probability on the sinks", "linear"),
)


def line_style(index: int) -> dict:
    """The ten default colours, then dashed, dotted, ...: no two of a study's 17 variants alike in a legend."""
    return {"color": f"C{index % 10}", "ls": ("-", "--", ":", "-.")[index // 10 % 4]}


def pyplot():
    """matplotlib's pyplot, imported on the first figure (it takes seconds) and drawing to files only."""
    import matplotlib

    matplotlib.use("Agg")  # never needs a display
    import matplotlib.pyplot as plt

    return plt


def plot_layer_profiles(runs: dict[str, list[dict]], path: Path) -> None:
    """Each per-layer statistic against block index at the last step that recorded it, one line per run (a run
    that never logged a statistic is left out of its panel)."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    fig, axes = plt.subplots(3, 3, figsize=(14, 10.5))
    for ax, (key, title, scale) in zip(axes.flat, LAYER_PANELS, strict=False):
        for index, (name, records) in enumerate(runs.items()):
            last = next((r[key] for r in reversed(records) if r["split"] == "train" and r.get(key) is not None), None)
            if last is not None:
                ax.plot(np.arange(len(last)), last, marker="o", label=name, **line_style(index))
        ax.set(title=title, xlabel="block", yscale=scale)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    legend = axes.flat[-1]  # the ninth cell holds the legend
    legend.axis("off")
    legend.legend(*axes.flat[0].get_legend_handles_labels(), loc="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
