"""Seeded index splits shared by the task builders."""

from __future__ import annotations

import torch

__all__ = ["holdout_indices", "stratified_indices", "generator"]


def generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed``."""
    gen = torch.Generator()
    gen.manual_seed(int(seed))
    return gen


def holdout_indices(n: int, holdout: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ``range(n)`` by a seeded permutation: ``(keep, holdout)``, the holdout being its last ``holdout``.

    Both index sets are returned sorted, so the original order is kept within a split.
    """
    perm = torch.randperm(n, generator=generator(seed))
    keep, held = perm[: n - holdout], perm[n - holdout :]
    return keep.sort().values, held.sort().values


def stratified_indices(
    labels: torch.Tensor, fractions: tuple[float, ...], seed: int
) -> list[torch.Tensor]:
    """Split indices per class by ``fractions`` of the later parts; the first part takes the rest.

    For ``fractions=(val, test)`` it returns ``[train, val, test]``; within each class
    the counts are ``round(fraction * class_size)``. Each part is shuffled by the seed.
    """
    gen = generator(seed)
    parts: list[list[torch.Tensor]] = [[] for _ in range(len(fractions) + 1)]
    for cls in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == cls).flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        start = 0
        sizes = [round(f * len(idx)) for f in fractions]
        for k, size in enumerate(sizes, start=1):
            parts[k].append(idx[start : start + size])
            start += size
        parts[0].append(idx[start:])
    out = []
    for chunks in parts:
        joined = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.int64)
        out.append(joined[torch.randperm(len(joined), generator=gen)])
    return out
