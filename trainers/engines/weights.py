"""Each weight that is a function of trainable tensors, computed once per step by the forward-only engines
(issue 32): a geotorch layer's W = f(theta) and an orthogonal convolution's Fourier symbol Q(weight).

Backprop computes such a weight once, in its forward, and takes one product through f in its backward. A
forward-only engine applies a layer several times per step (FOTON and PEPITA: a clean and a modulated pass; FA
and DFA: a pass and a local product per layer) and then routes its weight-space gradient G through f
(``models.orthogonal.route_weight_grad``): without a cache each application and the routing computed f again
(a matrix exponential, a Cayley solve per frequency). Inside :func:`weights_once` the first evaluation keeps its
graph to the trainable tensor and every later use reads it, so a step costs what backprop's does: one f, one
product through it.
"""

import contextlib

import torch
from torch.nn.utils import parametrize

from gradengines.models.orthogonal import has_parametrized_weight
from gradengines.models.orthogonal.conv import OrthogonalConv2d, cached_symbols

__all__ = ["weights_once"]


@contextlib.contextmanager
def weights_once(model: torch.nn.Module):
    """Within: ``parametrize.cached()`` and ``cached_symbols()``, primed with grad enabled, so that every
    parametrized weight and every ``OrthogonalConv2d`` symbol of ``model`` is computed once, with its graph to
    the tensors it is made of (the passes may then run under ``torch.no_grad()``). The parameters must not
    change inside (an engine's step computes gradients; the optimizer runs after)."""
    with parametrize.cached(), cached_symbols():
        with torch.enable_grad():
            for module in model.modules():
                if has_parametrized_weight(module):
                    module.weight  # noqa: B018 (the access computes and caches W)
                elif isinstance(module, OrthogonalConv2d):
                    module.symbol()
        yield
