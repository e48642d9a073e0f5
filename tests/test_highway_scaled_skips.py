"""Scaled skips (issue 63 item 4): blocks u = a h + f(norm(h)) with ``a`` a learned scalar, a learned vector or a
fixed number, and Doge's two of them (a2 (a1 h + attn(norm1(h))) + mlp(norm2(.))), found as ``r = h a + b``
with K = diag(a) (``models.adapters.discovery``, kind ``scaled``). In float64: Highway-BP at k >= L is autograd,
the first-batch self-check passes (Doge's, a = 1 at initialisation, was refused), and k = 0 carries the error at
the top down the skips alone, e_L prod_i a_i (with K = I it would carry e_L)."""

import pytest
import torch
from helpers import autograd_grads, engine_grads, relative
from torch import nn

from gradengines import models, trainers
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy

WIDTH = 6


def mlp():
    return nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.Tanh(), nn.Linear(2 * WIDTH, WIDTH))


class ScaledSkip(nn.Module):
    """a h + f(norm(h)): ``a`` a learned scalar, a learned vector or a fixed number."""

    def __init__(self, a):
        super().__init__()
        self.norm, self.f, self.a = nn.LayerNorm(WIDTH), mlp(), a

    def forward(self, h):
        return self.a * h + self.f(self.norm(h))

    def skip(self):
        return self.a


class DogeLike(nn.Module):
    """Doge's decoder layer: h' = a1 h + attn(norm1(h)), h'' = a2 h' + mlp(norm2(h')), a1, a2 learned vectors."""

    def __init__(self, a: str):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), \
            nn.LayerNorm(WIDTH), mlp()
        self.a1, self.a2 = (1.0 if a == "none" else nn.Parameter(torch.ones(WIDTH) if a == "ones" else
                                                                 torch.rand(WIDTH) + 0.5) for _ in range(2))

    def forward(self, h):
        h = self.a1 * h + self.attn(self.norm1(h))
        return self.a2 * h + self.mlp(self.norm2(h))

    def skip(self):
        return self.a1 * self.a2


class Net(nn.Module):
    def __init__(self, block, layers=3):
        super().__init__()
        self.stem, self.head = nn.Linear(5, WIDTH), nn.Linear(WIDTH, 4)
        self.blocks = nn.ModuleList(block() for _ in range(layers))

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


BLOCKS = {"learned scalar": lambda: ScaledSkip(nn.Parameter(torch.rand(()) + 0.5)),
          "learned vector": lambda: ScaledSkip(nn.Parameter(torch.rand(WIDTH) + 0.5)),
          "fixed number": lambda: ScaledSkip(0.5),
          "doge at initialisation": lambda: DogeLike("ones"),
          "doge trained": lambda: DogeLike("random")}


def case(block):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 5, generator=gen, dtype=torch.float64), torch.randint(0, 4, (5,), generator=gen)
    model = Net(block).double()
    return model, x, y, models.residual_stack(model, example=x)


def highway(stack, x, y, k):
    return engine_grads(stack, trainers.build_engine("highway", k=k), x, y, cross_entropy_loss, strip="model.")


@pytest.mark.parametrize("name", BLOCKS)
def test_a_scaled_skip_is_found_and_exact_at_full_k(name):
    model, x, y, stack = case(BLOCKS[name])
    assert "3 blocks" in stack.found and "as 3 residual sublayers: 3 a h + z (a scaled skip)" in stack.found
    trainers.build_engine("highway", k=3).first_batch_check(stack, x, y, cross_entropy_loss)  # no refusal
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    assert relative(highway(stack, x, y, 3), exact) < 1e-10
    assert relative(highway(stack, x, y, 0), exact) > 1e-3


@pytest.mark.parametrize("name", BLOCKS)
def test_at_k0_the_error_crosses_the_skips_scaled_by_their_product(name):
    """w^0_0 = e_L K_L ... K_1 = e_L prod_i a_i: the stem's gradient at k = 0 is its VJP of that alone."""
    model, x, y, stack = case(BLOCKS[name])
    with torch.no_grad():
        h0 = model.stem(x)
        top = h0
        for block in model.blocks:
            top = block(top)
    top.requires_grad_()
    e = torch.autograd.grad(cross_entropy_loss(model.head(top), y), top)[0]
    skips = [torch.as_tensor(b.skip(), dtype=e.dtype).detach().expand(WIDTH) for b in model.blocks]
    carried = e * torch.stack(skips).prod(0)
    with torch.enable_grad():
        expected = torch.autograd.grad(model.stem(x), model.stem.weight, carried)[0]
    assert relative(highway(stack, x, y, 0)["stem.weight"], expected) < 1e-10


def test_a_plain_pre_ln_block_is_still_split_in_two():
    """h + attn(norm1(h)), then + mlp(norm2(.)): no scale to read, two sublayers h + z as before."""
    model, x, y, stack = case(lambda: DogeLike("none"))
    assert "as 6 residual sublayers: 6 h + z" in stack.found
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    assert relative(highway(stack, x, y, 6), exact) < 1e-10


def test_transformers_doge_passes_its_self_check():
    """transformers' Doge (learned input_residual and post_attention_residual, ones at initialisation): its pre-LN
    split was refused by the first-batch self-check; the whole layer, a h + z with a = a1 a2, passes it."""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.DogeConfig(vocab_size=23, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
                                     keep_window_size=16)
    model = transformers.DogeForCausalLM(config).double().eval()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 23, (3, 7), generator=gen), torch.randint(0, 23, (3, 7), generator=gen)
    stack = models.residual_stack(model, example=(x, y))
    assert "2 blocks (DogeDecoderLayer in model.layers) as 2 residual sublayers: 2 a h + z" in stack.found
    exact = autograd_grads(model, sequence_cross_entropy(models.call_model(model, x, y).outputs, y))
    grads = engine_grads(stack, trainers.build_engine("highway", k=2), x, y, sequence_cross_entropy, strip="model.")
    assert relative({k: grads[k] for k in exact if "layers" in k}, {k: exact[k] for k in exact if "layers" in k}) \
        < 1e-10
    assert relative(grads, exact) < 1e-6  # the self-check's float64 tolerance (the embedding: 1e-8, as with h + z)
