"""A user's residual networks declared with models.residual_stack: a nanoGPT-style Transformer and
a ResNet-style MLP written with nn.Sequential; in float64, Highway-BP's identities as on the zoo."""

import inspect

import pytest
import torch
from helpers import GPT, GPTConfig, engine_grads, relative
from torch import nn

from gradengines import models, trainers
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy
from gradengines.trainers.core.engine import trainable_parameters

V, C, T, N_LAYER = 13, 8, 6, 2


def nanogpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=T, vocab_size=V, n_layer=N_LAYER, n_head=2, n_embd=C)).double()


def embed(gpt):
    """nanoGPT's stem, the residual stream's start: token and position embeddings (its dropout is off)."""
    return lambda idx: gpt.transformer.wte(idx) + gpt.transformer.wpe(torch.arange(idx.shape[1]))


def gpt_stack(gamma=0.0):
    gpt = nanogpt()
    idx = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(2))
    stack = models.residual_stack(
        gpt, stem=embed(gpt),
        blocks=[pair for b in gpt.transformer.h for pair in ((b.ln_1, b.attn), (b.ln_2, b.mlp))],
        head=lambda h: gpt.lm_head(gpt.transformer.ln_f(h)), gamma=gamma, example=(idx, targets))
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


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", ["reference", "batched"])
def test_highway_with_k_at_least_the_depth_is_backprop_on_a_users_model(case, path):
    user, stack, x, y, loss = CASES[case]()
    torch.testing.assert_close(stack(x), models.call_model(user, x, y).outputs, rtol=1e-12, atol=1e-12)  # its forward
    assert [p for p in stack.parameters()] == [p for p in user.parameters()]
    exact = engine_grads(stack, trainers.build_engine("backprop"), x, y, loss)
    n = len(stack.blocks)
    got = engine_grads(stack, trainers.build_engine("highway", k=n, path=path), x, y, loss)
    for name in exact:
        torch.testing.assert_close(got[name], exact[name], rtol=1e-10, atol=1e-12, msg=name)
    # the contrast on the same path: k = 0 keeps the residual path alone, not backprop
    assert relative(engine_grads(stack, trainers.build_engine("highway", k=0, path=path), x, y, loss), exact) > 1e-3


@pytest.mark.parametrize("path", ["reference", "batched"])
def test_after_k_iterations_the_top_k_plus_one_sublayers_are_exact_on_nanogpt(path):
    user, stack, x, y, loss = gpt_stack()
    exact = engine_grads(stack, trainers.build_engine("backprop"), x, y, loss)
    n = len(stack.blocks)
    for k in range(n - 1):
        got = engine_grads(stack, trainers.build_engine("highway", k=k, path=path), x, y, loss)
        top = {id(p) for block in list(stack.blocks)[n - k - 1:] for p in block.parameters()}
        names = {name for name, p in trainable_parameters(stack) if id(p) in top}
        assert names and all(torch.allclose(got[nm], exact[nm], rtol=1e-10, atol=1e-12) for nm in names), k
        below = set(exact) - names - {"model.lm_head.weight", "model.transformer.ln_f.weight",
                                      "model.transformer.ln_f.bias"}
        assert any(not torch.allclose(got[nm], exact[nm], rtol=1e-6, atol=1e-9) for nm in below), k


def declared_gpt(gpt, example=None):
    return models.residual_stack(
        gpt, stem=embed(gpt), blocks=[pair for b in gpt.transformer.h for pair in ((b.ln_1, b.attn), (b.ln_2, b.mlp))],
        head=lambda h: gpt.lm_head(gpt.transformer.ln_f(h)), example=example)


def test_a_stack_called_without_the_targets_its_forward_needs_gets_the_shapes_and_the_way_on():
    """nanoGPT returns only the last position's logits without targets: the right declaration, called as
    stack(idx), is told so with both shapes (it said "shapes differ; check their order and the norms")."""
    gpt = nanogpt()
    idx = torch.randint(0, V, (2, T))
    for call in (lambda: declared_gpt(gpt)(idx), lambda: declared_gpt(gpt, example=idx)):
        with pytest.raises(models.ModelConfigError) as err:
            call()
        message = str(err.value)
        assert f"the declared head returns (2, {T}, {V})" in message and f"is (2, 1, {V})" in message
        assert "call the stack with (inputs, targets)" in message and "example=(inputs, targets)" in message
    assert declared_gpt(gpt)(idx, idx).shape == (2, T, V)  # with its targets, the same declaration is accepted


def test_a_head_that_ends_at_another_output_than_the_one_read_is_told_which_was_read():
    class TwoOutputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.block, self.head = nn.Linear(4, 5), nn.Linear(5, 5), nn.Linear(5, 3)

        def forward(self, x):
            h = self.stem(x)
            h = h + self.block(h)
            return {"features": h, "scores": self.head(h)}

    net = models.declare_call(TwoOutputs().double(), output="features")
    x = torch.randn(2, 4, dtype=torch.float64)
    with pytest.raises(models.ModelConfigError) as err:
        models.residual_stack(net, stem=net.stem, blocks=[net.block], head=net.head, example=x)
    message = str(err.value)
    assert "the declared head returns (2, 3)" in message and "read as output='features', is (2, 5)" in message
    assert "--model-call output=" in message and "\n" not in message
    models.declare_call(net, output="scores")
    assert models.residual_stack(net, stem=net.stem, blocks=[net.block], head=net.head, example=x)(x).shape == (2, 3)


def test_a_declaration_that_is_not_the_models_forward_is_refused_in_one_line():
    gpt = nanogpt()
    idx = torch.randint(0, V, (2, T))
    with pytest.raises(models.ModelConfigError) as err:  # the MLP sublayers forgotten: another function
        models.residual_stack(gpt, stem=embed(gpt), blocks=[(b.ln_1, b.attn) for b in gpt.transformer.h],
                              head=lambda h: gpt.lm_head(gpt.transformer.ln_f(h)), example=(idx, idx))
    assert "do not compute the model's forward on the example" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(models.ModelConfigError, match=r"blocks\[0\] must be a module"):
        models.residual_stack(gpt, stem=embed(gpt), blocks=[lambda h: h], head=gpt.lm_head)


def test_a_declaration_is_checked_without_dropout_noise_while_the_model_trains():
    """The first-batch check of a declared stack compares in eval mode (issue 41: in training mode two forwards
    draw two dropout masks and a right declaration was refused); the model's mode is put back."""
    torch.manual_seed(0)
    branch = nn.Sequential(nn.Linear(5, 7), nn.Dropout(0.5), nn.Tanh(), nn.Linear(7, 5))
    net = nn.Sequential(nn.Linear(6, 5), Residual(branch), nn.Linear(5, 3)).double().train()
    stack = models.residual_stack(net, stem=net[0], blocks=[net[1].f], head=net[2])  # checked on the first batch
    assert stack(torch.randn(8, 6, dtype=torch.float64)).shape == (8, 3) and net.training


def test_nothing_declared_means_found_and_gamma_must_stay_below_one():
    """residual_stack(model, example=x) with no stem, blocks or head finds the structure; gamma in [0, 1)."""
    net, _, x, _, _ = mlp_stack()
    assert isinstance(models.residual_stack(net, example=x), models.adapters.discovery.ResidualFound)
    for gamma in (1.0, 1.5, -0.1):
        with pytest.raises(models.ModelConfigError, match=r"gamma must be in \[0, 1\)"):
            models.residual_stack(net, stem=net[0], blocks=[net[1].f], head=net[5], gamma=gamma)


def test_a_shape_mismatch_of_the_same_size_is_not_blamed_on_missing_targets():
    """Only a model output smaller than the head's (nanoGPT's last position without targets) points at the
    targets; the same number of elements in another shape points at the head (issue 41: > read as >=)."""

    class Transposed(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.block, self.head = nn.Linear(4, 3), nn.Linear(3, 3), nn.Linear(3, 2)

        def forward(self, x, targets=None):
            h = self.stem(x)
            return self.head(h + self.block(h)).t()  # (2, B): the scores transposed

    net = Transposed().double()
    with pytest.raises(models.ModelConfigError, match="a head that ends at another output") as err:
        models.residual_stack(net, stem=net.stem, blocks=[net.block], head=net.head)(torch.randn(5, 4).double())
    assert "call the stack with (inputs, targets)" not in str(err.value)


@pytest.mark.parametrize("call, message", [
    (lambda: models.residual_stack(nn.Linear(3, 3), example=torch.zeros(0, 3)),
     "residual_stack: the example is empty (shape (0, 3)); give a batch of at least one input"),
    (lambda: models.residual_stack(nn.Linear(3, 3), example=torch.zeros(0)),
     "residual_stack: the example is empty (shape (0,))"),
    (lambda: models.residual_stack(lambda x: x, example=torch.zeros(2, 3)),
     "residual_stack needs a torch.nn.Module, got a function"),
    (lambda: models.declare_call(lambda x: x, loss="own"), "declare_call needs a torch.nn.Module, got a function"),
    (lambda: models.declare_call(nn.Linear(3, 3), los="own"), "declare_call has no field los; its fields: "),
])
def test_the_python_apis_bad_arguments_are_the_projects_one_line_errors(call, message):
    with pytest.raises(models.ModelConfigError) as refused:
        call()
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


class NamedLikeAStack(nn.Module):
    """Attributes named ``stem``, ``blocks``, ``head`` (as many models name them) whose blocks have no
    ``branch``/``combine``: not a declaration. ``kinds``: the block classes in order."""

    def __init__(self, kinds):
        super().__init__()
        self.stem, self.head = nn.Linear(6, 5), nn.Linear(5, 3)
        self.blocks = nn.ModuleList(kind() for kind in kinds)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class TanhBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 5))

    def forward(self, h):
        return h + self.f(h)


class SineBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Linear(5, 5)

    def forward(self, h):
        return h + torch.sin(self.f(h))


def test_attributes_named_stem_blocks_head_are_no_declaration_the_stack_is_found_and_checked(tmp_path, capsys):
    """Only what ``residual_stack`` returns (or a stack as documented) skips discovery: the named attributes are
    found, and blocks of two classes alternating in one ModuleList (a hybrid, as Jamba's Mamba and attention
    layers) are one chain: exact at k >= L with the k = 0 and k = L/2 contrasts; from the command line it is
    found, self-checked and trained, never an AttributeError at step 0."""
    torch.manual_seed(0)
    x = torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (8,), generator=torch.Generator().manual_seed(2))
    for kinds, said in (([TanhBlock] * 3, "3 blocks (TanhBlock in blocks)"),
                        ([TanhBlock, SineBlock, TanhBlock, SineBlock], "4 blocks (TanhBlock, SineBlock in blocks)")):
        model = NamedLikeAStack(kinds).double()
        with pytest.raises(trainers.IncompatibleModelError, match="needs a residual stack"):
            trainers.build_engine("highway").check(model)
        stack = models.residual_stack(model, example=(x, y))
        assert stack.found.startswith(said) and len(stack.blocks) == len(kinds)
        exact = engine_grads(stack, trainers.build_engine("backprop"), x, y)
        assert relative(engine_grads(stack, trainers.build_engine("highway", k=len(kinds)), x, y), exact) < 1e-10
        for k in (0, len(kinds) // 2):
            assert relative(engine_grads(stack, trainers.build_engine("highway", k=k), x, y), exact) > 1e-3
    source = "\n\n".join(inspect.getsource(c) for c in (NamedLikeAStack, TanhBlock, SineBlock))
    (tmp_path / "named.py").write_text(
        f"import torch\nfrom torch import nn\n\n{source}\n\nclass Mixed(NamedLikeAStack):\n"
        "    def __init__(self):\n        super().__init__([TanhBlock, SineBlock, TanhBlock, SineBlock])\n"
        "        self.stem, self.head = nn.Linear(64, 5), nn.Linear(5, 10)\n")
    from gradengines.trainers.cli import train_main
    code = train_main(["--trainer", "highway", "--model", f"{tmp_path / 'named.py'}:Mixed", "--steps", "1",
                       "--logdir", str(tmp_path / "runs"), "--progress", "false"])
    err = capsys.readouterr().err
    assert code == 0 and "note: highway: found 4 blocks (TanhBlock, SineBlock in blocks)" in err, err
    assert len(list((tmp_path / "runs").rglob("result.json"))) == 1
