"""Truncated BPTT with a window of k steps: the recurrent baseline between FT-BPTT and BPTT.

Williams & Peng (1990), the form with k1 = k2 = k that language models train with (each batch's sequence cut into
windows of k steps, the state carried into the next window without its gradient). Inside every recurrent layer:

    s_t = f(x_t, s_{t-1})   within a window,     s_{start - 1} = stop_gradient(s_{start - 1})

so the error of each step flows back through at most k steps (through fewer for the first steps of a window), and
everything outside the recurrent layers (embedding, residuals, head) is differentiated exactly. k = 1 is FT-BPTT
(``ftbptt``: g_t = e_t); k >= T is BPTT (``backprop``). The states entering each window are the full forward's.

Time-parallel as DSF and FT-BPTT: each layer runs its fused sequence forward twice, once without a graph over the
whole sequence (the states where windows start), then with a graph on all ceil(T / k) windows at once, a batch of
B * ceil(T / k) sequences of k steps (the last window padded at its end, the padding's outputs dropped: a step
never reads a later one). No Python loop over time or windows; the cost of a step is about backprop's.

On its first batch the engine proves its machinery on the model at k = T, where it must equal autograd of the
model's own forward (``blocks.claim_exact``); ``--tbptt-self-check false`` skips that. Written only on
``gradengines.blocks``, the public pieces of an engine.
"""

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from gradengines import blocks

__all__ = ["TruncatedBPTT"]


@blocks.register_engine("tbptt")
class TruncatedBPTT(blocks.GradientEngine):
    """Truncated BPTT, k-step windows (module docstring)."""

    @dataclasses.dataclass
    class Options:
        k: int = blocks.option(16, "window: gradients flow back through at most k steps (1: ftbptt; >= the "
                                   "sequence length: BPTT); no published setting for these models: tune it")
        self_check: bool = blocks.option(True, "on the first batch, check at k = T that the windows give autograd's "
                                               "gradients on this model")

    def __init__(self, **options):
        super().__init__(**options)
        if self.options.k < 1:
            raise blocks.ConfigError(f"--tbptt-k must be >= 1, got {self.options.k}")

    def check(self, model: nn.Module) -> None:
        blocks.recurrent_layers(model, self.name)

    @staticmethod
    def windowed(layer: nn.Module, k: int):
        """``layer``'s forward with gradients through at most ``k`` steps (module docstring)."""

        def forward(x: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
            batch, steps = x.shape[:2]
            window = min(k, steps)
            with torch.no_grad():
                states = layer.forward_sequence(x, h0)
            starts = blocks.previous_states(states, h0)[:, ::window]  # the state before each window, detached
            count = starts.shape[1]
            padded = F.pad(x, (0, 0, 0, count * window - steps))
            local = layer.forward_sequence(padded.reshape(batch * count, window, -1), starts.reshape(batch * count, -1))
            return layer.output(local.reshape(batch, count * window, -1)[:, :steps])

        return forward

    def grads_at(self, model: nn.Module, inputs, targets, loss_fn, k: int):
        """(outputs, loss, the gradients of the trainable parameters) with windows of ``k`` steps."""
        params = [p for _, p in blocks.trainable_parameters(model)]
        with blocks.recurrent_forwards(model, lambda index, layer: self.windowed(layer, k)):
            outputs, loss = blocks.forward_loss(model, inputs, targets, loss_fn)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        return outputs, loss, grads

    def first_batch_check(self, model, inputs, targets, loss_fn) -> None:
        if self.options.self_check:
            blocks.claim_exact("trainer 'tbptt' at k = T (BPTT)", model, inputs, targets, loss_fn,
                               lambda *batch: self.grads_at(*batch, k=2**31 - 1)[2], "--tbptt-self-check false")

    def compute_grads(self, model, inputs, targets, loss_fn) -> blocks.StepOutput:
        outputs, loss, grads = self.grads_at(model, inputs, targets, loss_fn, self.options.k)
        blocks.write_grads([p for _, p in blocks.trainable_parameters(model)], grads)
        return blocks.StepOutput(loss=loss.detach(), outputs=outputs.detach())
