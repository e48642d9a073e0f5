"""A researcher's own engine, from outside the package: named by reference (``FILE.py:Class``, ``module:Class``),
by class or after ``register_engine``, or installed as a plugin (entry-point group ``gradengines.engines``), it is
trained, compared (summary, HParams, where it came from) and tuned like a built-in; every bad engine is one line."""

import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import one_line_error

import gradengines as ge
from gradengines.trainers.cli import compare_main, train_main
from gradengines.trainers.core import registry
from gradengines.trainers.run.hparams import session_hparams

ROOT = Path(__file__).resolve().parents[1]

RULE = (ROOT / "examples" / "sign_sgd" / "sign_sgd.py").read_text() + """
SignSGD.recipe = {"optimizer": ("sgd", "Bernstein et al. 2018, Sec. 5"), "lr": (0.01, "tuned on digits"),
                  "scale": (0.5, "half a step")}
"""  # the README's rule, its recipe naming an option of its own too

QUICK = ["--model", "mlp", "--depth", "2", "--width", "16", "--task", "teacher", "--task-option", "n_train=64",
         "--task-option", "n_val=32", "--task-option", "n_test=32", "--steps", "4", "--progress", "false"]


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def test_an_engine_in_a_file_trains_from_the_command_line_with_its_options_as_flags(tmp_path,
                                                                                    capsys):
    rule = write(tmp_path / "..", f"{tmp_path.name}_rule.py", RULE)  # a file outside the run's folder
    logdir = tmp_path / "runs"
    assert train_main([*QUICK, "--trainer", f"{rule}:SignSGD", "--signsgd-scale", "0.25", "--logdir",
                       str(logdir)]) == 0
    (run,) = logdir.glob("*/signsgd-scale0.25/seed0")  # named as the built-ins' runs are
    record = json.loads((run / "result.json").read_text())
    assert record["engine"] == {"trainer": "signsgd", "signsgd.scale": 0.25}
    origin = record["settings"]["engine"]
    assert origin["source"] == "file" and origin["path"] == str(rule.resolve())
    assert origin["sha256"] == hashlib.sha256(rule.read_bytes()).hexdigest()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train_main(["--trainer", f"{rule}:SignSGD", "--help"])
    shown = capsys.readouterr().out
    assert "--signsgd-scale SIGNSGD_SCALE" in shown and "multiplies the sign (default: 1.0)" in shown


def test_an_engine_in_a_file_is_compared_tuned_and_recorded_like_a_built_in(tmp_path, capsys):
    rule = write(tmp_path, "my_rule.py", RULE)
    logdir = tmp_path / "runs"
    assert compare_main([*QUICK, "--trainers", f"backprop,{rule}:SignSGD", "--seeds", "0,1", "--logdir", str(logdir),
                         "--experiment", "exp", "--tune", "--tune-grid", "lr=0.005,0.02"]) == 0
    out = capsys.readouterr().out
    assert "tuned signsgd: lr=0.005" in out or "tuned signsgd: lr=0.02" in out
    summary = (logdir / "exp" / "summary.md").read_text()
    verdict = summary.split("## Verdict")[1].split("## Results")[0]
    assert verdict.count("- **signsgd**: ") == 2  # its word against backprop at equal samples and at equal time
    assert "| signsgd |" in summary
    settings_row = next(line for line in summary.splitlines() if line.startswith("| signsgd | sgd |"))
    assert "Bernstein et al. 2018, Sec. 5" in settings_row and "tuned lr=" in settings_row  # its recipe, tuned
    sha = hashlib.sha256(rule.read_bytes()).hexdigest()[:16]
    assert f"- signsgd: SignSGD from {rule.resolve()}, sha256 {sha}" in summary
    assert "backprop:" not in summary.split("## Engines from outside the framework")[1]  # built-ins not listed
    record = json.loads((logdir / "exp" / "signsgd" / "seed1" / "result.json").read_text())
    hparams = session_hparams(record)
    assert hparams["_trainer"] == "signsgd" and hparams["signsgd.scale"] == 0.5  # its recipe's value


def test_an_engine_by_module_by_class_and_registered_by_name(tmp_path, monkeypatch):
    write(tmp_path, "lab_rules.py", RULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert ge.build_engine("lab_rules:SignSGD", scale=2.0).options.scale == 2.0
    origin = ge.engine_origin("signsgd")
    assert origin["source"] == "module" and origin["module"] == "lab_rules" and len(origin["sha256"]) == 64
    cls = ge.engine_class("signsgd")
    assert ge.build_engine(cls).name == "signsgd" and "signsgd" in ge.available()

    class Halved(cls):
        name = "halved_sign"

    assert ge.register_engine(Halved) is Halved
    assert ge.build_engine("halved_sign").options.scale == 1.0
    assert "--halved-sign-scale" in __import__("gradengines").trainers.cli.base_parser("x").format_help()


def plugin_site(tmp_path: Path, name: str = "signplugin", distribution: str = "lab-rules", body: str = RULE,
                cls: str = "SignSGD") -> Path:
    """A folder holding an installed distribution (its dist-info with an entry point) and its module."""
    site = tmp_path / f"site-{distribution}"
    info = site / f"{distribution.replace('-', '_')}-1.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text(f"[gradengines.engines]\n{name} = {distribution.replace('-', '_')}:{cls}\n")
    (site / f"{distribution.replace('-', '_')}.py").write_text(body)
    return site


def test_the_example_plugin_once_installed_is_listed_and_compared_by_name(tmp_path, monkeypatch, capsys):
    """examples/sign_sgd, pip-installed (into a folder on the path, as into site-packages): listed by --help with
    its flags, compared by its entry point's name, and summary.md says which distribution it came from."""
    source = tmp_path / "source"  # pip builds in the tree it is given: a copy keeps the checkout clean
    shutil.copytree(ROOT / "examples" / "sign_sgd", source)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(site), str(source)], check=True, capture_output=True, timeout=300)
    monkeypatch.syspath_prepend(str(site))  # in this process, as site-packages holds it
    monkeypatch.setattr(registry, "_PLUGINS", [])
    with pytest.raises(SystemExit):
        train_main(["--help"])
    shown = capsys.readouterr().out
    assert "signsgd" in shown.split("trainers:")[1].splitlines()[0] and "--signsgd-scale" in shown
    assert compare_main([*QUICK, "--trainers", "backprop,signsgd", "--seeds", "0", "--logdir", str(tmp_path / "runs"),
                         "--experiment", "plugin"]) == 0
    summary = (tmp_path / "runs" / "plugin" / "summary.md").read_text()
    assert "- signsgd: SignSGD from plugin gradengines-sign-sgd 0.1.0 (signsgd = sign_sgd:SignSGD)" in summary
    assert "| signsgd | sgd | 0.001 |" in summary  # its recipe


@pytest.mark.parametrize("case", ["broken", "clash", "twice"])
def test_a_plugin_that_fails_to_import_or_takes_a_taken_name_is_one_line(case, tmp_path, monkeypatch, capsys):
    """Installed plugins are read when a command starts (here in this process, their folders on the path): one that
    fails to import, or names an engine another holds, stops every command in one line, exit 2, nothing written."""
    sites = {"broken": [plugin_site(tmp_path, "broken", "broken-rules", body="raise ImportError('needs jax')\n")],
             "clash": [plugin_site(tmp_path, "fa", "clashing-rules")],
             "twice": [plugin_site(tmp_path, "signplugin", "lab-rules"),
                       plugin_site(tmp_path, "signplugin", "other-rules")]}[case]
    says = {"broken": "error: plugin engine 'broken' (broken-rules 1.2, broken_rules:SignSGD) failed to import: "
                      "ImportError: needs jax\n",
            "clash": "error: two engines are named 'fa': the built-in engine and the plugin of clashing-rules 1.2 "
                     "(fa = clashing_rules:SignSGD); give one another name attribute\n",
            "twice": "error: two installed plugins name an engine 'signplugin': lab-rules and other-rules; uninstall "
                     "one\n"}[case]
    for site in reversed(sites):
        monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_PLUGINS", [])  # read again, with these on the path
    assert train_main(["--steps", "1", "--logdir", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == says
    assert not (tmp_path / "runs").exists()


BAD = {
    "missing.py:Rule": "error: engine file missing.py does not exist\n",
    "raises.py:Rule": "error: engine file raises.py failed to import: ZeroDivisionError: division by zero\n",
    "plain.py:Rule": "error: plain.py:Rule is the class Rule, not a GradientEngine subclass "
                     "(gradengines.GradientEngine)\n",
    "plain.py:helper": "error: plain.py:helper is a function, not a GradientEngine subclass "
                       "(gradengines.GradientEngine)\n",
    "plain.py:Absent": "error: 'plain.py' has no engine class 'Absent'\n",
    "clash.py:FA": "error: two engines are named 'fa': the built-in engine and FA of {here}/clash.py; give one "
                   "another name attribute\n",
    "nodefault.py:Rule": "error: engine 'rule': option 'scale' has no default (each option is a flag, "
                         "--rule-scale, and its default is the option's)\n",
    "listtype.py:Rule": "error: engine 'rule': option 'sizes' has type list[int], which no flag can give; use int, "
                        "float, str, bool, Literal[...] or one of them | None\n",
    "badrecipe.py:Rule": "error: engine 'rule': recipe key 'learning_rate' is neither a training option "
                         "(optimizer, lr, momentum, weight_decay, batch_size, ...: gradengines.TrainConfig) nor one "
                         "of its Options (it has none)\n",
    "badname.py:Rule": "error: engine name 'My Rule' (badname.py:Rule) must be lower-case letters, digits, _ and -, "
                       "starting with a letter (it names flags, --My Rule-<option>, and run folders)\n",
    "nograds.py:Rule": "error: engine 'rule' (nograds.py:Rule) defines no compute_grads\n",
    "my_rule.py": "error: unknown trainer 'my_rule.py'; available: {available}; or your own engine, FILE.py:Class or "
                  "module:Class\n",
}

FILES = {
    "raises.py": "1 / 0\n",
    "plain.py": "class Rule:\n    pass\n\ndef helper():\n    pass\n",
    "clash.py": "from gradengines import blocks\nclass FA(blocks.GradientEngine):\n"
                "    def compute_grads(self, *args):\n        pass\n",
    "nodefault.py": "import dataclasses\nfrom gradengines import blocks\nclass Rule(blocks.GradientEngine):\n"
                    "    @dataclasses.dataclass\n    class Options:\n        scale: float\n"
                    "    def compute_grads(self, *args):\n        pass\n",
    "listtype.py": "import dataclasses\nfrom gradengines import blocks\nclass Rule(blocks.GradientEngine):\n"
                   "    @dataclasses.dataclass\n    class Options:\n        sizes: list[int] = dataclasses.field("
                   "default_factory=list)\n    def compute_grads(self, *args):\n        pass\n",
    "badrecipe.py": "from gradengines import blocks\nclass Rule(blocks.GradientEngine):\n"
                    "    recipe = {'learning_rate': (0.1, 'mine')}\n"
                    "    def compute_grads(self, *args):\n        pass\n",
    "badname.py": "from gradengines import blocks\nclass Rule(blocks.GradientEngine):\n    name = 'My Rule'\n"
                  "    def compute_grads(self, *args):\n        pass\n",
    "nograds.py": "from gradengines import blocks\nclass Rule(blocks.GradientEngine):\n    pass\n",
}


@pytest.mark.parametrize("reference", sorted(BAD))
def test_every_bad_engine_is_one_line_exit_2_and_nothing_written(reference, tmp_path, capsys,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, text in FILES.items():
        write(tmp_path, name, text)
    for command in (train_main, compare_main):
        flag = "--trainer" if command is train_main else "--trainers"
        assert command([*QUICK, flag, reference if command is train_main else f"backprop,{reference}"]) == 2
        expected = BAD[reference].format(here=tmp_path.resolve(), available=", ".join(ge.available()))
        assert one_line_error(capsys) == expected
        assert not (tmp_path / "runs").exists()


def test_a_plugin_engine_failing_on_its_first_batch_is_the_built_ins_one_line(tmp_path, capsys):
    rule = write(tmp_path, "crash.py", RULE.replace("outputs, loss = blocks.forward_loss",
                                                    "raise RuntimeError('mat1 and mat2 shapes cannot be multiplied')\n"
                                                    "        outputs, loss = blocks.forward_loss"))
    logdir = tmp_path / "runs"
    assert train_main([*QUICK, "--trainer", f"{rule}:SignSGD", "--logdir", str(logdir)]) == 2
    assert one_line_error(capsys) == ("error: trainer 'signsgd' fails on this model's first batch (RuntimeError: mat1 "
                                      "and mat2 shapes cannot be multiplied): it cannot train MLP as it is\n")
    assert not logdir.exists()  # before anything was written
    with pytest.raises(ge.ModelConfigError, match="trainer 'signsgd' fails on this model's first batch"):  # the API
        x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
        ge.build_engine(f"{rule}:SignSGD").compute_grads(torch.nn.Linear(3, 2), x, y, torch.nn.functional.cross_entropy)
