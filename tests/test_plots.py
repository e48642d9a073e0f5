"""comparison.png: labelled axes, a style per trainer, one legend outside the panels, a title clear of them; and
comparison_layers.png: per-layer heatmaps of the gradient agreement of each inexact trainer (the global cosine
alone is dominated by the largest gradients)."""

import matplotlib.colors
import matplotlib.figure
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from gradengines.trainers.experiments.plots import layer_grid, plot_comparison

pytestmark = pytest.mark.renders_figures  # these tests draw; the others build figures without rendering (conftest.py)


def history(cosines: dict[str, float], ratio: float, steps=(0, 10, 20)) -> list[dict]:
    records = []
    for step in steps:
        record = {"step": step, "train/loss": 1.0 / (step + 1), "eval/accuracy": 0.5, "grad/cosine_global": 0.9}
        for name, cos in cosines.items():
            record[f"grad/cosine/{name}"] = cos
            record[f"grad/norm_ratio/{name}"] = ratio
        records.append(record)
    return records


def test_layer_grid_is_the_seed_mean_per_weight_and_step():
    names = {"layers.0.weight": 0.2, "layers.0.bias": 0.9, "layers.1.weight": 0.6}
    seeds = [history(names, 2.0), history({k: v + 0.2 for k, v in names.items()}, 4.0)]
    steps, params, values = layer_grid(seeds)
    assert list(steps) == [0, 10, 20] and params == ["layers.0.weight", "layers.1.weight"]  # weights only
    assert np.allclose(values, [[0.3] * 3, [0.7] * 3])
    assert np.allclose(layer_grid(seeds, "grad/norm_ratio/")[2], 3.0)
    assert layer_grid([[{"step": 0, "train/loss": 1.0}]]) is None


def test_comparison_figure_has_axis_labels_and_a_heatmap_row_per_inexact_trainer(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: figures.append((self, a[0])))
    layers = {f"layers.{i}.weight": 1.0 for i in range(4)}
    histories = {"backprop": [history(layers, 1.0)],  # exact: no heatmap row
                 "foton": [history({k: 0.1 * i for i, k in enumerate(layers)}, 10.0)]}
    plot_comparison(histories, "accuracy", tmp_path / "c.png")
    (fig, _), (heatmaps, where) = figures
    assert where == tmp_path / "c_layers.png"  # the heatmaps in a figure of their own
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_title() for ax in axes] == ["training loss", "validation accuracy",
                                               "gradient cosine vs backprop (all parameters)"]
    assert all(ax.get_xlabel() == "step" and ax.get_ylabel() for ax in axes)
    heat = [ax for ax in heatmaps.axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_title() for ax in heat] == ["foton: per-layer gradient cosine vs backprop",
                                               "foton: per-layer gradient norm / backprop's"]
    assert heat[0].images[0].get_array().shape == (4, 3)
    assert np.allclose(heat[0].images[0].get_array()[:, 0], [0.0, 0.1, 0.2, 0.3])  # input layer at the bottom row
    assert np.allclose(heat[1].images[0].get_array(), 1.0)  # log10 of a norm ratio of 10
    # a trainer keeps its style in every panel; one legend for the figure, none inside a panel
    colours = [{line.get_label(): line.get_color() for line in ax.lines} for ax in axes[:3]]
    assert colours[0] == colours[1] == colours[2] and colours[0]["backprop"] == "black"
    assert not any(ax.get_legend() for ax in axes) and len(fig.legends) == 1


def test_fifteen_trainers_get_fifteen_styles_one_outside_legend_and_no_overlapping_titles(tmp_path, monkeypatch):
    """The default comparison has eleven trainers and grows: every trainer its own colour (backprop black), the
    legend outside every panel, the figure's title clear of the panels' titles (measured on the drawn figure)."""
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: figures.append(self))
    names = ["backprop", *(f"engine{i:02d}" for i in range(14))]
    histories = {name: [[{**r, "samples": 64 * (r["step"] + 1), "compute_ms": (i + 1.0) * (r["step"] + 1)}
                          for r in history({"w.weight": 0.5 + 0.03 * i}, 1.0 + i)]] for i, name in enumerate(names)}
    plot_comparison(histories, "accuracy", tmp_path / "c.png", title="compare-digits: task digits, model mlp (4 x 64)")
    fig = figures[0]
    FigureCanvasAgg(fig).draw()  # closed after it was drawn: draw it again to measure its artists
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.lines]
    for ax in panels:
        colours = [matplotlib.colors.to_rgba(line.get_color()) for line in ax.lines]
        assert len(set(colours)) == 15 and matplotlib.colors.to_rgba("black") == colours[0]
    titles = [fig._suptitle.get_window_extent(renderer)] + [ax.title.get_window_extent(renderer) for ax in panels]
    for i, a in enumerate(titles):
        for b in titles[i + 1:]:
            assert not a.overlaps(b), (a, b)
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    assert len(legend.get_texts()) == 15 and not any(box.overlaps(ax.get_window_extent(renderer)) for ax in panels)


def test_no_heatmap_without_per_layer_agreement(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: figures.append(self))
    plot_comparison({"pepita": [[{"step": 1, "train/loss": 1.0}]]}, "accuracy", tmp_path / "c.png")
    assert len(figures) == 1 and len([ax for ax in figures[0].axes if ax.get_label() != "<colorbar>"]) == 3


@pytest.mark.parametrize("metric", ["accuracy", "perplexity"])
def test_the_png_is_written(tmp_path, metric):
    plot_comparison({"foton": [history({"w.weight": 0.5}, 0.5)]}, metric, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_single_agreement_step_draws_without_warnings(tmp_path, recwarn):
    plot_comparison({"foton": [history({"w.weight": 0.5}, 0.5, steps=(0,))]}, "accuracy", tmp_path / "c.png")
    assert not [w for w in recwarn if "singular" in str(w.message)]


def test_a_comparison_figure_reads_against_samples_and_compute_time_with_a_title(tmp_path, monkeypatch):
    """Records with samples and compute_ms (a comparison's): the curves and heatmaps use samples seen, a row of
    loss and metric against compute time follows, the norm-ratio colours span the data, every panel is used."""
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: figures.append(self))

    def timed(batch, ms, cosine, ratio):
        return [{**r, "samples": batch * r["step"], "compute_ms": ms * r["step"]}
                for r in history({"layers.0.weight": cosine, "layers.1.weight": cosine}, ratio, steps=(1, 2, 3))]

    plot_comparison({"backprop": [timed(64, 2.0, 1.0, 1.0)], "foton": [timed(256, 1.0, 0.6, 1.26)]}, "accuracy",
                    tmp_path / "c.png", title="exp: task digits, model mlp")
    fig, heatmaps = figures
    assert fig._suptitle.get_text() == "exp: task digits, model mlp"
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_xlabel() for ax in axes] == ["training samples seen"] * 3 + ["compute time (s)"] * 2
    heat = [ax for ax in heatmaps.axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_xlabel() for ax in heat] == ["training samples seen"] * 2
    assert all(ax.lines or ax.images for ax in axes + heat)  # no empty panel
    loss = axes[0].lines
    assert [list(line.get_xdata()) for line in loss] == [[64, 128, 192], [256, 512, 768]]
    assert list(axes[3].lines[1].get_xdata()) == pytest.approx([1e-3, 2e-3, 3e-3])  # foton: 1 ms a step
    low, high = heat[-1].images[0].get_clim()
    assert (low, high) == pytest.approx((-np.log10(1.26), np.log10(1.26)))  # the data's range, not +-3 decades
