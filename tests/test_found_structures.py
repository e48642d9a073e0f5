"""Found structures that ended in a traceback (issue 39 item 4), now exact at k >= L and not at k = 0, float64:
a first block fed the raw input (no stem to train: a patchify stem taken as a block), a block whose pre-LN split
cannot run (transformers' OPT in its default pre-LN layout: the whole block is then the sublayer)."""

import pytest
import torch
from helpers import autograd_grads, engine_grads, relative
from torch import nn

import models
import trainers
from tasks.base import cross_entropy_loss, sequence_cross_entropy


class Residual(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, h):
        return h + torch.tanh(self.fc(h))


class RawInput(nn.Module):
    """Residual blocks on the raw input, then a head: nothing before the first block."""

    def __init__(self, width=6, layers=3):
        super().__init__()
        self.blocks = nn.ModuleList(Residual(width) for _ in range(layers))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def check_exact_and_k0(model, x, y, loss_fn, parameter):
    exact = autograd_grads(model, loss_fn(models.call_model(model, x, y).outputs, y))
    stack = models.residual_stack(model, example=(x, y))
    assert relative(engine_grads(stack, trainers.build_engine("highway", k=100), x, y, loss_fn, strip="model."),
                    exact) < 1e-10
    k0 = engine_grads(stack, trainers.build_engine("highway", k=0), x, y, loss_fn, strip="model.")
    assert relative(k0[parameter], exact[parameter]) > 1e-4
    return stack


def test_blocks_on_the_raw_input_are_exact_at_full_k():
    torch.manual_seed(0)
    model = RawInput().double()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 6, generator=gen, dtype=torch.float64), torch.randint(0, 4, (5,), generator=gen)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "blocks.0.fc.weight")
    assert stack.found.startswith("3 blocks (Residual in blocks)")


def test_opt_in_its_default_pre_ln_layout_is_exact_at_full_k():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.OPTConfig(vocab_size=23, hidden_size=8, num_hidden_layers=2, ffn_dim=16,
                                    num_attention_heads=2, max_position_embeddings=16, word_embed_proj_dim=8,
                                    dropout=0.0)
    model = transformers.OPTForCausalLM(config).double().eval()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 23, (3, 7), generator=gen), torch.randint(0, 23, (3, 7), generator=gen)
    stack = check_exact_and_k0(model, x, y, sequence_cross_entropy, "model.decoder.layers.0.fc1.weight")
    assert "2 blocks (OPTDecoderLayer in model.decoder.layers)" in stack.found


class Widening(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.fc = nn.Linear(cin, cout)

    def forward(self, h):
        return torch.tanh(self.fc(h))


def test_a_structure_whose_blocks_all_change_shape_says_that_highway_is_backprop_there():
    torch.manual_seed(0)
    model = nn.Sequential(Widening(4, 5), Widening(5, 6), Widening(6, 7), nn.Linear(7, 3)).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    stack = models.residual_stack(model, example=x)
    assert stack.found.endswith("3 exact boundaries (a shape change); every block changes the state's shape, so "
                                "each is an exact boundary: Highway-BP is backprop here")
