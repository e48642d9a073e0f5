"""Options as dataclasses: validated construction and generated CLI flags.

Each engine (and the Trainer) declares its hyperparameters as a dataclass
whose fields carry a ``help`` string in their metadata. ``parse_options``
rejects unknown keys, wrong types and non-finite numbers with a one-line ``ConfigError``;
``add_arguments`` turns the fields into ``--kebab-case`` flags.
"""

import argparse
import ast
import dataclasses
import math
import types
import typing

from gradengines.trainers.core.errors import ConfigError, on_command_line

__all__ = ["option", "flag_type", "FLAG_TYPES", "parse_options", "add_arguments", "options_from_args", "as_dict",
           "parse_key_values"]


def option(default, help: str, **kwargs):
    """A dataclass field with a help string (shown by ``--help``)."""
    return dataclasses.field(default=default, metadata={"help": help, **kwargs})


def _base_type(tp):
    """``int | None`` -> int; ``Literal[...]`` -> str; plain types unchanged."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return type(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])
    return tp


def _choices(tp):
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    for a in typing.get_args(tp):
        if typing.get_origin(a) is typing.Literal:
            return typing.get_args(a)
    return None


FLAG_TYPES = (int, float, str, bool)
"""The option types a command-line flag can give (also as ``Literal[...]`` and ``X | None``)."""


def flag_type(tp) -> bool:
    """Whether a flag can give a value of type ``tp``: one of ``FLAG_TYPES``, a ``Literal`` of them, or one of those
    ``| None`` (what ``add_arguments`` turns into a flag)."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return all(isinstance(a, FLAG_TYPES) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return len(args) == 1 and flag_type(args[0])
    return tp in FLAG_TYPES


def _allows_none(tp):
    return type(None) in typing.get_args(tp)


def _coerce(name, value, tp, shown):
    """Check (and gently convert ints to floats) one option value; ``shown`` names it in errors."""
    if value is None:
        if _allows_none(tp):
            return None
        raise ConfigError(f"{shown} may not be None")
    choices = _choices(tp)
    if choices is not None:
        if value not in choices:
            raise ConfigError(f"{shown} must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    base = _base_type(tp)
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if base is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{shown} must be a finite number, got {value}")
    wrong_type = base in (int, float, str, bool) and not isinstance(value, base)
    if wrong_type or (base in (int, float) and isinstance(value, bool)):
        raise ConfigError(f"{shown} must be {base.__name__}, got {value!r}")
    return value


def parse_options(cls, options: dict, *, prefix: str = ""):
    """Build the options dataclass ``cls`` from a dict; reject unknown keys and bad types.

    Errors name an option as its flag (``--<prefix>-<name>``) on the command line, else ``option '<name>'``.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown option {', '.join(unknown)} for {cls.__name__}; accepted: {', '.join(fields) or 'none'}"
        )
    hints = typing.get_type_hints(cls)
    shown = {k: "--" + (prefix + k).replace("_", "-") if on_command_line() else f"option '{k}'" for k in options}
    values = {k: _coerce(k, v, hints[k], shown[k]) for k, v in options.items()}
    return cls(**values)


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_arguments(parser: argparse.ArgumentParser, cls, *, prefix: str = "", title: str | None = None):
    """Add one ``--prefix-field-name`` flag per dataclass field (default: the field's default). A field whose help
    another group of ``parser`` already gave (the FA family's shared options) says "as --<that flag>" instead of
    repeating it."""
    group = parser.add_argument_group(title or cls.__name__)
    hints = typing.get_type_hints(cls)
    said = parser.__dict__.setdefault("_said_helps", {})  # (field, help) -> the flag that gave it first
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        base = _base_type(tp)
        flag = "--" + (prefix + f.name).replace("_", "-")
        text = f.metadata.get("help", "")
        first = said.setdefault((f.name, text), flag)
        kwargs: dict[str, typing.Any] = dict(dest=prefix + f.name, default=argparse.SUPPRESS,
                                             help=f"{text if first == flag else 'as ' + first} (default: {f.default})")
        choices = _choices(tp)
        if choices is not None:
            kwargs["choices"] = choices
        if base is bool:
            kwargs.update(type=_parse_bool, metavar="BOOL")
        elif _allows_none(tp) and base is not str:
            kwargs["type"] = lambda text, b=base: None if text.lower() == "none" else b(text)
        else:
            kwargs["type"] = base
        group.add_argument(flag, **kwargs)


def options_from_args(args: argparse.Namespace, cls, *, prefix: str = "") -> dict:
    """The flags of ``cls`` that the user actually gave, as a dict of field -> value."""
    given = vars(args)
    return {f.name: given[prefix + f.name] for f in dataclasses.fields(cls) if prefix + f.name in given}


def as_dict(options) -> dict:
    """Options dataclass -> plain dict (for logs, hparams and checkpoints)."""
    return dataclasses.asdict(options)


def parse_key_values(items, what: str) -> dict:
    """["n_train=4096", "flatten=False"] -> {"n_train": 4096, "flatten": False}
    (Python literals, else strings); ``what`` names the flag in the error."""
    options: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} expects KEY=VALUE, got {item!r}")
        if key in options:
            raise ConfigError(f"{what} gives {key} twice ({key}={options[key]!r} and {item}); give it once")
        try:
            options[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            options[key] = text
    return options
