"""The layout cannot decay silently: each package imports only the layers below it (CONTRIBUTING.md, "Map").

    models, tasks              the zoo and the data: nothing of trainers
    trainers.core              what every engine may use (contract, protocols, options, registry, errors, collectives)
    trainers.engines           the gradient engines
    trainers.run               one training run (the Trainer)
    trainers.loops             the engines inside other loops (the Hugging Face Trainer, Lightning)
    trainers.bench             timing suites
    trainers.experiments       many runs (comparisons, tuning, recipes, statistics)
    trainers.cli               the command line: nothing below imports it

Every import in a file counts, also one inside a function. Within a layer, imports go one way: no module
imports itself through others (an import circle, even one closed by an import inside a function)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["trainers.core", "trainers.engines", "trainers.run", "trainers.loops", "trainers.bench",
         "trainers.experiments", "trainers.cli"]
BOTTOM = {"models": {"models"}, "tasks": {"tasks"}}


def allowed(layer: str) -> set[str]:
    """The packages ``layer`` may import: itself, the layers below it, the zoo and the data."""
    if layer in BOTTOM:
        return BOTTOM[layer] | ({"tasks"} if layer == "models" else set())
    return set(ORDER[:ORDER.index(layer) + 1]) | {"models", "tasks"}


def layer_of(module: str) -> str | None:
    """The layer a module belongs to (None: the public package ``trainers`` itself, which re-exports)."""
    if module in FACADE:
        return FACADE[module]
    parts = module.split(".")
    if parts[0] in BOTTOM:
        return parts[0]
    if parts[0] == "trainers" and len(parts) > 1:
        return ".".join(parts[:2])
    return None


FACADE = {"gradengines.blocks": "trainers.engines"}
"""Modules of the facade folder ``gradengines/`` that engines import, and the layer they belong to: the public
pieces of an engine (``trainers/engines/tbptt.py`` is written on them) import only what an engine may."""


def in_folders(module: str) -> str:
    """A module's name as its folder in this repository names it: ``gradengines.trainers.core`` is
    ``trainers.core`` (the folders are mapped into the one import name ``gradengines``)."""
    return module if module in FACADE else module.removeprefix("gradengines.")


def imports(path: Path) -> set[str]:
    """Every module of this project that ``path`` imports (absolute imports; ``from gradengines.trainers import x``
    names the submodule), named as its folder."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {in_folders(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            module = in_folders(node.module)
            found.add(module)
            if module in ("gradengines", "trainers", "models"):
                found |= {in_folders(f"{node.module}.{alias.name}") for alias in node.names}
    return {m for m in found if m.split(".")[0] in ("trainers", "models", "tasks") or m in FACADE}


def violations(root: Path = ROOT) -> list[str]:
    found = []
    facade = [root / (name.replace(".", "/") + ".py") for name in FACADE]
    for package in ("models", "tasks", "trainers", "facade"):
        paths = facade if package == "facade" else sorted((root / package).rglob("*.py"))
        for path in paths:
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


def module_name(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def module_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of this project it imports, anywhere in its file: ``from a.b import c`` names the
    submodule ``a.b.c`` where there is one, else ``a.b``; relative imports are resolved. A package's
    ``__init__`` run on the way to a submodule is not counted (Python imports it first, whoever asks)."""
    files = {module_name(p, root): p for package in ("models", "tasks", "trainers")
             for p in sorted((root / package).rglob("*.py"))}
    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {in_folders(alias.name) for alias in node.names if in_folders(alias.name) in files}
            elif isinstance(node, ast.ImportFrom):
                base = in_folders(node.module or "")
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        graph[module] = {m for m in found if m in files and m != module}
    return graph


def import_circles(root: Path = ROOT) -> list[list[str]]:
    """Every set of modules that import one another round a circle (strongly connected), sorted."""
    graph, order, low, stack, circles = module_imports(root), {}, {}, [], []

    def visit(module):  # Tarjan's algorithm
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            circle = []
            while not circle or circle[-1] != module:
                circle.append(stack.pop())
            if len(circle) > 1:
                circles.append(sorted(circle))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(circles)


def test_every_package_imports_only_the_layers_below_it():
    assert violations() == []


def test_every_module_of_trainers_is_in_a_layer():
    top = {p.name for p in (ROOT / "trainers").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert top == {"__init__.py", *(layer.split(".")[1] for layer in ORDER)}


@pytest.mark.parametrize("module, line, expected", [
    ("trainers/engines/backprop.py", "from gradengines.trainers.run.trainer import Trainer",
     "trainers.engines.backprop (trainers.engines) imports trainers.run.trainer (trainers.run)"),
    ("trainers/run/trainer.py", "from gradengines.trainers.cli import train_main",
     "trainers.run.trainer (trainers.run) imports trainers.cli (trainers.cli)"),
    ("models/zoo/mlp.py", "import gradengines.trainers.core.errors",
     "models.zoo.mlp (models) imports trainers.core.errors (trainers.core)"),
    ("gradengines/blocks.py", "from gradengines.trainers.run.agreement import gradient_agreement",
     "gradengines.blocks (trainers.engines) imports trainers.run.agreement (trainers.run)"),
])
def test_an_upward_import_is_found(tmp_path, module, line, expected):
    """The check on a copy of the tree with one upward import added (the real tree is never touched)."""
    import shutil

    for package in ("models", "tasks", "trainers", "gradengines"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{line}\n")
    assert violations(tmp_path) == [expected]


def test_no_modules_import_each_other():
    assert import_circles() == []


@pytest.mark.parametrize("module, added, expected", [
    ("trainers/run/checkpoint.py", "def added():\n    from gradengines.trainers.run.rundir import RunDirectory\n",
     ["trainers.run.checkpoint", "trainers.run.rundir"]),
    ("trainers/run/notes.py", "from gradengines.trainers.run import records\n",
     ["trainers.run.notes", "trainers.run.records"]),
])
def test_an_import_circle_is_found(tmp_path, module, added, expected):
    """The check on a copy of the tree with one import added that closes a circle: inside a function, or of a
    submodule by ``from package import``. Only ``trainers`` is copied: the circles are in it."""
    import shutil

    shutil.copytree(ROOT / "trainers", tmp_path / "trainers", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / module
    path.write_text(path.read_text() + "\n\n" + added)
    assert import_circles(tmp_path) == [expected]


# ---- models/ by concern (issue 42) ---------------------------------------------------------------------------

MODELS_ORDER = ["models.errors", "models.layers", "models.orthogonal", "models.adapters", "models.registry",
                "models.zoo", "models"]
"""The concerns of ``models``, lowest first: one-line errors; shared layers (recurrent cells, dropout, scans,
activations); orthogonality (parametrizations, projections, the Cayley retraction, orthogonal convolutions);
users' models as stacks and how they are called; building by name; the zoo's architectures; the package's
re-exports. Each imports only itself and the concerns below it."""


def concern_of(module: str) -> str:
    parts = module.split(".")
    return "models" if len(parts) == 1 else ".".join(parts[:2])


def concern_violations(root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / "models").rglob("*.py")):
        module = module_name(path, root)
        concern = concern_of(module)
        if concern not in MODELS_ORDER:
            found.append(f"{module}: in no concern of models (a new folder? add it to MODELS_ORDER)")
            continue
        below = set(MODELS_ORDER[:MODELS_ORDER.index(concern) + 1])
        for imported in sorted(i for i in imports(path) if i.split(".")[0] == "models"):
            if concern_of(imported) not in below:
                found.append(f"{module} ({concern}) imports {imported} ({concern_of(imported)})")
    return found


def test_the_concerns_of_models_import_only_the_concerns_below_them():
    assert concern_violations() == []


def test_models_holds_its_concerns_and_nothing_beside_them():
    top = sorted(p.name for p in (ROOT / "models").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists())
    assert top == ["__init__.py", "adapters", "errors.py", "layers", "orthogonal", "registry.py", "zoo"]


@pytest.mark.parametrize("module, line, expected", [
    ("models/layers/scan.py", "from gradengines.models.zoo.mlp import MLP",
     "models.layers.scan (models.layers) imports models.zoo.mlp (models.zoo)"),
    ("models/orthogonal/cayley.py", "import gradengines.models.adapters.calling",
     "models.orthogonal.cayley (models.orthogonal) imports models.adapters.calling (models.adapters)"),
])
def test_an_import_across_concerns_is_found(tmp_path, module, line, expected):
    import shutil

    shutil.copytree(ROOT / "models", tmp_path / "models", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{line}\n")
    assert concern_violations(tmp_path) == [expected]
