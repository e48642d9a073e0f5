"""Every example of README.md and of the guide (docs/guide/*.md, docs/results.md), run as written (issue 31).

The ```python and ```bash blocks are read from the pages themselves, so an edit that breaks an example fails here.
Every block is accounted for: each Python block is run by one test below (``PYTHON_BLOCKS``), and each command
of a bash block (continuation lines joined, comments dropped, ``&&`` splitting two commands) is either run
(``RUNS``) or listed in ``SKIPPED`` with the reason; a command that is neither, or an entry that no longer
matches a README command, fails ``test_every_readme_block_is_run_or_skipped_with_a_reason``.

The commands run at reduced sizes: the README's argument list plus flags appended to it (argparse keeps the last
value), in a fresh directory per group (``runs/`` of their own), each followed by a check of what it wrote. They
run in this process through the function each script calls (``scripts/X.py`` is ``trainers.cli.COMMANDS["X"]``,
``gradengines`` is ``trainers.cli.main``), not as subprocesses: a process pays 7-10 s of imports (torch,
scikit-learn, the meta-device estimate, matplotlib) before its first step, which for the twenty commands would
cost minutes; the scripts' own process entry is run in tests/test_cli.py and the installed command in
tests/test_user_models.py.
"""

import dataclasses
import json
import math
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import GPT, GPTConfig, cosine, engine_grads, relative, write_tiny_ptb
from torch import nn
from torch.nn import functional as F

import gradengines as ge
from gradengines import models, tasks, trainers
from gradengines.models.adapters.calling import call_model
from gradengines.tasks.stream import StreamReader

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ["comparisons", "engines", "precision", "commands", "failures", "your-model", "your-data", "your-loop",
         "libraries", "threads", "distributed", "models-tasks", "your-engine", "layout"]
PAGES = [ROOT / "README.md", *(ROOT / "docs" / "guide" / f"{name}.md" for name in GUIDE), ROOT / "docs" / "results.md"]
"""The newcomer's reading order: the README, then the guide's pages (mkdocs.yml's order), then the results page;
their commands run in this order, in one folder."""
README = "".join(page.read_text() if page.exists() else "" for page in PAGES)


def where(line: int) -> str:
    """``file:line`` of a line of the joined pages."""
    for page in PAGES:
        count = page.read_text().count("\n") if page.exists() else 0
        if line <= count:
            return f"{page.relative_to(ROOT)}:{line}"
        line -= count
    return f"?:{line}"


# --- the blocks of README.md --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReadmeBlock:
    """One fenced block: its language, the README line of its first code line, its code (dedented)."""

    lang: str
    line: int
    code: str


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of a bash block: the README line it starts on, its words (shell quoting removed)."""

    line: int
    argv: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join(self.argv)


FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<code>.*?)^(?P=indent)```", re.S | re.M)


def readme_blocks(text: str = README) -> list[ReadmeBlock]:
    """Every fenced block of ``text``, also those indented under a list item."""
    return [ReadmeBlock(m["lang"], text.count("\n", 0, m.start()) + 2, textwrap.dedent(m["code"]))
            for m in FENCE.finditer(text)]


def block_commands(block: ReadmeBlock) -> list[Command]:
    """The commands of a bash block: continuation lines joined, comments dropped, ``a && b`` as two commands."""
    commands, pending, start = [], "", block.line
    for number, line in enumerate(block.code.splitlines(), start=block.line):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words, pending = shlex.split(pending + line, comments=True), ""
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            commands.append(Command(start, tuple(words[:cut])))
            words = words[cut + 1:]
    return commands


def readme_commands() -> list[Command]:
    return [c for b in readme_blocks() if b.lang == "bash" for c in block_commands(b)]


def example(first_line: str) -> str:
    """The README's Python block that begins with ``first_line`` (which may span lines)."""
    found = [b.code for b in readme_blocks() if b.lang == "python" and b.code.startswith(first_line)]
    assert len(found) == 1, f"{len(found)} Python blocks of README.md begin with {first_line!r}"
    return found[0]


# --- what each README command is: run at reduced size, or skipped with the reason ---------------------------------

COMPARE = "--seeds 0 --steps 2 --timing-rounds 5"  # one seed, two steps, the fewest timing rounds allowed
TRAIN = "--steps 2"
BENCH = "--steps 20 --warmup 1"  # the fewest timed steps allowed

MY_MODELS = '''\
from torch import nn


class Net(nn.Module):
    """A user's own MLP, as README.md's "Your own model" means it."""

    def __init__(self, in_features, out_features, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, out_features))

    def forward(self, x):
        return self.net(x)
'''


def write_my_models(cwd: Path) -> None:
    (cwd / "my_models.py").write_text(MY_MODELS)


SIGN_SGD = "# sign_sgd.py: your rule, in your folder"  # the first line of the README's own-engine block


def write_sign_sgd(cwd: Path) -> None:
    """The README's sign_sgd.py, as a reader saves it in their folder."""
    (cwd / "sign_sgd.py").write_text(example(SIGN_SGD))


MY_DATA = "# my_data.py: a CSV file"  # the first line of the README's factory block


def write_my_data(cwd: Path) -> None:
    """The README's my_data.py, as a reader saves it beside the data."""
    (cwd / "my_data.py").write_text(example(MY_DATA))


def wrote_csv(cwd: Path, output: str) -> None:
    """The digits as data.csv: 1797 rows of 64 features and a class."""
    table = np.loadtxt(cwd / "data.csv", delimiter=",")
    assert table.shape == (1797, 65) and set(table[:, -1]) == set(range(10))


def wrote_tokens(folder: str) -> Callable[[Path, str], None]:
    """scripts/token_file.py wrote train.bin, val.bin and meta.json in ``folder`` and said so."""

    def check(cwd: Path, output: str) -> None:
        meta = json.loads((cwd / folder / "meta.json").read_text())
        assert (cwd / folder / "train.bin").stat().st_size > 0 and meta["dtype"] == "uint16"
        assert f"and meta.json in {folder}" in output

    return check


def finished_run(run_dir: Path, steps: int | None = None) -> dict:
    """The run's result.json: the steps asked for (any, in a comparison's equal-samples budget), finite
    best-validation and test metrics."""
    record = json.loads((run_dir / "result.json").read_text())
    metric = record["metric"]
    assert record["steps"] >= 1 if steps is None else record["steps"] == steps, (run_dir, record["steps"])
    assert math.isfinite(record["best_val"][metric]) and math.isfinite(record["test"][metric]), record
    return record


def comparison(experiment: str, *runs: str) -> Callable[[Path, str], None]:
    """A comparison wrote every run's result.json and a summary.md with a row per run (and no other runs) into
    the default folder ``runs/<experiment>`` (``trainers/cli/names.py``)."""

    def check(cwd: Path, output: str) -> None:
        assert f"runs, summary.md and comparison.png in runs/{experiment}\n" in output
        exp = cwd / "runs" / experiment
        found = sorted(p.name for p in exp.iterdir() if p.is_dir() and p.name != "tuning")
        assert found == sorted(runs), found
        summary = (exp / "summary.md").read_text()
        for run in runs:
            finished_run(exp / run / "seed0")
            assert f"| {run} |" in summary, run

    return check


def tuned(experiment: str, trials: int, *runs: str) -> Callable[[Path, str], None]:
    """A --tune comparison: ``trials`` trials per trainer in tuning.json, a choice, then the comparison."""

    def check(cwd: Path, output: str) -> None:
        comparison(experiment, *runs)(cwd, output)
        for run in runs:
            record = json.loads((cwd / "runs" / experiment / "tuning" / run / "tuning.json").read_text())
            assert len(record["trials"]) == trials and record["best"] in [t["values"] for t in record["trials"]]

    return check


def trained(experiment: str, run: str, steps: int = 2) -> Callable[[Path, str], None]:
    """train.py wrote runs/<experiment>/<run>/seed0/result.json (and printed it)."""

    def check(cwd: Path, output: str) -> None:
        record = finished_run(cwd / "runs" / experiment / run / "seed0", steps=steps)
        assert f'"steps": {steps}' in output and record["run"] == run
        assert f'"run": "runs/{experiment}/{run}/seed0"' in output

    return check


def benched(suite: str, *trainers_timed: str) -> Callable[[Path, str], None]:
    """bench.py wrote bench_out/<suite>/bench.json (its own folder, said on its last line): rows of every trainer
    asked for, every number finite."""

    def check(cwd: Path, output: str) -> None:
        rows = json.loads((cwd / "bench_out" / suite / "bench.json").read_text())["rows"]
        assert rows and all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float)), rows
        assert {r["trainer"] for r in rows} >= set(trainers_timed), rows
        assert (cwd / "bench_out" / suite / "bench.md").read_text() in output
        assert f"\nbench.json and bench.md in bench_out/{suite}\n" in output + "\n"  # stdout's last line

    return check


def tabled(*columns: str, plot: str | None = None, only: bool = True) -> Callable[[Path, str], None]:
    """table.py printed a Markdown table with these columns (``only=False``: among others) and wrote the figure."""

    def check(cwd: Path, output: str) -> None:
        header = next(line for line in output.splitlines() if line.startswith("| experiment |"))
        found = [c.strip() for c in header.strip("|").split("|")][1:]
        assert found == list(columns) if only else set(columns) <= set(found), header
        if plot:
            assert (cwd / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    return check


def results_of(source: str, target: str) -> Callable[[Path], None]:
    """The table lines read what a benchmark script (too long to run here) writes: a folder of comparisons.
    A comparison run earlier in the README stands in for them."""

    def prepare(cwd: Path) -> None:
        shutil.copytree(cwd / "runs" / source, cwd / "runs" / target / source)

    return prepare


@dataclasses.dataclass(frozen=True)
class Run:
    """A README command this file runs: ``pattern`` (re.match on its words), ``shrink`` (flags appended: sizes
    only, never a flag that names a folder or is part of a default folder's name), ``check`` (of the files it
    wrote and its stdout + stderr), ``prepare`` (before it). All run in one directory, in README order, as a
    newcomer runs them; a ``...`` in a command stands for the words of the previous command run."""

    pattern: str
    check: Callable[[Path, str], None]
    shrink: str = ""
    prepare: Callable[[Path], None] | None = None


MLP_TRAINERS = ("backprop", "brsf", "dfa", "fa", "fgrad", "fgrad_act", "foton", "frsf", "mezo",  # every trainer of
                "pepita", "usf")  # the MLP
FAMILY = ("backprop", "fa", "usf", "brsf", "frsf", "dfa")
ONE_LR = " --tune-grid lr=1e-3"  # one trial per trainer: the grid's size is not part of a folder's name
BERT = ("compare-BertForTokenClassification-hidden_size=32-intermediate_size=64-num_attention_heads=2-"
        "num_hidden_layers=2-copy-delay=5-backprop+highway-k2+fa+dfa")
BART = ("train-BartForConditionalGeneration-d_model=16-decoder_attention_heads=2-decoder_ffn_dim=32-"
        "decoder_layers=2-encoder_attention_heads=2-encoder_ffn_dim=32-encoder_layers=2-reverse")

RUNS = [
    # "Quick start": the default comparison
    Run(r"\.venv/bin/python scripts/compare\.py$", comparison("compare-digits", *MLP_TRAINERS), COMPARE),
    # "Fair comparisons"
    Run(r"\.venv/bin/python scripts/compare\.py --tune$", tuned("compare-digits-tuned", 1, *MLP_TRAINERS),
        COMPARE + ONE_LR),
    Run(r"\.venv/bin/python scripts/compare\.py --trainers foton .*--tune ",
        tuned("compare-depth=32-digits-adam-foton-tuned", 8, "foton"), COMPARE),
    # "Trainers": the forward-only family (issue 50)
    Run(r"\.venv/bin/python scripts/compare\.py --model mlp --orthogonal bjorck .*"
        r"--trainers backprop,foton,pepita,fgrad,fgrad_act,mezo ",
        comparison("compare-mlp-depth=4-width=64-activation=tanh-orthogonal=bjorck-digits-backprop+foton+pepita+fgrad"
                   "+fgrad_act+mezo", "backprop", "foton", "pepita", "fgrad", "fgrad_act", "mezo"), COMPARE),
    # "The feedback-alignment family"
    Run(r"\.venv/bin/python scripts/compare\.py --trainers backprop,fa,usf,brsf,frsf,dfa$",
        comparison("compare-digits-" + "+".join(FAMILY), *FAMILY), COMPARE),
    # "Using it"
    Run(r"\.venv/bin/python scripts/train\.py --trainer backprop --model mlp --task digits ",
        trained("train-mlp-depth=4-width=64-orthogonal=bjorck-digits", "backprop"), TRAIN),
    Run(r"\.venv/bin/python scripts/train\.py \.\.\. --resume$",
        trained("train-mlp-depth=4-width=64-orthogonal=bjorck-digits", "backprop", steps=4), "--steps 4"),
    Run(r"\.venv/bin/python scripts/compare\.py --trainers backprop --model residual_mlp ",
        comparison("compare-residual_mlp-digits-backprop", "backprop"), COMPARE),
    Run(r"\.venv/bin/python scripts/bench\.py --suite engines ",
        benched("engines", "backprop", "foton", "foton:mode=lowmem"),
        BENCH + " --depths 2 --widths 16 --batch-size 16"),
    Run(r"\.venv/bin/python scripts/train\.py --trainer foton --model mlp ",
        trained("train-mlp-depth=32-activation=tanh-orthogonal=bjorck-digits-recipe", "foton"), TRAIN),
    Run(r"\.venv/bin/python scripts/train\.py --trainer highway --highway-k 2 --model resnet ",
        trained("train-resnet-depth=20-width=8-digits", "highway-k2"), TRAIN),
    Run(r"\.venv/bin/python scripts/table\.py runs/highway-digits --plot k\.png$",
        tabled(*MLP_TRAINERS, plot="k.png"), prepare=results_of("compare-digits", "highway-digits")),
    Run(r"\.venv/bin/python scripts/bench\.py --suite residual$",
        benched("residual", "backprop", "highway:k=0,path=batched", "highway:k=10,path=reference"),
        BENCH + " --residual-depth 3 --widths 8 --batch-size 8"),
    Run(r"\.venv/bin/python scripts/compare\.py --trainers backprop,ftbptt,dsf --model rnn_lm --cell gru ",
        comparison("compare-rnn_lm-hidden=128-cell=gru-vocab_size=10-copy-delay=20-length=5-adam-cosine-shared-"
                   "backprop+ftbptt+dsf", "backprop", "ftbptt", "dsf"), COMPARE),
    Run(r"\.venv/bin/python scripts/table\.py runs/foton-digits$", tabled(*MLP_TRAINERS),
        prepare=results_of("compare-digits", "foton-digits")),
    # "Your own model"
    Run(r"\.venv/bin/python scripts/train\.py --model my_models\.py:Net ",
        trained("train-Net-hidden=128-digits", "backprop"), TRAIN, prepare=write_my_models),
    Run(r"\.venv/bin/python scripts/compare\.py --model my_models\.py:Net$",  # every trainer a plain module allows
        comparison("compare-Net-digits", "backprop", "brsf", "dfa", "fa", "fgrad", "fgrad_act", "frsf", "mezo",
                                         "usf"), COMPARE),
    Run(r"\.venv/bin/python scripts/train\.py --model torch\.nn:Linear ", trained("train-Linear-digits", "linear"),
        TRAIN),
    # the installed command, as this checkout's trainers.cli.main
    Run(r"gradengines train --model my_models\.py:Net ", trained("train-Net-digits", "backprop"), TRAIN),
    Run(r"gradengines compare --trainers backprop,fa ", comparison("compare-digits-backprop+fa", "backprop", "fa"),
        COMPARE),
    Run(r"gradengines table runs$", tabled("backprop", "fa", "highway-k2", "linear", only=False)),
    # "Your data"
    Run(r"\.venv/bin/python -c import numpy as np, sklearn", wrote_csv, prepare=write_my_data),
    Run(r"\.venv/bin/python scripts/train\.py --task my_data\.py:csv_task ",
        trained("train-mlp-csv_task-path=data.csv", "fa"), TRAIN),
    Run(r"\.venv/bin/python scripts/compare\.py --task my_data\.py:csv_task ",
        comparison("compare-csv_task-path=data.csv-backprop+fa+dfa", "backprop", "fa", "dfa"), COMPARE),
    Run(r"\.venv/bin/python scripts/train\.py --task my_data\.py:csv_stream ",
        trained("train-mlp-csv_stream-path=data.csv", "fa"), TRAIN),
    Run(r"\.venv/bin/python scripts/token_file\.py --random ", wrote_tokens("data/random"),
        "--random 30000 --random-val 700"),
    Run(r"\.venv/bin/python scripts/train\.py --task tokens --data-dir data/random ",
        trained("train-gpt-depth=2-width=64-tokens-seq_len=64", "backprop"), TRAIN),
    # "Models from transformers and timm"
    Run(r"\.venv/bin/python scripts/compare\.py --model transformers:BertForTokenClassification ",
        comparison(BERT, "backprop", "highway-k2", "fa", "dfa"), COMPARE),
    Run(r"\.venv/bin/python scripts/train\.py --model transformers:BartForConditionalGeneration ",
        trained(BART, "highway-k1"), TRAIN),
    # "Your own engine"
    Run(r"\.venv/bin/python scripts/train\.py --trainer sign_sgd\.py:SignSGD --signsgd-scale 0\.5$",
        trained("train-mlp-digits", "signsgd-scale0.5"), TRAIN, prepare=write_sign_sgd),
    Run(r"\.venv/bin/python scripts/compare\.py --trainers backprop,sign_sgd\.py:SignSGD --tune$",
        tuned("compare-digits-backprop+signsgd-tuned", 1, "backprop", "signsgd"), COMPARE + ONE_LR),
]

DATA = "reads ../shared/data (outside the repository)"
SKIPPED = {
    r"bash scripts/setup\.sh( timm)?$": "builds a virtual environment from the network; the suite runs in .venv",
    r"\.venv/bin/python -m pytest( -n auto( --dist worksteal)?)?$": "the test suite itself",
    r"\.venv/bin/python -m pytest test_sign_sgd\.py$": "test_the_users_engine_test_file_passes_in_pytest",
    r"\.venv-timm/bin/python ": "needs .venv-timm (timm is not installed beside the project's torch)",
    r"\.venv/bin/tensorboard ": "a server that runs until it is stopped",
    r"\.venv/bin/python scripts/bench\.py --suite overhead$": (
        "fixed sizes (a width-1024 MLP at batch 256): 4-6 s at the fewest --steps, --warmup and --rounds"),
    r"bash scripts/benchmarks/foton_table\.sh ": "the FOTON table of BENCHMARKS.md: 144 runs of 30 epochs, no size "
                                                "flag",
    r"bash scripts/benchmarks/highway_table\.sh ": "the Highway-BP tables of BENCHMARKS.md: 14 comparisons, no "
                                                   "size flag",
    r"bash scripts/benchmarks/foton_depth\.sh ": "the FOTON depth table of BENCHMARKS.md: ~8 minutes, no size flag",
    r"bash scripts/benchmarks/dsf_bench\.sh cuda ": "needs a GPU",
    r"EPOCHS=1 bash scripts/benchmarks/dsf_table\.sh ptb-sentences ": DATA,
    r"\.venv/bin/python scripts/train\.py --trainer dsf .*--data-dir \.\./shared/data/ptb": DATA,
    r"\.venv/bin/python scripts/train\.py --trainer highway .*--data-dir \.\./shared/data/ptb": DATA,
    r"\.venv/bin/python scripts/compare\.py --model rnn_model\.py:RNNModel ": (
        DATA + "; the same models on a tiny corpus: the Python block below it"),
    r"\.venv/bin/python scripts/train\.py --model transformers:GPT2LMHeadModel ": DATA,
    r"\.venv/bin/python scripts/token_file\.py --train \.\./shared/data/ptb/": DATA,
    r"\.venv/bin/python scripts/compare\.py --task wikitext_data\.py:wikitext ": (
        DATA + "; the same factory on made-up text: "
        "test_the_wikitext_factory_feeds_gpt2_named_inputs_and_highway_is_exact"),
    r"\.venv/bin/python scripts/train\.py --task tokens --data-dir data/ptb-tokens ": (
        "trains on the files the command above makes of ../shared/data; the same on made-up PTB text: "
        "tests/test_your_data.py"),
    r"python -m venv env$": "a fresh environment installed from the network: tests/test_user_models.py installs "
                            "the package into one (offline) and runs the four commands",
    r"\. env/bin/activate$": "(the environment above)",
    r"pip install ": "installs from the network (tests/test_user_models.py: pip install of this checkout)",
    r"\.venv/bin/torchrun --standalone --nproc-per-node 2 scripts/(train|compare)\.py ": (
        "2 processes of 7-10 s imports each; torchrun training is tested in tests/test_distributed.py"),
    r"torchrun --nnodes 2 ": "two machines with 4 GPUs each",
    r"\.venv/bin/python hf_wikitext\.py (backprop|highway)$": (
        DATA + "; the same file on made-up WikiText-format text: "
        "test_the_hf_trainer_example_trains_gpt2_and_highway_at_full_k_is_backprop"),
    r"\.venv/bin/python scripts/train\.py --trainer foton \.\.\. --batch-size 64 --resume$": (
        "continues the 2-process torchrun run above (tests/test_distributed.py resumes one on 1 process)"),
}

PYTHON_BLOCKS = {  # the first line of each Python block: the test that runs it
    "from gradengines import models, tasks, trainers\n\ntask = tasks.build(\"digits\")":
        "test_the_api_example_trains_on_digits",
    "from gradengines import models, tasks, trainers\nfrom nanogpt import":
        "test_the_unmodified_models_example_trains_an_rnn_with_dsf_and_nanogpt_with_its_own_loss",
    "net = nn.Sequential(": "test_the_layer_stack_example_trains_a_sequential_mlp_with_foton",
    "class LanguageModel(nn.Module):": "test_the_gru_language_model_example_trains_with_dsf",
    "gpt = GPT(GPTConfig(": "test_the_nanogpt_example_trains_with_highway_and_matches_backprop_at_full_k",
    "retraction = models.retraction.CayleyRetraction(model)": "test_the_retraction_example_keeps_the_layers_orthogonal",
    SIGN_SGD: "test_the_own_engine_block_is_the_example_package_and_keeps_the_contract",
    "# test_sign_sgd.py": "test_the_users_engine_test_file_passes_in_pytest",
    "from torch.utils.data import TensorDataset\nimport torch\nfrom gradengines import models, tasks, trainers":
        "test_the_datasets_example_trains_with_highway",
    MY_DATA: "test_the_csv_factory_example_splits_the_rows_once",
    "# wikitext_data.py": "test_the_wikitext_factory_feeds_gpt2_named_inputs_and_highway_is_exact",
    "# hf_wikitext.py": "test_the_hf_trainer_example_trains_gpt2_and_highway_at_full_k_is_backprop",
    "# lightning_digits.py": "test_the_lightning_example_learns_the_digits_with_feedback_alignment",
}


def matches(patterns, command: Command) -> list[str]:
    return [p for p in patterns if re.match(p, command.text)]


def run_commands() -> list[tuple[Command, Run]]:
    """The README commands this file runs, in README order, each with its Run."""
    return [(c, r) for c in readme_commands() for r in RUNS if re.match(r.pattern, c.text)]


def test_every_readme_block_is_run_or_skipped_with_a_reason():
    blocks = readme_blocks()
    assert {b.lang for b in blocks} <= {"python", "bash", ""}, (
        "a README block in another language: write ```python or ```bash so that this file runs it")
    problems = []
    for command in readme_commands():
        claims = matches([r.pattern for r in RUNS], command) + matches(SKIPPED, command)
        if len(claims) != 1:
            problems.append(f"{where(command.line)}: {command.text!r} is claimed by {len(claims)} entries of "
                            f"RUNS and SKIPPED {claims} (run it in RUNS, or give the reason it cannot run in SKIPPED)")
    for pattern in [r.pattern for r in RUNS] + list(SKIPPED):
        if not any(re.match(pattern, c.text) for c in readme_commands()):
            problems.append(f"{pattern!r} matches no README command: remove it or fix it")
    for block in (b for b in blocks if b.lang == "python"):
        claims = [test for first, test in PYTHON_BLOCKS.items() if block.code.startswith(first)]
        if len(claims) != 1:
            problems.append(f"{where(block.line)}: the Python block {block.code.splitlines()[0]!r} is run by "
                            f"{len(claims)} tests {claims}; add it to PYTHON_BLOCKS with a test that runs it")
    for first, test in PYTHON_BLOCKS.items():
        assert callable(globals().get(test)), f"PYTHON_BLOCKS names no test of this file: {test}"
        if not any(b.code.startswith(first) for b in blocks if b.lang == "python"):
            problems.append(f"PYTHON_BLOCKS: no README Python block begins with {first!r}")
    assert not problems, "\n".join(problems)


def invoke(argv: list[str]) -> int:
    """What the command runs: ``scripts/X.py`` is ``trainers.cli.COMMANDS["X"]`` (another script its ``main``),
    ``python -c`` its program, ``gradengines`` is ``trainers.cli.main`` (the console script)."""
    from gradengines.trainers.cli import COMMANDS, main

    if argv[0] in ("python", ".venv/bin/python") and re.fullmatch(r"scripts/\w+\.py", argv[1]) \
            and Path(argv[1]).stem in COMMANDS:
        return COMMANDS[Path(argv[1]).stem](argv[2:])
    if argv[0] == "gradengines":
        return main(argv[1:])
    if argv[:2] == [".venv/bin/python", "-c"]:
        exec(argv[2], {})  # noqa: S102 - the README's one-line program
        return 0
    if argv[0] == ".venv/bin/python" and re.fullmatch(r"scripts/\w+\.py", argv[1]):  # a script of its own
        try:
            runpy.run_path(str(ROOT / argv[1]))["main"](argv[2:])
        except SystemExit as exit_:
            return int(exit_.code or 0)
        return 0
    raise AssertionError(f"no way to run {argv}")


@pytest.mark.renders_figures
def test_readme_commands_run_top_to_bottom_in_one_folder(tmp_path, monkeypatch, capsys):
    """Every command of the README that can run here, in README order, in one fresh folder, as a newcomer runs
    them (issue 42): none may fail, and in particular none may find its default folder taken by an earlier,
    different example (``trainers/cli/names.py``). Sizes are shrunk; folders are not."""
    from gradengines.trainers.experiments import compare

    # comparison.png is not drawn: 3-7 s a figure here; tests/test_cli.py draws the default comparison's
    monkeypatch.setattr(compare, "plot_comparison", lambda *args, **kwargs: None)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a --model file's folder joins it (models/adapters/user.py)
    monkeypatch.chdir(tmp_path)
    previous: list[str] = []
    for command, run in run_commands():
        argv = [word for w in command.argv for word in (previous if w == "..." else [w])]
        previous = argv[2:] if argv[0] != "gradengines" else argv[1:]
        if run.prepare:
            run.prepare(tmp_path)
        code = invoke(argv + shlex.split(run.shrink))
        out, err = capsys.readouterr()
        place = f"{where(command.line)}: {command.text} {run.shrink}"
        assert code == 0, f"{place}\nexit code {code}\n{err[-3000:]}"
        try:
            run.check(tmp_path, out + err)
        except Exception as failure:
            raise AssertionError(f"{place}\n{type(failure).__name__}: {failure}\n{err[-3000:]}") from failure


# --- the Python blocks -------------------------------------------------------------------------------------------


class RNNModel(nn.Module):
    """pytorch/examples' word_language_model RNNModel: its constructor, forward and init_hidden contracts."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.drop, self.encoder = nn.Dropout(dropout), nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.rnn_type, self.nhid, self.nlayers, self.ntoken = rnn_type, nhid, nlayers, ntoken

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


def token_batches(vocab, n=4, length=16):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(0, vocab, (8, length), generator=gen), torch.randint(0, vocab, (8, length), generator=gen))
            for _ in range(n)]


def test_the_gru_language_model_example_trains_with_dsf():
    vocab = 20
    scope = {"nn": nn, "torch": torch, "F": F, "models": models, "trainers": trainers, "vocab": vocab,
             "batches": token_batches(vocab)}
    torch.manual_seed(0)
    exec(example("class LanguageModel(nn.Module):"), scope)  # noqa: S102 - the README's example
    model = scope["model"]
    assert len(model.recurrent_layers) == 2 and model.rnn.weight_hh_l1.grad is not None
    # its engine's gradient, beside BPTT's on a batch: finite, the same way (cosine 0.70 measured), not the same
    tokens, targets = token_batches(vocab, n=1)[0]
    loss_fn = lambda y, t: F.cross_entropy(y.flatten(0, 1), t.flatten())  # noqa: E731
    dsf = engine_grads(model, scope["engine"], tokens, targets, loss_fn)
    bptt = engine_grads(model, trainers.build_engine("backprop"), tokens, targets, loss_fn)
    assert all(torch.isfinite(g).all() for g in dsf.values())
    assert cosine(dsf, bptt) > 0.5 and relative(dsf, bptt) > 1e-3
    # what the README says of it: with W_hh = 0, DSF's tied feedback is BPTT (float64)
    model.double()
    with torch.no_grad():
        model.rnn.weight_hh_l0.zero_()
        model.rnn.weight_hh_l1.zero_()
    tied = engine_grads(model, trainers.build_engine("dsf", feedback="tied"), tokens, targets, loss_fn)
    assert relative(tied, engine_grads(model, trainers.build_engine("backprop"), tokens, targets, loss_fn)) < 1e-12


def test_the_nanogpt_example_trains_with_highway_and_matches_backprop_at_full_k():
    vocab = 30
    torch.manual_seed(0)
    scope = {"nn": nn, "torch": torch, "F": F, "models": models, "trainers": trainers, "vocab": vocab,
             "GPT": GPT, "GPTConfig": GPTConfig, "batches": token_batches(vocab)}
    code = example("gpt = GPT(GPTConfig(")
    exec(code, scope)  # noqa: S102 - the README's example
    gpt, stack = scope["gpt"], scope["stack"]
    idx, targets = token_batches(vocab, n=1)[0]
    logits, loss = gpt(idx, targets)
    torch.testing.assert_close(stack(idx), logits)  # the declaration is the model's forward
    gpt.double()  # the README says k >= 2 x n_layer is exactly backprop: check it, in float64
    loss_fn = lambda y, t: F.cross_entropy(y.flatten(0, 1), t.flatten())  # noqa: E731
    exact = engine_grads(stack, trainers.build_engine("backprop"), idx, targets, loss_fn)
    full = engine_grads(stack, trainers.build_engine("highway", k=2 * len(gpt.transformer.h)), idx, targets, loss_fn)
    assert len(exact) == len(list(gpt.parameters()))
    for name in exact:
        torch.testing.assert_close(full[name], exact[name], rtol=1e-10, atol=1e-12, msg=name)
    readme_k = engine_grads(stack, scope["engine"], idx, targets, loss_fn)  # k = 2 < 2 x n_layer: not backprop
    assert relative(readme_k, exact) > 1e-3


def test_the_unmodified_models_example_trains_an_rnn_with_dsf_and_nanogpt_with_its_own_loss(tmp_path, monkeypatch):
    """The README's Python example with pytorch/examples' RNNModel and nanoGPT's GPT, on a tiny PTB-format corpus."""
    import sys
    import types

    write_tiny_ptb(tmp_path, lines=(200, 30, 30), words_per_line=8)
    monkeypatch.setitem(sys.modules, "nanogpt", types.SimpleNamespace(GPT=GPT, GPTConfig=GPTConfig))
    monkeypatch.setitem(sys.modules, "rnn_model", types.SimpleNamespace(RNNModel=RNNModel))
    code = example("from gradengines import models, tasks, trainers\nfrom nanogpt import")
    code = code.replace("../shared/data/ptb", str(tmp_path))
    torch.manual_seed(0)
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the README's example
    lm, gpt, task = scope["lm"], scope["gpt"], scope["task"]
    assert len(lm.recurrent_layers) == 2 and lm.rnn.weight_hh_l1.grad is not None
    x, y = task.val.inputs[:4], task.val.targets[:4]
    dsf = engine_grads(lm, trainers.build_engine("dsf"), x, y, task.loss_fn)  # through the declared call
    bptt = engine_grads(lm, trainers.build_engine("backprop"), x, y, task.loss_fn)
    assert all(torch.isfinite(g).all() for g in dsf.values())
    assert cosine(dsf, bptt) > 0.5 and relative(dsf, bptt) > 1e-3  # 0.73 and 0.68 measured
    own = gpt(x, y)[1]
    assert models.call_model(gpt, x, y).loss == own  # the loss it returns, every position's logits
    assert models.call_model(gpt, x, y).outputs.shape == (4, x.shape[1], task.num_outputs)


def digits_batches(n: int, batch: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from gradengines import tasks

    train = tasks.build("digits").train
    return [(train.inputs[i * batch:(i + 1) * batch], train.targets[i * batch:(i + 1) * batch]) for i in range(n)]


def test_the_api_example_trains_on_digits(tmp_path, monkeypatch):
    """As written: backprop on an 8-layer orthogonal MLP, its agreement with itself, then 10 epochs."""
    monkeypatch.chdir(tmp_path)  # it writes runs/
    torch.manual_seed(0)
    scope: dict = {}
    exec(example("from gradengines import models, tasks, trainers\n\ntask = tasks.build(\"digits\")"), scope)  # noqa: S102
    assert scope["report"]["global"] == pytest.approx(1.0) and math.isfinite(scope["out"].loss)
    [result] = (tmp_path / "runs").rglob("result.json")
    record = json.loads(result.read_text())
    assert record["test"]["accuracy"] > 0.5, record  # ten epochs of digits learn (chance is 0.1)


def test_the_layer_stack_example_trains_a_sequential_mlp_with_foton():
    """An nn.Sequential MLP as a layer stack: FOTON fills net's .grad, Björck keeps the hidden layers orthogonal,
    and the loss falls over 15 digits batches."""
    torch.manual_seed(0)
    loader = digits_batches(15)
    scope = {"nn": nn, "torch": torch, "models": models, "trainers": trainers, "loader": loader}
    x, y = torch.cat([b[0] for b in loader]), torch.cat([b[1] for b in loader])
    setup, loop = example("net = nn.Sequential(").split("for x, y in loader:")
    exec(setup, scope)  # noqa: S102 - the README's example, up to its loop
    net = scope["net"]
    before = F.cross_entropy(net(x), y).item()
    exec("for x, y in loader:" + loop, scope)  # noqa: S102 - then its loop
    assert F.cross_entropy(net(x), y).item() < before
    assert all(p.grad is not None for p in net.parameters())
    assert max(models.orthogonal.orthogonality_error(net[i].weight) for i in (0, 2)) < 1e-4


def test_the_retraction_example_keeps_the_layers_orthogonal():
    """The Cayley retraction in a plain loop: low-rank steps that move the weights and keep them orthogonal."""
    from gradengines import tasks

    torch.manual_seed(0)
    task = tasks.build("digits")
    model = models.build("mlp", in_features=64, out_features=10, depth=3, width=64, orthogonal="retraction")
    x, y = digits_batches(1)[0]
    scope = {"models": models, "model": model, "engine": trainers.build_engine("backprop"), "x": x, "y": y,
             "loss_fn": task.loss_fn, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
    hidden = model.layers[1].weight
    before = hidden.detach().clone()
    exec(example("retraction = models.retraction.CayleyRetraction(model)"), scope)  # noqa: S102
    assert scope["retraction"].lowrank_steps > 0 and not torch.equal(hidden, before)
    assert models.orthogonal.orthogonality_error(hidden) < 1e-5


def test_the_own_engine_block_is_the_example_package_and_keeps_the_contract():
    """The README's sign_sgd.py is examples/sign_sgd/sign_sgd.py (the plugin package), and keeps the contract."""
    code = example(SIGN_SGD)
    assert code == (ROOT / "examples" / "sign_sgd" / "sign_sgd.py").read_text()
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the README's example
    ge.testing.check_engine(scope["SignSGD"](scale=0.5))


def test_the_users_engine_test_file_passes_in_pytest(tmp_path):
    """The README's test_sign_sgd.py beside its sign_sgd.py, run by pytest as the README says: one test per
    promise, all passing."""
    write_sign_sgd(tmp_path)
    (tmp_path / "test_sign_sgd.py").write_text(example("# test_sign_sgd.py"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sign_sgd.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "6 passed" in done.stdout, done.stdout + done.stderr


def test_the_datasets_example_trains_with_highway(tmp_path, monkeypatch):
    """As written: three TensorDatasets, Highway-BP k=2 on the zoo's residual MLP, 3 epochs; it learns the rule
    (chance 0.5), and the task is the one the same tensors make (same fingerprint as tensor splits)."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    scope: dict = {}
    exec(example("from torch.utils.data import TensorDataset"), scope)  # noqa: S102 - the README's example
    assert scope["task"].num_outputs == 2 and scope["report"]["test"]["accuracy"] > 0.8, scope["report"]
    x, y = scope["x"], scope["y"]
    splits = [tasks.Split(x[a:b], y[a:b]) for a, b in ((0, 400), (400, 500), (500, 600))]
    assert tasks.Task("same", *splits, input_shape=(16,), num_outputs=2).fingerprint == scope["task"].fingerprint


def test_the_csv_factory_example_splits_the_rows_once(tmp_path, monkeypatch):
    """The README's my_data.py: every row of the CSV in exactly one split, in the fractions it says, features and
    class kept together; another seed another split. Its stream: the rows after the held-out ones, in order."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    write_my_data(tmp_path)
    table = np.c_[np.arange(50 * 3).reshape(50, 3) / 7, np.arange(50) % 4]
    np.savetxt(tmp_path / "rows.csv", table, delimiter=",", fmt="%g")
    task = tasks.build("my_data.py:csv_task", path="rows.csv")
    parts = [getattr(task, name).take(slice(0, None)) for name in ("train", "val", "test")]
    assert [len(x) for x, _ in parts] == [30, 10, 10]
    rows = torch.cat([torch.cat([x, y[:, None].float()], 1) for x, y in parts])
    assert torch.allclose(rows[rows[:, 0].argsort()], torch.from_numpy(table).float())
    other = tasks.build("my_data.py:csv_task", path="rows.csv", seed=1)
    assert other.fingerprint != task.fingerprint
    # the same file streamed: the rows after the held-out ones, in file order, pass after pass; those validate, test
    streamed = tasks.build("my_data.py:csv_stream", path="rows.csv", held_out=10, classes=4)
    assert streamed.train.streamed and streamed.train.size is None
    reader = StreamReader(streamed.train)
    passes = [torch.stack([torch.cat([x, torch.tensor([float(y)])]) for x, y in reader.next_items(30)])
              for _ in range(2)]
    for rows, (a, b) in zip([*passes, *(torch.cat([x, y[:, None].float()], 1) for x, y in
                                        (getattr(streamed, n).take(slice(0, None)) for n in ("val", "test")))],
                            ((20, 50), (20, 50), (0, 10), (10, 20)), strict=True):
        assert torch.allclose(rows, torch.from_numpy(table[a:b]).float())


def test_the_wikitext_factory_feeds_gpt2_named_inputs_and_highway_is_exact(tmp_path, monkeypatch):
    """The README's Hugging Face datasets factory on made-up WikiText-format files: windows whose labels are the
    next words, 90% / 10% of the valid file, every word of the vocabulary an id; then GPT-2, given the batch's
    named inputs by keyword, trains under Highway-BP on the structure found with k >= 2 x layers equal to
    backprop in float64 (and k = 0 not: the contrast)."""
    datasets = pytest.importorskip("datasets")
    transformers = pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    rng = np.random.default_rng(0)
    for name, lines in (("wiki.valid.tokens", 60), ("wiki.test.tokens", 20)):
        (tmp_path / name).write_text("\n".join(" ".join(rng.choice([f"w{i}" for i in range(12)], 6))
                                               for _ in range(lines)) + "\n")
    (tmp_path / "wikitext_data.py").write_text(example("# wikitext_data.py"))
    task = tasks.build("wikitext_data.py:wikitext", data_dir=str(tmp_path), seq_len=8)
    stream = 60 * 7  # 6 words and <eos> a line
    assert task.num_outputs == 14 and len(task.train) + len(task.val) == (stream - 8) // 9 + 1
    assert len(task.train) == int(0.9 * (len(task.train) + len(task.val)))
    x, y = task.train.take(slice(0, 4))
    assert set(x) == {"input_ids"} and torch.equal(x["input_ids"][:, 1:], y[:, :-1])
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=14, n_positions=8, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)  # no dropout: two engines, one function
    gpt = transformers.GPT2LMHeadModel(config).double()
    stack = models.residual_stack(gpt, example=(x, y))
    # the structure found is the model's function on the named inputs (as the Trainer and evaluation call it)
    assert torch.equal(call_model(stack, x, y).outputs, call_model(gpt, x, y).outputs)
    exact = engine_grads(gpt, trainers.build_engine("backprop"), x, y, task.loss_fn)
    highway = engine_grads(stack, trainers.build_engine("highway", k=4), x, y, task.loss_fn, strip="model.")
    assert max(relative(highway[n], exact[n]) for n in exact) < 1e-10
    zero = engine_grads(stack, trainers.build_engine("highway", k=0), x, y, task.loss_fn, strip="model.")
    assert max(relative(zero[n], exact[n]) for n in exact) > 1e-3


def test_the_hf_trainer_example_trains_gpt2_and_highway_at_full_k_is_backprop(tmp_path, monkeypatch):
    """The README's hf_wikitext.py on made-up WikiText-format lines (tiny sizes): both engines train GPT-2 through
    the Hugging Face Trainer and write TensorBoard logs, and Highway-BP at its default k (>= 2 x 2 layers: exact)
    ends where backprop ends (the engine's scalars in the log history: tests/test_hf_trainer.py)."""
    pytest.importorskip("accelerate")
    datasets = pytest.importorskip("datasets")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    rng = np.random.default_rng(0)
    (tmp_path / "wiki.valid.tokens").write_text(
        "\n".join(" ".join(rng.choice([f"w{i}" for i in range(12)], 6)) for _ in range(40)) + "\n")
    scope: dict = {"__name__": "hf_wikitext"}
    exec(example("# hf_wikitext.py"), scope)  # noqa: S102 - the README's example
    finals = {}
    for engine in ("backprop", "highway"):
        torch.manual_seed(0)
        trainer = scope["main"](engine, data_dir=str(tmp_path), steps=3, width=8, seq_len=8)
        finals[engine] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        assert list((tmp_path / "runs" / "hf-wikitext" / engine).rglob("events.out.tfevents.*"))
    assert max(float((finals["highway"][n] - finals["backprop"][n]).abs().max()) for n in finals["backprop"]) < 1e-5


def test_the_lightning_example_learns_the_digits_with_feedback_alignment(monkeypatch, tmp_path):
    """The README's lightning_digits.py as written: FA through Lightning learns the digits (chance 0.1)."""
    pytest.importorskip("lightning")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    scope: dict = {}
    exec(example("# lightning_digits.py"), scope)  # noqa: S102 - the README's example
    x, y = scope["data"].tensors
    with torch.no_grad():
        accuracy = float((scope["model"](x).argmax(1) == y).double().mean())
    assert accuracy > 0.8, accuracy


def test_the_site_lists_the_guide_in_the_order_its_commands_run():
    """mkdocs.yml's guide is GUIDE, in the same order (the newcomer's reading order is the site's), every page of
    docs/guide/ in it, and the README links each page."""
    nav = re.findall(r"guide/([\w-]+)\.md", (ROOT / "mkdocs.yml").read_text())
    assert nav == GUIDE and sorted(p.stem for p in (ROOT / "docs" / "guide").glob("*.md")) == sorted(GUIDE)
    front = (ROOT / "README.md").read_text()
    assert all(f"docs/guide/{name}.md" in front for name in GUIDE) and front.count("\n") <= 250


def test_the_readme_engine_table_names_every_registered_engine_and_no_other():
    """The front page's table of engines is the registry's list: a new engine without its row, or a row for a
    name that trains nothing, fails here."""
    section = (ROOT / "README.md").read_text().split("## The engines")[1].split("\n## ")[0]
    named = {name for row in section.splitlines() if row.startswith("| `")
             for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert named == set(trainers.available())
