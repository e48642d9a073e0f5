"""DSF (diagonal state feedback) and FT-BPTT: time-parallel training of recurrent layers.

Caillon, Fagnou, Allauzen, "Fast Training of Recurrent Neural Networks with Stationary
State Feedbacks", arXiv 2503.23104. BPTT propagates g_t = e_t + g_{t+1} J_{t+1} with the
per-sample, per-step Jacobian J_{t+1} = d s_{t+1} / d s_t; DSF replaces every J_{t+1} by
one fixed diagonal A:

    g_T = e_T,    g_t = e_t + a * g_{t+1}     (element-wise; a = diag A)

where e_t = dL/ds_t through the non-recurrent paths only (the layer above, the residual,
the head). In every layer of ``model.recurrent_layers``, during the model's own forward:

1. s_1 .. s_T = ``forward_sequence(x)`` without a graph (fused nn.GRU / nn.RNN / nn.LSTM);
2. the cell recomputed on all B*T pairs (x_t, s_{t-1}) at once, s_{t-1} detached: a local
   graph per step that depends on theta and x_t only, whose outputs equal step 1's;
3. in the backward pass, the e_t arriving at those outputs is replaced by g_t, computed by
   one reverse scan (``models.layers.scan.reverse_scan``: sequential on the CPU, chunked on a GPU,
   never the a^-t cumsum trick), and autograd pushes g_t through the local graph to theta
   (summed over t) and to x_t, which is the e_t of the layer below.

Stacked layers each apply their own feedback; everything outside the recurrent layers
(embedding, residuals, LayerNorms, MLPs, head) is differentiated exactly.

``feedback`` (the choice of a):
* ``linspace`` (default): a = linspace(0, 1, state_size), the authors' code, every layer.
* ``constant``: a = ``decay`` in every channel (0 is FT-BPTT, 1 an undecayed reverse cumsum).
* ``tied``: a_t = the layer's own gate at step t+1 (``cell_with_gate``): lambda for the
  diagonal linear RNN, where DSF is then exact BPTT; the update gate z_{t+1} for the GRU
  (exact when W_hh = 0), the diagonal direct-path part of its Jacobian (per sample and
  per step, so not stationary; beyond the paper).
* ``gate``: a stationary a = the gate's mean over batch, time and the ``refresh`` steps
  since the last refresh, refreshed every ``refresh`` steps (beyond the paper).

LSTM (state [h; c]): nothing above a layer reads c, so the error reaching the state is
zero on its c half. ``linspace`` and ``constant`` act on [h; c] as the authors' code does
(so only the h half's channels matter); ``tied`` and ``gate`` act instead on the carry
path: on the error at c_t after the h readout h_t = o_t tanh c_t (``cell_carry`` /
``readout``), with a_t = f_{t+1} (or its mean), since d c_{t+1} / d c_t = diag(f_{t+1});
exact BPTT when W_hh = 0.

``ftbptt`` (fully truncated BPTT) is the same step with a = 0: no scan at all.
"""

import dataclasses
from typing import Literal

import torch
import torch.nn as nn

from gradengines.models.adapters.calling import forward_loss
from gradengines.models.layers.recurrent import previous_states
from gradengines.models.layers.scan import METHODS, reverse_scan
from gradengines.trainers.core.distributed import mean_over_ranks
from gradengines.trainers.core.engine import GradientEngine, StepOutput, trainable_parameters, write_grads
from gradengines.trainers.core.errors import ConfigError, IncompatibleModelError
from gradengines.trainers.core.options import option
from gradengines.trainers.core.protocols import recurrent_forwards, recurrent_layers
from gradengines.trainers.core.registry import register_engine

__all__ = ["TimeParallel", "FTBPTT", "DSF"]


class TimeParallel(GradientEngine):
    """Shared step of FT-BPTT and DSF: detached fused forward, local recompute, feedback hook."""

    def check(self, model: nn.Module) -> None:
        recurrent_layers(model, self.name)

    needs_gate = False  # coefficients need the cell's gate

    def coefficients(self, index: int, gate: torch.Tensor | None, size: int | None = None,
                     device: torch.device | None = None) -> torch.Tensor | None:
        """a for layer ``index``: None (no scan), or broadcastable to its (B, T, size) states."""
        return None

    def _feed_back(self, states: torch.Tensor, a: torch.Tensor | None) -> None:
        """Replace the error reaching ``states`` (B, T, n) by its reverse scan with ``a``."""
        if a is not None and states.requires_grad:
            method, a = self.scan_method(), a.to(states.dtype)
            states.register_hook(lambda e: reverse_scan(e, a, dim=1, method=method))

    def scan_method(self) -> str:
        return "auto"

    def _layer_forward(self, index: int, layer: nn.Module):
        def forward(x, h0=None):
            with torch.no_grad():
                states = layer.forward_sequence(x, h0)  # (B, T, state), fused, no graph
            B, T = states.shape[:2]
            prev = previous_states(states, h0)  # s_0 .. s_{T-1}, detached
            flat_x, flat_prev = x.reshape(B * T, -1), prev.reshape(B * T, -1)
            if self.needs_gate and hasattr(layer, "cell_carry"):  # LSTM: feed back on c after the h readout
                carry, o, gate = (t.reshape(B, T, -1) for t in layer.cell_carry(flat_x, flat_prev))
                self._feed_back(carry, self.coefficients(index, gate.detach()))
                return layer.output(layer.readout(carry, o))
            if self.needs_gate:
                local, gate = layer.cell_with_gate(flat_x, flat_prev)
                gate = gate.detach().reshape(B, T, -1)
            else:
                local, gate = layer.cell(flat_x, flat_prev), None
            local = local.reshape(B, T, -1)
            self._feed_back(local, self.coefficients(index, gate, layer.state_size, local.device))
            return layer.output(local)

        return forward

    def time_parallel(self, model: nn.Module):
        """Context in which every recurrent layer of ``model`` runs the DSF / FT-BPTT step."""
        self.check(model)
        return recurrent_forwards(model, self._layer_forward)

    def compute_grads(self, model, inputs, targets, loss_fn) -> StepOutput:
        params = [p for _, p in trainable_parameters(model)]
        with self.time_parallel(model):
            outputs, loss = forward_loss(model, inputs, targets, loss_fn)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        write_grads(params, grads)
        self.after_step()
        return StepOutput(loss=loss.detach(), outputs=outputs.detach())

    def after_step(self) -> None:
        """Hook for per-step bookkeeping (DSF's gate statistics)."""


@register_engine("ftbptt")
class FTBPTT(TimeParallel):
    """Fully truncated BPTT: g_t = e_t, no gradient through time (DSF with A = 0)."""


@register_engine("dsf")
class DSF(TimeParallel):
    """Diagonal state feedback (module docstring)."""

    @dataclasses.dataclass
    class Options:
        feedback: Literal["linspace", "constant", "tied", "gate"] = option(
            "linspace", "diagonal feedback a: linspace(0,1,d) (authors), constant decay, tied to the "
                        "cell's gate per step, or the gate's running mean (module docstring)")
        decay: float = option(0.5, "a for feedback=constant, in [0, 1]")
        refresh: int = option(100, "feedback=gate: refresh a from the gate's mean every N steps")
        scan: Literal[METHODS] = option("auto", "reverse-scan form (auto: sequential on CPU, chunked on GPU)")

    def __init__(self, **options):
        super().__init__(**options)
        if not 0.0 <= self.options.decay <= 1.0:
            raise ConfigError(f"--dsf-decay must be in [0, 1], got {self.options.decay}")
        if self.options.refresh < 1:
            raise ConfigError(f"--dsf-refresh must be a positive integer, got {self.options.refresh}")
        if self.options.scan == "fft" and self.options.feedback == "tied":
            raise ConfigError("--dsf-scan fft needs a time-invariant feedback; feedback=tied varies per step")
        self.needs_gate = self.options.feedback in ("tied", "gate")
        self.steps = 0
        self.gate_sum: dict[int, torch.Tensor] = {}  # feedback=gate, per layer: gate means summed since refresh
        self.gate_count = 0  # steps in gate_sum before the current one
        self.a: dict[int, torch.Tensor] = {}  # feedback=gate: the current stationary a per layer
        self.fixed: dict[tuple, torch.Tensor] = {}  # linspace / constant a per (state size, device)
        self._means: dict[int, torch.Tensor] = {}  # mean a per layer of the last step (metrics)

    def check(self, model):
        super().check(model)
        if self.needs_gate:
            for layer in model.recurrent_layers:
                if not getattr(layer, "has_diagonal_path", True):
                    raise IncompatibleModelError(
                        f"--dsf-feedback {self.options.feedback} needs a cell with a diagonal direct path "
                        f"(gru, lstm, diagonal); {type(layer).__name__}'s gate is zero, i.e. ftbptt")

    def scan_method(self):
        return self.options.scan

    def coefficients(self, index, gate, size=None, device=None):
        kind = self.options.feedback
        if kind in ("linspace", "constant"):  # fixed: built once per (size, device)
            key = (size, device)
            if key not in self.fixed:
                a = torch.linspace(0.0, 1.0, size) if kind == "linspace" else torch.full((size,), self.options.decay)
                self.fixed[key] = a.to(device)
            a = self.fixed[key]
        elif kind == "tied":  # a_t carries g_{t+1} back to t: the gate at step t+1 (last entry unused)
            a = torch.cat([gate[:, 1:], torch.zeros_like(gate[:, :1])], dim=1)
        else:  # gate: the mean since the last refresh, refreshed every `refresh` steps
            batch_mean = mean_over_ranks(gate.mean(dim=(0, 1)).double(), gate.shape[0])  # the global batch's
            self.gate_sum[index] = self.gate_sum.get(index, 0) + batch_mean
            if index not in self.a or self.steps % self.options.refresh == 0:
                self.a[index] = self.gate_sum[index] / (self.gate_count + 1)
            a = self.a[index]
        self._means[index] = a.mean()  # a tensor: read (synchronised) only when metrics are logged
        return a

    def after_step(self):
        self.gate_count += 1  # steps accumulated in gate_sum
        if self.steps % self.options.refresh == 0:
            self.gate_sum, self.gate_count = {}, 0
        self.steps += 1

    def metrics(self):
        return {f"feedback_mean/layer{i}": float(v) for i, v in sorted(self._means.items())}

    def state_dict(self):
        return {"steps": self.steps, "gate_count": self.gate_count,
                "gate_sum": {i: t.clone() for i, t in self.gate_sum.items()},
                "a": {i: t.clone() for i, t in self.a.items()}}

    def load_state_dict(self, state):
        self.steps, self.gate_count = state["steps"], state["gate_count"]
        self.gate_sum = {i: t.clone() for i, t in state["gate_sum"].items()}
        self.a = {i: t.clone() for i, t in state["a"].items()}
