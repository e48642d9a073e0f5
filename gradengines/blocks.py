"""The pieces a gradient rule is made of: the views of a model and the passes the built-in engines are written on.

    import gradengines as ge
    from gradengines import blocks

    class MyRule(ge.GradientEngine):
        def compute_grads(self, model, inputs, targets, loss_fn):
            outputs, loss = blocks.forward_loss(model, inputs, targets, loss_fn)
            ...
            blocks.write_grads(params, grads)
            return blocks.StepOutput(loss=loss.detach(), outputs=outputs.detach())

The contract (``GradientEngine``): write ``.grad`` of every trainable parameter, overwriting, and nothing else.
Each block says what it returns; none needs a private module. An engine is a ``GradientEngine`` subclass with an
``Options`` dataclass (fields made with ``option(default, help)``: flags ``--<name>-<field>``), refusing a model it
cannot train in ``check`` with one ``IncompatibleModelError`` line and a bad option with one ``ConfigError`` line;
``register_engine`` names it (``trainers.core.registry``). ``trainers/engines/tbptt.py`` is written on this module
alone.

Calling the model (every engine does it this way; users' models need no wrapper)
    ``forward_loss(model, inputs, targets, loss_fn) -> (outputs, loss)``: the model's own forward and the task's
    loss (or the model's own, ``models.declare_call(model, loss="model")``).
    ``call_model(model, inputs, targets) -> ModelCall result`` (``.outputs``): the forward alone.
    ``output_error(model, inputs, targets, loss_fn) -> (outputs, loss, e)``: e = dL/d outputs, the error at the
    model's output (what DFA projects, what a local rule starts from).
    ``trainable_parameters(model) -> [(name, p)]``; ``write_grads(params, grads)``: overwrite ``p.grad`` (zeros
    for None); ``StepOutput(loss, outputs)``: what ``compute_grads`` returns.

The layer-stack view (FOTON, PEPITA, FA, DFA)
    ``layer_stack(nn.Sequential) -> SequentialStack``: ``h_l = act(A_l h_{l-1} + b_l)`` with ``.layers``, ``.act``.
    ``covered_layers(model) -> [(name, module)]``: the weight layers (Linear, Conv2d, Conv1D) whose backward a
    layer-local rule replaces. ``LocalFeedback(rule, seed).compute(model, inputs, targets, loss_fn, params) ->
    (outputs, loss, grads)``: each covered layer's weight gradient its own local one (delta^T x), the error it
    hands below the rule's (``fa``, ``usf``, ``brsf``, ``frsf``: delta B; ``dfa``: e D), everything between
    layers exact.

The residual-stack view (Highway-BP)
    ``residual_stack(model, example=batch) -> ResidualView``: stem, blocks ``h_i = r_i(h_{i-1}, g_i(h_{i-1}))``
    (``.branch``, ``.combine``), head, found in any model or declared; ``.found`` says what was found.

The recurrent view (DSF, FT-BPTT, TBPTT)
    ``wrap_recurrent(model)``: a model with ``nn.GRU``/``nn.LSTM``/``nn.RNN`` gets ``model.recurrent_layers`` (in
    place, the same Parameters). ``recurrent_layers(model, engine) -> [layer]``: them, or the one-line refusal
    (for ``check``). Each layer has ``cell(x_t, h_prev)``, ``forward_sequence(x, h0) -> states``
    (B, T, state) and ``output(states)``. ``recurrent_forwards(model, make_forward)``: within it, layer i runs
    ``make_forward(i, layer)`` inside the model's own forward. ``previous_states(states, h0)``: s_0 .. s_{T-1},
    detached.

Passes without a backward (forward gradients, zeroth order)
    ``directional_derivative(model, inputs, targets, loss_fn, v) -> (loss, dL . v, outputs)``: one forward-mode
    pass over the parameters. ``direction(params, distribution, seed, step, index) -> [tensor]``: a seeded random
    direction, the same on every rank and after a resume. ``perturbed(model, scale, draw)``: within it, every
    module's forward sees ``p + scale * draw(k, p)``, the parameters unwritten.

Exactness, claimed and measured
    ``claim_exact(what, model, inputs, targets, loss_fn, grads_of, opt_out)``: the first-batch self-check. Call it in
    ``first_batch_check`` where the rule claims to equal backprop: ``grads_of(model, inputs, targets, loss_fn)``
    computes the rule's gradients at its exact setting; a difference from autograd is one ``ModelConfigError``
    line (the model in eval mode, its buffers and the random generators put back).
    ``gradengines.gradient_agreement(model, engine, inputs, targets, loss_fn) -> {"global": cos, "per_param":
    {...}}``: the engine's gradient against backprop's, same weights and dropout masks (with the Trainer's logging,
    a layer above the engines: not imported here); ``gradengines.testing.check_engine``: the whole contract.
"""

import torch
from torch import nn

from gradengines.models.adapters.calling import call_model, forward_loss
from gradengines.models.adapters.recurrent import wrap_recurrent
from gradengines.models.adapters.residual import ResidualView, residual_stack
from gradengines.models.adapters.sequential import SequentialStack, layer_stack
from gradengines.models.errors import ModelConfigError
from gradengines.models.layers.recurrent import previous_states
from gradengines.trainers.core.engine import GradientEngine, StepOutput, trainable_parameters, write_grads
from gradengines.trainers.core.errors import ConfigError, IncompatibleModelError
from gradengines.trainers.core.options import option
from gradengines.trainers.core.protocols import RecurrentLayer, recurrent_forwards, recurrent_layers
from gradengines.trainers.core.registry import register_engine
from gradengines.trainers.core.self_check import (
    autograd_reference,
    failures_refused,
    loosest,
    quiet,
    refuse_differences,
)
from gradengines.trainers.engines.directions import direction
from gradengines.trainers.engines.feedback_layers import LocalFeedback, covered_layers
from gradengines.trainers.engines.fgrad import directional_derivative
from gradengines.trainers.engines.mezo import perturbed

__all__ = [
    "GradientEngine", "StepOutput", "option", "register_engine", "ConfigError", "IncompatibleModelError",
    "ModelConfigError", "forward_loss", "call_model", "output_error", "trainable_parameters",
    "write_grads", "layer_stack", "SequentialStack", "covered_layers", "LocalFeedback", "residual_stack",
    "ResidualView", "wrap_recurrent", "RecurrentLayer", "recurrent_layers", "recurrent_forwards", "previous_states",
    "directional_derivative", "direction", "perturbed", "claim_exact",
]


def output_error(model: nn.Module, inputs, targets, loss_fn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(outputs, loss, e = dL/d outputs): the forward with a graph (outputs and loss keep it, for a backward the
    rule may still take), and the error at the model's output."""
    outputs, loss = forward_loss(model, inputs, targets, loss_fn)
    (e,) = torch.autograd.grad(loss, outputs, retain_graph=True)
    return outputs, loss, e


def claim_exact(what: str, model: nn.Module, inputs, targets, loss_fn, grads_of, opt_out: str) -> None:
    """Prove on this batch that the rule equals autograd where it claims to: ``grads_of(model, inputs, targets,
    loss_fn)`` returns the rule's gradient of every trainable parameter (``trainable_parameters`` order) at its
    exact setting. One ``ModelConfigError`` line if any differs beyond the dtype's tolerance (1e-6 in float64, 1e-3
    in float32), naming ``what``, the parameters and ``opt_out`` (how the user skips the check); nothing of the
    model, its buffers or the random generators changes."""
    named = trainable_parameters(model)
    params = [p for _, p in named]
    with quiet(model), failures_refused(what, opt_out):
        expected = autograd_reference(model, inputs, targets, loss_fn, params)[1]
        got = grads_of(model, inputs, targets, loss_fn)
    refuse_differences(what, [n for n, _ in named], got, expected, loosest(params),
                       "the rule's exact setting is not exact on this model", opt_out)
