"""Activation functions by name, shared by every zoo model."""

import torch.nn as nn

from gradengines.models.errors import ModelConfigError

__all__ = ["ACTIVATIONS", "build_activation"]

ACTIVATIONS = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "identity": nn.Identity,
}


def build_activation(name: str) -> nn.Module:
    """Return a fresh activation module for ``name`` (one of ``ACTIVATIONS``)."""
    try:
        return ACTIVATIONS[name]()
    except KeyError:
        raise ModelConfigError(
            f"unknown activation '{name}'; choose one of: {', '.join(ACTIVATIONS)}"
        ) from None
