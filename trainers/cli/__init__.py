"""The command line: ``train``, ``compare``, ``bench`` and ``table``, one module each over shared argument
helpers (``args``) and one way to run as a process (``process``: one-line errors, exit codes, signals).

Flags are generated from the option dataclasses (``TrainConfig``, each engine's ``Options``). Every user
error prints one line on stderr and exits with code 2, before any run directory or checkpoint is written;
a NaN/Inf loss, or a rank of a ``torchrun`` job that died or hung, exits with code 1. ``train`` and
``compare`` run unchanged under ``torchrun``: they join the process group (``--dist-backend``,
``--dist-timeout``), train data parallel, and only rank 0 prints and writes.
"""

import sys

from gradengines.trainers.cli.args import OneLineParser, Setup, base_parser, build_from_args
from gradengines.trainers.cli.bench import bench_main
from gradengines.trainers.cli.compare import DEFAULT_COMPARISON, compare_main
from gradengines.trainers.cli.process import run_cli
from gradengines.trainers.cli.table import table_main
from gradengines.trainers.cli.train import train_main

__all__ = ["train_main", "compare_main", "bench_main", "table_main", "main", "console", "base_parser",
           "build_from_args", "run_cli", "DEFAULT_COMPARISON", "Setup", "OneLineParser", "COMMANDS"]

COMMANDS = {"train": train_main, "compare": compare_main, "bench": bench_main, "table": table_main}


def main(argv=None) -> int:
    """``gradengines COMMAND ...``: the scripts as one installed command (``pip install .``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    usage = f"usage: gradengines {{{','.join(COMMANDS)}}} [--help | OPTIONS]"
    if argv and argv[0] in ("-h", "--help"):
        print(usage + "\n\n  train    train one model with one trainer\n  compare  several trainers, same model, task "
              "and seeds\n  bench    step time and memory against backprop\n  table    result.json files as one "
              "Markdown table\n\n'gradengines COMMAND --help' lists the options of each.")
        return 0
    if not argv or argv[0] not in COMMANDS:
        what = f"unknown command '{argv[0]}'" if argv else "give a command"
        print(f"error: {what}; {usage[len('usage: '):]}", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:], prog=f"gradengines {argv[0]}")


def console() -> None:
    """The ``gradengines`` console script: ``main``, then ``exit_process`` (``torchrun`` safe)."""
    from gradengines.trainers.core.distributed import exit_process

    exit_process(main())

