"""The reference results: every gradient engine on an MLP, a CNN, a recurrent LM and a transformer, each tuned on
validation, then trained at equal compute time against backprop; one resumable command, and the page made from
its runs alone.

    .venv/bin/python scripts/benchmarks/reference.py run                 # every row; rerun it to continue
    .venv/bin/python scripts/benchmarks/reference.py run --rows digits-mlp,mnist-cnn
    .venv/bin/python scripts/benchmarks/reference.py page > docs/results.md
    .venv/bin/python scripts/benchmarks/reference.py run --device cuda --size gpu --dry-run   # the GPU's command

Each row is one ``compare.py`` over every engine the model allows (``--tune --budget time``: each engine's
learning rate searched on a log grid around its recipe's, on the validation split, seed 0, the grid's edges
flagged; then 3 seeds at its best point, each engine given the compute time of backprop's run by the step-time
ratios measured in one timing round), so each row's folder holds the runs, ``summary.md`` (verdicts against
backprop, time to target, step time and memory ratios, gradient cosines, the settings and their sources) and
``comparison.png``. An engine that refuses the model is in the summary's note with its one-line reason.
``run`` passes ``--resume auto``: a finished run is kept, a killed one continues from its checkpoint, a tuning
trial already run is read back. A line on stderr says which row runs and how many remain.
"""

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path("../shared/data")  # from the repository root, where the command runs

NOTES = "reference_notes.md"  # what the rows say against the papers, read by a person, appended to the page
# the language-model rows fit the CPU budget (about an hour a row on one core, the two rows side by side): a 3-point
# learning-rate grid of each recipe's, each row's own (at these short budgets larger steps win); evaluations every
# 10 steps on 2 batches of 256 validation windows (the final ones on the whole splits)
SHORT_LM = ["--eval-every", "10", "--eval-batches", "2", "--eval-batch-size", "256"]
COMMON = ["--tune", "--budget", "time", "--seeds", "0,1,2", "--progress", "false"]
ROWS = {
    # row: (what it is, its flags on the CPU, the same row larger on a GPU)
    "digits-mlp": ("orthogonal tanh MLP (4 x 64, Björck) on scikit-learn's digits, 30 epochs of backprop's time",
                   ["--model", "mlp", "--depth", "4", "--width", "64", "--activation", "tanh", "--orthogonal",
                    "bjorck", "--task", "digits", "--epochs", "30"],
                   ["--width", "256", "--epochs", "100"]),
    "mnist-cnn": ("the zoo's convnet (2 convolutions of 16 channels, ReLU) on MNIST's t10k images (6,000 train, 2,000 "
                  "validation, 2,000 test, stratified), 5 epochs of backprop's time",
                  ["--model", "convnet", "--depth", "2", "--model-option", "channels=16", "--activation", "relu",
                   "--task", "mnist-t10k", "--data-dir", str(DATA), "--epochs", "5"],
                  ["--model-option", "channels=64", "--epochs", "20"]),
    "ptb-lstm": ("2-layer LSTM language model (hidden 128) on PTB words (the first 100,000 training tokens, windows "
                 "of 35; periodic evaluations on 512 validation windows, the final ones on the whole splits), 1 "
                 "epoch of backprop's time, learning rates tuned on a 3-point grid (x3.16, x10, x31.6 the recipe's)",
                 ["--model", "rnn_lm", "--cell", "lstm", "--depth", "2", "--hidden", "128", "--task", "ptb-word",
                  "--data-dir", str(DATA / "ptb"), "--task-option", "seq_len=35", "--task-option",
                  "max_tokens=100000", "--epochs", "1", "--tune-grid", "lr=x3.16,x10,x31.6", *SHORT_LM],
                 ["--hidden", "512", "--task-option", "max_tokens=1000000", "--epochs", "10", "--eval-every", "100"]),
    "ptb-gpt2": ("transformers' GPT-2 (4 layers, width 128, 4 heads) on PTB words (the first 100,000 training "
                 "tokens, windows of 64, batch 32 for every engine; periodic evaluations on 512 validation windows, "
                 "the final ones on the whole splits), 1 epoch of backprop's time, learning rates tuned on a "
                 "3-point grid (x1, x3.16, x10 the recipe's)",
                 ["--model", "transformers:GPT2LMHeadModel", "--model-option", "n_layer=4", "--model-option",
                  "n_embd=128", "--model-option", "n_head=4", "--task", "ptb-word", "--data-dir", str(DATA / "ptb"),
                  "--task-option", "seq_len=64", "--task-option", "max_tokens=100000", "--batch-size", "32",
                  "--epochs", "1", "--tune-grid", "lr=x1,x3.16,x10", *SHORT_LM],
                 ["--model-option", "n_embd=256", "--task-option", "max_tokens=1000000", "--batch-size", "128",
                  "--epochs", "10",
                  "--eval-every", "100"]),
}


def row_command(row: str, out: Path, device: str, size: str) -> list[str]:
    """The compare.py arguments of ``row``: its flags (the GPU's larger sizes after them: a later flag wins),
    the common ones, its experiment folder."""
    _, cpu, gpu = ROWS[row]
    flags = [*cpu, *(gpu if size == "gpu" else []), *COMMON, "--device", device]
    return [*flags, "--logdir", str(out), "--experiment", row, "--resume", "auto"]


def refusals(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """The engines the row's model takes, and those that refuse it, each with its one-line reason: by its
    structure (as compare.py leaves them out) or on one training step of its first batch (an engine that
    accepts the structure but not an operation of its forward: forward-mode AD through a fused LSTM kernel)."""
    from gradengines.trainers.cli.args import build_from_args, trainers_for
    from gradengines.trainers.cli.compare import compare_parser
    from gradengines.trainers.core.errors import USER_ERRORS
    from gradengines.trainers.run.trainer import Trainer

    args = compare_parser(argv).parse_args(argv)
    probe = build_from_args(args, "backprop", 0)
    found, refused = trainers_for(probe.model, probe.task)
    taken = []
    for name in found:
        setup = build_from_args(args, name, 0)
        try:  # the Trainer runs the engine's first-batch check, then one step
            trainer = Trainer(setup.model, setup.engine, setup.task, config=setup.config, progress=False)
            trainer.train_step(*trainer._batch(0))
        except USER_ERRORS as err:
            refused[name] = str(err)
            continue
        taken.append(name)
    return taken, refused


def run(rows: list[str], out: Path, device: str, size: str, dry_run: bool) -> int:
    from gradengines.trainers.cli import compare_main

    for done, row in enumerate(rows):
        argv = row_command(row, out, device, size)
        print(f"reference: row {done + 1} of {len(rows)}: {row} ({len(rows) - done - 1} after it)\n"
              f"  compare.py {shlex.join(argv)}", file=sys.stderr, flush=True)
        if dry_run:
            continue
        started = time.time()
        taken, refused = refusals(argv)
        if "--trainers" not in argv:  # those refused on their first step left out, as the others refused
            argv = [*argv, "--trainers", ",".join(taken)]
        code = compare_main(argv)
        if code != 0:
            print(f"reference: row {row} stopped with exit status {code}; rerun to continue", file=sys.stderr)
            return code
        record = out / row / "reference.json"
        first = json.loads(record.read_text()) if record.exists() else {}  # a rerun of a finished row keeps its time
        record.write_text(json.dumps({
            "row": row, "what": ROWS[row][0], "command": "compare.py " + shlex.join(argv),
            "seconds": first.get("seconds", round(time.time() - started)),
            "finished": first.get("finished", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())),
            "device": device, "size": size, "refused": refused}, indent=2) + "\n")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("run", "page"))
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma list of rows (default: all: {', '.join(ROWS)})")
    parser.add_argument("--out", default="runs/reference", help="the rows' folder (default: runs/reference)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=("cpu", "gpu"), default="cpu", help="the rows' sizes (gpu: larger)")
    parser.add_argument("--dry-run", action="store_true", help="print each row's command, run nothing")
    parser.add_argument("--figures", default="docs/figures", help="page: where its figures go (default: docs/figures)")
    args = parser.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown or not rows:
        print(f"error: --rows: no row {', '.join(unknown) or '(empty)'}; rows: {', '.join(ROWS)}", file=sys.stderr)
        return 2
    if args.action == "page":
        from gradengines.trainers.experiments.reference_page import results_page

        print(results_page(Path(args.out), rows, ROWS, Path(args.figures), Path(__file__).with_name(NOTES)))
        return 0
    return run(rows, Path(args.out), args.device, args.size, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
