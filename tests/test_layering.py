"""The layout cannot decay silently: each package imports only the layers below it (CONTRIBUTING.md, "Map").

    models, tasks              the zoo and the data: nothing of trainers
    trainers.core              what every engine may use (contract, protocols, options, registry, errors, collectives)
    trainers.engines           the gradient engines
    trainers.run               one training run (the Trainer)
    trainers.bench             timing suites
    trainers.experiments       many runs (comparisons, tuning, recipes, statistics)
    trainers.cli               the command line: nothing below imports it

Every import in a file counts, also one inside a function."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["trainers.core", "trainers.engines", "trainers.run", "trainers.bench", "trainers.experiments", "trainers.cli"]
BOTTOM = {"models": {"models"}, "tasks": {"tasks"}}


def allowed(layer: str) -> set[str]:
    """The packages ``layer`` may import: itself, the layers below it, the zoo and the data."""
    if layer in BOTTOM:
        return BOTTOM[layer] | ({"tasks"} if layer == "models" else set())
    return set(ORDER[:ORDER.index(layer) + 1]) | {"models", "tasks"}


def layer_of(module: str) -> str | None:
    """The layer a module belongs to (None: the public package ``trainers`` itself, which re-exports)."""
    parts = module.split(".")
    if parts[0] in BOTTOM:
        return parts[0]
    if parts[0] == "trainers" and len(parts) > 1:
        return ".".join(parts[:2])
    return None


def imports(path: Path) -> set[str]:
    """Every module of this project that ``path`` imports (absolute imports; ``from trainers import x`` names
    the submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names if node.module in ("trainers", "models")}
    return {m for m in found if m.split(".")[0] in ("trainers", "models", "tasks")}


def violations(root: Path = ROOT) -> list[str]:
    found = []
    for package in ("models", "tasks", "trainers"):
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            layer = layer_of(module)
            if layer is None:
                continue
            for imported in sorted(imports(path)):
                target = layer_of(imported)
                if target is not None and target not in ORDER + list(BOTTOM):
                    found.append(f"{module} imports {imported}: not in any layer (a new folder? add it to ORDER)")
                elif target is not None and target not in allowed(layer):
                    found.append(f"{module} ({layer}) imports {imported} ({target})")
    return found


def test_every_package_imports_only_the_layers_below_it():
    assert violations() == []


def test_every_module_of_trainers_is_in_a_layer():
    top = {p.name for p in (ROOT / "trainers").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert top == {"__init__.py", *(layer.split(".")[1] for layer in ORDER)}


@pytest.mark.parametrize("module, line, expected", [
    ("trainers/engines/backprop.py", "from trainers.run.trainer import Trainer",
     "trainers.engines.backprop (trainers.engines) imports trainers.run.trainer (trainers.run)"),
    ("trainers/run/trainer.py", "from trainers.cli import train_main",
     "trainers.run.trainer (trainers.run) imports trainers.cli (trainers.cli)"),
    ("models/mlp.py", "import trainers.core.errors",
     "models.mlp (models) imports trainers.core.errors (trainers.core)"),
])
def test_an_upward_import_is_found(tmp_path, module, line, expected):
    """The check on a copy of the tree with one upward import added (the real tree is never touched)."""
    import shutil

    for package in ("models", "tasks", "trainers"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{line}\n")
    assert violations(tmp_path) == [expected]
