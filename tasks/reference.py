"""Objects named by reference, ``path/to/file.py:NAME`` or ``package.module:NAME``: a task factory
(``tasks.build``) and, in the package above this one, a model class or factory (``models.adapters.user``).

A file is imported once per process, under a name derived from its path, its own folder importable as for a
script (``from helpers import load`` beside it works without ``PYTHONPATH``). Every failure (a malformed
reference, no such file, an import error, ``sys.exit()`` at import) is one line of the caller's error class,
naming what was asked for (``model file x.py does not exist``).
"""

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from .errors import one_line

__all__ = ["is_reference", "import_reference"]


def is_reference(name: str) -> bool:
    """Whether ``name`` is a reference (``file.py:Name`` or ``module:name``), not a registered name."""
    return ":" in name


def _import_file(path: Path, what: str, error: type[Exception]) -> ModuleType:
    if not path.is_file():
        raise error(f"{what} file {path} does not exist")
    name = "gradengines_user_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise error(f"{what} file {path} cannot be imported (not a Python file)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(path.resolve().parent)
    if folder not in sys.path:  # its own folder importable, as for a script
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:  # a module that calls sys.exit() on import must not end the run quietly
        del sys.modules[name]
        raise error(f"{what} file {path} failed to import: {one_line(err)}") from None
    return module


def import_reference(reference: str, what: str, error: type[Exception]) -> tuple[ModuleType, str, str]:
    """(the module ``reference`` names, where it was named, the attribute's name); ``what`` ("model", "task")
    and ``error`` say the failures (module docstring). The attribute itself is the caller's to read and check."""
    where, _, attr = reference.rpartition(":")
    if not where or not attr:
        raise error(f"a {what} reference is FILE.py:NAME or MODULE:NAME, got {reference!r}")
    if where.endswith(".py") or "/" in where or "\\" in where:
        return _import_file(Path(where), what, error), where, attr
    try:
        return importlib.import_module(where), where, attr
    except (Exception, SystemExit) as err:
        raise error(f"{what} module '{where}' cannot be imported: {one_line(err)}") from None

