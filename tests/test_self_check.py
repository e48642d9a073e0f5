"""The first-batch self-check (trainers/core/self_check.py): a structure an engine found or was given proves, on
one batch, that the engine's exact setting is autograd of the model's own forward, or is refused in one line
naming the parameters that differ. Float64, models written in plain torch with the kinds of structure that
fool a forward check: a table every block reads (a side input), an encoder whose output every decoder block
reads (a second chain), a layer scale on split sublayers, a weight transform a layer function bypasses. Each
refusal has its contrast: the same model without the fault passes, and its gradients are exact."""

import re

import pytest
import torch
from helpers import autograd_grads, engine_grads, relative
from torch import nn
from torch.nn import functional as F

from gradengines import models, trainers
from gradengines.models.adapters.calling import call_model
from gradengines.models.adapters.discovery import ResidualFound
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy
from gradengines.trainers.core.self_check import differences, failures_refused, loosest, quiet, tolerance
from gradengines.trainers.engines.highway import exact_cotangents, highway_iterations

V, T, B, N = 11, 6, 3, 8


class Block(nn.Module):
    """A pre-LN residual block h + W tanh(LN(h) + side); ``side`` (optional) reaches every block alike."""

    def __init__(self, n=N):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(n), nn.Linear(n, n)

    def forward(self, h, side=None):
        u = self.norm(h)
        return h + self.fc(torch.tanh(u if side is None else u + side))


class SharedTable(nn.Module):
    """Every block reads one learned table (BEiT's shared relative position bias, DeBERTa's rel_embeddings);
    ``learned=False`` makes it a buffer: no gradient to lose."""

    def __init__(self, layers=3, learned=True):
        super().__init__()
        self.embed, self.head = nn.Embedding(V, N), nn.Linear(N, V)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        table = torch.randn(T, N)
        if learned:
            self.table = nn.Parameter(table)
        else:
            self.register_buffer("table", table)

    def forward(self, idx):
        h, side = self.embed(idx), self.table[: idx.shape[1]]  # computed once, read by every block
        for block in self.blocks:
            h = block(h, side=side)
        return self.head(h)


class CrossBlock(Block):
    """A decoder block: reads the encoder's output (its memory) besides its state, as cross-attention does."""

    def __init__(self):
        super().__init__()
        self.cross = nn.Linear(N, N)

    def forward(self, h, memory=None):
        return super().forward(h) + self.cross(memory.mean(1, keepdim=True))


class EncoderDecoder(nn.Module):
    """An encoder chain of ``Block`` then a longer decoder chain of ``CrossBlock``, each reading the memory:
    discovery takes the decoder, the longer chain."""

    def __init__(self, encoder=2, decoder=3):
        super().__init__()
        self.embed, self.head = nn.Embedding(V, N), nn.Linear(N, V)
        self.encoder = nn.ModuleList(Block() for _ in range(encoder))
        self.decoder = nn.ModuleList(CrossBlock() for _ in range(decoder))

    def encode(self, idx):
        memory = self.embed(idx)
        for block in self.encoder:
            memory = block(memory)
        return memory

    def forward(self, idx):
        memory, h = self.encode(idx), self.embed(idx.flip(1))
        for block in self.decoder:
            h = block(h, memory=memory)
        return self.head(h)


class LayerScaleBlock(nn.Module):
    """A pre-LN block with a layer scale on each sublayer (CaiT, DeiT III, timm's ViTs with init_values):
    h + g1 * attn(LN1(h)), then + g2 * mlp(LN2(.))."""

    def __init__(self, n=N):
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(n), nn.Linear(n, n), nn.LayerNorm(n)
        self.mlp = nn.Sequential(nn.Linear(n, 2 * n), nn.GELU(), nn.Linear(2 * n, n))
        self.gamma1, self.gamma2 = nn.Parameter(torch.rand(n) + 0.5), nn.Parameter(torch.rand(n) + 0.5)

    def forward(self, h):
        h = h + self.gamma1 * self.attn(self.norm1(h))
        return h + self.gamma2 * self.mlp(self.norm2(h))


class LayerScaleNet(nn.Module):
    def __init__(self, layers=3):
        super().__init__()
        self.embed, self.head = nn.Embedding(V, N), nn.Linear(N, V)
        self.blocks = nn.ModuleList(LayerScaleBlock() for _ in range(layers))

    def forward(self, idx):
        h = self.embed(idx)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def build(cls, **kw):
    torch.manual_seed(0)
    return cls(**kw).double()


def batch(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=gen), torch.randint(0, V, (B, T), generator=gen)


def highway(model, x, y, **options):
    stack = models.residual_stack(model, example=(x, y))
    return stack, engine_grads(stack, trainers.build_engine("highway", k=100, **options), x, y,
                               sequence_cross_entropy, strip="model.")


def refusal(model, x, y) -> str:
    with pytest.raises(models.ModelConfigError) as info:
        highway(model, x, y)
    message = str(info.value)
    assert "\n" not in message and message.startswith("self-check: Highway-BP at k >= L")
    return message


# ---- Highway-BP on found stacks: side inputs followed, each kind of fault refused -------------------------

def exact_and_k0_differs(model, x, y, names):
    """Highway-BP at k >= L is autograd on every parameter; at k = 0 the parameters ``names`` differ."""
    exact = autograd_grads(model, sequence_cross_entropy(model(x), y))
    stack, got = highway(model, x, y)
    assert relative(got, exact) < 1e-12
    k0 = engine_grads(stack, trainers.build_engine("highway", k=0), x, y, sequence_cross_entropy, strip="model.")
    assert all(relative(k0[n], exact[n]) > 1e-3 for n in names)
    return stack


def test_a_learned_table_every_block_reads_is_a_side_input_exact_at_full_k():
    x, y = batch()
    stack = exact_and_k0_differs(build(SharedTable), x, y, ["table", "blocks.0.fc.weight"])
    assert stack.found.endswith("; 1 side input (side) read by every block")


def test_a_side_input_not_followed_is_refused_naming_the_parameter_it_drops(monkeypatch):
    """The deliberately broken case: side inputs dropped (what discovery did before it followed them)."""
    monkeypatch.setattr(ResidualFound, "side_inputs", lambda self: [])
    x, y = batch()
    message = refusal(build(SharedTable), x, y)
    assert "1 of 16 parameter gradients differ" in message and "first table (" in message
    assert "a side input Highway-BP does not follow" in message


def test_the_same_table_as_a_buffer_is_no_side_input_and_exact():
    model, (x, y) = build(SharedTable, learned=False), batch()
    stack = exact_and_k0_differs(model, x, y, ["blocks.0.fc.weight"])
    assert "side input" not in stack.found


def test_an_encoders_output_read_by_every_decoder_block_is_a_side_input_exact_at_full_k():
    """The decoder, the longer chain, is found; the encoder is backpropagated exactly through its output."""
    x, y = batch()
    stack = exact_and_k0_differs(build(EncoderDecoder), x, y, ["decoder.0.fc.weight", "encoder.0.fc.weight"])
    assert "CrossBlock in decoder" in stack.found and "1 side input (memory)" in stack.found


class StoredCrossBlock(CrossBlock):
    def forward(self, h):
        return super().forward(h, memory=self.__dict__["memory"])


class HiddenMemory(EncoderDecoder):
    """The decoder blocks read the encoder's output from an attribute, not from their arguments: a side input
    no call shows, so the encoder is one chain of two left out."""

    def __init__(self):
        super().__init__()
        self.decoder = nn.ModuleList(StoredCrossBlock() for _ in range(3))

    def forward(self, idx):
        memory, h = self.encode(idx), self.embed(idx.flip(1))
        for block in self.decoder:
            block.__dict__["memory"] = memory
            h = block(h)
        return self.head(h)


def test_an_encoder_reached_by_no_argument_is_refused_naming_its_parameters():
    x, y = batch()
    message = refusal(build(HiddenMemory), x, y)
    assert "first encoder." in message and "a second chain of blocks not found" in message


def test_the_longer_encoder_found_makes_the_decoder_part_of_the_head_and_is_exact():
    """With the encoder the longer chain, the decoder (and its reading of the memory) is the head: exact."""
    x, y = batch()
    stack = exact_and_k0_differs(build(EncoderDecoder, encoder=3, decoder=2), x, y, ["encoder.0.fc.weight"])
    assert "Block in encoder" in stack.found


def test_layer_scale_on_split_sublayers_is_exact_at_full_k_and_not_at_k0():
    """The two sublayers of a split block share its parameters: the first's gamma, read by the second as
    gamma * 0, must add a zero to the first's gradient, not replace it (it did: gamma1 rel 1.0, silent)."""
    model, (x, y) = build(LayerScaleNet), batch()
    exact = autograd_grads(model, sequence_cross_entropy(model(x), y))
    stack, got = highway(model, x, y)
    assert stack.found.endswith("6 residual sublayers: 6 h + z")
    assert relative(got, exact) < 1e-12
    k0 = engine_grads(stack, trainers.build_engine("highway", k=0), x, y, sequence_cross_entropy, strip="model.")
    assert relative(k0["blocks.0.gamma1"], exact["blocks.0.gamma1"]) > 1e-3


def test_the_opt_out_skips_the_check_and_the_wrong_gradient_is_then_the_users(monkeypatch):
    """``self_check=False`` runs without a word: the check, not luck, is what refuses."""
    monkeypatch.setattr(ResidualFound, "side_inputs", lambda self: [])
    model, (x, y) = build(SharedTable), batch()
    exact = autograd_grads(model, sequence_cross_entropy(model(x), y))
    _, got = highway(model, x, y, self_check=False)
    assert relative(got["table"], exact["table"]) == pytest.approx(1.0)


def test_a_declared_stack_whose_blocks_read_a_table_is_refused_with_the_declarations_cause():
    model, (x, y) = build(SharedTable), batch()
    stack = models.residual_stack(
        model, stem=model.embed, head=model.head, example=x, blocks=[_Bound(b, model) for b in model.blocks])
    with pytest.raises(models.ModelConfigError, match="first table .*; the declared stem, blocks and head compute "
                                                      "the model's forward but not its gradient"):
        trainers.build_engine("highway", k=100).compute_grads(stack, x, y, sequence_cross_entropy)


class _Bound(nn.Module):
    """A declared sublayer (``fn`` of ``h + fn(h)``) that reads the model's table besides its state."""

    def __init__(self, block, model):
        super().__init__()
        self.block = block
        self.__dict__["model"] = model

    def forward(self, h):
        return self.block(h, side=self.model.table[: h.shape[1]]) - h


# ---- the check leaves no trace -----------------------------------------------------------------------

class NoisyBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.BatchNorm1d(N), nn.Linear(N, N)

    def forward(self, h):
        return h + self.fc(self.norm(h))


class Noisy(nn.Module):
    """Dropout and BatchNorm in training mode: the check must not draw a mask or move a statistic."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(4, N), nn.Linear(N, 3)
        self.blocks = nn.ModuleList(NoisyBlock() for _ in range(3))
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        h = self.drop(self.embed(x))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def test_a_step_with_the_check_is_the_step_without_it():
    """Same gradients, same BatchNorm statistics, same next random draw, training mode kept."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=gen, dtype=torch.float64), torch.randint(0, 3, (8,), generator=gen)
    results = []
    for check in (True, False):
        model = build(Noisy).train()
        stack = models.residual_stack(model, example=x)
        torch.manual_seed(5)
        trainers.build_engine("highway", k=100, self_check=check).compute_grads(stack, x, y, cross_entropy_loss)
        results.append(({n: p.grad.clone() for n, p in model.named_parameters()},
                        [b.clone() for b in model.buffers()], torch.rand(3), model.training))
    (g1, b1, r1, m1), (g2, b2, r2, m2) = results
    assert g1.keys() == g2.keys() and all(torch.equal(g1[n], g2[n]) for n in g1)
    assert all(torch.equal(a, b) for a, b in zip(b1, b2, strict=True)) and torch.equal(r1, r2) and m1 and m2


def test_quiet_puts_modes_buffers_and_the_generator_back():
    model = build(Noisy).train()
    before = [b.clone() for b in model.buffers()]
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    with quiet(model):
        assert not model.training
        model.blocks[0].norm.running_mean.add_(1.0)
        torch.rand(5)
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(a, b) for a, b in zip(before, model.buffers(), strict=True))
    assert torch.equal(torch.rand(2), expected)


# ---- the measure ---------------------------------------------------------------------------------------

def test_a_zero_gradient_is_measured_against_the_whole_gradient_and_a_dropped_one_is_caught():
    big, zero = torch.full((4,), 3.0, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    rounding = torch.full((3,), 1e-14, dtype=torch.float64)  # a key bias: zero by theory, rounding in practice
    assert differences(["w", "b"], [big, rounding], [big, zero], torch.float64) == []
    wrong = differences(["w", "b"], [big * 0, zero], [big, zero], torch.float64)
    assert [n for n, _ in wrong] == ["w"] and wrong[0][1] == pytest.approx(1 / 1.001)
    small = big * 1e-8  # a parameter with a tiny share of the gradient, dropped: still caught in float64
    assert [n for n, _ in differences(["w", "s"], [big, 0 * small], [big, small], torch.float64)] == ["s"]
    assert differences(["w", "s"], [big, 0 * small], [big, small], torch.float32) == []  # below float32's reach
    assert tolerance(torch.float64) < tolerance(torch.float32) < tolerance(torch.bfloat16)


def test_exact_cotangents_are_highway_iterations_at_k_equal_n_and_not_below():
    """The check's recurrence is the limit of the iterations (the same paths, summed by where they start)."""
    gen = torch.Generator().manual_seed(0)
    n, d = 5, 4
    e = torch.randn(n + 1, 2, d, generator=gen, dtype=torch.float64)
    carry = torch.cat([torch.rand(n, 2, d, generator=gen, dtype=torch.float64), torch.zeros(1, 2, d)])
    J = torch.randn(n, d, d, generator=gen, dtype=torch.float64) / d

    def back(W):  # v_j = w_{j+1} J_j
        return torch.cat([torch.einsum("jbd,jde->jbe", W[1:], J), torch.zeros_like(W[:1])])

    exact = exact_cotangents(e, carry, lambda j, w: w @ J[j])
    full = highway_iterations(e, carry, back, k=n)[0]
    assert relative(full, exact) < 1e-14
    assert relative(highway_iterations(e, carry, back, k=n - 2)[0], exact) > 1e-3


# ---- FA and DFA's layer path --------------------------------------------------------------------------

class StdConv2d(nn.Conv2d):
    """Weight standardisation in the forward (timm's StdConv2d): the stored weight is not the one applied."""

    def forward(self, x):
        w = self.weight
        w = (w - w.mean((1, 2, 3), keepdim=True)) / (w.std((1, 2, 3), keepdim=True) + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding)


def convnet(conv=nn.Conv2d):
    torch.manual_seed(0)
    return nn.Sequential(conv(2, 4, 3, padding=1), nn.ReLU(), conv(4, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 5 * 5, 3)).double()


def images(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, 2, 5, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (B,), generator=gen)


class SameConv2d(nn.Conv2d):
    """TF's "same" padding computed in the forward (timm's Conv2dSame): the input is padded, then convolved."""

    def forward(self, x):
        return F.conv2d(F.pad(x, (0, 2, 0, 2)), self.weight, self.bias, self.stride, 0)


class ManualLinear(nn.Linear):
    """A dense layer that makes no F.linear call (Falcon's FalconLinear): run as x W^T + b written out."""

    def forward(self, x):
        return x @ self.weight.t() + self.bias


class ScaledLinear(nn.Linear):
    """No F.linear call, and more than x W^T + b: the function written out is not its forward."""

    def forward(self, x):
        return 2 * (x @ self.weight.t()) + self.bias


@pytest.mark.parametrize("conv", [StdConv2d, SameConv2d])
def test_fa_with_b_equal_w_is_backprop_through_a_weight_transform_or_padding_in_the_forward(conv):
    """The layer runs as written: FA with B = the weight each call uses is backprop, the local weight gradient
    flowing through the standardisation (or the input gradient through the padding) by autograd."""
    model, (x, y) = convnet(conv), images()
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    engine = trainers.build_engine("fa", path="layers")
    engine.layers.mirror = True
    assert relative(engine_grads(model, engine, x, y), exact) < 1e-12
    dfa = engine_grads(model, trainers.build_engine("dfa", path="layers"), x, y)
    assert relative(dfa, exact) > 1e-3 and all(torch.isfinite(g).all() for g in dfa.values())


def bypass_weight_transforms(monkeypatch):
    """The deliberately broken layer path: each layer function reads the stored weight, as before 'run as written'
    (a weight standardised in the forward is then bypassed)."""
    from gradengines.trainers.engines import feedback_layers

    def bypass(self, index, name, module):
        kind = feedback_layers._Conv(module.stride, module.padding, module.dilation, module.groups) \
            if isinstance(module, nn.Conv2d) else feedback_layers._Dense()
        feed = self._feed(index, name, kind)
        return lambda x: feedback_layers._LocalBackward.apply(x, module.weight, module.bias, kind, feed)

    monkeypatch.setattr(feedback_layers.LocalFeedback, "_forward", bypass)


@pytest.mark.parametrize("trainer", ["fa", "dfa"])
def test_a_weight_transform_bypassed_is_refused_in_one_line(trainer, monkeypatch):
    """The deliberately broken case (``bypass_weight_transforms``) is refused, naming what differs."""
    bypass_weight_transforms(monkeypatch)
    x, y = images()
    with pytest.raises(models.ModelConfigError) as info:
        trainers.build_engine(trainer, path="layers").compute_grads(convnet(StdConv2d), x, y, cross_entropy_loss)
    assert re.fullmatch(rf"self-check: trainer '{trainer}''s forward through the layer functions is not the model's "
                        rf"own on the first batch \(6 of 6 parameter gradients then differ, first "
                        rf"[0-9]\.(weight|bias), [0-9]\.(weight|bias), [0-9]\.(weight|bias)\); train this model "
                        rf"with backprop "
                        rf"\(--{trainer}-self-check false \(Python: self_check=False\) skips the check\)",
                        str(info.value))


def test_a_layer_without_a_linear_call_runs_as_written_out_if_that_is_its_forward_and_is_refused_if_not():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(B, 4, generator=gen, dtype=torch.float64), torch.randint(0, 3, (B,), generator=gen)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), ManualLinear(5, 3)).double()
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    engine = trainers.build_engine("fa", path="layers")
    engine.compute_grads(model, x, y, cross_entropy_loss)
    assert engine.layers.written == {"2"}
    assert engine.structure(model) == ("fa: the backward of 2 layers of Sequential replaced by the feedback (1 "
                                       "Linear, 1 ManualLinear); everything else exact; 1 run as x W^T + b written "
                                       "out, their forward making no linear call (2)")
    engine.layers.mirror = True
    assert relative(engine_grads(model, engine, x, y), exact) < 1e-12
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), ScaledLinear(5, 3)).double()
    with pytest.raises(models.ModelConfigError, match=r"^self-check: trainer 'fa''s forward through the layer "
                                                      r"functions \(with 2 run as the function of their weight"):
        trainers.build_engine("fa", path="layers").compute_grads(model, x, y, cross_entropy_loss)
    opted_out = trainers.build_engine("fa", path="layers", self_check=False)  # the opt-out: no check, no refusal
    opted_out.compute_grads(model, x, y, cross_entropy_loss)
    assert opted_out.layers.uncovered == {"2"} and not opted_out.layers.written


@pytest.mark.parametrize("trainer", ["fa", "dfa"])
def test_plain_and_parametrized_layers_pass_the_layer_paths_check(trainer):
    """Contrast: a torch parametrization is the weight the layer function reads (module.weight), so it passes."""
    x, y = images()
    model = convnet()
    torch.nn.utils.parametrize.register_parametrization(model[2], "weight", _Scaled())
    engine = trainers.build_engine(trainer, path="layers")
    engine.compute_grads(model, x, y, cross_entropy_loss)
    assert all(p.grad is not None for p in model.parameters())


class _Scaled(nn.Module):
    def forward(self, w):
        return 2 * w


def test_a_weight_also_read_outside_its_layer_passes_the_check_and_fa_with_b_equal_w_is_exact():
    """Contrast for the check: the layer's own gradient and autograd's of the other use are summed."""

    class Reuse(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out = nn.Linear(4, 4), nn.Linear(4, 3)

        def forward(self, x):
            return self.out(torch.tanh(self.fc(x)) + x @ self.fc.weight)

    torch.manual_seed(0)
    model = Reuse().double()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(B, 4, generator=gen, dtype=torch.float64), torch.randint(0, 3, (B,), generator=gen)
    exact = autograd_grads(model, cross_entropy_loss(call_model(model, x, y).outputs, y))
    engine = trainers.build_engine("fa", path="layers")
    engine.layers.feedback = {"fc": model.fc.weight.detach(), "out": model.out.weight.detach()}  # B = W
    assert relative(engine_grads(model, engine, x, y), exact) < 1e-12


# ---- the command line --------------------------------------------------------------------------------

TABLE_NET = '''import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, h):  # reads a side input no call argument shows
        return h + self.fc(torch.tanh(self.norm(h) + self.__dict__["side"]))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(64, 8), nn.Linear(8, 10)
        self.bias = nn.Parameter(torch.randn(8))
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        h, side = self.embed(x), 2 * self.bias
        for block in self.blocks:
            block.__dict__["side"] = side
            h = block(h)
        return self.head(h)
'''


def test_the_command_line_refuses_a_silent_wrong_in_one_line_before_anything_is_written(tmp_path, capsys):
    from gradengines.trainers.cli import train_main

    (tmp_path / "table.py").write_text(TABLE_NET)
    flags = ["--model", f"{tmp_path / 'table.py'}:Net", "--trainer", "highway", "--steps", "2", "--progress", "false"]
    code = train_main([*flags, "--logdir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: self-check: Highway-BP at k >= L") and "first bias (" in err[-1]
    assert not any("Traceback" in line for line in err) and not (tmp_path / "runs").exists()
    code = train_main([*flags, "--logdir", str(tmp_path / "opted-out"), "--highway-self-check", "false"])
    assert code == 0 and (tmp_path / "opted-out").exists()


def test_a_failure_inside_the_check_is_one_line_and_a_refusal_passes_through():
    with pytest.raises(models.ModelConfigError) as info:
        with failures_refused("trainer 'dfa'", "--dfa-self-check false"):
            raise RuntimeError("expected m1 and m2 to have the same dtype\n  (a second line)")
    assert str(info.value) == ("self-check: trainer 'dfa' fails on this model's first batch (RuntimeError: expected "
                               "m1 and m2 to have the same dtype): the structure does not run as the model does; "
                               "train it with backprop, or skip the check with --dfa-self-check false to see where "
                               "it fails")
    with pytest.raises(models.ModelConfigError, match="^as it was$"):
        with failures_refused("Highway-BP", "--highway-self-check false"):
            raise models.ModelConfigError("as it was")


class CachedBias(nn.Module):
    """timm's LeViT attention bias: in eval mode the bias is computed once and cached, with its graph, until
    ``train()`` drops it."""

    def __init__(self):
        super().__init__()
        self.bias, self.cache = nn.Parameter(torch.randn(N)), {}
        self.register_buffer("index", torch.arange(N).flip(0))  # LeViT's bias indices: a backward that saves them

    def train(self, mode=True):
        super().train(mode)
        if mode:
            self.cache = {}
        return self

    def forward(self, h):
        if self.training:
            return h + self.bias[self.index]
        if "b" not in self.cache:
            self.cache["b"] = self.bias[self.index]
        return h + self.cache["b"]


class CachedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.cached = nn.Linear(N, N), CachedBias()

    def forward(self, h):
        return h + torch.tanh(self.cached(self.fc(h)))


@pytest.mark.parametrize("trainer", ["highway", "fa", "dfa"])
def test_the_checks_passes_each_build_an_eval_mode_cache_of_their_own_and_leave_none(trainer):
    """Every pass of the check (eval mode) would read the first pass's cached tensor, whose graph that pass's
    backward freed: 'backward through the graph a second time' (LeViT, EfficientFormer-V2). The output layer
    is written out (no F.linear call): the layer path's check then runs a second pass."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, N), CachedBlock(), CachedBlock(), CachedBlock(), ManualLinear(N, 3)).double()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(B, 4, generator=gen, dtype=torch.float64), torch.randint(0, 3, (B,), generator=gen)
    target = models.residual_stack(model, example=x) if trainer == "highway" else model
    engine = trainers.build_engine(trainer, **({"k": 100} if trainer == "highway" else {"path": "layers"}))
    engine.compute_grads(target, x, y, cross_entropy_loss)
    assert model.training and all(not block.cached.cache for block in model[1:4])


def test_the_checks_tolerance_is_the_least_precise_parameter_dtype():
    mixed = [torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float32),
             torch.zeros(1, dtype=torch.float64)]
    assert loosest(mixed) is torch.float32 and loosest(mixed[::2]) is torch.float64
    assert loosest([torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.bfloat16)]) is torch.bfloat16
