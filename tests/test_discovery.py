"""models.residual_stack(model, example=...) with nothing declared: the stem, blocks and head found from
one example run (models/adapters/discovery.py), in float64 on models written in plain torch with the
shapes of nanoGPT, the original ResNet (ReLU(h + z), downsampling blocks with projection shortcuts,
in-place ReLU) and BERT (post-LN). Highway-BP on the found stack is backprop at k >= L and not at k = 0;
the combine found and its Jacobian factor K agree with a hand computation at k = 0."""

import pytest
import torch
from helpers import autograd_grads, engine_grads, relative
from torch import nn
from torch.nn import functional as F

from gradengines import models, trainers
from gradengines.models.adapters.discovery import ResidualFound
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy

V, T, B = 11, 6, 3


class Block(nn.Module):
    """nanoGPT's pre-LN block: h + attn(ln_1(h)), then + mlp(ln_2(.)); the attention a causal mean."""

    def __init__(self, n):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(n), nn.Linear(n, n)
        self.ln_2, self.mlp = nn.LayerNorm(n), nn.Sequential(nn.Linear(n, 2 * n), nn.GELU(), nn.Linear(2 * n, n))

    def forward(self, x, mask):
        a = self.attn(self.ln_1(x))
        x = x + torch.einsum("ts,bsn->btn", mask, a)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's layout; the causal mask and the positions are built from each batch's length."""

    def __init__(self, n=8, layers=3):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, n), wpe=nn.Embedding(16, n),
                                              h=nn.ModuleList(Block(n) for _ in range(layers)), ln_f=nn.LayerNorm(n)))
        self.lm_head = nn.Linear(n, V, bias=False)

    def forward(self, idx):
        t = self.transformer
        steps = idx.shape[1]
        mask = torch.tril(torch.ones(steps, steps, dtype=t.wte.weight.dtype))
        mask = mask / mask.sum(1, keepdim=True)
        x = t.wte(idx) + t.wpe(torch.arange(steps))
        for block in t.h:
            x = block(x, mask)
        return self.lm_head(t.ln_f(x))


class BasicBlock(nn.Module):
    """The original ResNet block: ReLU(h + bn(conv(relu(bn(conv(h)))))), a projection shortcut when it
    downsamples; in-place ReLUs, as timm's."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.act2 = nn.ReLU(inplace=True)
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) \
            if stride != 1 or cin != cout else None

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.bn2(self.conv2(self.act1(self.bn1(self.conv1(x)))))
        return self.act2(x + shortcut)


class ResNet(nn.Module):
    def __init__(self, stages=((4, 2), (6, 2))):
        super().__init__()
        self.conv1, self.bn1, self.act1 = nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU()
        layers, cin = [], 4
        for i, (cout, n) in enumerate(stages):
            layers.append(nn.Sequential(*(BasicBlock(cin if j == 0 else cout, cout, 2 if i and j == 0 else 1)
                                          for j in range(n))))
            cin = cout
        self.layer1, self.layer2 = layers
        self.fc = nn.Linear(cin, 10)

    def forward(self, x):
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(x.mean((2, 3)))


class SelfOutput(nn.Module):
    """BERT's sublayer end: LayerNorm(dense(x) + input)."""

    def __init__(self, n, inner):
        super().__init__()
        self.dense, self.LayerNorm = nn.Linear(inner, n), nn.LayerNorm(n)

    def forward(self, x, input_tensor):
        return self.LayerNorm(self.dense(x) + input_tensor)


class Attention(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.self, self.output = nn.Linear(n, n), SelfOutput(n, n)

    def forward(self, h, mask):
        return self.output(torch.tanh(self.self(h)) * mask, h), None  # a tuple, as transformers' attention


class PostLNLayer(nn.Module):
    """BERT's layer: h1 = LN(h + attention(h)), h2 = LN(h1 + ffn(h1))."""

    def __init__(self, n):
        super().__init__()
        self.attention, self.intermediate, self.output = Attention(n), nn.Linear(n, 2 * n), SelfOutput(n, 2 * n)

    def forward(self, h, mask):
        h1, _ = self.attention(h, mask)
        return self.output(F.gelu(self.intermediate(h1)), h1)


class Bert(nn.Module):
    def __init__(self, n=8, layers=2, classes=4):
        super().__init__()
        self.embed, self.norm = nn.Embedding(V, n), nn.LayerNorm(n)
        self.layer = nn.ModuleList(PostLNLayer(n) for _ in range(layers))
        self.classifier = nn.Linear(n, classes)

    def forward(self, idx):
        h = self.norm(self.embed(idx))
        mask = (idx != 0).to(h.dtype)[..., None]  # built from the batch: must not be replayed stale
        for layer in self.layer:
            h = layer(h, mask)
        return self.classifier(h[:, 0])


def randomised(model):
    """BatchNorm with non-trivial affine parameters and statistics (a fresh one is the identity)."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                for t, lo in ((m.weight, 0.5), (m.running_var, 0.5)):
                    t.copy_(torch.rand(t.shape, generator=gen, dtype=t.dtype) + lo)
                for t in (m.bias, m.running_mean):
                    t.copy_(0.2 * torch.randn(t.shape, generator=gen, dtype=t.dtype))
    return model


def gpt_case():
    torch.manual_seed(0)
    return GPT().double().eval(), torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T)), sequence_cross_entropy


def resnet_case():
    torch.manual_seed(0)
    model = randomised(ResNet().double()).eval()
    return model, torch.randn(B, 1, 8, 8, dtype=torch.float64), torch.tensor([1, 4, 7]), cross_entropy_loss


def bert_case():
    torch.manual_seed(0)
    x = torch.randint(1, V, (B, T))
    x[0, -2:] = 0  # padding: the mask matters
    return Bert().double().eval(), x, torch.tensor([0, 3, 1]), cross_entropy_loss


CASES = {"nanogpt": gpt_case, "resnet": resnet_case, "bert": bert_case}
FOUND = {"nanogpt": "3 blocks (Block in transformer.h) as 6 residual sublayers: 6 h + z",
         "resnet": "4 blocks (BasicBlock in layer1, layer2) as 4 residual sublayers: 3 ReLU(h + z), "
                   "1 exact boundaries (a shape change)",
         "bert": "2 blocks (PostLNLayer in layer) as 4 residual sublayers: 4 LayerNorm(h + z)"}
DEPTH = {"nanogpt": 6, "resnet": 2, "bert": 4}  # the longest segment


def stack_grads(stack, engine, x, y, loss_fn):
    """The engine's grads on a stack, named as its model's parameters (without ``model.``)."""
    return engine_grads(stack, engine, x, y, loss_fn, strip="model.")


@pytest.mark.parametrize("case", list(CASES))
def test_the_structure_found_is_said_and_highway_at_full_k_is_backprop(case):
    model, x, y, loss_fn = CASES[case]()
    stack = models.residual_stack(model, example=x)
    assert isinstance(stack, ResidualFound) and stack.found == FOUND[case]
    exact = autograd_grads(model, loss_fn(model(x), y))
    assert relative(stack_grads(stack, trainers.build_engine("highway", k=DEPTH[case]), x, y, loss_fn),
                    exact) < 1e-12
    assert relative(stack_grads(stack, trainers.build_engine("highway", k=0), x, y, loss_fn), exact) > 1e-3


@pytest.mark.parametrize("case", ["nanogpt", "bert"])
def test_what_the_stem_passes_the_blocks_is_rebuilt_for_each_batch(case):
    model, x, y, loss_fn = CASES[case]()
    stack = models.residual_stack(model, example=x)  # found on (3, 6)
    x2 = torch.randint(1, V, (2, T - 2))
    x2[1, -1] = 0
    y2 = torch.randint(0, V, (2, T - 2)) if case == "nanogpt" else torch.tensor([2, 0])
    exact = autograd_grads(model, loss_fn(model(x2), y2))
    got = stack_grads(stack, trainers.build_engine("highway", k=DEPTH[case]), x2, y2, loss_fn)
    assert relative(got, exact) < 1e-12  # a causal mask or padding mask of the example would not fit


def test_the_found_nanogpt_stack_is_the_hand_declared_one():
    model, x, y, loss_fn = gpt_case()
    t = model.transformer

    class Attend(nn.Module):  # the hand declaration needs the mask: a wrapper, as users wrote them
        def __init__(self, attn):
            super().__init__()
            self.attn = attn

        def forward(self, h):
            steps = h.shape[1]
            mask = torch.tril(torch.ones(steps, steps, dtype=h.dtype))
            return torch.einsum("ts,bsn->btn", mask / mask.sum(1, keepdim=True), self.attn(h))

    hand = models.residual_stack(
        model, stem=lambda idx: t.wte(idx) + t.wpe(torch.arange(idx.shape[1])),
        blocks=[pair for b in t.h for pair in ((b.ln_1, Attend(b.attn)), (b.ln_2, b.mlp))],
        head=lambda h: model.lm_head(t.ln_f(h)), example=x)
    found = models.residual_stack(model, example=x)
    assert len(found.blocks) == len(hand.blocks) == 6
    for k in (0, 1, 2):  # the same split gives the same approximate gradient, not only the same exact one
        engine = trainers.build_engine("highway", k=k)
        assert relative(stack_grads(found, engine, x, y, loss_fn), stack_grads(hand, engine, x, y, loss_fn)) < 1e-12


def test_highway_k0_on_relu_blocks_carries_the_relu_masks_to_the_stem():
    """k = 0: the stem receives e_top K_L ... K_1 with K_i = diag(1[h_{i-1} + z_i > 0]), through the one
    boundary exactly (a hand computation with the model's own modules)."""
    model, x, y, loss_fn = resnet_case()
    stack = models.residual_stack(model, example=x)
    stem = [model.conv1, model.bn1]
    h0 = model.act1(model.bn1(model.conv1(x)))
    b1, b2 = model.layer1
    b3, b4 = model.layer2

    def residual(block, h):  # z: the block's output before its final ReLU, less h
        return block.bn2(block.conv2(torch.relu(block.bn1(block.conv1(h)))))

    with torch.no_grad():
        z1 = residual(b1, h0)
        h1 = torch.relu(h0 + z1)
        z2 = residual(b2, h1)
        h2 = torch.relu(h1 + z2)
        h3 = b3(h2.clone())
        z4 = residual(b4, h3)
    top = torch.relu(h3 + z4).requires_grad_()
    e = torch.autograd.grad(loss_fn(model.fc(top.mean((2, 3))), y), top)[0]
    w3 = e * (h3 + z4 > 0)  # k = 0: the segment [b4] carries e by its ReLU mask only
    x3 = h2.clone().requires_grad_()
    w2 = torch.autograd.grad(b3(x3), x3, w3)[0]  # the boundary: exact
    w0 = w2 * (h1 + z2 > 0) * (h0 + z1 > 0)
    params = [p for m in stem for p in m.parameters()]
    expected = torch.autograd.grad(model.act1(model.bn1(model.conv1(x))), params, w0)
    stack_grads(stack, trainers.build_engine("highway", k=0), x, y, loss_fn)
    for p, g in zip(params, expected, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-12, atol=1e-14)


def test_highway_k0_on_post_ln_blocks_carries_gamma_over_sigma_to_the_stem():
    """k = 0: LN(h + z) = h a + b with a = gamma / sigma(h + z): the stem receives e_top a_L ... a_1."""
    model, x, y, loss_fn = bert_case()
    stack = models.residual_stack(model, example=x)
    h = model.norm(model.embed(x)).detach()
    mask = (x != 0).to(h.dtype)[..., None]
    scales = []
    for layer in model.layer:
        with torch.no_grad():
            attn = layer.attention
            u1 = attn.output.dense(torch.tanh(attn.self(h)) * mask) + h
            h1 = attn.output.LayerNorm(u1)
            u2 = layer.output.dense(F.gelu(layer.intermediate(h1))) + h1
            h = layer.output.LayerNorm(u2)
        for u, norm in ((u1, attn.output.LayerNorm), (u2, layer.output.LayerNorm)):
            scales.append(norm.weight / torch.sqrt(u.var(-1, unbiased=False, keepdim=True) + norm.eps))
    top = h.requires_grad_()
    e = torch.autograd.grad(loss_fn(model.classifier(top[:, 0]), y), top)[0]
    w0 = e * torch.stack(scales).prod(0)
    params = [*model.embed.parameters(), *model.norm.parameters()]
    expected = torch.autograd.grad(model.norm(model.embed(x)), params, w0)
    stack_grads(stack, trainers.build_engine("highway", k=0), x, y, loss_fn)
    for p, g in zip(params, expected, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-12, atol=1e-14)


def test_batchnorm_in_training_mode_is_exact_and_updated_once_per_step():
    model, x, y, loss_fn = resnet_case()
    model.train()
    stack = models.residual_stack(model, example=x)
    reference = randomised(ResNet().double()).train()
    reference.load_state_dict(model.state_dict())
    exact = autograd_grads(reference, loss_fn(reference(x), y))
    got = stack_grads(stack, trainers.build_engine("highway", k=2), x, y, loss_fn)
    assert relative(got, exact) < 1e-12
    for (name, a), b in zip(model.named_buffers(), reference.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14, msg=name)  # the stem's statistics once


def test_gamma_splits_the_found_residual_as_the_paper():
    model, x, y, loss_fn = gpt_case()
    plain, split = models.residual_stack(model, example=x), models.residual_stack(model, example=x, gamma=0.2)
    assert split.found.endswith("6 0.8 h + z")
    exact = autograd_grads(model, loss_fn(model(x), y))
    assert relative(stack_grads(split, trainers.build_engine("highway", k=6), x, y, loss_fn), exact) < 1e-12
    k1 = trainers.build_engine("highway", k=1)
    assert relative(stack_grads(split, k1, x, y, loss_fn), stack_grads(plain, k1, x, y, loss_fn)) > 1e-3


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Linear(4, 4)

    def forward(self, x):
        return x + self.f(x)


class Shared(nn.Module):
    """One residual block applied three times (tied weights)."""

    def __init__(self):
        super().__init__()
        self.block = Residual()

    def forward(self, x):
        for _ in range(3):
            x = self.block(x)
        return x


@pytest.mark.parametrize("model, expected", [
    (Plain(), "found no repeated blocks in Plain"),
    (Shared(), "block is called more than once in a row \\(shared weights\\)"),
])
def test_a_model_without_found_blocks_is_refused_in_one_line(model, expected):
    with pytest.raises(models.ModelConfigError, match=expected) as info:
        models.residual_stack(model, example=torch.randn(2, 4))
    assert "\n" not in str(info.value)


def test_the_highway_refusal_of_a_plain_model_names_residual_stack():
    with pytest.raises(trainers.IncompatibleModelError, match=r"models.residual_stack\(model, example=inputs\)"):
        trainers.build_engine("highway").check(Plain())


def test_a_declaration_without_example_is_checked_on_its_first_batch():
    model, x, y, loss_fn = gpt_case()
    t = model.transformer
    wrong = models.residual_stack(model, stem=t.wte, blocks=[b.mlp for b in t.h], head=model.lm_head)  # no example
    with pytest.raises(models.ModelConfigError, match="do not compute the model's forward on the first batch"):
        trainers.build_engine("highway", k=1).compute_grads(wrong, x, y, loss_fn)


class TupleMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Linear(4, 4)

    def forward(self, h):
        return self.f(h), "aux"


def test_a_sublayer_returning_a_tuple_is_read_as_a_models_output():
    torch.manual_seed(0)
    stem, f1, f2, head = nn.Linear(3, 4), TupleMLP(), TupleMLP(), nn.Linear(4, 2)
    net = nn.ModuleList([stem, f1, f2, head]).double()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1])

    def forward(inputs):
        h = stem(inputs)
        for f in (f1, f2):
            h = h + f(h)[0]
        return head(h)

    stack = models.residual_stack(net, stem=stem, blocks=[f1, f2], head=head)
    exact = autograd_grads(net, cross_entropy_loss(forward(x), y))
    net.forward = forward  # what the first batch's check compares with
    assert relative(stack_grads(stack, trainers.build_engine("highway", k=2), x, y, cross_entropy_loss),
                    exact) < 1e-12


def test_the_command_line_says_why_no_residual_stack_was_found(tmp_path, capsys):
    from gradengines.trainers.cli import train_main

    (tmp_path / "plain.py").write_text("import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n"
                                       "    def __init__(self):\n        super().__init__()\n"
                                       "        self.a, self.b = nn.Linear(64, 8), nn.Linear(8, 10)\n\n"
                                       "    def forward(self, x):\n        return self.b(torch.tanh(self.a(x)))\n")
    code = train_main(["--model", f"{tmp_path / 'plain.py'}:Net", "--trainer", "highway", "--steps", "1",
                       "--logdir", str(tmp_path / "runs"), "--progress", "false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "trainer 'highway' needs a residual stack or recurrent layers, and none was found in Net" in err[0]
    assert not (tmp_path / "runs").exists()


def test_compare_takes_each_trainers_options_with_its_name(tmp_path, capsys):
    from gradengines.trainers.cli import compare_main
    from gradengines.trainers.cli.args import trainer_runs

    assert trainer_runs("backprop, highway:k=1,highway:k=4:tol=0.01") == {
        "backprop": ("backprop", {}), "highway-k1": ("highway", {"k": 1}),
        "highway-k4-tol0.01": ("highway", {"k": 4, "tol": 0.01})}
    for text in ("highway:k=1,highway:k=1", ""):
        with pytest.raises(trainers.ConfigError, match="must list each trainer once"):
            trainer_runs(text)
    code = compare_main(["--trainers", "backprop,highway:kk=1", "--model", "residual_mlp", "--depth", "2",
                         "--steps", "1", "--seeds", "0", "--logdir", str(tmp_path / "runs"), "--progress", "false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "kk" in err[0] and not (tmp_path / "runs").exists()


class RotaryBlock(nn.Module):
    """A decoder layer reading its own (cos, sin) tables besides the state, as Gemma 3n's layers do."""

    def __init__(self, width):
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, h, rope):
        cos, sin = rope
        return h + self.proj(self.norm(h) * cos + torch.roll(h, 1, -1) * sin)


class PerLayerTables(nn.Module):
    """Sliding and full layers alternate, each handed its own tuple of tables (tensors compared by identity)."""

    def __init__(self, width=6, depth=4):
        super().__init__()
        self.embed, self.head = nn.Linear(5, width), nn.Linear(width, 3)
        self.layers = nn.ModuleList(RotaryBlock(width) for _ in range(depth))
        angles = torch.linspace(0, 1, width)
        self.tables = [(torch.cos(angles * (1 + i % 2)), torch.sin(angles * (1 + i % 2))) for i in range(depth)]

    def forward(self, x):
        h = self.embed(x)
        for layer, rope in zip(self.layers, self.tables, strict=True):
            h = layer(h, rope)
        return self.head(h)


def test_blocks_each_given_their_own_tuple_of_tensors_are_found_and_exact_never_a_traceback():
    """Discovery compared the arguments blocks receive with ==, and a tuple of tensors made it evaluate a tensor's
    truth (RuntimeError on Gemma 3n): tuples are compared item by item, tensors by identity; the blocks are found,
    and Highway-BP at k >= L equals autograd."""
    torch.manual_seed(0)
    model = PerLayerTables().double()
    x, y = torch.randn(8, 5, dtype=torch.float64), torch.randint(0, 3, (8,))
    stack = models.residual_stack(model, example=(x[:2], y[:2]))
    assert "4 blocks (RotaryBlock in layers)" in stack.found
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    assert relative(engine_grads(stack, trainers.build_engine("highway", k=4), x, y, strip="model."), exact) < 1e-10
