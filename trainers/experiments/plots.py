"""Figures: loss, metric and gradient cosine against samples (or steps) and compute time; the per-layer agreement
heatmaps in a figure of their own; a final metric against runs.

Every trainer keeps one style in every panel (``trainer_styles``): backprop black, the others a colour each (tab10
up to ten, tab20 up to twenty, evenly spaced hues beyond) and, past ten, a line style too; one legend, outside the
panels, serves the figure; the figure's title sits above the panels (a constrained layout)."""

import numpy as np

__all__ = ["plot_comparison", "plot_runs", "layer_grid", "trainer_styles", "layers_path", "seed_curve", "pyplot"]


AXES = {"step": ("step", 1.0), "samples": ("training samples seen", 1.0), "compute_ms": ("compute time (s)", 1e-3)}


def pyplot():
    """matplotlib's pyplot on the file backend, imported on first use: every command imports this module, and
    pyplot costs 0.2 s of each process's start, paid only by a command that draws."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axis(histories: list[list[dict]]) -> str:
    """``samples`` when every record has it (a comparison's runs), else ``step``."""
    records = [r for h in histories for r in h]
    return "samples" if records and all("samples" in r for r in records) else "step"


def seed_curve(histories: list[list[dict]], tag: str, axis: str = "step"):
    """Mean and spread over seeds of ``tag`` at the points of ``axis`` where every seed logged it."""
    scale = AXES[axis][1]
    per_seed = [{r[axis] * scale: r[tag] for r in h if tag in r and axis in r and isinstance(r[tag], (int, float))}
                for h in histories]
    xs = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    if not xs:
        return None
    values = np.array([[s[k] for k in xs] for s in per_seed])
    return np.array(xs), values.mean(0), values.min(0), values.max(0)


def layer_grid(histories: list[list[dict]], prefix: str = "grad/cosine/", axis: str = "step"):
    """(x, parameter names, values (params x points)) of the per-parameter tags ``<prefix><name>``
    (seed mean, at the points of ``axis`` every seed logged); weights only when the model has any. None when
    not logged."""
    names = list(dict.fromkeys(k[len(prefix):] for h in histories for r in h for k in r if k.startswith(prefix)))
    names = [n for n in names if n.endswith("weight")] or names
    curves = [seed_curve(histories, prefix + name, axis) for name in names]
    if not curves or any(c is None or len(c[0]) != len(curves[0][0]) for c in curves):
        return None
    return curves[0][0], names, np.stack([c[1] for c in curves])


def _heatmap(ax, fig, title: str, grid, label: str, xlabel: str, **style) -> None:
    steps, names, values = grid
    right = steps[-1] if steps[-1] > steps[0] else steps[0] + 1  # one logged step still gets a width
    image = ax.imshow(values, aspect="auto", origin="lower", interpolation="nearest",
                      extent=(steps[0], right, -0.5, len(names) - 0.5), **style)
    ticks = np.unique(np.linspace(0, len(names) - 1, min(len(names), 10)).round().astype(int))
    ax.set_yticks(ticks, [names[i] for i in ticks], fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("parameter (input at the bottom)")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label=label)


REFERENCE_COLOR = "black"
LINE_STYLES = ("-", "--", ":", "-.")


def trainer_styles(trainers: list[str]) -> dict[str, dict]:
    """Each trainer's ``{"color", "linestyle"}``: backprop black; the others, in order, a colour each (distinct for
    any number: tab10, tab20, then evenly spaced hues) and, past ten, a line style from ``LINE_STYLES`` too."""
    from matplotlib import colormaps

    others = [t for t in trainers if t != "backprop"]
    n = len(others)
    if n <= 10:
        colors = list(colormaps["tab10"].colors)
    elif n <= 20:
        colors = list(colormaps["tab20"].colors)
    else:
        colors = [colormaps["hsv"](i / n) for i in range(n)]
    styles = {"backprop": {"color": REFERENCE_COLOR, "linestyle": "-"}}
    for i, trainer in enumerate(others):
        styles[trainer] = {"color": colors[i], "linestyle": LINE_STYLES[(i // 10) % len(LINE_STYLES)] if n > 10
                           else "-"}
    return styles


def _panel(ax, histories, tag, title, ylabel, axis, styles: dict[str, dict]) -> None:
    """Mean curve and min..max band per trainer, each in its style in every panel (one legend serves them)."""
    for trainer, runs in histories.items():
        curve = seed_curve(runs, tag, axis)
        if curve is None:
            continue
        xs, mean, low, high = curve
        ax.plot(xs, mean, label=trainer, **styles[trainer])
        ax.fill_between(xs, low, high, color=styles[trainer]["color"], alpha=0.15)
    ax.set_title(title)
    ax.set_xlabel(AXES[axis][0])
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if tag == "train/loss":
        ax.set_yscale("log")
    if tag == "grad/cosine_global" and ax.lines:
        lowest = min(line.get_ydata().min() for line in ax.lines)
        ax.set_ylim(min(lowest, 0.9) - 0.01, 1.01)  # cosines near 1 stay readable, not zoomed to 1e-12
    if not ax.lines:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)


def layers_path(path):
    """Where ``plot_comparison`` draws the per-layer heatmaps: beside ``path``, ``<stem>_layers.png``."""
    from pathlib import Path

    path = Path(path)
    return path.with_name(f"{path.stem}_layers{path.suffix}")


def plot_comparison(histories: dict[str, list[list[dict]]], metric: str, path, title: str | None = None) -> None:
    """Curves per trainer (mean over seeds, band = min..max): training loss, validation metric and
    global gradient cosine against training samples seen (a comparison's runs; else steps), so trainers
    with different batch sizes share an axis; when the runs were timed (``compute_ms``), a row of
    loss and metric against compute time. In a figure of its own (``layers_path``), one row per trainer
    that logged gradient agreement and is not exact: heatmaps of the per-parameter cosine and log10 norm
    ratio against backprop (the global cosine is dominated by the largest gradients, often the head's, and
    hides layers that get no useful signal or a wrongly scaled one); the norm ratio's colour scale is
    symmetric around 1 and spans the data's largest deviation.

    ``histories[trainer]`` is a list (one per seed) of logged records (``Trainer.history``,
    metrics.jsonl); ``metric`` is the eval metric name (e.g. accuracy).
    """
    every = [h for runs in histories.values() for h in runs]
    axis = _axis(every)
    timed = bool(every) and all(any("compute_ms" in r for r in h) for h in every)
    styles = trainer_styles(list(histories))
    plt = pyplot()
    fig = plt.figure(figsize=(15, 4 * (1 + timed) + (0.5 if title else 0)), layout="constrained")
    grid = fig.add_gridspec(1 + timed, 6)
    for i, (tag, name, ylabel) in enumerate([("train/loss", "training loss", "loss (log scale)"),
                                             (f"eval/{metric}", f"validation {metric}", metric),
                                             ("grad/cosine_global", "gradient cosine vs backprop (all parameters)",
                                              "cosine")]):
        _panel(fig.add_subplot(grid[0, 2 * i:2 * i + 2]), histories, tag, name, ylabel, axis, styles)
    if timed:
        for i, (tag, name, ylabel) in enumerate([("train/loss", "training loss against compute time",
                                                  "loss (log scale)"),
                                                 (f"eval/{metric}", f"validation {metric} against compute time",
                                                  metric)]):
            _panel(fig.add_subplot(grid[1, 3 * i:3 * i + 3]), histories, tag, name, ylabel, "compute_ms", styles)
    handles = {line.get_label(): line for ax in fig.axes for line in ax.lines}
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside right upper", frameon=False)
    if title:
        fig.suptitle(title, fontsize=13)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    layered = {t: (c, layer_grid(runs, "grad/norm_ratio/", axis)) for t, runs in histories.items()
               if (c := layer_grid(runs, axis=axis)) is not None and not np.allclose(c[2], 1.0, atol=1e-6)}
    if not layered:
        layers_path(path).unlink(missing_ok=True)  # an earlier comparison's, in this folder
        return
    fig = plt.figure(figsize=(15, 4 * len(layered) + (0.5 if title else 0)), layout="constrained")
    grid = fig.add_gridspec(len(layered), 6)
    for row, (trainer, (cosines, ratios)) in enumerate(layered.items()):
        _heatmap(fig.add_subplot(grid[row, 0:3] if ratios is not None else grid[row, :]), fig,
                 f"{trainer}: per-layer gradient cosine vs backprop",
                 cosines, "cosine (seed mean)", AXES[axis][0], cmap="RdBu", vmin=-1, vmax=1)
        if ratios is not None:
            steps, names, values = ratios
            logs = np.log10(np.maximum(values, 1e-12))
            span = max(float(np.abs(logs).max()), 0.05)  # the data's range, symmetric around a ratio of 1
            _heatmap(fig.add_subplot(grid[row, 3:6]), fig, f"{trainer}: per-layer gradient norm / backprop's",
                     (steps, names, logs), "log10 norm ratio (seed mean)", AXES[axis][0],
                     cmap="PuOr", vmin=-span, vmax=span)
    if title:
        fig.suptitle(f"{title}: per-layer agreement with backprop", fontsize=13)
    fig.savefig(layers_path(path), dpi=110)
    plt.close(fig)


def plot_runs(cells: dict[tuple[str, str], list[float]], experiments: list[str], runs: list[str],
              ylabel: str, path) -> None:
    """One panel per experiment: the final metric of each run (x, in the given order, e.g.
    backprop, highway-k0 .. highway-k8) as mean over seeds with min..max bars and the seeds as dots.

    ``cells[(experiment, run)]`` holds one value per seed; missing cells are skipped."""
    plt = pyplot()
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
