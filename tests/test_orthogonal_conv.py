"""Tests of models/orthogonal/conv.py and models/zoo/cnn.py: orthogonal convolutions,
their adjoints, and the orthogonal CNN layer stacks (ortho_lenet, ortho_convnet)."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import relative
from torch import nn

from gradengines import models, tasks, trainers
from gradengines.models.errors import ModelConfigError
from gradengines.models.orthogonal import orthogonal_method, orthogonality_error
from gradengines.models.orthogonal.conv import FlattenLinear, OrthoConvBlock, OrthogonalConv2d, SpaceToDepth
from gradengines.models.zoo.cnn import OrthoConvNet, OrthoLeNet, infer_image_shape
from gradengines.trainers.core.protocols import LayerStack
from gradengines.trainers.engines.backprop import Backprop

TOL64 = 1e-12
TOL32 = 1e-5

# (C_in, C_out, k, H, W): square channels (several kernels, H != W, odd sizes,
# kernel larger than the image) and narrowing channels (rows orthonormal)
SQUARE = [(4, 4, 3, 4, 4), (3, 3, 1, 5, 7), (2, 2, 5, 3, 3), (6, 6, 3, 6, 4), (1, 1, 3, 8, 8)]
NARROW = [(6, 3, 3, 5, 6), (8, 5, 1, 4, 7), (16, 4, 3, 2, 2), (4, 1, 2, 3, 4)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: on a shared, busy CPU oversubscribed intra-op threads slow
    these tests down by 10-100x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _conv(ci, co, k, h, w, dtype=torch.float64, seed=0, **kwargs):
    torch.manual_seed(seed)
    return OrthogonalConv2d(ci, co, k, (h, w), **kwargs).to(dtype)


def _linear_part(layer, x):
    """A x without bias (the bias is layer(0))."""
    return layer(x) - layer(torch.zeros_like(x))


def _dense(layer, in_shape, dtype=torch.float64):
    """The matrix (d_out, d_in) of the linear part of ``layer`` from the basis vectors."""
    n = math.prod(in_shape)
    basis = torch.eye(n, dtype=dtype).reshape(n, *in_shape)
    with torch.no_grad():
        return _linear_part(layer, basis).reshape(n, -1).T


def _randn(*shape, dtype=torch.float64, seed=1):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- #
# OrthogonalConv2d: orthogonality
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("ci, co, k, h, w", SQUARE)
def test_square_conv_preserves_norm_float64(ci, co, k, h, w):
    conv = _conv(ci, co, k, h, w, bias=False)
    x = _randn(5, ci, h, w)
    with torch.no_grad():
        y = conv(x)
    assert y.shape == (5, co, h, w)
    # per sample: ||W x|| = ||x||, and also W^T W x = x (orthogonal, invertible)
    assert torch.allclose(y.flatten(1).norm(dim=1), x.flatten(1).norm(dim=1), rtol=TOL64, atol=0)
    assert relative(conv.adjoint(y), x) < TOL64
    assert conv.orthogonality_error() < TOL64


@pytest.mark.parametrize("ci, co, k, h, w", SQUARE[:2] + NARROW)
def test_dense_gram_is_identity_float64(ci, co, k, h, w):
    A = _dense(_conv(ci, co, k, h, w), (ci, h, w))  # bias removed by _dense
    assert A.shape == (co * h * w, ci * h * w)
    eye = torch.eye(A.shape[0], dtype=A.dtype)
    assert (A @ A.T - eye).abs().max().item() < TOL64


@pytest.mark.parametrize("ci, co, k, h, w", NARROW)
def test_narrowing_conv_rows_orthonormal(ci, co, k, h, w):
    conv = _conv(ci, co, k, h, w)
    v = _randn(4, co, h, w)
    with torch.no_grad():
        u = conv.adjoint(v)  # W^T v
        back = _linear_part(conv, u)  # W W^T v
    assert u.shape == (4, ci, h, w)
    assert torch.allclose(u.flatten(1).norm(dim=1), v.flatten(1).norm(dim=1), rtol=TOL64, atol=0)
    assert relative(back, v) < TOL64
    # and it does lose information in the other direction (not an isometry on inputs)
    x = _randn(4, ci, h, w, seed=2)
    assert (_linear_part(conv, x).flatten(1).norm(dim=1) < x.flatten(1).norm(dim=1) * (1 - 1e-6)).all()


def test_float32_orthogonality():
    conv = _conv(6, 4, 3, 6, 5, dtype=torch.float32)
    assert conv.orthogonality_error() < TOL32
    A = _dense(conv, (6, 6, 5), dtype=torch.float32).double()
    assert (A @ A.T - torch.eye(A.shape[0], dtype=A.dtype)).abs().max().item() < TOL32


def test_zero_kernel_is_identity_on_first_channels():
    conv = _conv(5, 3, 3, 4, 4, init_scale=0.0, bias=False)
    x = _randn(2, 5, 4, 4)
    with torch.no_grad():
        assert relative(conv(x), x[:, :3]) < TOL64


def test_is_a_circular_convolution():
    """Translation equivariance: rolling the input rolls the output (bias included)."""
    conv = _conv(3, 2, 3, 5, 6)
    with torch.no_grad():
        conv.bias.normal_()
        x = _randn(2, 3, 5, 6)
        shifted = conv(torch.roll(x, shifts=(2, -1), dims=(2, 3)))
        assert relative(shifted, torch.roll(conv(x), shifts=(2, -1), dims=(2, 3))) < TOL64


def test_small_kernel_is_local():
    """A 1x1 kernel gives a per-pixel channel map: output pixel depends on that input pixel only."""
    conv = _conv(4, 4, 1, 5, 5, bias=False)
    x = torch.zeros(1, 4, 5, 5, dtype=torch.float64)
    x[0, :, 2, 3] = _randn(4)
    with torch.no_grad():
        y = conv(x)
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[2, 3] = False
    assert y[0][:, mask].abs().max().item() < TOL64
    assert y[0, :, 2, 3].norm() > 0.1


# --------------------------------------------------------------------------- #
# Adjoints: <A x, v> = <x, A^T v>, and A^T v = autograd VJP
# --------------------------------------------------------------------------- #
def _layers(dtype):
    torch.manual_seed(0)
    cases = {
        "conv_square": (OrthogonalConv2d(4, 4, 3, (4, 5)), (4, 4, 5)),
        "conv_narrow": (OrthogonalConv2d(6, 2, 3, (3, 4)), (6, 3, 4)),
        "space_to_depth": (SpaceToDepth(2, (3, 4, 6)), (3, 4, 6)),
        "space_to_depth_free": (SpaceToDepth(2), (2, 6, 2)),
        "flatten_linear": (FlattenLinear((2, 3, 4), 7), (2, 3, 4)),
        "flatten_linear_expm": (FlattenLinear((2, 3, 4), 7, orthogonal="expm"), (2, 3, 4)),
        "flatten_linear_bjorck": (FlattenLinear((4, 2, 2), 5, bias=False, orthogonal="bjorck"), (4, 2, 2)),
        "block": (OrthoConvBlock((2, 4, 8), 6, 3, downsample=1), (2, 4, 8)),
        "block_two_steps": (OrthoConvBlock((1, 8, 4), 16, 3, downsample=2), (1, 8, 4)),
    }
    return {name: (layer.to(dtype), shape) for name, (layer, shape) in cases.items()}


@pytest.mark.parametrize("dtype, tol", [(torch.float64, TOL64), (torch.float32, TOL32)])
def test_adjoint_identity(dtype, tol):
    for name, (layer, in_shape) in _layers(dtype).items():
        x = _randn(3, *in_shape, dtype=dtype)
        with torch.no_grad():
            Ax = _linear_part(layer, x)
            v = _randn(*Ax.shape, dtype=dtype, seed=2)
            ATv = layer.adjoint(v)
        assert ATv.shape == x.shape, name
        lhs, rhs = (Ax * v).sum().item(), (x * ATv).sum().item()
        scale = (Ax.norm() * v.norm()).item()
        assert abs(lhs - rhs) <= tol * scale, (name, lhs, rhs)


def test_adjoint_equals_autograd_vjp():
    for name, (layer, in_shape) in _layers(torch.float64).items():
        x = _randn(3, *in_shape).requires_grad_(True)
        y = layer(x)
        v = _randn(*y.shape, seed=3)
        (vjp,) = torch.autograd.grad((y * v).sum(), x)
        assert relative(layer.adjoint(v), vjp) < TOL64, name


def test_adjoint_of_block_is_reverse_composition():
    torch.manual_seed(0)
    block = OrthoConvBlock((1, 8, 8), 4, 3, downsample=1).double()
    v = _randn(2, 4, 4, 4)
    expected = F.pixel_shuffle(block.conv.adjoint(v), 2)
    assert torch.equal(block.adjoint(v), expected)
    assert block.out_shape == (4, 4, 4) and block.out_features == 64


def test_space_to_depth_is_a_permutation():
    s = SpaceToDepth(2, (2, 4, 6))
    A = _dense(s, (2, 4, 6))
    assert torch.equal(A @ A.T, torch.eye(48, dtype=A.dtype))
    assert set(A.flatten().tolist()) == {0.0, 1.0}
    x = _randn(2, 2, 4, 6)
    assert torch.equal(s.adjoint(s(x)), x)


def test_flatten_linear_wraps_a_linear():
    layer = FlattenLinear((2, 3, 4), 8, orthogonal="cayley")
    assert isinstance(layer.linear, nn.Linear) and orthogonal_method(layer.linear) == "cayley"
    assert orthogonality_error(layer) < TOL32
    x = _randn(3, 2, 3, 4, dtype=torch.float32)
    assert torch.equal(layer(x), layer(x.flatten(1)))  # flat or shaped input
    v = _randn(3, 8, dtype=torch.float32)
    assert torch.allclose(layer.adjoint(v), (v @ layer.linear.weight).reshape(3, 2, 3, 4))


# --------------------------------------------------------------------------- #
# Training the conv parameters
# --------------------------------------------------------------------------- #
def test_gradients_flow_and_step_keeps_orthogonality():
    conv = _conv(4, 3, 3, 4, 4)
    opt = torch.optim.Adam(conv.parameters(), lr=0.1)
    x = _randn(8, 4, 4, 4)
    target = _randn(8, 3, 4, 4, seed=5)
    before = conv.weight.detach().clone()
    losses = []
    for _ in range(5):
        loss = (conv(x) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        assert conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0
        assert torch.isfinite(conv.weight.grad).all() and conv.bias.grad.abs().sum() > 0
        opt.step()
        losses.append(loss.item())
    assert (conv.weight - before).abs().max() > 1e-2  # it moved
    assert losses[-1] < losses[0]
    A = _dense(conv, (4, 4, 4))
    assert (A @ A.T - torch.eye(A.shape[0], dtype=A.dtype)).abs().max().item() < TOL64


def test_bad_conv_options():
    with pytest.raises(ModelConfigError, match="out_channels <= in_channels"):
        OrthogonalConv2d(2, 3, 3, (4, 4))
    with pytest.raises(ModelConfigError):
        OrthogonalConv2d(2, 2, 0, (4, 4))
    with pytest.raises(ModelConfigError):
        OrthogonalConv2d(2, 2, 3, (4,))
    with pytest.raises(ModelConfigError, match="divisible"):
        SpaceToDepth(2, (1, 5, 4))
    with pytest.raises(ModelConfigError, match="out_channels <= in_channels"):
        OrthoConvBlock((1, 4, 4), 5, downsample=1)
    with pytest.raises(ValueError):
        _conv(2, 2, 3, 4, 4)(torch.zeros(1, 2, 4, 5, dtype=torch.float64))


# --------------------------------------------------------------------------- #
# The CNN layer stacks
# --------------------------------------------------------------------------- #
MODELS = {
    "ortho_lenet": dict(),
    "ortho_convnet": dict(depth=3),
}


def _model(name, dtype=torch.float32, seed=0, **options):
    torch.manual_seed(seed)
    return models.build(name, in_features=64, out_features=10, **{**MODELS[name], **options}).to(dtype)


def test_registered():
    assert {"ortho_lenet", "ortho_convnet"} <= set(models.available())
    assert isinstance(_model("ortho_lenet"), OrthoLeNet)
    assert isinstance(_model("ortho_convnet"), OrthoConvNet)


@pytest.mark.parametrize("name", MODELS)
def test_model_shapes_and_protocol(name):
    model = _model(name)
    assert isinstance(model, LayerStack)
    assert len(model.dropouts) == len(model.layers) - 1
    x = _randn(5, 64, dtype=torch.float32)
    h0 = model.input_features(x)
    assert h0.shape == (5, 1, 8, 8) and torch.equal(h0.flatten(1), x)
    assert torch.equal(model.input_features(x.reshape(5, 1, 8, 8)), h0)
    y = model(x)
    assert y.shape == (5, 10)
    assert torch.equal(model(x.reshape(5, 1, 8, 8)), y)
    # the layer-stack equations, written out
    h = h0
    for layer, dropout in zip(model.layers[:-1], model.dropouts, strict=True):
        h = model.act(dropout(layer(h)))
    assert torch.equal(model.layers[-1](h), y)
    widths = model.widths
    assert widths[0] == 64 and widths[-1] == 10
    assert all(b <= a for a, b in zip(widths[:-2], widths[1:-1], strict=True)), widths


def test_lenet_architecture_on_digits():
    model = _model("ortho_lenet")
    assert model.shapes == [(1, 8, 8), (4, 4, 4), (16, 2, 2), (32,), (10,)]
    assert isinstance(model.layers[0], OrthoConvBlock) and isinstance(model.layers[2], FlattenLinear)
    assert orthogonal_method(model.layers[2].linear) == "expm"
    assert all(isinstance(layer, FlattenLinear) for layer in model.layers[2:])
    assert orthogonal_method(model.layers[-1].linear) is None  # output layer free
    wide = _model("ortho_lenet", channels=[3, 8], width=[24, 16])
    assert wide.shapes == [(1, 8, 8), (3, 4, 4), (8, 2, 2), (24,), (16,), (10,)]
    assert _model("ortho_convnet", depth=2, channels=3).shapes == [(1, 8, 8), (3, 4, 4), (3, 4, 4), (10,)]


@pytest.mark.parametrize("name, options", [
    ("ortho_lenet", dict()),
    ("ortho_lenet", dict(channels=[3, 8], width=[24, 16], kernel_size=2)),
    ("ortho_lenet", dict(width=[24, 16], orthogonal="bjorck")),
    ("ortho_lenet", dict(orthogonal="cayley")),
    ("ortho_convnet", dict()),
    ("ortho_convnet", dict(channels=2, space_to_depth=1, kernel_size=5)),
])
def test_hidden_layers_orthogonal(name, options):
    model = _model(name, dtype=torch.float64, **options)
    shapes = model.shapes
    for i, layer in enumerate(model.layers[:-1]):
        A = _dense(layer, shapes[i])
        assert A.shape[0] <= A.shape[1]
        gram_err = (A @ A.T - torch.eye(A.shape[0], dtype=A.dtype)).abs().max().item()
        assert gram_err < TOL64, (i, gram_err)


def test_double_reprojects_dense_layers_in_place():
    """Built in float32 (orthogonal to ~1e-7), converted with .double(): the dense
    orthogonal weights are projected again in float64, same Parameter objects."""
    model = _model("ortho_lenet", width=[24, 16])
    params = {name: id(p) for name, p in model.named_parameters()}
    assert orthogonality_error(model) > 1e-13  # float32 rounding
    model.double()
    assert {name: id(p) for name, p in model.named_parameters()} == params
    assert orthogonality_error(model) < TOL64
    assert all(p.dtype == torch.float64 for p in model.parameters())


@pytest.mark.parametrize("activation", ["identity", "tanh"])
def test_hidden_stack_gives_exact_foton_signal(activation):
    """The identity FOTON needs (paper section 5): with identity activations and
    row-orthonormal hidden maps, h_l - h~_l = delta_l (the backpropagated error)
    for x~ = x - A_1^T .. A_L^T e, in float64 to 1e-10. The contrast: with tanh it is not."""
    model = _model("ortho_lenet", dtype=torch.float64, activation=activation, channels=[3, 10], width=24)
    with torch.no_grad():  # an arbitrary output layer
        model.layers[-1].linear.weight.mul_(3.0)
    x = _randn(6, 64)
    labels = torch.arange(6) % 10
    h0 = model.input_features(x)
    hs = [h0.requires_grad_(True)]
    for layer in model.layers[:-1]:
        hs.append(model.act(layer(hs[-1])))
    y = model.layers[-1](hs[-1])
    e = torch.softmax(y, 1) - F.one_hot(labels, 10).double()  # B * dCE/dy
    deltas = torch.autograd.grad(F.cross_entropy(y, labels, reduction="sum"), hs)
    with torch.no_grad():
        v = e
        for layer in reversed(model.layers):
            v = layer.adjoint(v)
        h_mod = h0 - v
        for i, layer in enumerate(model.layers[:-1], start=1):
            h_mod = model.act(layer(h_mod))
            gap = relative(hs[i] - h_mod, deltas[i])
            assert (gap < 1e-10) if activation == "identity" else (gap > 1e-2), (i, gap)


def test_bad_model_options():
    with pytest.raises(ModelConfigError, match="square"):
        models.build("ortho_lenet", in_features=50, out_features=10)
    with pytest.raises(ModelConfigError, match="in_shape"):
        models.build("ortho_convnet", in_features=64, out_features=10, in_shape=(1, 4, 8, 2))
    with pytest.raises(ModelConfigError, match="features"):
        models.build("ortho_lenet", in_features=64, out_features=10, in_shape=(1, 8, 4))
    with pytest.raises(ModelConfigError, match="C_out > C_in"):
        models.build("ortho_lenet", in_features=64, out_features=10, channels=[5, 16])
    with pytest.raises(ModelConfigError, match="C_out > C_in"):
        models.build("ortho_lenet", in_features=64, out_features=10, channels=[4, 17])
    with pytest.raises(ModelConfigError, match="C_out > C_in"):
        models.build("ortho_convnet", in_features=64, out_features=10, channels=5)
    with pytest.raises(ModelConfigError, match="non-increasing"):
        models.build("ortho_lenet", in_features=64, out_features=10, width=65)
    with pytest.raises(ModelConfigError, match="non-increasing"):
        models.build("ortho_lenet", in_features=64, out_features=10, width=[16, 32])
    with pytest.raises(ModelConfigError, match="divisible"):
        models.build("ortho_lenet", in_features=36, out_features=10)  # 6 -> 3 -> not even
    with pytest.raises(ModelConfigError, match="unknown orthogonal method"):
        models.build("ortho_convnet", in_features=64, out_features=10, orthogonal="qr")
    with pytest.raises(ModelConfigError, match="activation"):
        models.build("ortho_convnet", in_features=64, out_features=10, activation="swish")
    with pytest.raises(ModelConfigError, match="depth"):
        models.build("ortho_convnet", in_features=64, out_features=10, depth=0)
    with pytest.raises(ModelConfigError, match="no option"):
        models.build("ortho_convnet", in_features=64, out_features=10, width=8)


def test_infer_image_shape():
    assert infer_image_shape(64) == (1, 8, 8)
    assert infer_image_shape(784) == (1, 28, 28)
    assert infer_image_shape(3072) == (3, 32, 32)
    assert infer_image_shape(48, (3, 4, 4)) == (3, 4, 4)
    with pytest.raises(ModelConfigError):
        infer_image_shape(10)


@pytest.mark.parametrize("name", MODELS)
def test_short_training_lowers_loss(name):
    model = _model(name, dropout=0.1)
    x = _randn(32, 64, dtype=torch.float32)
    labels = torch.arange(32) % 10
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    model.eval()
    for layer in model.layers[:-1]:  # still orthogonal after training
        if isinstance(layer, OrthoConvBlock):
            assert layer.orthogonality_error() < TOL32
    assert orthogonality_error(model) < TOL32


def test_trainer_with_backprop():
    task = tasks.build("teacher", in_features=16, num_classes=4, n_train=128, n_val=32, n_test=32, hidden=16)
    torch.manual_seed(0)
    model = models.build("ortho_lenet", in_features=16, out_features=4, width=8)
    assert model.shapes == [(1, 4, 4), (4, 2, 2), (16, 1, 1), (8,), (4,)]
    trainer = trainers.Trainer(model, Backprop(), task, batch_size=32, progress=False, seed=0,
                               optimizer="adam", lr=1e-2)
    first = trainer.evaluate("train")["loss"]
    trainer.fit(steps=20)
    assert trainer.evaluate("train")["loss"] < first


def test_a_symbol_cached_in_a_scope_is_computed_afresh_after_it():
    """cached_symbols(): Q once inside the scope; after it, a changed kernel changes the output (issue 41: a scope
    that never closed kept a stale Q for every later step)."""
    from gradengines.models.orthogonal.conv import cached_symbols

    torch.manual_seed(0)
    conv = OrthogonalConv2d(3, 3, 3, (4, 4)).double()
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    with cached_symbols():
        before = conv(x)
        with torch.no_grad():
            conv.weight.mul_(1.5)  # inside the scope: the cached Q stays (the documented contract)
        assert torch.equal(conv(x), before)
    assert not torch.allclose(conv(x), before)


def test_space_to_depth_refuses_an_input_of_another_shape_than_declared():
    with pytest.raises(ValueError, match=r"SpaceToDepth.forward expects \(B, 3, 4, 4\), got \(2, 3, 4, 6\)"):
        SpaceToDepth(2, in_shape=(3, 4, 4))(torch.randn(2, 3, 4, 6))


def test_the_orthogonal_conv_block_defaults_to_a_3x3_kernel():
    assert OrthoConvBlock((4, 8, 8), 4).conv.weight.shape[-2:] == (3, 3)


def test_the_fourier_matrices_center_the_kernel_at_its_middle_tap():
    """E_h v = H ifft(v placed with its middle tap p = k // 2 at index 0, circularly): for k = 5 the kernel is
    centered, as a 'same' convolution's (issue 41: the center read as k // 3, which agrees with k // 2 at k = 3)."""
    conv = OrthogonalConv2d(2, 2, 5, (7, 8)).double()
    E_h, E_w = conv._dft_matrices(torch.complex128, "cpu")
    v = torch.randn(5, dtype=torch.float64)
    for E, n in ((E_h, 7), (E_w, 8)):
        placed = torch.zeros(n, dtype=torch.float64)
        placed[(torch.arange(5) - 2) % n] = v
        expected = (n * torch.fft.ifft(placed.to(torch.complex128)))[:E.shape[0]]
        torch.testing.assert_close(E @ v.to(torch.complex128), expected, rtol=1e-12, atol=1e-12)


def test_flatten_linear_refuses_an_input_of_another_shape():
    """(B, *in_shape) or already flat (B, prod): anything else is refused in one line, not flattened into a
    Linear of the right width by chance ((B, 6, 4, 2) has the 48 features of (B, 3, 4, 4))."""
    layer = FlattenLinear((3, 4, 4), 5)
    assert layer(torch.randn(2, 3, 4, 4)).shape == (2, 5) and layer(torch.randn(2, 48)).shape == (2, 5)
    with pytest.raises(ValueError, match=r"FlattenLinear.forward expects \(B, 3, 4, 4\), got \(2, 6, 4, 2\)"):
        layer(torch.randn(2, 6, 4, 2))


# --------------------------------------------------------------------------- #
# What each module says of itself, its defaults and its bad inputs
# --------------------------------------------------------------------------- #
class _HiddenStack(nn.Module):
    """A user's layer stack (trainers.core.protocols.LayerStack) of the conv module's layers, as FOTON reads it."""

    def __init__(self, layers):
        super().__init__()
        self.layers, self.dropouts, self.act = nn.ModuleList(layers), [nn.Identity()] * (len(layers) - 1), torch.tanh

    def input_features(self, x):
        return x


def test_every_layer_orthogonal_by_construction_says_so_and_foton_takes_it_as_a_hidden_layer():
    torch.manual_seed(0)
    hidden = [OrthogonalConv2d(2, 2, 3, (4, 4)), SpaceToDepth(2, (2, 4, 4)), OrthoConvBlock((8, 2, 2), 8),
              FlattenLinear((8, 2, 2), 6, orthogonal="cayley")]
    shapes = [(2, 4, 4), (2, 4, 4), (8, 2, 2), (8, 2, 2)]
    for layer, shape in zip(hidden, shapes, strict=True):
        A = _dense(layer.double(), shape)
        assert (A @ A.T - torch.eye(A.shape[0], dtype=A.dtype)).abs().max() < TOL64, type(layer).__name__
    assert all(type(layer).is_orthogonal for layer in hidden[:3])
    foton = trainers.build_engine("foton")
    foton.check(_HiddenStack([*hidden, FlattenLinear(6, 3)]))
    with pytest.raises(trainers.IncompatibleModelError, match="hidden layer 1 of _HiddenStack is not"):
        foton.check(_HiddenStack([hidden[0], FlattenLinear((2, 4, 4), 6), FlattenLinear(6, 3)]))
    for name in MODELS:  # the zoo's orthogonal CNNs: every hidden layer orthogonal
        foton.check(_model(name))


def test_the_documented_defaults():
    """A bias (zero at the start), the kernel drawn in +-init_scale / sqrt(C_in k^2) with init_scale 1; one
    space-to-depth step of factor 2 in a block; a bias in FlattenLinear."""
    torch.manual_seed(0)
    conv = OrthogonalConv2d(6, 4, 3, (4, 4))
    bound = 1 / math.sqrt(6 * 9)
    assert conv.bias is not None and not conv.bias.any()
    assert 0.9 * bound < conv.weight.abs().max() <= bound
    wider = OrthogonalConv2d(6, 4, 3, (4, 4), init_scale=2.0)
    assert bound < wider.weight.abs().max() <= 2 * bound
    with torch.no_grad():
        conv.bias.fill_(1.0)
    conv.reset_parameters()
    assert not conv.bias.any()
    block = OrthoConvBlock((2, 4, 4), 5)
    assert block.out_shape == (5, 2, 2) and len(block.downsample) == 1 and block.conv.bias is not None
    assert block.conv.init_scale == 1.0
    assert SpaceToDepth()(torch.zeros(1, 3, 4, 6)).shape == (1, 12, 2, 3)
    assert FlattenLinear((2, 3), 4).linear.bias is not None


def test_the_bias_is_added_to_the_convolution():
    conv = _conv(3, 2, 3, 4, 4)
    with torch.no_grad():
        conv.bias.copy_(torch.tensor([0.5, -2.0]))
    out = conv(torch.zeros(1, 3, 4, 4, dtype=torch.float64))
    assert torch.equal(out, torch.tensor([0.5, -2.0], dtype=torch.float64)[None, :, None, None].expand(1, 2, 4, 4))


def test_an_adjoint_of_another_shape_than_the_output_is_refused():
    with pytest.raises(ValueError, match=r"OrthogonalConv2d.adjoint expects \(B, 2, 4, 4\)"):
        _conv(3, 2, 3, 4, 4).adjoint(torch.zeros(1, 3, 4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"SpaceToDepth.adjoint expects \(B, 8, 2, 2\)"):
        SpaceToDepth(2, (2, 4, 4)).adjoint(torch.zeros(1, 2, 4, 4))


@pytest.mark.parametrize("build, message", [
    (lambda: OrthogonalConv2d(2, 2, 3, (4, True)), "spatial must be a tuple of positive integers"),
    (lambda: OrthogonalConv2d(2, 2, 3, (4, 2.0)), "spatial must be a tuple of positive integers"),
    (lambda: OrthogonalConv2d(2, 2, 3, (4, 0)), "spatial must be a tuple of positive integers"),
    (lambda: OrthogonalConv2d(2, 2, 3, (4, 4), init_scale=-1.0), "init_scale must be a number >= 0"),
    (lambda: OrthogonalConv2d(2, 2, 3, (4, 4), init_scale=True), "init_scale must be a number >= 0"),
    (lambda: OrthogonalConv2d(2, 2, 3, (4, 4), init_scale="1"), "init_scale must be a number >= 0"),
    (lambda: OrthoConvBlock((2, 4, 4), 2, downsample=-1), "downsample must be an integer >= 0"),
    (lambda: OrthoConvBlock((2, 4, 4), 2, downsample=True), "downsample must be an integer >= 0"),
    (lambda: OrthoConvBlock((2, 4, 4), 2, downsample=1.0), "downsample must be an integer >= 0"),
], ids=["bool side", "float side", "zero side", "negative scale", "bool scale", "text scale", "negative steps",
        "bool steps", "float steps"])
def test_bad_shapes_scales_and_steps_are_one_line(build, message):
    with pytest.raises(ModelConfigError, match=message):
        build()


def test_space_to_depth_describes_itself():
    assert repr(SpaceToDepth()) == "SpaceToDepth(factor=2)"
    assert repr(SpaceToDepth(2, (3, 4, 4))) == "SpaceToDepth(factor=2, in_shape=(3, 4, 4))"


def test_a_free_flatten_linear_is_not_projected():
    """Only an orthogonal FlattenLinear is set to its polar factor (on a dtype change); a free one keeps its weight."""
    torch.manual_seed(0)
    free = FlattenLinear((2, 3), 4)
    before = free.linear.weight.detach().clone()
    free.reorthogonalize_()
    assert torch.equal(free.linear.weight, before)
    assert torch.equal(free.double().linear.weight, before.double())
