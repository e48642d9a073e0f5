"""The reference results page (``docs/results.md``), made from the rows' runs alone: per row, each engine's test
metric over seeds, its word against backprop from every seed and test example, its step time and peak memory
against backprop's in one timing round, its time to a target, its gradient's cosine with backprop's, its tuned
learning rate and where its settings come from; engines that refuse the model with their one-line reason; and a
figure of validation metric against compute time, a band over the seeds (``scripts/benchmarks/reference.py``)."""

from __future__ import annotations

import json
import statistics
import textwrap
from pathlib import Path

from gradengines.trainers.experiments.plots import pyplot, seed_curve, trainer_styles
from gradengines.trainers.experiments.verdict import default_target, example_family, example_word, time_to_target

__all__ = ["results_page", "row_table", "row_figure"]

REFERENCE = "backprop"


def _records(folder: Path) -> dict[str, list[dict]]:
    """run -> its seeds' result.json records (and their histories), the comparison's runs only (no tuning trials)."""
    out: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*/seed*/result.json")):
        record = json.loads(path.read_text())
        lines = (path.parent / "metrics.jsonl").read_text().splitlines()
        record["history"] = [json.loads(line) for line in lines if line.strip()]
        out.setdefault(path.parent.parent.name, []).append(record)
    return out


def _mean_sd(values: list[float], digits: int) -> str:
    if len(values) < 2:
        return f"{values[0]:.{digits}f}" if values else "-"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _words(records: dict[str, list[dict]], metric: str) -> dict[str, str]:
    """Each run's word against backprop on test, from every seed and example (one Holm family per row)."""
    return {run: example_word(boot, adjusted, metric)
            for run, (boot, adjusted) in example_family(records, REFERENCE).items()}


def _tuned(record: dict) -> str:
    settings = record.get("settings") or {}
    tuned = settings.get("tuned")
    lr = record["config"]["lr"]
    if not tuned:
        return f"{lr:g}"
    edge = " (grid edge)" if tuned.get("edges") else ""
    return f"{lr:g}, tuned{edge}"


def row_table(folder: Path, refused: dict[str, str]) -> str:
    """The row's Markdown table (module docstring); refused engines last, with "—" and their reason."""
    records = _records(folder)
    if not records:
        return "_No run yet._\n"
    metric = next(iter(records.values()))[0]["metric"]
    higher = metric != "perplexity"
    timing = json.loads((folder / "comparison.json").read_text())["timing"]["trainers"]
    target = default_target([r["best_val"][metric] for r in records.get(REFERENCE, [])] or [0.0], higher)
    words = _words(records, metric)
    lines = [f"| engine | test {metric} (mean ± sd over seeds) | against backprop (test, every seed and example) | "
             f"step time / "
             f"backprop's | peak memory / backprop's | seeds reaching {target:.4g} val {metric} (compute s) | "
             f"gradient cosine with backprop | lr | settings from |", "|---|---|---|---|---|---|---|---|---|"]
    for run, seeds in sorted(records.items(), key=lambda item: (item[0] != REFERENCE, item[0])):
        tested = [r["test"][metric] for r in seeds if r.get("test")]
        clock = timing.get(run, {})
        ref_peak = timing.get(REFERENCE, {}).get("peak_mb")
        peak = f"{clock['peak_mb'] / ref_peak:.2f}" if clock.get("peak_mb") and ref_peak else "-"
        hits = [h for r in seeds if (h := time_to_target(r["history"], metric, target, higher))]
        reached = (f"{len(hits)} of {len(seeds)} ({statistics.fmean(h['compute_ms'] for h in hits) / 1e3:.1f} s)"
                   if hits and all(h["compute_ms"] is not None for h in hits) else f"{len(hits)} of {len(seeds)}")
        cosines = [r["summary"].get("grad_cosine") for r in seeds if r.get("summary", {}).get("grad_cosine")
                   is not None]
        sources = "; ".join(dict.fromkeys((seeds[0].get("settings") or {}).get("recipe", {}).values())) or "defaults"
        ratio = f"{clock['ratio']:.2f} ({clock['ratio_low']:.2f}..{clock['ratio_high']:.2f})" \
            if "ratio_low" in clock else "-"
        word = "reference" if run == REFERENCE else words.get(run, "-")
        lines.append(f"| {run} | {_mean_sd(tested, 4)} | {word} | {ratio} | {peak} | {reached} | "
                     f"{_mean_sd(cosines, 3)} | {_tuned(seeds[0])} | {sources} |")
    for name, why in sorted(refused.items()):
        lines.append(f"| {name} | — | refuses the model: {why} | | | | | | |")
    return "\n".join(lines) + "\n"


def row_figure(folder: Path, path: Path, title: str) -> Path | None:
    """Validation metric against compute time at the evaluations every seed made (``plots.seed_curve``), each
    engine's mean over seeds with a band from its worst to its best seed, in the comparison figure's styles
    (backprop black); None where no run has a timed history."""
    records = _records(folder)
    if not records:
        return None
    plt = pyplot()
    metric = next(iter(records.values()))[0]["metric"]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    ordered = sorted(records.items(), key=lambda item: (item[0] != REFERENCE, item[0]))
    styles = trainer_styles([run for run, _ in ordered])
    for run, seeds in ordered:
        curve = seed_curve([r["history"] for r in seeds], f"eval/{metric}", "compute_ms")
        if curve is None:
            continue
        xs, mean, low, high = curve
        ax.plot(xs, mean, label=run, lw=2.2 if run == REFERENCE else 1.4, **styles[run])
        ax.fill_between(xs, low, high, color=styles[run]["color"], alpha=0.15)
    ax.set_xlabel("compute time (s, timed steps)")
    ax.set_ylabel(f"validation {metric}")
    if metric == "perplexity":
        ax.set_yscale("log")
    ax.set_title(textwrap.fill(title, 90), fontsize=9)  # a row's description runs long: wrapped, not widened
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def results_page(out: Path, rows: list[str], definitions: dict, figures: Path | None = None,
                 notes: Path | None = None) -> str:
    """The whole page (Markdown): per row, its command, when and on what it ran, its table and figure; then
    ``notes`` (a Markdown file: what the rows say against the papers, written by whoever read them)."""
    parts = ["# Reference results\n",
             "What each gradient engine gains or loses against exact backpropagation, in accuracy, speed and "
             "memory: every engine each model allows, its learning rate tuned on the validation split (a log grid "
             "around its recipe's, seed 0), then 3 seeds at equal compute time (each engine gets the compute "
             "backprop's run took, by the step-time ratios of one timing round). Words against backprop: "
             "*ahead*/*behind* (established, Holm-corrected over the row), *equivalent* (within ±0.01 accuracy or "
             "±1% perplexity), *undecided* (neither). Made by `scripts/benchmarks/reference.py page` from the runs "
             "alone.\n"]
    done = [json.loads((out / row / "reference.json").read_text()) for row in rows
            if (out / row / "reference.json").exists()]
    if done:
        threads = [json.loads((out / d["row"] / "comparison.json").read_text())["timing"]["threads"]["count"]
                   for d in done]  # each row's own: rows run side by side get a core each
        parts.append(f"\nThe {len(done)} row{'s' if len(done) > 1 else ''} run so far took "
                     f"{sum(d['seconds'] for d in done) / 60:.0f} minutes of wall time on "
                     f"{' or '.join(map(str, sorted(set(threads))))} thread(s), about "
                     f"{sum(d['seconds'] * n for d, n in zip(done, threads, strict=True)) / 3600:.1f} CPU-hours; "
                     f"on a GPU: `.venv/bin/python scripts/benchmarks/reference.py run --device cuda --size gpu`.\n")
    for row in rows:
        what, *_ = definitions[row]
        folder = out / row
        info_path = folder / "reference.json"
        parts.append(f"\n## {row}: {what}\n")
        if not info_path.exists():
            parts.append(f"_Not run yet_: `.venv/bin/python scripts/benchmarks/reference.py run --rows {row}`.\n")
            continue
        info = json.loads(info_path.read_text())
        machine = json.loads((folder / "comparison.json").read_text())["timing"].get("machine", "?")
        took = f"{info['seconds'] / 60:.0f} min" if info["seconds"] >= 60 else f"{info['seconds']} s"
        parts.append(f"`{info['command']}` — finished {info['finished']}, {took} on "
                     f"{machine} ({info['device']}).\n\n{row_table(folder, info.get('refused', {}))}")
        if figures is not None and row_figure(folder, figures / f"results-{row}.png", f"{row}: {what}"):
            parts.append(f"\n![{row}](figures/results-{row}.png)\n")
    if notes is not None and notes.exists():
        parts.append("\n" + notes.read_text())
    return "".join(parts)
