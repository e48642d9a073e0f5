"""DFA's projection reaches every covered layer's input, whatever its layout (trainers/engines/feedback_layers.py):
positions flattened into the batch (OPT's MLP), windows of a per-sample output's tokens (Swin), a layer that
computes in float32 inside a float64 model; each against the rule written out by hand, float64, a batch size
unlike every other dimension. Then transformers' OPT, Swin and DeBERTa-v2, which stopped at step 0 with a
shape error."""

import pytest
import torch
from helpers import autograd_grads, engine_grads, relative
from torch import nn

from gradengines import models, trainers
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy

B, T, D, H, C = 3, 5, 4, 6, 7  # batch, positions, width, hidden width, outputs: all different


class Flattened(nn.Module):
    """A token model whose hidden layer runs on (B T, d), as OPT's MLP: fc, tanh, then the output layer."""

    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(D, H), nn.Linear(H, C)

    def forward(self, x):
        h = torch.tanh(self.fc(x.reshape(-1, D)))
        return self.out(h).reshape(x.shape[0], x.shape[1], C)


def test_dfa_with_the_output_weights_as_feedback_is_backprop_on_flattened_positions():
    """One hidden layer: DFA with D = W_out at the output layer is backprop (the stack path's identity), here
    with the output layer's input (B T, H) against the error (B, T, C)."""
    torch.manual_seed(0)
    model = Flattened().double()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(B, T, D, generator=gen, dtype=torch.float64), torch.randint(0, C, (B, T), generator=gen)
    exact = autograd_grads(model, sequence_cross_entropy(model(x), y))
    engine = trainers.build_engine("dfa", path="layers")
    engine.layers.feedback = {"fc": torch.zeros(C, D, dtype=torch.float64), "out": model.out.weight.detach()}
    assert relative(engine_grads(model, engine, x, y, sequence_cross_entropy), exact) < 1e-12


class Windows(nn.Module):
    """A classifier whose blocks see windows of tokens (B x windows, t, d), as Swin's attention, then a mean."""

    def __init__(self, windows=2):
        super().__init__()
        self.windows = windows
        self.fc1, self.fc2, self.out = nn.Linear(D, H), nn.Linear(H, D), nn.Linear(D, C)

    def forward(self, x):  # x: (B, windows * t, D)
        w = x.reshape(x.shape[0] * self.windows, -1, D)
        h = self.fc2(torch.tanh(self.fc1(w)))
        return self.out(h.reshape(x.shape[0], -1, D).mean(1))


def test_dfa_projects_a_per_sample_error_to_every_window_position_as_written_by_hand():
    torch.manual_seed(0)
    model = Windows().double()
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(B, 2 * T, D, generator=gen, dtype=torch.float64), torch.randint(0, C, (B,), generator=gen)
    engine = trainers.build_engine("dfa", path="layers")
    got = engine_grads(model, engine, x, y)
    D2 = engine.layers.matrix("fc2")  # (C, H): drawn at the first step
    assert D2.shape == (C, H)
    w = x.reshape(2 * B, T, D)
    a1 = model.fc1(w)
    with torch.no_grad():
        logits = model(x)
        e = (torch.softmax(logits, -1) - nn.functional.one_hot(y, C)) / B  # dL/dy of the mean cross-entropy
        delta2 = (e @ D2).repeat_interleave(2, 0).unsqueeze(1).expand(2 * B, T, H)  # every window of a sample
        delta1 = delta2 * (1 - torch.tanh(a1) ** 2)
        by_hand = delta1.reshape(-1, H).t() @ w.reshape(-1, D)
    assert relative(got["fc1.weight"], by_hand) < 1e-12


class Float32Inside(nn.Module):
    """A float64 model with one layer that computes in float32 (as Mamba's and Qwen2's RMSNorm do)."""

    def __init__(self):
        super().__init__()
        self.fc, self.inner, self.out = nn.Linear(D, H), nn.Linear(H, H), nn.Linear(H, C)

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        h = self.inner(h.float()).double()
        return self.out(torch.tanh(h))


def test_dfa_projects_in_the_dtype_a_layer_computes_in():
    torch.manual_seed(0)
    model = Float32Inside().double()
    model.inner.float()
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(B, D, generator=gen, dtype=torch.float64), torch.randint(0, C, (B,), generator=gen)
    got = engine_grads(model, trainers.build_engine("dfa", path="layers"), x, y)
    assert got["inner.weight"].dtype == torch.float32 and got["fc.weight"].dtype == torch.float64
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in got.values())


class SharedTable(nn.Module):
    """A layer on a table shared by the whole batch: (1, T, D) as DeBERTa's position projections, or without a
    batch dimension, (T, D), as timm's relative-position MLP on its coordinate table."""

    def __init__(self, shape):
        super().__init__()
        self.table, self.proj = nn.Parameter(torch.randn(shape)), nn.Linear(D, D)
        self.out = nn.Linear(D, C)

    def forward(self, x):  # x: (B, T, D)
        return self.out(torch.tanh(x + self.proj(self.table)).mean(1))


@pytest.mark.parametrize("shape", [(1, T, D), (T, D)], ids=["led by 1", "no batch dimension"])
def test_dfa_gives_a_layer_on_a_batch_shared_table_the_sum_of_the_samples_projections(shape):
    torch.manual_seed(0)
    model = SharedTable(shape).double()
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(B, T, D, generator=gen, dtype=torch.float64), torch.randint(0, C, (B,), generator=gen)
    engine = trainers.build_engine("dfa", path="layers")
    got = engine_grads(model, engine, x, y)
    P = engine.layers.matrix("proj")  # (C, T D): the table's input of the projection, whole
    assert P.shape == (C, T * D)
    with torch.no_grad():
        e = (torch.softmax(model(x), -1) - nn.functional.one_hot(y, C)) / B
    assert relative(got["table"], (e @ P).sum(0).reshape(shape)) < 1e-12


class UserCNN(nn.Module):
    """A user's CNN as written: two padded convolutions with tanh, a flatten, the output layer."""

    def __init__(self, channels=(2, 4, 5), side=6):
        super().__init__()
        c0, c1, c2 = channels
        self.conv1, self.conv2 = nn.Conv2d(c0, c1, 3, padding=1), nn.Conv2d(c1, c2, 3, padding=1)
        self.out = nn.Linear(c2 * side * side, C)

    def forward(self, x):
        return self.out(torch.tanh(self.conv2(torch.tanh(self.conv1(x)))).flatten(1))


def test_dfa_on_a_users_cnn_is_the_rule_written_by_hand():
    """Each layer's input gets e D reshaped to it (per sample: D is d_y x C H W), through the activation to the
    layer below, whose weight gradient is then exact: both convolutions' kernels and biases by hand (issue 41's
    survivors: the layer path's per-sample branch and the batch read from the error). Batch 3, channels 2, 4, 5,
    a 6 x 6 image, 7 classes."""
    torch.manual_seed(0)
    model = UserCNN().double()
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(B, 2, 6, 6, generator=gen, dtype=torch.float64), torch.randint(0, C, (B,), generator=gen)
    engine = trainers.build_engine("dfa", path="layers")
    got = engine_grads(model, engine, x, y)
    D_out, D_conv2 = engine.layers.matrix("out"), engine.layers.matrix("conv2")
    assert D_out.shape == (C, 5 * 36) and D_conv2.shape == (C, 4 * 36)
    with torch.no_grad():
        a1 = model.conv1(x)
        h1 = torch.tanh(a1)
        a2 = model.conv2(h1)
        e = (torch.softmax(model(x), -1) - nn.functional.one_hot(y, C)) / B
        delta2 = (e @ D_out).reshape(a2.shape) * (1 - torch.tanh(a2) ** 2)
        delta1 = (e @ D_conv2).reshape(a1.shape) * (1 - h1 ** 2)
        conv_weight = torch.nn.grad.conv2d_weight
        by_hand = {"conv2.weight": conv_weight(h1, model.conv2.weight.shape, delta2, padding=1),
                   "conv2.bias": delta2.sum((0, 2, 3)),
                   "conv1.weight": conv_weight(x, model.conv1.weight.shape, delta1, padding=1),
                   "conv1.bias": delta1.sum((0, 2, 3)),
                   "out.weight": e.t() @ torch.tanh(a2).flatten(1)}
    for name, expected in by_hand.items():
        assert relative(got[name], expected) < 1e-12, name
    assert relative(got["conv1.weight"], autograd_grads(model, cross_entropy_loss(model(x), y))["conv1.weight"]) > 0.1


class SequenceToOne(nn.Module):
    """A sequence classifier: a per-position MLP on (B, T, D), the mean over positions, the output layer."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(D, H), nn.Linear(H, D), nn.Linear(D, C)

    def forward(self, x):
        return self.out(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))).mean(1))


def test_dfa_on_a_sequence_to_one_model_projects_each_samples_error_to_all_its_positions_by_hand():
    torch.manual_seed(0)
    model = SequenceToOne().double()
    gen = torch.Generator().manual_seed(6)
    x, y = torch.randn(B, T, D, generator=gen, dtype=torch.float64), torch.randint(0, C, (B,), generator=gen)
    engine = trainers.build_engine("dfa", path="layers")
    got = engine_grads(model, engine, x, y)
    D_fc2 = engine.layers.matrix("fc2")
    assert D_fc2.shape == (C, H)  # per position's width: every position of a sample gets the sample's e D
    with torch.no_grad():
        a1 = model.fc1(x)
        e = (torch.softmax(model(x), -1) - nn.functional.one_hot(y, C)) / B
        delta1 = (e @ D_fc2).unsqueeze(1).expand(B, T, H) * (1 - torch.tanh(a1) ** 2)
    assert relative(got["fc1.weight"], delta1.reshape(-1, H).t() @ x.reshape(-1, D)) < 1e-12
    assert relative(got["fc1.bias"], delta1.sum((0, 1))) < 1e-12


transformers = pytest.importorskip("transformers")


def _opt():
    config = transformers.OPTConfig(vocab_size=23, hidden_size=8, num_hidden_layers=2, ffn_dim=16,
                                    num_attention_heads=2, max_position_embeddings=16, word_embed_proj_dim=8,
                                    dropout=0.0)
    return transformers.OPTForCausalLM(config), "tokens"


def _swin():
    config = transformers.SwinConfig(image_size=16, patch_size=2, num_channels=3, embed_dim=8, depths=[1, 1],
                                     num_heads=[2, 2], window_size=2, num_labels=4)
    return transformers.SwinForImageClassification(config), "images"


def _deberta_v2():
    config = transformers.DebertaV2Config(vocab_size=23, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=16, max_position_embeddings=16, num_labels=4,
                                          relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=4,
                                          max_relative_positions=8)
    return transformers.DebertaV2ForSequenceClassification(config), "classes"


@pytest.mark.parametrize("build", [_opt, _swin, _deberta_v2], ids=["opt", "swin", "deberta_v2"])
def test_dfa_trains_opt_swin_and_deberta_v2_where_it_stopped_at_step_0(build):
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    model, kind = build()
    model = model.double()
    gen = torch.Generator().manual_seed(1)
    if kind == "images":
        x, y, loss_fn = torch.randn(B, 3, 16, 16, generator=gen, dtype=torch.float64), torch.randint(0, 4, (B,)), \
            cross_entropy_loss
    elif kind == "tokens":
        x, y, loss_fn = torch.randint(0, 23, (B, T), generator=gen), torch.randint(0, 23, (B, T)), \
            sequence_cross_entropy
    else:
        x, y, loss_fn = torch.randint(0, 23, (B, T), generator=gen), torch.randint(0, 4, (B,)), cross_entropy_loss
    exact = autograd_grads(model, loss_fn(models.call_model(model, x, y).outputs, y))
    got = engine_grads(model, trainers.build_engine("dfa"), x, y, loss_fn)
    assert got.keys() == exact.keys() and all(torch.isfinite(g).all() for g in got.values())
    assert relative(got, exact) > 1e-3  # random feedback: not backprop
