r"""Gradients for engines that compute dLoss/dW themselves: the trainable tensor behind a (possibly parametrized)
weight, and writing a weight-space gradient into it (``route_weight_grad``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

__all__ = ["has_parametrized_weight", "trainable_weight", "route_weight_grad"]


def has_parametrized_weight(module: nn.Module) -> bool:
    """``parametrize.is_parametrized(module, "weight")``, with a dict lookup first: a parametrized module holds
    its ``parametrizations`` in ``_modules``, and on a plain module ``is_parametrized`` costs 1.6 us (an
    attribute miss), paid per layer and step by the forward-only engines (issue 32)."""
    return "parametrizations" in module._modules and parametrize.is_parametrized(module, "weight")


def trainable_weight(module: nn.Module) -> nn.Parameter:
    """The Parameter an optimizer updates for ``module``'s weight.

    ``module.parametrizations.weight.original`` for a parametrized weight
    (geotorch "expm"/"cayley"), else ``module.weight``.
    """
    if parametrize.is_parametrized(module, "weight"):
        return module.parametrizations.weight.original
    w = getattr(module, "weight", None)
    if not isinstance(w, nn.Parameter):
        raise ValueError(f"{type(module).__name__} has no `weight` Parameter")
    return w


def route_weight_grad(module: nn.Module, G: Tensor) -> Tensor:
    r"""Write a weight-space gradient :math:`G = \partial L / \partial W` into the
    trainable tensor's ``.grad``, **overwriting** it (no accumulation); return it.

    * plain / projected layers: ``weight.grad = G`` (detached, cast to the
      weight's dtype/device; no copy when they already match, so do not mutate
      ``G`` afterwards).
    * geotorch layers, :math:`W = f(\theta)` with :math:`\theta` =
      ``parametrizations.weight.original``: one local vector–Jacobian product
      through the parametrization only,

      .. math::  \theta.\mathrm{grad} = J_f(\theta)^\top G
                 = \texttt{autograd.grad}(f(\theta), \theta, G),

      which equals :math:`\partial L/\partial\theta` for any loss that depends
      on :math:`\theta` only through :math:`W`. Inside ``parametrize.cached()``
      whose W was first computed with its graph (``trainers.engines.weights_once``),
      the product runs through that graph: W is evaluated once per step, as in
      backprop; otherwise f is evaluated here, once, so this works inside
      ``torch.no_grad()`` too.

    ``G.shape != weight.shape`` raises ValueError.
    """
    theta = trainable_weight(module)
    parametrized = parametrize.is_parametrized(module, "weight")
    with torch.enable_grad():
        W = module.weight  # the cached W inside parametrize.cached(), else f(original) now, with its graph
        if parametrized and W.grad_fn is None:  # cached without a graph: f afresh, bypassing the cache
            W = module.parametrizations.weight()
    if tuple(G.shape) != tuple(W.shape):
        raise ValueError(
            f"route_weight_grad: gradient shape {tuple(G.shape)} != weight shape {tuple(W.shape)} "
            f"of {type(module).__name__}"
        )
    G = G.detach().to(dtype=theta.dtype, device=theta.device)
    if parametrized:  # a cached W's graph lives as long as the cache: another product through it stays possible
        (grad,) = torch.autograd.grad(W, theta, grad_outputs=G, retain_graph=True)
    else:
        grad = G
    theta.grad = grad
    return grad
