"""A user's residual networks declared with models.residual_stack: a nanoGPT-style Transformer and
a ResNet-style MLP written with nn.Sequential; in float64, Highway-BP's identities as on the zoo."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import models
import trainers
from tasks.base import cross_entropy_loss, sequence_cross_entropy
from trainers.core.engine import trainable_parameters

V, C, T, N_LAYER = 13, 8, 6, 2


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn, self.c_proj, self.n_head = nn.Linear(C, 3 * C), nn.Linear(C, C), 2

    def forward(self, x):
        B, T_, _ = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T_, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
        att = att.masked_fill(torch.ones(T_, T_, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T_, C))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(C), CausalSelfAttention(), nn.LayerNorm(C), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's layout: transformer.{wte, wpe, h, ln_f}, lm_head."""

    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C),
                                              h=nn.ModuleList(Block() for _ in range(N_LAYER)), ln_f=nn.LayerNorm(C)))
        self.lm_head = nn.Linear(C, V, bias=False)

    def embed(self, idx):
        return self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def gpt_stack(gamma=0.0):
    torch.manual_seed(0)
    gpt = GPT().double()
    idx = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(1))
    stack = models.residual_stack(
        gpt, stem=gpt.embed,
        blocks=[pair for b in gpt.transformer.h for pair in ((b.ln_1, b.attn), (b.ln_2, b.mlp))],
        head=lambda h: gpt.lm_head(gpt.transformer.ln_f(h)), gamma=gamma, example=idx)
    targets = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(2))
    return gpt, stack, idx, targets, sequence_cross_entropy


class Residual(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return x + self.f(x)


def mlp_stack():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 5), *(Residual(nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 5)))
                                           for _ in range(4)), nn.Linear(5, 3)).double()
    x = torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    stack = models.residual_stack(net, stem=net[0], blocks=[net[i].f for i in range(1, 5)], head=net[5], example=x)
    return net, stack, x, torch.randint(0, 3, (8,), generator=torch.Generator().manual_seed(2)), cross_entropy_loss


CASES = {"nanogpt": gpt_stack, "nanogpt gamma 0.2": lambda: gpt_stack(0.2), "sequential resnet": mlp_stack}


def grads(model, engine, x, y, loss):
    engine.compute_grads(model, x, y, loss)
    return {name: p.grad.clone() for name, p in trainable_parameters(model)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", ["reference", "batched"])
def test_highway_with_k_at_least_the_depth_is_backprop_on_a_users_model(case, path):
    user, stack, x, y, loss = CASES[case]()
    torch.testing.assert_close(stack(x), user(x), rtol=1e-12, atol=1e-12)  # the user's forward
    assert [p for p in stack.parameters()] == [p for p in user.parameters()]
    exact = grads(stack, trainers.build_engine("backprop"), x, y, loss)
    n = len(stack.blocks)
    got = grads(stack, trainers.build_engine("highway", k=n, path=path), x, y, loss)
    for name in exact:
        torch.testing.assert_close(got[name], exact[name], rtol=1e-10, atol=1e-12, msg=name)


def test_after_k_iterations_the_top_k_plus_one_sublayers_are_exact_on_nanogpt():
    user, stack, x, y, loss = gpt_stack()
    exact = grads(stack, trainers.build_engine("backprop"), x, y, loss)
    n = len(stack.blocks)
    for k in range(n - 1):
        got = grads(stack, trainers.build_engine("highway", k=k, path="reference"), x, y, loss)
        top = {id(p) for block in list(stack.blocks)[n - k - 1:] for p in block.parameters()}
        names = {name for name, p in trainable_parameters(stack) if id(p) in top}
        assert names and all(torch.allclose(got[nm], exact[nm], rtol=1e-10, atol=1e-12) for nm in names), k
        below = set(exact) - names - {"model.lm_head.weight", "model.transformer.ln_f.weight",
                                      "model.transformer.ln_f.bias"}
        assert any(not torch.allclose(got[nm], exact[nm], rtol=1e-6, atol=1e-9) for nm in below), k


def test_a_declaration_that_is_not_the_models_forward_is_refused_in_one_line():
    torch.manual_seed(0)
    gpt = GPT().double()
    idx = torch.randint(0, V, (2, T))
    with pytest.raises(models.ModelConfigError) as err:  # the MLP sublayers forgotten: another function
        models.residual_stack(gpt, stem=gpt.embed, blocks=[(b.ln_1, b.attn) for b in gpt.transformer.h],
                              head=lambda h: gpt.lm_head(gpt.transformer.ln_f(h)), example=idx)
    assert "do not compute the model's forward on the example" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(models.ModelConfigError, match=r"blocks\[0\] must be a module"):
        models.residual_stack(gpt, stem=gpt.embed, blocks=[lambda h: h], head=gpt.lm_head)
