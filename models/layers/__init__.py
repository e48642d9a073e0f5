"""Layers and utilities the zoo, the adapters and the engines share: recurrent cells, consistent dropout, the
reverse and forward scans, activations by name."""

from gradengines.models.layers import activations, dropout, recurrent, scan

__all__ = ["activations", "dropout", "recurrent", "scan"]
