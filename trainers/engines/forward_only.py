"""Shared machinery of the forward-only engines (FOTON, PEPITA) on a layer stack.

A layer stack (``trainers.core.protocols.LayerStack``) computes

    h_0 = input_features(x),  h_l = act(drop_l(A_l h_{l-1} + b_l)),  y = A_L h_{L-1} + b_L.

A forward-only engine runs a clean pass, takes the output error
``e = dloss/dy`` per sample (``softmax(T y) - onehot`` for cross-entropy), runs
a second pass on a modulated input ``h~_0 = h_0 + s F e`` with the same dropout
masks, and sets for every layer

    G_l = (1/B) sum_batch delta_l (presynaptic_{l-1})^T

with ``delta_l = h_l - h~_l`` for hidden layers and an output error for the
last one. No backward pass through the network: the only autograd is local
(the loss head for ``e``; the VJP of one layer's linear map for layers that are
not plain ``nn.Linear``, e.g. parametrized convolutions; the VJP through a
geotorch parametrization).

Dropout masks: the clean pass draws each layer's mask once from the torch RNG
(in layer order, from the step's start, as a backprop reference run from the same
state would, e.g. ``trainers.gradient_agreement``) and keeps it for the modulated
pass: one scaled mask of the layer's activation shape per active dropout, which
doubles the activation memory the clean pass keeps (the masks are freed at the end
of the step). The RNG is left where one forward pass leaves it. FOTON's ``lowmem``
mode keeps no per-layer tensor: it replays the RNG instead (``MaskReplay``), so it
draws every mask twice per step.
"""

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules import module as module_hooks
from torch.nn.utils import parametrize

from gradengines.models.orthogonal import has_parametrized_weight, route_weight_grad
from gradengines.models.orthogonal.retraction import record_layer_grads
from gradengines.tasks.base import cross_entropy_loss
from gradengines.trainers.core.engine import GradientEngine, StepOutput, write_grads
from gradengines.trainers.core.protocols import LayerStack, require
from gradengines.trainers.core.rng import set_torch_rng_state, torch_rng_state
from gradengines.trainers.engines.weights import weights_once

__all__ = ["active_dropouts", "stack_calls", "stack_forward", "apply_mask", "output_error", "layer_adjoint",
           "write_layer_grads", "linear_part", "MaskReplay", "ModulatedForward"]


_MEAN_CROSS_ENTROPY = (F.cross_entropy, cross_entropy_loss)  # losses whose output error has a closed form


def linear_part(layer: nn.Module) -> nn.Linear | None:
    """The ``nn.Linear`` computing ``layer`` on flattened inputs (the layer itself, or ``layer.linear``)."""
    if isinstance(layer, nn.Linear):
        return layer
    inner = getattr(layer, "linear", None)
    return inner if isinstance(inner, nn.Linear) else None


def layer_adjoint(layer: nn.Module, v: torch.Tensor) -> torch.Tensor:
    """A^T v for the linear part of ``layer`` (no bias): (B, *out) -> (B, *in)."""
    if hasattr(layer, "adjoint"):
        return layer.adjoint(v)
    return v @ layer.weight  # nn.Linear: (B, d_out) @ (d_out, d_in)


_IN_PLACE_ACTIVATIONS = {nn.Tanh: torch.tanh_, nn.ReLU: torch.relu_, nn.Identity: lambda a: a}


def _hook_free(module: nn.Module) -> bool:
    return not (module._forward_hooks or module._forward_pre_hooks)


def _plain_linear(layer: nn.Module) -> bool:
    """An ``nn.Linear`` (geotorch-parametrized or not) whose call is ``F.linear(h, weight, bias)``: no subclass
    forward, no forward hooks."""
    plain = type(layer) is nn.Linear or parametrize.type_before_parametrizations(layer) is nn.Linear
    return plain and _hook_free(layer)


def stack_calls(model) -> tuple[list, object]:
    """The maps h -> A_l h + b_l of ``model.layers`` and the activation, as the passes call them.

    A stack of plain ``nn.Linear`` layers (``_plain_linear``) with a tanh, ReLU or identity activation and no
    global forward hooks gets direct calls: ``F.linear`` with each layer's weight and bias read once (inside
    ``weights_once`` a parametrized W is the step's cached one) and the activation in place on the map's
    fresh output. The same numbers as the module calls, about 3.5 us less per layer and pass (a module call
    costs 4.9 us against 2.7 us, tanh 1.8 us against 0.6 us: about 3% of a FOTON step at depth 32, width 256,
    batch 64; issue 32). Any other stack gets its modules, so that hooks (the Cayley retraction records the
    forward calls by one) and other layers run as written."""
    act = model.act
    direct = (not (module_hooks._global_forward_hooks or module_hooks._global_forward_pre_hooks)
              and type(act) in _IN_PLACE_ACTIVATIONS and _hook_free(act)
              and all(_plain_linear(layer) for layer in model.layers))
    if not direct:
        return list(model.layers), act
    return ([functools.partial(F.linear, weight=layer.weight, bias=layer.bias) for layer in model.layers],
            _IN_PLACE_ACTIVATIONS[type(act)])


def active_dropouts(model) -> list:
    """Each hidden layer's dropout module, or None where it is the identity (eval mode or p = 0): a call
    skipped is a Python module call saved per layer and pass."""
    return [d if d.training and d.p > 0 else None for d in model.dropouts]


def stack_forward(model, h0, *, keep: bool, masks: list | None = None, calls: tuple | None = None):
    """Clean pass from h_0; returns ([h_0 .. h_{L-1}] if keep else [], y). With ``masks`` (a list), the
    scaled mask each hidden layer's dropout drew is appended to it (None where the dropout is the identity),
    for a second pass over the same batch (``apply_mask``). ``calls``: ``stack_calls(model)`` if the caller
    has it."""
    maps, act = stack_calls(model) if calls is None else calls
    hs = [h0] if keep else []
    h = h0
    for layer, dropout in zip(maps[:-1], active_dropouts(model), strict=True):
        a = layer(h)
        if dropout is not None:
            mask = dropout.mask_for(a)
            a = a * mask
        if masks is not None:
            masks.append(None if dropout is None else mask)
        h = act(a)  # (B, *shape_l)
        if keep:
            hs.append(h)
    return hs, maps[-1](h)  # (B, d_L)


def apply_mask(a: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Dropout with a mask the clean pass drew (``stack_forward(..., masks=)``); None: the identity."""
    return a if mask is None else a * mask


def output_error(y, targets, loss_fn, temperature: float = 1.0) -> torch.Tensor:
    """Per-sample output error e = B * d loss_fn(T y, t) / dy / T, shape (B, d_L).

    For the mean cross-entropy this is ``softmax(T y) - onehot(t)`` (FOTON's
    ``ce_T`` convention), computed in that closed form for ``F.cross_entropy`` and the
    tasks' ``cross_entropy_loss`` on class labels; with T = 1 it is B times the exact
    gradient of the mean loss, for any loss, which other losses get from one local
    autograd call on the loss head only.
    """
    if loss_fn in _MEAN_CROSS_ENTROPY and y.dim() == 2 and targets.dim() == 1 and not targets.is_floating_point() \
            and int(targets.min()) >= 0:
        e = torch.softmax(temperature * y, dim=-1)
        e[torch.arange(y.shape[0], device=y.device), targets] -= 1
        return e
    with torch.enable_grad():
        y = y.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(loss_fn(temperature * y, targets), y)
    return grad * (y.shape[0] / temperature)


def write_layer_grads(layer: nn.Module, presynaptic, delta, batch: int, scale: float = 1.0,
                      output: torch.Tensor | None = None) -> None:
    """Overwrite the grads of ``layer``'s parameters with (scale/B) sum delta presynaptic^T.

    ``nn.Linear`` (or a layer wrapping one as ``.linear``): closed form, one GEMM with
    the factor scale/B folded in (a separate division of the weight-sized result cost
    as much as the product at width 1024), then routed into the trainable tensor
    (``route_weight_grad``). Other linear layers: one local VJP of
    <delta, layer(presynaptic)> scale/B with respect to the layer's own parameters
    (its bias gets scale sum(delta) / B the same way); ``output``: ``layer(presynaptic)`` already
    computed with a graph to the parameters, which then is not recomputed.
    """
    alpha = scale / batch
    linear = linear_part(layer)
    if linear is not None:
        d = delta if delta.dim() == 2 else delta.reshape(batch, -1)  # (B, d_out)
        h = presynaptic if presynaptic.dim() == 2 else presynaptic.reshape(batch, -1)
        G = torch.addmm(d.new_zeros(()), d.T, h, beta=0, alpha=alpha)  # (d_out, d_in)
        if has_parametrized_weight(linear):
            route_weight_grad(linear, G)
        else:
            linear.weight.grad = G.to(linear.weight.dtype)  # its shape by construction; float32 under autocast
        record_layer_grads(linear, d, presynaptic, alpha)  # the factors of G, for a Cayley retraction
        bias = linear.bias
        if bias is not None:  # alpha sum(d) as one matrix-vector product: 2% of a FOTON step at width 256
            bias.grad = torch.mv(d.T, d.new_full((batch,), alpha)).to(bias.dtype)  # not sum().mul_() or mean()
        return
    params = [p for p in layer.parameters() if p.requires_grad]
    with torch.enable_grad():
        out = layer(presynaptic.detach()) if output is None else output
        grads = torch.autograd.grad(out, params, grad_outputs=delta * alpha, allow_unused=True)
    write_grads(params, grads)


class MaskReplay:
    """Same dropout masks in every pass of one step, by replaying the torch RNG (FOTON's ``lowmem`` mode,
    which keeps no mask between its passes).

        with MaskReplay() as replay:
            first pass            # draws the masks
            replay()              # back to the step's start
            second pass           # draws the same masks again

    On exit the RNG is where one pass leaves it, as after a backprop step.
    """

    def __enter__(self):
        self.start, self.after_first = torch_rng_state(), None
        return self

    def __call__(self):
        if self.after_first is None:
            self.after_first = torch_rng_state()
        set_torch_rng_state(self.start)

    def __exit__(self, *exc):
        if self.after_first is not None:
            set_torch_rng_state(self.after_first)
        return False


class ModulatedForward(GradientEngine):
    """Two forward passes, local updates (module docstring); subclasses set the rule.

    Subclass attributes: ``sign`` (h~_0 = h_0 + sign F e), ``modulated_presynaptic``
    (use h~_{l-1} instead of h_{l-1}), ``modulated_output_error`` (use the error
    of the modulated output for the last layer), and the method ``feedback``.
    """

    # set by each engine (FOTON's class; PEPITA's class and variant)
    sign: float
    modulated_presynaptic: bool
    modulated_output_error: bool
    zoo = "mlp, ortho_lenet, ortho_convnet"

    def check(self, model):
        require(model, LayerStack, self.name, "a layer stack h_l = act(A_l h_{l-1} + b_l) with adjoint-capable A_l",
                self.zoo)

    def feedback(self, model, h0: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """F e in the shape of h_0: (B, d_L) -> (B, *shape_0)."""
        raise NotImplementedError

    def temperature(self) -> float:
        return 1.0

    def error_scale(self) -> float:
        """s in h~_0 = h_0 + sign s F e; the hidden deltas are divided by s."""
        return 1.0

    def compute_grads(self, model, inputs, targets, loss_fn) -> StepOutput:
        # list(): a ModuleList's slice is a new ModuleList, built at 1 us a layer
        batch, layers, T = inputs.shape[0], list(model.layers), self.temperature()
        with weights_once(model), torch.no_grad():
            # clean pass, keeping h_0 .. h_{L-1} and the dropout masks
            h0 = model.input_features(inputs)
            masks: list = []
            maps, act = calls = stack_calls(model)
            clean, y = stack_forward(model, h0, keep=True, masks=masks, calls=calls)
            e = output_error(y, targets, loss_fn, T)  # (B, d_L)
            # modulated pass with the same masks; hidden updates on the fly
            s = self.error_scale()
            h = h0 + (self.sign * s) * self.feedback(model, h0, e)
            for i, (layer, layer_map, mask) in enumerate(zip(layers[:-1], maps[:-1], masks, strict=True)):
                previous = h
                h = act(apply_mask(layer_map(h), mask))  # h~_l
                presynaptic = previous if self.modulated_presynaptic else clean[i]
                write_layer_grads(layer, presynaptic, clean[i + 1] - h, batch, scale=1 / s)
            # output layer
            err = output_error(maps[-1](h), targets, loss_fn, T) if self.modulated_output_error else e
            write_layer_grads(layers[-1], h if self.modulated_presynaptic else clean[-1], err, batch)
            loss = loss_fn(y, targets)
        return StepOutput(loss=loss, outputs=y)
