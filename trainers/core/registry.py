"""Engines by name, by class or by reference: ``build_engine``, ``engine_class``, ``available()``.

An engine is named in one of three ways, wherever a trainer is named (``build_engine``, ``--trainer``,
``compare.py --trainers``, ``bench.py --trainers``):

* a registered name: the built-ins (``@register_engine("fa")`` in ``trainers/engines``), an engine a program
  registered (``register_engine(MyRule)``), and one a pip-installed package declares in the entry-point group
  ``gradengines.engines`` (``[project.entry-points."gradengines.engines"] myrule = "my_pkg.rule:MyRule"``);
* a ``GradientEngine`` subclass: ``build_engine(MyRule, lr=0.1)``;
* a reference, ``path/to/file.py:Class`` or ``package.module:Class`` (as ``--model`` takes a model).

A class or reference is registered the first time it is named, so from then on it is a name like the built-ins' (run
folders, flags ``--<name>-<option>``, recipes, tuning, the HParams table). Its name is its ``name`` attribute (its
own or inherited), else its class name lower-cased (an entry point's name must agree with one it sets). Registering
checks what the command line needs, each failure one ``ConfigError`` line: a ``GradientEngine`` subclass with its
own ``compute_grads``; a name of lower-case letters, digits, ``_`` and ``-``, held by no other engine (a clash names
both); an ``Options`` dataclass whose every field has a default and a type a flag can give (int, float, str, bool,
``Literal``, or one of them ``| None``); a ``recipe`` (``trainers.experiments.recipes``) whose keys are training or
engine options, each ``(value, source)``. ``engine_origin(name)`` says where an engine came from (built in; a file
and its sha256; a module, its file's sha256 and its distribution's version; an installed plugin), as a comparison
records it.
"""

import dataclasses
import functools
import hashlib
import importlib.metadata
import re
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gradengines.models.errors import one_line
from gradengines.tasks.reference import import_reference, is_reference
from gradengines.trainers.core.engine import GradientEngine
from gradengines.trainers.core.errors import ConfigError
from gradengines.trainers.core.options import flag_type

__all__ = ["register_engine", "build_engine", "engine_class", "available", "resolve_engine", "engine_origin",
           "engine_name", "split_spec", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "gradengines.engines"

_ENGINES: dict[str, type[GradientEngine]] = {}
_ORIGINS: dict[str, dict[str, str]] = {}
_PLUGINS: list[bool] = []  # [True] once the entry points were read
_NAME = re.compile(r"[a-z][a-z0-9_-]*")


def engine_name(cls: type[GradientEngine]) -> str:
    """An engine class's name: its ``name`` attribute (its own or that of the engine it extends: a subclass of a
    built-in that sets none clashes with it, and is told so), else its class name lower-cased
    (``GradientEngine.__init_subclass__``); or the name it was registered under."""
    return cls.name


def _describe(origin: dict[str, str]) -> str:
    if origin["source"] == "built in":
        return "the built-in engine"
    if origin["source"] == "plugin":
        return f"the plugin of {origin['distribution']} {origin['version']} ({origin['entry_point']})"
    return f"{origin['class']} of {origin.get('path') or origin['module']}"


def _file_hash(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    """Top-level module -> the installed distributions providing it (read once: it scans every installed one)."""
    return importlib.metadata.packages_distributions()


def _origin(cls: type, reference: str | None = None) -> dict[str, str]:
    """Where ``cls`` comes from: built in, a file (path, sha256) or a module (its file's sha256, its version)."""
    module = sys.modules.get(cls.__module__)
    if cls.__module__.startswith("gradengines."):
        return {"source": "built in", "class": cls.__qualname__}
    origin = {"source": "module", "class": cls.__qualname__, "module": cls.__module__}
    path = getattr(module, "__file__", None)
    if reference is not None and reference.rpartition(":")[0].endswith(".py"):
        origin.update(source="file", path=str(Path(reference.rpartition(":")[0]).resolve()))
    elif path:
        origin["path"] = str(Path(path).resolve())
    if origin.get("path") and Path(origin["path"]).is_file():
        origin["sha256"] = _file_hash(origin["path"])
    top = cls.__module__.split(".")[0]
    distributions = _distributions().get(top, [])
    if distributions:
        origin.update(distribution=distributions[0], version=importlib.metadata.version(distributions[0]))
    return origin


def _check_options(cls: type, name: str) -> None:
    options = getattr(cls, "Options", None)
    if not (isinstance(options, type) and dataclasses.is_dataclass(options)):
        raise ConfigError(f"engine '{name}': Options must be a dataclass (its fields become --{name}-<option> flags)")
    try:
        hints = typing.get_type_hints(options)
    except Exception as err:  # an annotation that does not resolve
        raise ConfigError(f"engine '{name}': the types of its Options cannot be read ({err})") from None
    for field in dataclasses.fields(options):
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"engine '{name}': option '{field.name}' has no default (each option is a flag, "
                              f"--{name}-{field.name.replace('_', '-')}, and its default is the option's)")
        if not flag_type(hints[field.name]):
            raise ConfigError(f"engine '{name}': option '{field.name}' has type {hints[field.name]}, which no flag "
                              f"can give; use int, float, str, bool, Literal[...] or one of them | None")


def _check_recipe(cls: type, name: str) -> None:
    """The recipe's shape: ``{key: (value, source)}``; its keys are checked against the training options by
    ``trainers.experiments.recipes.check_recipe`` (a layer above)."""
    recipe = vars(cls).get("recipe")
    if recipe is None:
        return
    if not isinstance(recipe, dict):
        raise ConfigError(f"engine '{name}': recipe must be a dict {{option: (value, source)}}, got "
                          f"{type(recipe).__name__}")
    for key, entry in recipe.items():
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str) and entry[1].strip()):
            raise ConfigError(f"engine '{name}': recipe['{key}'] must be (value, source), the source saying where "
                              f"the value comes from, got {entry!r}")


def _register(cls: Any, origin: dict[str, str] | None = None, *, name: str | None = None,
              where: str | None = None) -> str:
    """Register ``cls`` (checked, module docstring) and return its name; the same class again is a no-op."""
    shown = where or getattr(cls, "__qualname__", repr(cls))
    if not (isinstance(cls, type) and issubclass(cls, GradientEngine)):
        what = f"the class {cls.__name__}" if isinstance(cls, type) else f"a {type(cls).__name__}"
        raise ConfigError(f"{shown} is {what}, not a GradientEngine subclass (gradengines.GradientEngine)")
    if name is not None and cls.name_given and cls.name != name:
        raise ConfigError(f"{shown} is registered as '{name}' but its name attribute says '{cls.name}'")
    name = name or engine_name(cls)
    if _ENGINES.get(name) is cls:
        return name
    if not _NAME.fullmatch(name):
        raise ConfigError(f"engine name {name!r} ({shown}) must be lower-case letters, digits, _ and -, starting "
                          f"with a letter (it names flags, --{name}-<option>, and run folders)")
    origin = origin or _origin(cls)
    if name in _ENGINES:
        raise ConfigError(f"two engines are named '{name}': {_describe(_ORIGINS[name])} and "
                          f"{_describe(origin)}; give one another name attribute")
    if cls.compute_grads is GradientEngine.compute_grads:
        raise ConfigError(f"engine '{name}' ({shown}) defines no compute_grads")
    _check_options(cls, name)
    _check_recipe(cls, name)
    cls.name = name
    _ENGINES[name] = cls
    _ORIGINS[name] = origin
    return name


def register_engine(target: str | type[GradientEngine]) -> Any:
    """``@register_engine("name")`` above a class, or ``register_engine(MyRule)`` (its own name): the engine is
    then named like the built-ins everywhere (``build_engine``, ``--trainer``, ``available()``)."""
    if isinstance(target, str):
        def decorate(cls):
            _register(cls, name=target)
            return cls

        return decorate
    _register(target)
    return target


def _load_plugins() -> None:
    """Register every engine of the entry-point group ``gradengines.engines`` (once per process)."""
    if _PLUGINS:
        return
    _PLUGINS.append(True)
    seen: dict[str, str] = {}
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = point.dist.name if point.dist is not None else "an unknown distribution"
        version = point.dist.version if point.dist is not None else "?"
        shown = f"plugin engine '{point.name}' ({dist} {version}, {point.value})"
        if point.name in seen and seen[point.name] != dist:
            raise ConfigError(f"two installed plugins name an engine '{point.name}': {seen[point.name]} and {dist}; "
                              f"uninstall one")
        seen[point.name] = dist
        try:
            cls = point.load()
        except (Exception, SystemExit) as err:
            raise ConfigError(f"{shown} failed to import: {one_line(err)}") from None
        origin = {"source": "plugin", "class": getattr(cls, "__qualname__", point.value), "distribution": dist,
                  "version": version, "entry_point": f"{point.name} = {point.value}"}
        _register(cls, origin, name=point.name, where=shown)


def split_spec(spec: str) -> tuple[str, list[str]]:
    """A trainer with its options, as the command line gives it: ``highway:k=1`` -> ``("highway", ["k=1"])``,
    ``my_rule.py:SignSGD:clip=1`` -> ``("my_rule.py:SignSGD", ["clip=1"])``: the engine is every ``:``-part before the
    first that holds ``=``."""
    parts = spec.split(":")
    cut = next((i for i, part in enumerate(parts) if "=" in part), len(parts))
    return ":".join(parts[:cut]).strip(), parts[cut:]


def available() -> list[str]:
    """Sorted names accepted by ``build_engine``: built in, registered and installed as plugins."""
    _load_plugins()
    return sorted(_ENGINES)


def resolve_engine(engine: str | type[GradientEngine]) -> str:
    """The registered name of ``engine``: a name, a class or a reference (module docstring), registering the latter
    two."""
    _load_plugins()
    if isinstance(engine, type):
        return _register(engine)
    if not isinstance(engine, str):
        raise ConfigError(f"an engine is a name, a GradientEngine subclass or FILE.py:Class, got "
                          f"{type(engine).__name__}")
    if engine in _ENGINES:
        return engine
    if is_reference(engine):
        module, where, attr = import_reference(engine, "engine", ConfigError)
        if not hasattr(module, attr):
            defined = sorted(n for n, v in vars(module).items() if isinstance(v, type)
                             and issubclass(v, GradientEngine) and v.__module__ == module.__name__)
            raise ConfigError(f"'{where}' has no engine class '{attr}'"
                              + (f"; its GradientEngine classes: {', '.join(defined)}" if defined else ""))
        cls = getattr(module, attr)
        origin = _origin(cls, engine) if isinstance(cls, type) else None
        return _register(cls, origin, where=engine)
    raise ConfigError(f"unknown trainer '{engine}'; available: {', '.join(available())}; or your own engine, "
                      f"FILE.py:Class or module:Class")


def engine_class(engine: str | type[GradientEngine]) -> type[GradientEngine]:
    """The engine class of a name, class or reference (``ConfigError`` if none)."""
    return _ENGINES[resolve_engine(engine)]


def engine_origin(engine: str | type[GradientEngine]) -> dict[str, str]:
    """Where the engine comes from: ``{"source": "built in" | "file" | "module" | "plugin", "class", ...}`` with
    the file's path and sha256, the module and its distribution's version, or the plugin's distribution."""
    return dict(_ORIGINS[resolve_engine(engine)])


def build_engine(engine: str | type[GradientEngine], **options: Any) -> GradientEngine:
    """Instantiate an engine (a name, a class or a reference) with validated options."""
    return engine_class(engine)(**options)

