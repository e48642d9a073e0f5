"""Your own model by reference: ``path/to/file.py:ClassName`` or ``package.module:factory``.

``models.build`` accepts such a reference wherever it accepts a zoo name, so a
model written outside the zoo gets the CLI, the comparison, checkpoints and
resume like a zoo model:

    python scripts/train.py --model my_models.py:Net --model-option hidden=128
    models.build("torch.nn:Linear", in_features=64, out_features=10)

The object named is called with the options; it must return an ``nn.Module``.
Its constructor's parameters say which options it takes: the task's sizes
(``in_features``, ``out_features``, ``input_vocab``: the number of input token ids,
``input_shape``) are passed only to a callable that names them, never into its
``**kwargs`` (timm's ``create_model`` takes ``num_classes`` and ``in_chans`` there).
A transformers model class is built from its config, sized to the task
(``models.adapters.libraries``).
A file is imported once per process, under a name derived from its path
(``tasks.reference``, shared with ``--task FILE.py:factory``).
Every failure (no such file, no such name, an import or constructor error, an
unknown option, not a module) is one ``ModelConfigError`` line.
"""

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from gradengines.models.adapters.libraries import is_transformers_class, transformers_factory
from gradengines.models.errors import ModelConfigError, one_line
from gradengines.tasks.reference import import_reference, is_reference

__all__ = ["is_reference", "load_reference", "build_reference", "accepts", "names"]


def load_reference(reference: str) -> Callable[..., Any]:
    """The class or factory ``reference`` names (``file.py:Name`` or ``package.module:name``)."""
    module, where, attr = import_reference(reference, "model", ModelConfigError)
    target = getattr(module, attr, None)
    if target is None or not callable(target):
        defined = sorted(n for n, v in vars(module).items()
                         if not n.startswith("_") and isinstance(v, type) and issubclass(v, nn.Module))
        raise ModelConfigError(f"'{where}' has no model class or factory '{attr}'"
                               + (f"; its nn.Module classes: {', '.join(defined)}" if defined else ""))
    return transformers_factory(target) if is_transformers_class(target) else target


def accepts(target: Callable[..., Any], option: str) -> bool:
    """Whether ``target`` takes the keyword ``option`` (named, or through ``**kwargs``)."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    return option in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def names(target: Callable[..., Any], option: str) -> bool:
    """Whether ``target`` names the keyword ``option`` among its parameters (``**kwargs`` does not count)."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    return option in params and params[option].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                         inspect.Parameter.KEYWORD_ONLY)


def build_reference(reference: str, **options: Any) -> nn.Module:
    """Call the object ``reference`` names with ``options``; one-line errors (module docstring)."""
    target = load_reference(reference)
    unknown = sorted(k for k in options if not accepts(target, k))
    if unknown:
        try:
            accepted = [p for p in inspect.signature(target).parameters if p != "self"]
        except (TypeError, ValueError):
            accepted = []
        raise ModelConfigError(f"model '{reference}' has no option {', '.join(unknown)}; accepted: "
                               f"{', '.join(accepted) or 'none'}")
    try:
        model = target(**options)
    except ModelConfigError as err:  # a transformers config's own refusal, already one line
        raise ModelConfigError(f"model '{reference}': {err}") from None
    except (Exception, SystemExit) as err:
        raise ModelConfigError(f"model '{reference}' could not be built with {options}: {one_line(err)}") from None
    if not isinstance(model, nn.Module):
        raise ModelConfigError(f"model '{reference}' returned a {type(model).__name__}, not a torch.nn.Module")
    return model
