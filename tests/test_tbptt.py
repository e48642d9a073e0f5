"""Truncated BPTT (``tbptt``) in float64: k = 1 is FT-BPTT, k >= T is BPTT, and in between it is the gradient of
the loss through windows of k steps, each starting from the full forward's state, detached (written out below
with a Python loop over the windows, the definition); tested on the zoo's cells and on a user's nn.GRU model."""

import pytest
import torch
from helpers import engine_grads, relative
from torch import nn

from gradengines import blocks, models, trainers
from gradengines.tasks.base import sequence_cross_entropy

T = 11


def lm(cell: str, depth: int = 2):
    torch.manual_seed(0)
    return models.build("rnn_lm", in_features=12, out_features=4, input_dim=1, cell=cell, hidden=6, depth=depth,
                        per_step=True).double()


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(5, T, 1, generator=gen, dtype=torch.float64), torch.randint(0, 4, (5, T), generator=gen)


def windows_by_hand(model, x, y, k):
    """The definition: every layer's states recomputed window by window with the cell, a window starting from the
    full forward's state before it, detached; the loss through those states; autograd of it."""

    def forward(layer):
        def run(inputs, h0=None):
            with torch.no_grad():
                full = layer.forward_sequence(inputs, h0)
            prev = blocks.previous_states(full, h0)
            states = []
            for t in range(inputs.shape[1]):
                h = prev[:, t] if t % k == 0 else states[-1]  # a window's first step reads the detached state
                states.append(layer.cell(inputs[:, t], h))
            return layer.output(torch.stack(states, 1))

        return run

    params = [p for _, p in blocks.trainable_parameters(model)]
    with blocks.recurrent_forwards(model, lambda index, layer: forward(layer)):
        outputs, loss = blocks.forward_loss(model, x, y, sequence_cross_entropy)
    return dict(zip([n for n, _ in blocks.trainable_parameters(model)], torch.autograd.grad(loss, params),
                    strict=True))


@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn", "diagonal"])
def test_k1_is_ftbptt_k_at_least_t_is_bptt_and_between_it_is_the_windows_gradient(cell):
    model, (x, y) = lm(cell), batch()
    grads = {k: engine_grads(model, trainers.build_engine("tbptt", k=k), x, y, sequence_cross_entropy)
             for k in (1, 3, 4, T, T + 5)}
    ftbptt = engine_grads(model, trainers.build_engine("ftbptt"), x, y, sequence_cross_entropy)
    bptt = engine_grads(model, trainers.build_engine("backprop"), x, y, sequence_cross_entropy)
    assert relative(grads[1], ftbptt) < 1e-12
    assert relative(grads[T], bptt) < 1e-12 and relative(grads[T + 5], bptt) < 1e-12
    for k in (3, 4):  # a window that divides nothing and one that leaves a short last window
        assert relative(grads[k], windows_by_hand(model, x, y, k)) < 1e-12
        assert relative(grads[k], bptt) > 1e-3 and relative(grads[k], ftbptt) > 1e-3
    assert relative(grads[4], bptt) < relative(grads[1], bptt)  # longer windows, nearer to BPTT here


class UsersLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 5)
        self.rnn = nn.GRU(5, 6, num_layers=2, batch_first=True)
        self.head = nn.Linear(6, 7)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


def test_a_users_gru_model_wrapped_trains_as_bptt_at_full_window_and_differs_below():
    torch.manual_seed(0)
    model = models.wrap_recurrent(UsersLM().double())
    x = torch.randint(0, 7, (4, 9), generator=torch.Generator().manual_seed(2))
    y = torch.roll(x, -1, 1)
    bptt = engine_grads(model, trainers.build_engine("backprop"), x, y, sequence_cross_entropy)
    def tbptt(k):
        return engine_grads(model, trainers.build_engine("tbptt", k=k), x, y, sequence_cross_entropy)

    assert relative(tbptt(9), bptt) < 1e-12 and relative(tbptt(2), bptt) > 1e-3


def test_the_first_batch_check_refuses_a_structure_that_is_not_the_models():
    """A recurrent layer whose own forward is not what its view's sequence forward computes (here: it scales its
    input first) is refused on the first batch, naming the check and its opt-out; with the check off it trains."""
    model, (x, y) = lm("gru", depth=1), batch()
    layer = model.recurrent_layers[0]
    layer.forward = lambda inputs, h0=None: layer.output(layer.forward_sequence(1.5 * inputs, h0))
    with pytest.raises(trainers.ModelConfigError, match=r"self-check: trainer 'tbptt' at k = T \(BPTT\) does not "
                                                        r"equal autograd.*--tbptt-self-check false"):
        trainers.build_engine("tbptt", k=3).compute_grads(model, x, y, sequence_cross_entropy)
    trainers.build_engine("tbptt", k=3, self_check=False).compute_grads(model, x, y, sequence_cross_entropy)


@pytest.mark.parametrize("options, says", [({"k": 0}, "--tbptt-k must be >= 1, got 0"),
                                           ({"k": 2.5}, "must be int")])
def test_bad_windows_are_one_line(options, says):
    with pytest.raises(trainers.ConfigError, match=says):
        trainers.build_engine("tbptt", **options)


def test_a_model_without_recurrent_layers_is_refused_in_one_line():
    with pytest.raises(trainers.IncompatibleModelError, match="trainer 'tbptt' needs a model with recurrent layers"):
        trainers.build_engine("tbptt").check(models.build("mlp", in_features=4, out_features=2, depth=2, width=4))
