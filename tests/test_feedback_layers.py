"""FA and DFA on any model (trainers/engines/feedback_layers.py): every nn.Linear / nn.Conv2d's backward
uses the fixed feedback, autograd does the rest. Float64: on a layer stack the layer path is the stack
path with the same feedback; with B = W, FA is backprop on a ResNet and a Transformer; with D = W_2,
one-hidden-layer DFA is backprop; with drawn feedback every covered layer's gradient differs from
backprop's, and the count of covered layers is checked so that an uncovered one cannot hide."""

import pytest
import torch
from helpers import engine_grads as grads
from helpers import relative
from torch import nn
from torch.nn import functional as F

from gradengines import models, trainers
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy
from gradengines.trainers.engines.feedback_layers import covered_layers

V, T, B = 11, 5, 4


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln_1, self.attn, self.proj = nn.LayerNorm(n), nn.Linear(n, 3 * n), nn.Linear(n, n)
        self.ln_2, self.fc, self.out = nn.LayerNorm(n), nn.Linear(n, 2 * n), nn.Linear(2 * n, n)

    def forward(self, x):
        q, k, v = self.attn(self.ln_1(x)).chunk(3, dim=-1)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    def __init__(self, n=8, layers=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, n), nn.Embedding(T, n)
        self.h = nn.ModuleList(Block(n) for _ in range(layers))
        self.ln_f, self.lm_head = nn.LayerNorm(n), nn.Linear(n, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2's

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.c1, self.c2 = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.down, self.proj = nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.Conv2d(4, 6, 1, stride=2)
        self.bn = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 10)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(h + self.c2(torch.relu(self.c1(h))))
        h = torch.relu(self.bn(self.down(h)) + self.proj(h))
        return self.fc(h.mean((2, 3)))


class SamePadded(nn.Module):
    """Convolutions with padding="same" and kernels that are not square (the padding is worked out per side)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 4, (3, 5), padding="same"), nn.Conv2d(4, 5, (5, 3), padding="same")
        self.fc = nn.Linear(5, 10)

    def forward(self, x):
        return self.fc(torch.tanh(self.conv2(torch.tanh(self.conv1(x)))).mean((2, 3)))


def same_padding_case():
    torch.manual_seed(0)
    return SamePadded().double(), torch.randn(B, 1, 6, 7, dtype=torch.float64), torch.tensor([1, 2, 3, 9]), \
        cross_entropy_loss, 3


def gpt_case():
    torch.manual_seed(0)
    x = torch.randint(0, V, (B, T))
    return TinyGPT().double(), x, torch.randint(0, V, (B, T)), sequence_cross_entropy, 9


def resnet_case():
    torch.manual_seed(0)
    return TinyResNet().double().train(), torch.randn(B, 1, 6, 6, dtype=torch.float64), torch.tensor([1, 2, 3, 9]), \
        cross_entropy_loss, 6


class WritesIntoAView(nn.Module):
    """Attention-style: a (B, T, d) projection whose heads view is scaled in place and whose padded positions are
    filled in place (Longformer, DeBERTa v1 write into their query projections so)."""

    def __init__(self):
        super().__init__()
        self.query, self.out = nn.Linear(6, 8), nn.Linear(8, 10)

    def forward(self, x):
        q = self.query(x)
        q.view(*q.shape[:2], 2, 4).mul_(0.5)  # in place, through a view of the layer's output
        q.masked_fill_(x[..., :1] > 1.0, 0.0)
        return self.out(torch.tanh(q)).mean(1)


def inplace_view_case():
    torch.manual_seed(0)
    return WritesIntoAView().double(), torch.randn(B, 5, 6, dtype=torch.float64), torch.tensor([1, 2, 3, 9]), \
        cross_entropy_loss, 2


class ConvWithDefaults(nn.Conv2d):
    """A convolution whose forward passes only its input and weight, positionally: stride, padding, dilation and
    groups are F.conv2d's defaults (1, 0, 1, 1), whatever the module was built with."""

    def forward(self, x):
        return F.conv2d(x, self.weight)


class SameWithDefaults(nn.Conv2d):
    """A convolution called with "same" padding positionally and no dilation: F.conv2d's default dilation, 1."""

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, 1, "same")


class WrittenOut(nn.Linear):
    """A linear layer whose forward writes x W^T + b out, with no F.linear call."""

    def forward(self, x):
        return x @ self.weight.T + self.bias


class TwoCalls(nn.Linear):
    """A linear layer whose forward makes a second linear call, with a weight of its own: only the first is the
    layer's (its feedback); the second is part of the rest of the model, backpropagated exactly."""

    def __init__(self, n_in, n_out, n_extra):
        super().__init__(n_in, n_out)
        self.extra = nn.Parameter(torch.randn(n_extra, n_out) / n_out ** 0.5)

    def forward(self, x):
        return F.linear(torch.tanh(F.linear(x, self.weight, self.bias)), self.extra)


class LayerForwards(nn.Module):
    """Layers whose forwards call the functions as users' subclasses do: "valid" padding, a dilated "same"
    padding, positional arguments with the defaults, no linear call at all, two linear calls."""

    def __init__(self):
        super().__init__()
        self.valid = nn.Conv2d(2, 3, 3, padding="valid")
        self.defaults = ConvWithDefaults(3, 4, 3, stride=2, padding=1, dilation=2, groups=1, bias=False)
        self.dilated = nn.Conv2d(4, 4, 3, padding="same", dilation=2)
        self.same = SameWithDefaults(4, 4, 3, dilation=3)
        self.written, self.two = WrittenOut(4 * 4 * 4, 6), TwoCalls(6, 5, 10)

    def forward(self, x):  # x: (B, 2, 10, 10) -> 8 x 8 -> 6 x 6 (defaults: no stride, padding nor dilation) -> 6
        h = torch.tanh(self.dilated(torch.tanh(self.defaults(torch.tanh(self.valid(x))))))
        h = torch.tanh(self.same(h))
        return self.two(torch.tanh(self.written(h[:, :, 1:5, 1:5].flatten(1))))


def layer_forwards_case():
    torch.manual_seed(0)
    return LayerForwards().double(), torch.randn(B, 2, 10, 10, dtype=torch.float64), torch.tensor([1, 2, 3, 9]), \
        cross_entropy_loss, 6


CASES = {"transformer": gpt_case, "resnet": resnet_case, "same padding": same_padding_case,
         "in place into a view": inplace_view_case, "layer forwards": layer_forwards_case}


@pytest.mark.parametrize("case", list(CASES))
def test_fa_with_the_forward_weights_as_feedback_is_backprop_and_drawn_feedback_is_not(case):
    model, x, y, loss_fn, count = CASES[case]()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    exact = grads(model, trainers.build_engine("backprop"), x, y, loss_fn)
    covered = covered_layers(model)
    assert len(covered) == count
    engine = trainers.build_engine("fa")
    model.load_state_dict(state)  # BatchNorm's statistics as before
    drawn = grads(model, engine, x, y, loss_fn)
    reading_data = {"resnet": ["stem"], "same padding": ["conv1"], "in place into a view": ["query"],
                    "layer forwards": ["valid"]}.get(case, [])
    assert sorted(engine.layers.feedback) == sorted(name for name, _ in covered if name not in reading_data)
    below_the_top = [name for name, _ in covered][:-1]  # the output layer's error is e itself
    for name in below_the_top:
        assert relative(drawn[f"{name}.weight"], exact[f"{name}.weight"]) > 1e-3, name
    for name, module in covered:
        if name in engine.layers.feedback:
            engine.layers.feedback[name] = module.weight.detach().clone()  # B = W
    model.load_state_dict(state)
    same = grads(model, engine, x, y, loss_fn)
    for name in exact:
        torch.testing.assert_close(same[name], exact[name], rtol=1e-12, atol=1e-14, msg=name)


class OneHidden(nn.Module):
    """Not a layer stack (a norm between the layers, a skip into the output): one hidden layer for DFA."""

    def __init__(self, hidden=1):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 7), *(nn.Linear(7, 7) for _ in range(hidden - 1))])
        self.norm, self.head = nn.LayerNorm(7), nn.Linear(7, 3)

    def forward(self, x):
        h = x
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return self.head(self.norm(h)) + x[:, :3]


def test_dfa_with_one_hidden_layer_and_the_output_weights_as_feedback_is_backprop():
    torch.manual_seed(0)
    x, y = torch.randn(B, 6, dtype=torch.float64), torch.tensor([0, 2, 1, 1])
    model = OneHidden().double()
    exact = grads(model, trainers.build_engine("backprop"), x, y, cross_entropy_loss)
    engine = trainers.build_engine("dfa")
    grads(model, engine, x, y, cross_entropy_loss)
    engine.layers.feedback["head"] = model.head.weight.detach().clone()  # D = W_2: e D is backprop's e W_2
    same = grads(model, engine, x, y, cross_entropy_loss)
    for name in exact:
        torch.testing.assert_close(same[name], exact[name], rtol=1e-12, atol=1e-14, msg=name)
    deeper = OneHidden(hidden=2).double()  # two hidden layers: the lower one gets e D_1, not backprop's error
    exact = grads(deeper, trainers.build_engine("backprop"), x, y, cross_entropy_loss)
    engine = trainers.build_engine("dfa")
    grads(deeper, engine, x, y, cross_entropy_loss)
    engine.layers.feedback["head"] = deeper.head.weight.detach().clone()
    got = grads(deeper, engine, x, y, cross_entropy_loss)
    assert relative(got["layers.0.weight"], exact["layers.0.weight"]) > 1e-3


@pytest.mark.parametrize("rule", ["fa", "dfa"])
def test_on_a_layer_stack_the_layer_path_is_the_stack_path(rule):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    stack = models.layer_stack(net)
    x, y = torch.randn(B, 6, dtype=torch.float64), torch.tensor([0, 2, 1, 1])
    on_stack = trainers.build_engine(rule, path="stack")
    expected = grads(stack, on_stack, x, y, cross_entropy_loss)
    on_layers = trainers.build_engine(rule, path="layers")
    grads(stack, on_layers, x, y, cross_entropy_loss)
    names = [n for n, _ in covered_layers(stack)]  # sequential.0, .2, .4
    # fa: B_2, B_3 feed layers 2 and 3's inputs; dfa: D_1, D_2, e projected at the inputs of layers 2 and 3
    on_layers.layers.feedback.update({names[1]: on_stack.matrices()[0], names[2]: on_stack.matrices()[1]})
    got = grads(stack, on_layers, x, y, cross_entropy_loss)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-12, atol=1e-14, msg=name)


@pytest.mark.parametrize("rule", ["fa", "dfa"])
def test_fa_and_dfa_train_a_transformer_through_the_trainer_and_resume_their_feedback(rule):
    model, x, y, loss_fn, _ = gpt_case()
    engine = trainers.build_engine(rule)
    first = grads(model, engine, x, y, loss_fn)
    again = trainers.build_engine(rule, feedback_seed=7)
    again.load_state_dict(engine.state_dict())  # a resume: the feedback of the checkpoint, not a new draw
    for name, g in grads(model, again, x, y, loss_fn).items():
        torch.testing.assert_close(g, first[name], rtol=0, atol=0)
    other = grads(model, trainers.build_engine(rule, feedback_seed=7), x, y, loss_fn)
    assert relative(other["h.0.fc.weight"], first["h.0.fc.weight"]) > 1e-3


def test_the_coverage_line_counts_the_layers_by_class_and_names_those_written_out():
    model, x, y, loss_fn, _ = layer_forwards_case()
    engine = trainers.build_engine("fa")
    grads(model, engine, x, y, loss_fn)
    assert engine.layers.coverage(model) == (
        "the backward of 6 layers of LayerForwards replaced by the feedback (2 Conv2d, 1 ConvWithDefaults, "
        "1 SameWithDefaults, 1 WrittenOut, 1 TwoCalls); everything else exact; 1 run as x W^T + b written out, "
        "their forward making no linear call (written)")


class Unused(nn.Module):
    """A layer built but never called (a head kept for another task): the loss does not reach it."""

    def __init__(self):
        super().__init__()
        self.fc, self.out, self.spare = nn.Linear(6, 7), nn.Linear(7, 3), nn.Linear(7, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(x)))


@pytest.mark.parametrize("rule", ["fa", "dfa"])
def test_a_parameter_the_loss_does_not_reach_gets_no_gradient_as_under_backprop(rule):
    torch.manual_seed(0)
    model, x, y = Unused().double(), torch.randn(B, 6, dtype=torch.float64), torch.tensor([0, 2, 1, 1])
    exact = grads(model, trainers.build_engine("backprop"), x, y, cross_entropy_loss)
    got = grads(model, trainers.build_engine(rule), x, y, cross_entropy_loss)
    for name in ("spare.weight", "spare.bias"):
        assert torch.equal(got[name], exact[name]) and not got[name].any()
    assert got["fc.weight"].abs().sum() > 0


@pytest.mark.parametrize("rule", ["fa", "dfa"])
def test_the_feedback_follows_the_model_to_another_dtype(rule):
    """Drawn in float64 at the first step, the feedback (FA's B, DFA's projection) is cast with the model to
    float32: the same rule, in float32."""
    torch.manual_seed(0)
    model, x, y = OneHidden(hidden=2).double(), torch.randn(B, 6, dtype=torch.float64), torch.tensor([0, 2, 1, 1])
    engine = trainers.build_engine(rule)
    first = grads(model, engine, x, y, cross_entropy_loss)
    after = grads(model.float(), engine, x.float(), y, cross_entropy_loss)
    kept = engine.layers.feedback if rule == "fa" else engine.layers.projection
    assert kept and all(t.dtype == torch.float32 for t in kept.values())
    for name, g in first.items():
        assert after[name].dtype == torch.float32
        torch.testing.assert_close(after[name].double(), g, rtol=1e-4, atol=1e-6, msg=name)


def test_a_layer_state_saved_without_its_step_resumes_the_draws_from_step_0():
    """brsf draws its magnitudes from (seed, layer, step): a state written before the step was kept (an older
    checkpoint) loads at step 0, the draws of a fresh engine."""
    model, x, y, loss_fn, _ = layer_forwards_case()
    fresh = trainers.build_engine("brsf")
    state = fresh.state_dict()
    expected = grads(model, fresh, x, y, loss_fn)
    state["layers"].pop("step")
    older = trainers.build_engine("brsf")
    older.load_state_dict(state)
    assert older.layers.step == 0
    for name, g in grads(model, older, x, y, loss_fn).items():
        assert torch.equal(g, expected[name]), name


class PooledAndPositions(nn.Module):
    """An LM-like (B, T, C) output from layers that see every position and one that sees each sample once (a
    summary of the sequence added back to every position): DFA's error laid out both ways in one step."""

    def __init__(self, d=4, c=5):
        super().__init__()
        self.embed, self.summary, self.mix, self.out = nn.Linear(3, d), nn.Linear(d, d), nn.Linear(d, d), \
            nn.Linear(d, c)

    def forward(self, x):
        h = torch.tanh(self.embed(x))
        h = h + torch.tanh(self.summary(h.mean(1))).unsqueeze(1)
        return self.out(torch.tanh(self.mix(h)))


def test_dfa_projects_a_sequences_error_per_position_and_per_sample_each_by_its_matrix_whatever_the_length():
    """Per position, a layer's input gets e_t D (D: C x d); per sample, e_(B, T C) D (D: T C x d), drawn again when
    a batch of another length comes. The gradients of the layers below are then autograd's through the
    activations (checked by hand on the embedding, which reads both)."""
    torch.manual_seed(0)
    model = PooledAndPositions().double()
    engine = trainers.build_engine("dfa", path="layers")
    for length in (5, 7):
        gen = torch.Generator().manual_seed(length)
        x = torch.randn(B, length, 3, generator=gen, dtype=torch.float64)
        y = torch.randint(0, 5, (B, length), generator=gen)
        got = grads(model, engine, x, y, sequence_cross_entropy)
        D = {n: engine.layers.matrix(n) for n in ("out", "mix", "summary")}
        assert {n: tuple(m.shape) for n, m in D.items()} == {"out": (5, 4), "mix": (5, 4), "summary": (length * 5, 4)}
        assert set(engine.layers.projection) == {"position", "sample"}
        with torch.no_grad():
            out = model(x)
            e = (torch.softmax(out, -1) - F.one_hot(y, 5)) / (B * length)  # dL/dy of the mean cross-entropy
        a = model.embed(x).requires_grad_()
        h = torch.tanh(a)
        pooled = h.mean(1)
        s = model.summary(pooled)
        h2 = h + torch.tanh(s).unsqueeze(1)
        m = model.mix(h2)
        # the error each layer's input gets: e D at every position (mix, out), e of the sample at the summary's
        dm_in = e @ D["mix"]
        ds_in = e.reshape(B, -1) @ D["summary"]
        h2_grad = dm_in
        h_grad = h2_grad + (ds_in / length).unsqueeze(1)  # the mean's backward
        (a_grad,) = torch.autograd.grad(h, a, h_grad)
        assert relative(got["embed.weight"], a_grad.reshape(-1, 4).T @ x.reshape(-1, 3)) < 1e-12
        m_grad = e @ D["out"] * (1 - torch.tanh(m) ** 2)
        assert relative(got["mix.weight"], m_grad.reshape(-1, 4).T @ h2.detach().reshape(-1, 4)) < 1e-12


def test_dfa_with_one_error_per_sample_reads_one_matrix_for_dense_and_convolution_layers_alike():
    """Launay et al.'s one random matrix: with a (B, C) error, every layer's D is a slice of the same projection,
    whatever its input's layout (a convolution's (B, C, H, W), a dense layer's (B, d))."""
    model, x, y, loss_fn, _ = resnet_case()
    engine = trainers.build_engine("dfa", path="layers")
    grads(model, engine, x, y, loss_fn)
    assert list(engine.layers.projection) == ["sample"]
    assert {key for key, *_ in engine.layers.slices.values()} == {"sample"}
