"""Defaults are behaviour: every engine option whose default changes results, pinned beside where the value
comes from, and shown as the default by ``train.py --help`` (the flag ``--<engine>-<option>``)."""

import pytest

from gradengines import trainers
from gradengines.trainers.cli.train import train_parser

# (engine, option): (default, where it comes from)
DOCUMENTED = {
    ("highway", "k"): (4, "README: k = 4 on the Hugging Face example (2 x layers); BENCHMARKS' default rows"),
    ("highway", "tol"): (0.0, "no adaptive stop unless --highway-tol is given"),
    ("highway", "mode"): ("highway", "the paper's iteration (fpi: the fixed-point variant, asked for)"),
    ("dsf", "feedback"): ("linspace", "README's recipes: dsf (linspace), the DSF authors' PTB configs"),
    ("dsf", "decay"): (0.5, "the constant feedback's a (tests/test_dsf.py: a half)"),
    ("dsf", "refresh"): (100, "feedback=gate: a refreshed from the gate's mean every 100 steps"),
    ("foton", "mode"): ("difference", "the FOTON paper's two forward passes"),
    ("foton", "temperature"): (1.0, "README's recipes: temperature 1, the FOTON authors' default config"),
    ("foton", "error_scale"): (1.0, "the paper's modulation, unscaled"),
    ("pepita", "variant"): ("iclr2024", "README's recipes: the iclr2024 rule"),
    ("pepita", "feedback_scale"): (0.05, "README's recipes: feedback scale 0.05, the PEPITA code's"),
    ("fa", "scale"): ("weight", "BENCHMARKS, the FA family: the scale decides whether FA trains GPT-2"),
    ("usf", "scale"): ("weight", "as fa"),
    ("brsf", "scale"): ("weight", "as fa"),
    ("frsf", "scale"): ("weight", "as fa"),
    ("dfa", "scale"): ("fan_in", "Nøkland's U(+-1/sqrt(fan_in)) draw"),
    ("dfa", "slices"): ("shared", "Launay et al. 2020: one matrix, every layer its first columns"),
    ("fgrad", "directions"): (1, "Baydin et al.: one direction per step"),
    ("fgrad", "distribution"): ("gaussian", "Baydin et al.: v ~ N(0, I)"),
    ("fgrad_act", "directions"): (1, "Ren et al.'s FG-A: one direction per step"),
    ("fgrad_act", "distribution"): ("gaussian", "Ren et al.: u ~ N(0, I)"),
    ("mezo", "eps"): (1e-3, "the MeZO paper's 1e-3"),
    ("mezo", "directions"): (1, "the MeZO paper: one z per step"),
}


@pytest.fixture(scope="module")
def parser():
    return train_parser()


@pytest.mark.parametrize("engine, option", list(DOCUMENTED), ids=[f"{e}-{o}" for e, o in DOCUMENTED])
def test_each_default_that_changes_results_is_the_documented_one_and_the_help_says_it(engine, option, parser):
    value, _ = DOCUMENTED[(engine, option)]
    assert getattr(trainers.build_engine(engine).options, option) == value
    flag = f"--{engine.replace('_', '-')}-{option.replace('_', '-')}"
    action = next(a for a in parser._actions if flag in a.option_strings)
    said = " ".join(parser._get_formatter()._format_action(action).split())  # this flag's --help entry
    assert said.startswith(flag) and said.endswith(f"(default: {value})"), said
