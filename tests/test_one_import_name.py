"""One import name: the distribution installs the package ``gradengines`` and nothing beside it (the installed
wheel's contents: tests/test_user_models.py), so a researcher's own ``models``, ``tasks`` or ``trainers`` package is
theirs, and ours is ``gradengines.models``."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

THEIRS = {
    "models/__init__.py": "def build(name):\n    return f'their {name}'\n",
    "tasks/__init__.py": "NAME = 'their tasks'\n",
    "trainers/__init__.py": "NAME = 'their trainers'\n",
}

SCRIPT = textwrap.dedent("""
    import models, tasks, trainers                       # the researcher's own packages
    import gradengines as ge                             # ours

    assert models.build("mlp") == "their mlp", models.__file__
    assert (tasks.NAME, trainers.NAME) == ("their tasks", "their trainers")
    net = ge.models.build("mlp", in_features=4, out_features=3, depth=2, width=5)
    task = ge.tasks.build("teacher", in_features=4, num_classes=3, n_train=16, n_val=8, n_test=8, hidden=4)
    ge.build_engine("backprop").compute_grads(net, task.train.inputs, task.train.targets, task.loss_fn)
    assert all(p.grad is not None for p in net.parameters())
    assert isinstance(ge.build_engine("fa"), ge.GradientEngine) and ge.trainers.Trainer is ge.Trainer
    print("both", models.__file__, ge.models.__file__)
""")


def test_a_users_own_models_tasks_and_trainers_packages_live_beside_ours(tmp_path):
    for name, text in THEIRS.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "run.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    _, theirs, ours = done.stdout.split()
    assert Path(theirs).resolve() == (tmp_path / "models" / "__init__.py").resolve()
    assert Path(ours).resolve() == (ROOT / "models" / "__init__.py").resolve()
