"""Figures: loss, metric and gradient cosine against steps; a final metric against runs."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["plot_comparison", "plot_runs", "layer_grid"]


def _curve(histories: list[list[dict]], tag: str):
    """Mean and spread over seeds of ``tag`` at the steps where every seed logged it."""
    per_seed = [{r["step"]: r[tag] for r in h if tag in r and isinstance(r[tag], (int, float))} for h in histories]
    steps = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    if not steps:
        return None
    values = np.array([[s[k] for k in steps] for s in per_seed])
    return np.array(steps), values.mean(0), values.min(0), values.max(0)


def layer_grid(histories: list[list[dict]], prefix: str = "grad/cosine/"):
    """(steps, parameter names, values (params x steps)) of the per-parameter tags ``<prefix><name>``
    (seed mean, at the steps every seed logged); weights only when the model has any. None when
    not logged."""
    names = list(dict.fromkeys(k[len(prefix):] for h in histories for r in h for k in r if k.startswith(prefix)))
    names = [n for n in names if n.endswith("weight")] or names
    curves = [_curve(histories, prefix + name) for name in names]
    if not curves or any(c is None or len(c[0]) != len(curves[0][0]) for c in curves):
        return None
    return curves[0][0], names, np.stack([c[1] for c in curves])


def _heatmap(ax, fig, title: str, grid, label: str, **style) -> None:
    steps, names, values = grid
    right = steps[-1] if steps[-1] > steps[0] else steps[0] + 1  # one logged step still gets a width
    image = ax.imshow(values, aspect="auto", origin="lower", interpolation="nearest",
                      extent=(steps[0], right, -0.5, len(names) - 0.5), **style)
    ticks = np.unique(np.linspace(0, len(names) - 1, min(len(names), 10)).round().astype(int))
    ax.set_yticks(ticks, [names[i] for i in ticks], fontsize=7)
    ax.set_xlabel("step")
    ax.set_ylabel("parameter (input at the bottom)")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label=label)


def plot_comparison(histories: dict[str, list[list[dict]]], metric: str, path) -> None:
    """Curves per trainer (mean over seeds, band = min..max): training loss, validation metric,
    global gradient cosine; below them, one row per trainer that logged gradient agreement and
    is not exact: heatmaps of the per-parameter cosine and log10 norm ratio against backprop
    over steps (the global cosine is dominated by the largest gradients, often the head's, and
    hides layers that get no useful signal or a wrongly scaled one).

    ``histories[trainer]`` is a list (one per seed) of logged records
    (``Trainer.history``); ``metric`` is the eval metric name (e.g. accuracy).
    """
    panels = [("train/loss", "training loss", "loss (log scale)"),
              (f"eval/{metric}", f"validation {metric}", metric),
              ("grad/cosine_global", "gradient cosine vs backprop (all parameters)", "cosine")]
    layered = {t: (c, layer_grid(runs, "grad/norm_ratio/")) for t, runs in histories.items()
               if (c := layer_grid(runs)) is not None and not np.allclose(c[2], 1.0, atol=1e-6)}
    rows = 1 + len(layered)
    fig = plt.figure(figsize=(15, 4 * rows))
    axes = [fig.add_subplot(rows, 3, i + 1) for i in range(3)]
    for ax, (tag, title, ylabel) in zip(axes, panels, strict=True):
        for trainer, runs in histories.items():
            curve = _curve(runs, tag)
            if curve is None:
                continue
            steps, mean, low, high = curve
            (line,) = ax.plot(steps, mean, label=trainer)
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if tag == "train/loss":
            ax.set_yscale("log")
        if tag == "grad/cosine_global" and ax.lines:
            lowest = min(line.get_ydata().min() for line in ax.lines)
            ax.set_ylim(min(lowest, 0.9) - 0.01, 1.01)  # cosines near 1 stay readable, not zoomed to 1e-12
        if ax.lines:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    for row, (trainer, (cosines, ratios)) in enumerate(layered.items(), start=1):
        _heatmap(fig.add_subplot(rows, 3, 3 * row + 1), fig, f"{trainer}: per-layer gradient cosine vs backprop",
                 cosines, "cosine (seed mean)", cmap="RdBu", vmin=-1, vmax=1)
        if ratios is not None:
            steps, names, values = ratios
            _heatmap(fig.add_subplot(rows, 3, 3 * row + 2), fig, f"{trainer}: per-layer gradient norm / backprop's",
                     (steps, names, np.log10(np.maximum(values, 1e-12))), "log10 norm ratio (seed mean)",
                     cmap="PuOr", vmin=-3, vmax=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_runs(cells: dict[tuple[str, str], list[float]], experiments: list[str], runs: list[str],
              ylabel: str, path) -> None:
    """One panel per experiment: the final metric of each run (x, in the given order, e.g.
    backprop, highway-k0 .. highway-k8) as mean over seeds with min..max bars and the seeds as dots.

    ``cells[(experiment, run)]`` holds one value per seed; missing cells are skipped."""
    fig, axes = plt.subplots(1, len(experiments), figsize=(5 * len(experiments), 4), squeeze=False)
    for ax, exp in zip(axes[0], experiments, strict=True):
        for x, run in enumerate(runs):
            values = np.array(cells.get((exp, run), []))
            if values.size:
                ax.errorbar([x], [values.mean()], yerr=[[values.mean() - values.min()], [values.max() - values.mean()]],
                            fmt="o", color="C0", capsize=3)
                ax.plot([x] * values.size, values, ".", color="C1", alpha=0.6)
        ax.set_xticks(range(len(runs)), runs, rotation=30, ha="right")
        ax.set_title(exp)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
