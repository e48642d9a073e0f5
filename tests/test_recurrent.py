"""Tests of the recurrent layers (``models.layers.recurrent``) and the recurrent language models."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from helpers import write_ptb_text

from gradengines import models, tasks, trainers
from gradengines.models import ModelConfigError
from gradengines.models.layers.recurrent import CELLS, GRU, LSTM, DiagonalLinearRNN, TanhRNN
from gradengines.models.layers.scan import forward_scan
from gradengines.trainers.core.protocols import RecurrentLayer

B, T, D_IN, D = 3, 7, 5, 6
LAYERS = [TanhRNN, GRU, LSTM, DiagonalLinearRNN]


def make(cls, seed=0, bias=True):
    torch.manual_seed(seed)
    return cls(D_IN, D, bias=bias).double()


def data(state_size, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D_IN, generator=gen, dtype=torch.float64)
    h0 = 0.5 * torch.randn(B, state_size, generator=gen, dtype=torch.float64)
    return x, h0


def previous_states(states, h0):
    first = torch.zeros_like(states[:, :1]) if h0 is None else h0[:, None]
    return torch.cat([first, states[:, :-1]], dim=1)


def jacobian(layer, x_t, h_prev):
    """d cell(x_t, h) / d h at one sample: (state, state)."""
    return torch.autograd.functional.jacobian(lambda h: layer.cell(x_t[None], h[None])[0], h_prev)


# ---------------------------------------------------------------- layers


@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("with_h0", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_cell_on_all_pairs_at_once_equals_forward_sequence(cls, with_h0, bias):
    layer = make(cls, bias=bias)
    assert isinstance(layer, RecurrentLayer)
    x, h0 = data(layer.state_size)
    h0 = h0 if with_h0 else None
    states = layer.forward_sequence(x, h0)
    assert states.shape == (B, T, layer.state_size) and states.dtype == torch.float64
    prev = previous_states(states, h0)
    stepped = layer.cell(x.reshape(B * T, D_IN), prev.reshape(B * T, -1)).reshape(B, T, -1)
    torch.testing.assert_close(stepped, states, atol=1e-10, rtol=0)
    # and a plain loop over time with the cell gives the same states
    h = torch.zeros(B, layer.state_size, dtype=torch.float64) if h0 is None else h0
    for t in range(T):
        h = layer.cell(x[:, t], h)
        torch.testing.assert_close(h, states[:, t], atol=1e-10, rtol=0)
    torch.testing.assert_close(layer(x, h0), layer.output(states), atol=1e-12, rtol=0)
    assert layer.gate(x[:, 0], prev[:, 0]).shape == (B, layer.state_size)


def test_state_sizes_and_lstm_layout():
    assert [make(cls).state_size for cls in LAYERS] == [D, D, 2 * D, D]
    layer = make(LSTM)
    x, h0 = data(2 * D)
    states = layer.forward_sequence(x, h0)
    hc = (h0[:, :D][None].contiguous(), h0[:, D:][None].contiguous())
    out, (h_T, c_T) = layer.rnn(x, hc)
    torch.testing.assert_close(states[..., :D], out, atol=1e-12, rtol=0)  # h first
    torch.testing.assert_close(states[:, -1, D:], c_T[0], atol=1e-10, rtol=0)  # then c
    torch.testing.assert_close(layer.output(states), out, atol=1e-12, rtol=0)
    torch.testing.assert_close(layer(x, h0), out, atol=1e-12, rtol=0)


@pytest.mark.parametrize("T", [1, 2, 7, 8, 33])
def test_forward_scan_matches_a_loop(T):
    gen = torch.Generator().manual_seed(3)
    u = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    a = torch.rand(B, T, D, generator=gen, dtype=torch.float64)
    s0 = torch.randn(B, D, generator=gen, dtype=torch.float64)
    for coef in (a, a[:1, :1]):
        s, ref = s0, []
        for t in range(T):
            s = coef.expand_as(u)[:, t] * s + u[:, t]
            ref.append(s)
        torch.testing.assert_close(forward_scan(u, coef, s0), torch.stack(ref, 1), atol=1e-12, rtol=0)


def test_diagonal_rnn_forward_sequence_equals_python_loop_and_gradients_flow():
    layer = make(DiagonalLinearRNN)
    lam = layer.decay
    assert ((lam > 0) & (lam < 1)).all()
    x, h0 = data(D)
    h, ref = h0, []
    for t in range(T):
        h = lam * h + x[:, t] @ layer.B.weight.T + layer.B.bias
        ref.append(h)
    states = layer.forward_sequence(x, h0)
    torch.testing.assert_close(states, torch.stack(ref, 1), atol=1e-12, rtol=0)
    states.square().sum().backward()
    assert layer.nu.grad is not None and layer.nu.grad.abs().sum() > 0


def test_diagonal_rnn_gate_is_the_full_jacobian():
    layer = make(DiagonalLinearRNN)
    x, h0 = data(D)
    for i in range(B):
        J = jacobian(layer, x[i, 0], h0[i])
        torch.testing.assert_close(J, torch.diag(torch.diagonal(J)), atol=0, rtol=0)  # diagonal
        torch.testing.assert_close(torch.diagonal(J), layer.gate(x[i:i + 1, 0], h0[i:i + 1])[0], atol=1e-12, rtol=0)


def test_gru_gate_is_the_update_gate_of_pytorch_convention():
    layer = make(GRU)
    with torch.no_grad():
        layer.rnn.weight_hh_l0.zero_()  # gates and candidate no longer read h: J = diag(z) exactly
    x, h0 = data(D)
    gate = layer.gate(x[:, 0], h0)
    for i in range(B):
        torch.testing.assert_close(jacobian(layer, x[i, 0], h0[i]), torch.diag(gate[i]), atol=1e-12, rtol=0)
    # the fused module agrees that the coefficient of h_{t-1} is z: h_1 = (1 - z) n + z h_0
    h1 = layer.rnn(x[:, :1], h0[None])[0][:, 0]
    h1_from_zero = layer.rnn(x[:, :1], torch.zeros_like(h0)[None])[0][:, 0]  # = (1 - z) n (same z, n)
    torch.testing.assert_close(h1 - h1_from_zero, gate * h0, atol=1e-12, rtol=0)
    assert ((gate > 0) & (gate < 1)).all()


def test_lstm_gate_is_forget_gate_on_c_and_zero_on_h():
    layer = make(LSTM)
    x, h0 = data(2 * D)
    gate = layer.gate(x[:, 0], h0)
    assert torch.equal(gate[:, :D], torch.zeros(B, D, dtype=torch.float64))
    for i in range(B):
        J = jacobian(layer, x[i, 0], h0[i])
        torch.testing.assert_close(J[D:, D:], torch.diag(gate[i, D:]), atol=1e-12, rtol=0)  # dc/dc = diag(f)


def test_tanh_rnn_gate_is_zero():
    layer = make(TanhRNN)
    x, h0 = data(D)
    assert torch.equal(layer.gate(x[:, 0], h0), torch.zeros(B, D, dtype=torch.float64))
    with torch.no_grad():
        layer.rnn.weight_hh_l0.zero_()
    assert torch.equal(jacobian(layer, x[0, 0], h0[0]), torch.zeros(D, D, dtype=torch.float64))


@pytest.mark.parametrize("cls, fused", [(TanhRNN, nn.RNN), (GRU, nn.GRU), (LSTM, nn.LSTM)])
def test_parameters_are_shared_with_the_fused_module(cls, fused):
    layer = make(cls)
    params = list(layer.parameters())
    assert len({id(p) for p in params}) == len(params)
    assert sum(p.numel() for p in params) == sum(p.numel() for p in fused(D_IN, D).parameters())
    assert {id(p) for p in params} == {id(p) for p in layer.rnn.parameters()}
    # the cell reads the fused module's Parameters: its gradient lands there
    x, h0 = data(layer.state_size)
    layer.cell(x[:, 0], h0).sum().backward()
    assert all(p.grad is not None for p in layer.rnn.parameters())


def test_layer_bad_sizes_raise():
    for cls in LAYERS:
        with pytest.raises(ModelConfigError, match="hidden_size"):
            cls(3, 0)


# ---------------------------------------------------------------- language models

LMS = ["rnn_lm", "rnn_block_lm"]


@pytest.mark.parametrize("name", LMS)
@pytest.mark.parametrize("cell", list(CELLS))
def test_lm_shapes_tokens_and_features(name, cell):
    torch.manual_seed(0)
    lm = models.build(name, in_features=12, out_features=11, cell=cell, hidden=8, depth=2)
    assert len(lm.recurrent_layers) == 2 and all(isinstance(r, RecurrentLayer) for r in lm.recurrent_layers)
    assert lm(torch.randint(0, 11, (4, 12))).shape == (4, 12, 11)
    clf = models.build(name, in_features=64, out_features=10, input_dim=1, cell=cell, hidden=8)
    assert clf(torch.randn(4, 64, 1)).shape == (4, 10)
    adding = models.build(name, in_features=40, out_features=5, input_dim=2, cell=cell, hidden=8)
    assert adding(torch.randn(4, 20, 2)).shape == (4, 5)
    copy = models.build(name, in_features=9, out_features=4, vocab_size=5, cell=cell, hidden=8)
    assert copy(torch.randint(0, 5, (4, 9))).shape == (4, 9, 4)


@pytest.mark.parametrize("name", LMS)
@pytest.mark.parametrize("cell", ["gru", "lstm", "diagonal"])
def test_lm_trains_with_plain_autograd(name, cell):
    torch.manual_seed(0)
    lm = models.build(name, in_features=10, out_features=7, cell=cell, hidden=16, depth=2)
    x = torch.randint(0, 7, (8, 10))
    y = torch.roll(x, -1, dims=1)
    opt = torch.optim.Adam(lm.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = nn.functional.cross_entropy(lm(x).reshape(-1, 7), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_lm_classifier_trains():
    torch.manual_seed(0)
    lm = models.build("rnn_lm", in_features=16, out_features=3, input_dim=1, hidden=16)
    x, y = torch.randn(12, 16, 1), torch.randint(0, 3, (12,))
    opt = torch.optim.Adam(lm.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        loss = nn.functional.cross_entropy(lm(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.8 * first


def test_tie_weights_shares_head_and_embedding():
    lm = models.build("rnn_lm", in_features=5, out_features=9, hidden=8, tie_weights=True)
    assert lm.head.weight is lm.stem.weight
    with pytest.raises(ModelConfigError, match="tie_weights"):
        models.build("rnn_lm", in_features=5, out_features=9, vocab_size=10, hidden=8, tie_weights=True)


@pytest.mark.parametrize("name", LMS)
def test_trainer_runs_backprop_on_tiny_ptb_char(name, tmp_path):
    write_ptb_text(tmp_path, " the cat sat on the mat \n the dog sat \n a <unk> ran \n")
    task = tasks.build("ptb-char", data_dir=tmp_path, seq_len=6)
    torch.manual_seed(0)
    model = models.build(name, in_features=task.in_features, out_features=task.num_outputs, cell="gru", hidden=16)
    trainer = trainers.Trainer(model, trainers.build_engine("backprop"), task, progress=False, batch_size=4)
    report = trainer.fit(steps=3)
    assert report["steps"] == 3 and math.isfinite(report["test"]["perplexity"])


@pytest.mark.parametrize("options, match", [
    ({"cell": "transformer"}, "unknown cell"),
    ({"hidden": 0}, "hidden"),
    ({"depth": 0}, "depth"),
    ({"dropout": 1.5}, "dropout"),
    ({"input_dim": 1, "vocab_size": 4}, "not both"),
    ({"widht": 3}, "no option"),
])
@pytest.mark.parametrize("name", LMS)
def test_bad_options_raise_model_config_error(name, options, match):
    with pytest.raises(ModelConfigError, match=match):
        models.build(name, in_features=5, out_features=4, **options)


def test_wrong_input_kind_fails_at_forward():
    lm = models.build("rnn_lm", in_features=5, out_features=4, hidden=8)
    with pytest.raises(RuntimeError, match="token ids"):
        lm(torch.randn(2, 5, 1))


@pytest.mark.parametrize("cls", LAYERS)
def test_cell_with_gate_is_cell_and_gate_from_one_evaluation(cls):
    layer = make(cls)
    x, h0 = data(layer.state_size)
    x_t, h_prev = x[:, 0], h0
    s, gate = layer.cell_with_gate(x_t, h_prev)
    torch.testing.assert_close(s, layer.cell(x_t, h_prev), rtol=0, atol=0)
    torch.testing.assert_close(gate, layer.gate(x_t, h_prev), rtol=0, atol=0)
    assert layer.has_diagonal_path == (cls is not TanhRNN)
