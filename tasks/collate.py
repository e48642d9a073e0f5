"""Items to batches: ``(inputs, targets)`` of a list of a dataset's items, by the user's collate function or by
stacking (``stack_items``), with their errors in one line.

An item is ``(input, target)`` (tensors, numbers or numpy arrays; an input may be a dict of them) or a dict whose
``labels`` (or ``label``, ``target``, ``targets``) entry is the target and whose other entries are the named
inputs, as Hugging Face datasets give them. Float inputs are float32, integer inputs and every target int64.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from .errors import TaskConfigError, one_line

__all__ = ["TARGET_KEYS", "collate_items", "stack_items"]

#: Keys of a dict item that hold its target (the first present is used).
TARGET_KEYS = ("labels", "label", "targets", "target")


def _tensor(value: Any, where: str) -> torch.Tensor:
    """``value`` (a tensor, number, numpy array or list of numbers) as a tensor: float32 or int64."""
    if isinstance(value, torch.Tensor):
        tensor = value
    elif isinstance(value, (int, float, np.ndarray, np.number, list, tuple)) and not isinstance(value, bool):
        try:
            tensor = torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError) as err:
            raise TaskConfigError(f"{where} is not numbers ({one_line(err)})") from None
    else:
        raise TaskConfigError(f"{where} is a {type(value).__name__}, not a tensor, a number or an array")
    if tensor.is_floating_point():
        return tensor.to(torch.float32)
    if tensor.is_complex() or tensor.dtype == torch.bool:
        raise TaskConfigError(f"{where} has dtype {tensor.dtype}, not float or integer")
    return tensor.to(torch.int64)


def _split_item(item: Any, where: str) -> tuple[Any, Any]:
    """(input, target) of one item: a pair, or a dict with a target key (module docstring)."""
    if isinstance(item, Mapping):
        key = next((k for k in TARGET_KEYS if k in item), None)
        if key is None:
            raise TaskConfigError(f"{where} is a dict with keys {', '.join(map(str, item))} and no target: name "
                                  f"it one of {', '.join(TARGET_KEYS)}")
        return {k: v for k, v in item.items() if k != key}, item[key]
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    size = f" of {len(item)}" if isinstance(item, (tuple, list)) else ""
    raise TaskConfigError(f"{where} is a {type(item).__name__}{size}, not (input, target) or a dict with a target "
                          f"key ({', '.join(TARGET_KEYS)})")


def _stack(values: list[torch.Tensor], where: str) -> torch.Tensor:
    shapes = {tuple(v.shape) for v in values}
    if len(shapes) > 1:
        raise TaskConfigError(f"{where} differ in shape ({', '.join(map(str, sorted(shapes)[:3]))}"
                              f"{', ...' if len(shapes) > 3 else ''}): give a collate function that pads them "
                              f"(collate=, or the DataLoader's collate_fn)")
    return torch.stack(values)


def stack_items(items: list[Any], where: str = "the data") -> tuple[Any, torch.Tensor]:
    """The default collate: ``(inputs, targets)`` of a list of items, each entry stacked along a new first axis."""
    pairs = [_split_item(item, f"an item of {where}") for item in items]
    inputs = [p[0] for p in pairs]
    targets = _stack([_tensor(p[1], f"a target of {where}") for p in pairs], f"the targets of {where}")
    if isinstance(inputs[0], Mapping):
        keys = list(inputs[0])
        if any(not isinstance(x, Mapping) or list(x) != keys for x in inputs):
            raise TaskConfigError(f"the items of {where} name different inputs: each needs {', '.join(keys)}")
        return {k: _stack([_tensor(x[k], f"input {k!r} of {where}") for x in inputs], f"the inputs {k!r} of {where}")
                for k in keys}, targets
    return _stack([_tensor(x, f"an input of {where}") for x in inputs], f"the inputs of {where}"), targets


def collate_items(items: list[Any], collate: Callable[[list[Any]], Any] | None, name: str) -> tuple[Any, torch.Tensor]:
    """``(inputs, targets)`` of a list of items: ``collate(items)`` (the user's, its error in one line; it may return
    ``(inputs, targets)`` or one dict with a target key, as an item may), or ``stack_items`` without one."""
    if collate is None:
        return stack_items(items, f"the {name} data")
    try:
        batch = collate(items)
    except TaskConfigError:
        raise
    except Exception as err:  # the user's collate function: its error, in one line
        raise TaskConfigError(f"the {name} data's collate function failed: {one_line(err)}") from None
    where = f"a collated batch of the {name} data"
    inputs, targets = _split_item(batch, where)
    if isinstance(inputs, Mapping):
        return {k: _tensor(v, f"input {k!r} of {where}") for k, v in inputs.items()}, \
            _tensor(targets, f"the target of {where}")
    return _tensor(inputs, f"the input of {where}"), _tensor(targets, f"the target of {where}")
