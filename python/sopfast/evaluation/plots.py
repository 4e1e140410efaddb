"""Pictures of :func:`sopfast.evaluate`'s results: the paper's accuracy curves."""

from __future__ import annotations

from typing import Any

from ..integrity import save_figure

Results = dict[str, dict[str, Any]]
# SOP and random groups in fixed colours; the other methods take the rest of matplotlib's tab10
COLOURS = {"SOP": "#1f77b4", "Random": "#7f7f7f"}
OTHERS = ("#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")


def _parse(key: str) -> tuple[float, int | None]:
    tau, _, m = key.partition("/")
    return float(tau), (int(m) if m else None)


def plot_curves(results: Results, path: str, metric: str = "accuracy") -> str:
    """A PNG of the ``curves`` results: one panel per group count (accuracy over inference sparsity τ),
    a line per method; methods with one group (the -F baselines, FRESH) appear in every panel.
    Returns ``path``; ValueError when no method has curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {name: r["curves"] for name, r in results.items() if r.get("curves")}
    if not curves:
        raise ValueError("the results hold no curves: evaluate with metrics=[..., 'curves']")
    counts = sorted({m for c in curves.values() for k in c if (m := _parse(k)[1]) is not None})
    panels: list[int | None] = list(counts) or [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.2), squeeze=False, sharey=True)
    others = iter(OTHERS * 2)
    colours = {name: COLOURS.get(name) or next(others) for name in curves}
    taus = sorted({_parse(k)[0] for c in curves.values() for k in c})
    for ax, m in zip(axes[0], panels):
        for name, curve in curves.items():
            points = sorted((t, v) for k, v in curve.items() if (p := _parse(k))[1] in (m, None) for t in [p[0]])
            if not points:
                continue
            single = all(_parse(k)[1] is None for k in curve)
            ax.plot(
                [t for t, _ in points],
                [v for _, v in points],
                marker="o",
                linestyle="--" if single else "-",
                linewidth=2.2 if name == "SOP" else 1.2,
                color=colours[name],
                label=name + (" (1 group)" if single else ""),
            )
        ax.set_title("all methods" if m is None else f"{m} group{'s' if m != 1 else ''}", fontsize=10)
        ax.set_xscale("log")
        ax.set_xticks(taus, [f"{t:g}" for t in taus])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(metric)
    fig.supxlabel("inference sparsity τ (fraction of features per group)", fontsize=9, y=0.13)
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(f"{metric} over inference sparsity and group count", fontsize=11)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path
