"""Recurrent layers with a fused whole-sequence forward and a time-parallel one-step cell.

Every layer here has the same interface (``trainers.core.protocols.RecurrentLayer`` and more):

* ``state_size``: d for ``TanhRNN``, ``GRU`` and ``DiagonalLinearRNN``; 2d for ``LSTM``,
  whose state is ``[h; c]`` concatenated on the last dim (h first).
* ``forward_sequence(x, h0=None) -> states``: (B, T, d_in) -> (B, T, state_size), the
  states s_1 .. s_T (s_0 = h0, zeros when None, shape (B, state_size)). GRU / tanh RNN:
  PyTorch's fused ``nn.GRU`` / ``nn.RNN`` (cuDNN on a GPU). LSTM: the fused ``nn.LSTM``
  gives h_1 .. h_T but only the last c, so the c_t are rebuilt from the gates evaluated
  at all (x_t, h_{t-1}) at once and the linear recurrence c_t = f_t c_{t-1} + i_t g_t,
  solved with ``models.layers.scan.forward_scan`` (a log-depth scan). DiagonalLinearRNN: the
  recurrence is linear, so the whole sequence is one scan, no fused module is needed.
* ``cell(x_t, h_prev) -> s_t``: (N, d_in), (N, state_size) -> (N, state_size), batched
  over any N (e.g. all B*T pairs of a sequence at once), the same math as the fused path
  and on the SAME Parameter objects (no duplicated weights).
* ``output(states)``: what the next layer sees: the h half for the LSTM, the state otherwise.
* ``gate(x_t, h_prev) -> (N, state_size)``: the diagonal of the cheap part of the
  residual Jacobian d s_t / d s_{t-1} along the state's direct path (Highway-BP's K_t):
    - GRU (PyTorch convention h_t = (1 - z_t) n_t + z_t h_{t-1}): the update gate z_t.
      The full Jacobian is diag(z_t) plus terms through the reset gate, the candidate
      n_t and z_t's own dependence on h_{t-1}; it equals diag(z_t) exactly when
      ``weight_hh_l0`` is zero.
    - LSTM: 0 on the h half, the forget gate f_t on the c half. d c_t / d c_{t-1} =
      diag(f_t) exactly (the gates do not read c).
    - DiagonalLinearRNN: lambda, broadcast to (N, d): the exact, diagonal Jacobian.
    - TanhRNN: zeros (no diagonal direct path: h_t = tanh(W_ih x + W_hh h_{t-1} + b)).
* ``cell_with_gate(x_t, h_prev) -> (s_t, gate)``: both from one evaluation of the gates.
  The LSTM also splits its step into ``cell_carry`` (c_t and the gates) and ``readout``
  (h_t = o_t tanh c_t), so an engine can act on the error at c_t after the h readout.
* ``has_diagonal_path``: False for the tanh RNN (its gate is identically zero).
* ``forward(x, h0=None) = output(forward_sequence(x, h0))``: a plain module (B, T, d_in) ->
  (B, T, d). The LSTM's ``forward`` takes the fused h directly (same values, skips c).

The single-layer fused modules are ``batch_first``; their weights keep PyTorch's names
(``self.rnn.weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``) and
gate order (GRU: r, z, n; LSTM: i, f, g, o).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from gradengines.models.errors import ModelConfigError, positive_int
from gradengines.models.layers.scan import forward_scan

__all__ = ["TanhRNN", "GRU", "LSTM", "DiagonalLinearRNN", "CELLS", "build_cell", "previous_states"]


def _check_sizes(input_size, hidden_size) -> None:
    positive_int("input_size", input_size)
    positive_int("hidden_size", hidden_size)


class _FusedRecurrent(nn.Module):
    """Shared plumbing of the layers backed by one PyTorch fused module ``self.rnn``."""

    has_diagonal_path = True

    def _weights(self):
        rnn = self.rnn
        return (rnn.weight_ih_l0, rnn.weight_hh_l0,
                getattr(rnn, "bias_ih_l0", None), getattr(rnn, "bias_hh_l0", None))

    def _h0(self, h0, x):
        return None if h0 is None else h0.to(x.dtype).unsqueeze(0).contiguous()  # (1, B, d)

    def forward_sequence(self, x, h0=None):
        return self.rnn(x, self._h0(h0, x))[0]  # (B, T, d)

    def output(self, states):
        return states

    def forward(self, x, h0=None):
        return self.output(self.forward_sequence(x, h0))


class TanhRNN(_FusedRecurrent):
    """Elman RNN h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh) on an ``nn.RNN``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        super().__init__()
        _check_sizes(input_size, hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.state_size = hidden_size
        self.rnn = nn.RNN(input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=bias, batch_first=True)

    def cell(self, x_t, h_prev):
        w_ih, w_hh, b_ih, b_hh = self._weights()
        return torch.tanh(F.linear(x_t, w_ih, b_ih) + F.linear(h_prev, w_hh, b_hh))

    has_diagonal_path = False

    def gate(self, x_t, h_prev):
        """Zeros: the tanh RNN has no diagonal direct path (module docstring)."""
        return torch.zeros_like(h_prev)

    def cell_with_gate(self, x_t, h_prev):
        return self.cell(x_t, h_prev), torch.zeros_like(h_prev)


class GRU(_FusedRecurrent):
    """PyTorch's GRU: h_t = (1 - z_t) n_t + z_t h_{t-1} on an ``nn.GRU``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        super().__init__()
        _check_sizes(input_size, hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.state_size = hidden_size
        self.rnn = nn.GRU(input_size, hidden_size, num_layers=1, bias=bias, batch_first=True)

    def _gates(self, x_t, h_prev):
        w_ih, w_hh, b_ih, b_hh = self._weights()
        i_r, i_z, i_n = F.linear(x_t, w_ih, b_ih).chunk(3, dim=-1)
        h_r, h_z, h_n = F.linear(h_prev, w_hh, b_hh).chunk(3, dim=-1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return z, n

    def cell(self, x_t, h_prev):
        z, n = self._gates(x_t, h_prev)
        return (1 - z) * n + z * h_prev

    def gate(self, x_t, h_prev):
        """The update gate z_t, the coefficient of h_{t-1} (module docstring)."""
        return self._gates(x_t, h_prev)[0]

    def cell_with_gate(self, x_t, h_prev):
        z, n = self._gates(x_t, h_prev)
        return (1 - z) * n + z * h_prev, z


class LSTM(_FusedRecurrent):
    """PyTorch's LSTM on an ``nn.LSTM``; state [h; c] (size 2d), h first."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        super().__init__()
        _check_sizes(input_size, hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.state_size = 2 * hidden_size
        self.rnn = nn.LSTM(input_size, hidden_size, num_layers=1, bias=bias, batch_first=True)

    def _gates(self, x_t, h):
        w_ih, w_hh, b_ih, b_hh = self._weights()
        i, f, g, o = (F.linear(x_t, w_ih, b_ih) + F.linear(h, w_hh, b_hh)).chunk(4, dim=-1)
        return torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)

    def _split(self, state):
        return state[..., : self.hidden_size], state[..., self.hidden_size :]

    def cell(self, x_t, h_prev):
        return self.cell_with_gate(x_t, h_prev)[0]

    def gate(self, x_t, h_prev):
        """[0; f_t]: zeros on the h half, the forget gate on the c half (module docstring)."""
        h, _ = self._split(h_prev)
        f = self._gates(x_t, h)[1]
        return torch.cat([torch.zeros_like(f), f], dim=-1)

    def cell_with_gate(self, x_t, h_prev):
        c_new, o, f = self.cell_carry(x_t, h_prev)
        return self.readout(c_new, o), torch.cat([torch.zeros_like(f), f], dim=-1)

    def cell_carry(self, x_t, h_prev):
        """(c_t, o_t, f_t): the new cell state before the h readout, the output and forget gates.

        d c_t / d c_{t-1} = diag(f_t) exactly: the carry path of the state."""
        h, c = self._split(h_prev)
        i, f, g, o = self._gates(x_t, h)
        return f * c + i * g, o, f

    def readout(self, c, o):
        """The state [h; c] with h = o * tanh(c)."""
        return torch.cat([o * torch.tanh(c), c], dim=-1)

    def output(self, states):
        return states[..., : self.hidden_size]

    def _fused(self, x, h0):
        hc = None
        if h0 is not None:
            h, c = self._split(h0.to(x.dtype))
            hc = (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous())
        return self.rnn(x, hc)[0]  # (B, T, d)

    def forward_sequence(self, x, h0=None):
        H = self._fused(x, h0)  # h_1 .. h_T
        B, T, _ = x.shape
        d = self.hidden_size
        h_first = H.new_zeros(B, 1, d) if h0 is None else h0[:, None, :d].to(H.dtype)
        H_prev = torch.cat([h_first, H[:, :-1]], dim=1)  # h_0 .. h_{T-1}
        i, f, g, _ = self._gates(x, H_prev)  # all steps at once
        c0 = None if h0 is None else h0[:, d:].to(H.dtype)
        C = forward_scan(i * g, f, c0)  # c_t = f_t c_{t-1} + i_t g_t
        return torch.cat([H, C], dim=-1)

    def forward(self, x, h0=None):
        return self._fused(x, h0)


class DiagonalLinearRNN(nn.Module):
    """h_t = lambda * h_{t-1} + B x_t (+ b), lambda = sigmoid(nu) in (0, 1) per channel.

    ``nu`` is initialised so that lambda is uniform in [0.5, 0.99]; ``B`` is an
    ``nn.Linear(input_size, hidden_size, bias=bias)``. The whole sequence is one scan
    (``models.layers.scan.forward_scan``); no fused module.
    """

    has_diagonal_path = True

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        super().__init__()
        _check_sizes(input_size, hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.state_size = hidden_size
        self.B = nn.Linear(input_size, hidden_size, bias=bias)
        lam = torch.empty(hidden_size).uniform_(0.5, 0.99)
        self.nu = nn.Parameter(torch.log(lam) - torch.log1p(-lam))  # logit

    @property
    def decay(self) -> torch.Tensor:
        """lambda = sigmoid(nu), shape (d,)."""
        return torch.sigmoid(self.nu)

    def forward_sequence(self, x, h0=None):
        u = self.B(x)  # (B, T, d)
        lam = self.decay.to(u.dtype).reshape(1, 1, -1)
        return forward_scan(u, lam, None if h0 is None else h0.to(u.dtype))

    def cell(self, x_t, h_prev):
        return self.decay * h_prev + self.B(x_t)

    def gate(self, x_t, h_prev):
        """lambda broadcast to (N, d): the exact (diagonal) Jacobian d h_t / d h_{t-1}."""
        return self.decay.to(h_prev.dtype).expand_as(h_prev)

    def cell_with_gate(self, x_t, h_prev):
        return self.cell(x_t, h_prev), self.gate(x_t, h_prev)

    def output(self, states):
        return states

    def forward(self, x, h0=None):
        return self.forward_sequence(x, h0)


#: ``cell`` option names of the language models -> layer classes.
CELLS = {"rnn": TanhRNN, "gru": GRU, "lstm": LSTM, "diagonal": DiagonalLinearRNN}


def build_cell(cell: str, input_size: int, hidden_size: int, bias: bool = True) -> nn.Module:
    """The recurrent layer named ``cell`` (one of ``CELLS``); unknown names raise ``ModelConfigError``."""
    if cell not in CELLS:
        raise ModelConfigError(f"unknown cell {cell!r}; choose one of {', '.join(CELLS)}")
    return CELLS[cell](input_size, hidden_size, bias=bias)


def previous_states(states: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
    """s_0 .. s_{T-1} from the states s_1 .. s_T (B, T, n), detached: the inputs of a
    time-parallel recompute of the cell on all B*T pairs (x_t, s_{t-1}) at once."""
    first = states.new_zeros(states.shape[0], 1, states.shape[2]) if h0 is None else h0.to(states.dtype)[:, None]
    return torch.cat([first, states[:, :-1]], dim=1).detach()
