"""gradengines: train a model with interchangeable gradient engines and compare them with exact backprop.

    import gradengines as ge
    model = ge.models.build("mlp", in_features=64, out_features=10, depth=8, width=64, orthogonal="bjorck")
    task = ge.tasks.build("digits")
    engine = ge.build_engine("foton")          # a registered name, an engine class, or "file.py:Class"
    ge.Trainer(model, engine, task, logdir="runs").fit(epochs=10)
    ge.testing.check_engine(MyRule)            # your own engine against the whole contract

Your own engine: a ``GradientEngine`` subclass (``gradengines.blocks``: the pieces the built-ins are made of),
named by reference (``--trainer my_rule.py:MyRule``), registered (``ge.register_engine(MyRule)``) or installed as a
plugin (entry-point group ``gradengines.engines``).

One import name: the repository's folders ``trainers/``, ``models/`` and ``tasks/`` are this package's
subpackages ``gradengines.trainers``, ``gradengines.models`` and ``gradengines.tasks`` (``pyproject.toml`` maps
them into it), so a researcher's own ``models`` or ``tasks`` package never meets ours.
"""

from pathlib import Path as _Path

# In a source checkout the mapped folders sit beside this one (an installed wheel holds them inside it).
_ROOT = _Path(__file__).resolve().parent.parent
if (_ROOT / "pyproject.toml").is_file() and (_ROOT / "trainers" / "__init__.py").is_file():
    __path__.append(str(_ROOT))  # noqa: F821  (a package's __path__)

from gradengines import models, tasks, trainers  # noqa: E402  isort: skip
# after trainers: the engines (tbptt) import blocks, which reads them
from gradengines import blocks, testing  # noqa: E402  isort: skip
from gradengines.trainers import *  # noqa: E402,F401,F403
from gradengines.trainers import __all__ as _trainers_all  # noqa: E402

__all__ = ["models", "tasks", "trainers", "blocks", "testing", *_trainers_all]
