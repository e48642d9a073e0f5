"""FOTON: forward-only training of orthogonal networks (Caillon, Colagrande,
Fagnou, Delattre, Allauzen, ECAI 2025, arXiv 2512.20668).

    e     = softmax(T y) - onehot(t)                      output error (per sample)
    h~_0  = h_0 - F e,   F e = A_1^T A_2^T ... A_L^T e      transposed forward weights
    G_l   = (1/B) sum (h_l - h~_l) h_{l-1}^T              hidden layers, clean presynaptic
    G_L   = (1/B) sum e h_{L-1}^T                          output layer

With row-orthonormal hidden maps (A_k A_k^T = I), identity activations and no
dropout, G_l is exactly the backprop gradient of the mean loss for every l;
with nonlinear activations it approximates it (exact to first order for one
hidden layer). Writes ``p.grad``; the Trainer's optimizer steps and its
projection keeps the weights orthogonal.

Options: ``mode`` (``difference``: the paper's rule, clean activations kept;
``jvp``: the first-order limit of h_l - h~_l, the tangent along F e, no
cancellation between two large passes: without active dropout and with tanh,
ReLU or identity, propagated from the kept clean activations with act' read
off them (backprop's cost); otherwise by forward-mode AD in lockstep with a
recomputed clean pass, with the dropout masks of the first pass kept;
``lowmem``: a first pass computes only e, then the clean and modulated passes run
in lockstep layer by layer, so activation memory does not grow with depth; it keeps
no mask either, so each mask is drawn twice, by replaying the RNG), ``temperature`` (the paper code's
``ce_T``), ``feedback`` (``dense``: F^T = A_L ... A_1 built output-first and
cached until a weight changes; ``adjoint``: the chain of adjoint maps applied
to e, as for convolutions; ``auto``: dense for all-``nn.Linear`` stacks).

Deviations from the paper's code: F is built output-first (cheaper) and only
when a weight changed; the update uses the actual batch size; biases work
(mean of h_l - h~_l); the optimizer, weight decay and orthogonality upkeep
are the Trainer's (torch.optim, in-place projection or geotorch).
"""

import dataclasses
from typing import Literal

import torch
import torch.nn as nn
from torch.nn.functional import linear

from gradengines.models.orthogonal import has_parametrized_weight, orthogonal_method
from gradengines.trainers.core.engine import StepOutput
from gradengines.trainers.core.errors import ConfigError, IncompatibleModelError
from gradengines.trainers.core.options import option
from gradengines.trainers.core.registry import register_engine
from gradengines.trainers.engines.forward_only import (
    MaskReplay,
    ModulatedForward,
    apply_mask,
    layer_adjoint,
    linear_part,
    output_error,
    stack_forward,
    write_layer_grads,
)
from gradengines.trainers.engines.weights import weights_once

__all__ = ["Foton"]


_DERIVATIVES = {nn.Tanh: lambda h: 1 - h * h, nn.ReLU: lambda h: (h > 0).to(h.dtype), nn.Identity: lambda h: 1.0}


def _closed_form_derivative(model):
    """act'(z) as a function of h = act(z), for an all-``nn.Linear`` stack without active dropout
    whose activation has one (tanh, ReLU, identity); None otherwise."""
    if any(d.training and d.p > 0 for d in model.dropouts) or not all(isinstance(layer, nn.Linear)
                                                                      for layer in model.layers):
        return None
    return _DERIVATIVES.get(type(model.act))


def _weight_version(layer: nn.Linear) -> tuple:
    """What A_l depends on, as (storage, version) pairs: the weight, or a parametrization's tensors."""
    if has_parametrized_weight(layer):
        return tuple((t.data_ptr(), t._version) for t in (*layer.parameters(), *layer.buffers()))
    return layer.weight.data_ptr(), layer.weight._version


def _is_orthogonal(layer: nn.Module) -> bool:
    inner = linear_part(layer)
    return orthogonal_method(inner if inner is not None else layer) is not None or getattr(
        layer, "is_orthogonal", False)


@register_engine("foton")
class Foton(ModulatedForward):
    """FOTON (module docstring)."""

    sign = -1.0
    modulated_presynaptic = False
    modulated_output_error = False

    @dataclasses.dataclass
    class Options:
        mode: Literal["difference", "jvp", "lowmem"] = option(
            "difference", "difference (paper), jvp (first-order limit, forward mode) or lowmem (depth-flat memory)")
        temperature: float = option(1.0, "output error softmax(T y) - onehot (the paper code's ce_T)")
        feedback: Literal["auto", "dense", "adjoint"] = option(
            "auto", "F e by a cached dense product (MLPs) or a chain of adjoint maps (convolutions)")
        error_scale: float = option(
            1.0, "modulate by s F e and divide h_l - h~_l by s (s -> 0: the jvp limit; linear nets: any s)")

        def __post_init__(self):
            if not self.temperature > 0 or not self.error_scale > 0:
                raise ConfigError("foton temperature and error_scale must be > 0")

    def __init__(self, **options):
        super().__init__(**options)
        self._dense = None  # (key, F^T of shape (d_L, d_0)) for the current weights

    def check(self, model):
        super().check(model)
        loose = [i for i, layer in enumerate(model.layers[:-1]) if not _is_orthogonal(layer)]
        if loose:
            raise IncompatibleModelError(
                f"trainer 'foton' needs orthogonal hidden layers (hidden layer {loose[0]} of {type(model).__name__} "
                f"is not); build the model with orthogonal=bjorck|polar|expm|cayley, or use ortho_lenet/ortho_convnet")

    def temperature(self) -> float:
        return self.options.temperature

    def error_scale(self) -> float:
        return self.options.error_scale

    # ------------------------------------------------------------- feedback
    def _use_dense(self, model, h0) -> bool:
        if self.options.feedback == "adjoint":
            return False
        all_linear = h0.dim() == 2 and all(isinstance(layer, nn.Linear) for layer in model.layers)
        if self.options.feedback == "dense" and not all_linear:
            raise IncompatibleModelError("foton feedback=dense needs a stack of nn.Linear layers; use feedback=adjoint")
        return all_linear

    def _dense_feedback(self, model) -> torch.Tensor:
        """F^T = A_L ... A_1, (d_L, d_0), output-first: cost d_L sum_l d_l d_{l-1}; cached by weight versions."""
        key = tuple(_weight_version(layer) for layer in model.layers)
        if self._dense is None or self._dense[0] != key:
            *hidden, last = model.layers
            F_T = last.weight  # (d_L, d_{L-1})
            for layer in reversed(hidden):
                F_T = F_T @ layer.weight  # (d_L, d_{l-1})
            self._dense = (key, F_T)
        return self._dense[1]

    def feedback(self, model, h0, e):
        if self._use_dense(model, h0):
            return e @ self._dense_feedback(model)  # (B, d_L) @ (d_L, d_0)
        v = e
        for layer in reversed(model.layers):
            v = layer_adjoint(layer, v)  # (B, *shape_{l-1})
        return v

    # ---------------------------------------------------------------- modes
    def compute_grads(self, model, inputs, targets, loss_fn) -> StepOutput:
        if self.options.mode == "difference":
            return super().compute_grads(model, inputs, targets, loss_fn)
        if self.options.mode == "jvp" and _closed_form_derivative(model) is not None:
            return self._jvp_from_kept_activations(model, inputs, targets, loss_fn)
        if self.options.mode == "jvp":
            return self._jvp_lockstep(model, inputs, targets, loss_fn)
        return self._lowmem(model, inputs, targets, loss_fn)

    def _jvp_lockstep(self, model, inputs, targets, loss_fn) -> StepOutput:
        """``jvp`` mode with active dropout or another layer or activation: a first pass takes e and keeps the
        dropout masks, then (h_l, J_l F e) layer by layer, a forward-mode JVP along F e with the same masks."""
        batch, layers, T = inputs.shape[0], list(model.layers), self.options.temperature
        with weights_once(model), torch.no_grad():
            h0 = model.input_features(inputs)
            masks: list = []
            _, y = stack_forward(model, h0, keep=False, masks=masks)
            e = output_error(y, targets, loss_fn, T)
            direction = self.feedback(model, h0, e)  # F e: h_0 - h~_0
            h = h0
            for layer, mask in zip(layers[:-1], masks, strict=True):
                if isinstance(layer, nn.Linear):  # linear map: the tangent is W t, no functorch call
                    a, da = layer(h), linear(direction, layer.weight)
                else:
                    a, da = torch.func.jvp(layer, (h,), (direction,))
                h_next, direction = torch.func.jvp(model.act, (apply_mask(a, mask),), (apply_mask(da, mask),))
                write_layer_grads(layer, h, direction, batch)
                h = h_next
            write_layer_grads(layers[-1], h, e, batch)
            loss = loss_fn(y, targets)
        return StepOutput(loss=loss, outputs=y)

    def _lowmem(self, model, inputs, targets, loss_fn) -> StepOutput:
        """``lowmem`` mode: a first pass takes only e (nothing kept), then the clean and modulated passes run in
        lockstep with one mask per layer, drawn again by replaying the RNG (``MaskReplay``): no tensor per
        layer outlives its layer, at the price of drawing every mask twice."""
        batch, layers, T = inputs.shape[0], list(model.layers), self.options.temperature
        with weights_once(model), torch.no_grad(), MaskReplay() as replay:
            h0 = model.input_features(inputs)
            _, y = stack_forward(model, h0, keep=False)
            e = output_error(y, targets, loss_fn, T)
            direction = self.feedback(model, h0, e)  # F e: h_0 - h~_0
            replay()
            # lockstep clean and modulated passes; only the current layer is alive
            h, s = h0, self.options.error_scale
            h_mod = h0 - s * direction
            for layer, dropout in zip(layers[:-1], model.dropouts, strict=True):
                with dropout.shared_mask():
                    h_next, h_mod = model.act(dropout(layer(h))), model.act(dropout(layer(h_mod)))
                write_layer_grads(layer, h, h_next - h_mod, batch, scale=1 / s)
                h = h_next
            write_layer_grads(layers[-1], h, e, batch)
            loss = loss_fn(y, targets)
        return StepOutput(loss=loss, outputs=y)

    def _jvp_from_kept_activations(self, model, inputs, targets, loss_fn) -> StepOutput:
        """``jvp`` mode without dropout and with tanh, ReLU or identity: the clean pass keeps h_1 .. h_{L-1};
        the tangent t_l = act'(h_l) * (W_l t_{l-1}), t_0 = F e, takes act' from h_l (1 - h^2, h > 0, 1).
        The same numbers as the lockstep path, with one forward pass and no second activation: the
        cost profile of backprop (three products per layer)."""
        batch, layers, T = inputs.shape[0], list(model.layers), self.options.temperature
        derivative = _closed_form_derivative(model)
        with weights_once(model), torch.no_grad():
            h0 = model.input_features(inputs)
            clean, y = stack_forward(model, h0, keep=True)
            e = output_error(y, targets, loss_fn, T)
            tangent = self.feedback(model, h0, e)  # F e: h_0 - h~_0
            for i, layer in enumerate(layers[:-1]):
                tangent = linear(tangent, layer.weight).mul_(derivative(clean[i + 1]))
                write_layer_grads(layer, clean[i], tangent, batch)
            write_layer_grads(layers[-1], clean[-1], e, batch)
            loss = loss_fn(y, targets)
        return StepOutput(loss=loss, outputs=y)
