"""Figures: loss, metric and gradient cosine against steps; a final metric against runs."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["plot_comparison", "plot_runs"]


def _curve(histories: list[list[dict]], tag: str):
    """Mean and spread over seeds of ``tag`` at the steps where every seed logged it."""
    per_seed = [{r["step"]: r[tag] for r in h if tag in r and isinstance(r[tag], (int, float))} for h in histories]
    steps = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    if not steps:
        return None
    values = np.array([[s[k] for k in steps] for s in per_seed])
    return np.array(steps), values.mean(0), values.min(0), values.max(0)


def plot_comparison(histories: dict[str, list[list[dict]]], metric: str, path) -> None:
    """One line per trainer (mean over seeds, band = min..max) in three panels.

    ``histories[trainer]`` is a list (one per seed) of logged records
    (``Trainer.history``); ``metric`` is the eval metric name (e.g. accuracy).
    """
    panels = [("train/loss", "training loss"), (f"eval/{metric}", f"validation {metric}"),
              ("grad/cosine_global", "gradient cosine vs backprop")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (tag, title) in zip(axes, panels):
        for trainer, runs in histories.items():
            curve = _curve(runs, tag)
            if curve is None:
                continue
            steps, mean, low, high = curve
            (line,) = ax.plot(steps, mean, label=trainer)
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
        ax.set_title(title)
        ax.set_xlabel("step")
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_runs(cells: dict[tuple[str, str], list[float]], experiments: list[str], runs: list[str],
              ylabel: str, path) -> None:
    """One panel per experiment: the final metric of each run (x, in the given order, e.g.
    backprop, highway-k0 .. highway-k8) as mean over seeds with min..max bars and the seeds as dots.

    ``cells[(experiment, run)]`` holds one value per seed; missing cells are skipped."""
    fig, axes = plt.subplots(1, len(experiments), figsize=(5 * len(experiments), 4), squeeze=False)
    for ax, exp in zip(axes[0], experiments):
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
