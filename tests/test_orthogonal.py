"""Tests of models/orthogonal/ (projection.py, marking.py, gradients.py): making layers orthogonal, keeping them so."""

import math

import pytest
import torch
from torch import nn

from gradengines.models.errors import ModelConfigError
from gradengines.models.orthogonal import (
    DEFAULT_BJORCK_ITERS,
    METHODS,
    PARAMETRIZED_METHODS,
    PROJECTED_METHODS,
    RETRACTED_METHODS,
    Projection,
    Retraction,
    bjorck,
    make_orthogonal,
    orthogonal_method,
    orthogonality_error,
    polar,
    project_,
    route_weight_grad,
    trainable_weight,
)

# (out, in): square, wide (rows orthonormal), tall (columns orthonormal)
SHAPES = {"square": (16, 16), "wide": (12, 20), "tall": (20, 12)}
TOL32 = 1e-5


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny matrices: intra-op threads only add overhead, and on a shared, busy
    CPU oversubscribed OpenMP threads slow these tests down by 10-100x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _layer(shape, method, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    out_f, in_f = shape
    return make_orthogonal(nn.Linear(in_f, out_f).to(dtype), method)


def _random_orthogonal(shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return polar(torch.randn(*shape, generator=g, dtype=dtype))


def _gram_error_exact(W):
    """Independent check of the error: Frobenius norm >= spectral norm."""
    W = W.detach().double()
    gram = W @ W.T if W.shape[0] <= W.shape[1] else W.T @ W
    return torch.linalg.matrix_norm(gram - torch.eye(gram.shape[0], dtype=gram.dtype), 2).item()


# --------------------------------------------------------------------------- #
# Marking
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("method", METHODS)
def test_make_orthogonal_initializes_to_polar_of_current_weight(method, shape):
    torch.manual_seed(0)
    layer = nn.Linear(shape[1], shape[0])
    W0 = layer.weight.detach().clone()
    rng_before = torch.get_rng_state()
    out = make_orthogonal(layer, method)
    assert out is layer
    assert torch.equal(torch.get_rng_state(), rng_before), "marking must not consume the global RNG"
    assert orthogonal_method(layer) == method
    err = orthogonality_error(layer.weight)
    assert err < TOL32
    assert abs(err - _gram_error_exact(layer.weight)) < 1e-9
    assert orthogonality_error(layer) == err
    # the starting weight is the polar factor of the previous init, whatever the method
    assert torch.allclose(layer.weight.detach(), polar(W0), atol=1e-5)
    # semi-orthogonal on the smaller side
    W = layer.weight.detach().double()
    k = min(shape)
    gram = W @ W.T if shape[0] <= shape[1] else W.T @ W
    assert gram.shape == (k, k)


@pytest.mark.parametrize("method", METHODS)
def test_trainable_weight_and_marker(method):
    layer = _layer((8, 8), method)
    p = trainable_weight(layer)
    assert isinstance(p, nn.Parameter)
    if method in PARAMETRIZED_METHODS:
        assert p is layer.parametrizations.weight.original
        assert not hasattr(layer, "_orthogonal_projection")
    else:
        assert p is layer.weight
        marker = Retraction() if method in RETRACTED_METHODS else Projection(method, DEFAULT_BJORCK_ITERS)
        assert layer._orthogonal_projection == marker
    assert {id(q) for q in layer.parameters()} == {id(p), id(layer.bias)}


def test_none_unchanged_and_plain_module_has_no_method():
    layer = nn.Linear(5, 4)
    w = layer.weight
    before = w.detach().clone()
    assert make_orthogonal(layer, None) is layer
    assert layer.weight is w and torch.equal(w, before)
    assert orthogonal_method(layer) is None
    assert orthogonal_method(nn.ReLU()) is None
    assert trainable_weight(layer) is w


def test_marking_twice_is_idempotent_and_switching_is_refused():
    for method in METHODS:
        layer = _layer((6, 9), method)
        p = trainable_weight(layer)
        W = layer.weight.detach().clone()
        make_orthogonal(layer, method)
        assert trainable_weight(layer) is p and torch.equal(layer.weight.detach(), W)
        other = "polar" if method != "polar" else "expm"
        with pytest.raises(ModelConfigError):
            make_orthogonal(layer, other)


def test_iters_is_stored_for_bjorck():
    layer = make_orthogonal(nn.Linear(4, 4), "bjorck", iters=7)
    assert layer._orthogonal_projection == Projection("bjorck", 7)
    with pytest.raises(ModelConfigError):
        make_orthogonal(layer, "bjorck", iters=3)


@pytest.mark.parametrize(
    "build, kwargs, needle",
    [
        (lambda: nn.Linear(4, 4), {"method": "householder"}, "householder"),
        (lambda: nn.Linear(4, 4), {"method": "Expm"}, "Expm"),
        (lambda: nn.Linear(4, 4), {"method": "bjorck", "iters": 0}, "iters"),
        (lambda: nn.Linear(4, 4), {"method": "expm", "iters": -2}, "iters"),
        (lambda: nn.Linear(4, 4), {"method": "bjorck", "iters": 2.0}, "iters"),
        (lambda: nn.Linear(4, 4), {"method": None, "iters": 0}, "iters"),
        (lambda: nn.Conv1d(3, 4, 5), {"method": "bjorck"}, "2-D"),
        (lambda: nn.Conv1d(3, 4, 5), {"method": "expm"}, "2-D"),
        (lambda: nn.ReLU(), {"method": "polar"}, "2-D"),
    ],
)
def test_bad_options_raise_model_config_error(build, kwargs, needle):
    module = build()
    with pytest.raises(ModelConfigError) as info:
        make_orthogonal(module, kwargs.pop("method"), **kwargs)
    msg = str(info.value)
    assert "\n" not in msg and needle in msg
    assert isinstance(info.value, ValueError)
    assert orthogonal_method(module) is None  # nothing half-registered


def test_unknown_method_message_lists_choices():
    with pytest.raises(ModelConfigError) as info:
        make_orthogonal(nn.Linear(3, 3), "qr")
    for m in METHODS:
        assert repr(m) in str(info.value)


# --------------------------------------------------------------------------- #
# Training keeps the layer orthogonal (float32)
# --------------------------------------------------------------------------- #
def _regression(shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    out_f, in_f = shape
    # inputs of std 0.5 keep each raw optimizer step's distortion below ~0.15
    # (the near-orthogonal regime in which 3 Björck iterations reach float32 precision)
    X = 0.5 * torch.randn(64, in_f, generator=g)
    target = nn.Linear(in_f, out_f)
    with torch.no_grad():
        target.weight.copy_(polar(torch.randn(out_f, in_f, generator=g)))
        target.bias.copy_(torch.randn(out_f, generator=g))
    return X, target(X).detach()


@pytest.mark.parametrize("opt", ["adam", "sgd_momentum"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("method", [m for m in METHODS if m not in RETRACTED_METHODS])  # test_retraction.py
def test_training_stays_orthogonal_and_learns(method, shape, opt):
    layer = _layer(shape, method)
    model = nn.Sequential(layer)
    X, Y = _regression(shape)
    if opt == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, pre_errors = [], []
    for _ in range(100):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(X), Y)
        loss.backward()
        optimizer.step()
        pre_errors.append(orthogonality_error(model))
        project_(model)
        err = orthogonality_error(model)
        assert err < TOL32, f"step {len(losses)}: error {err:.2e}"
        losses.append(loss.item())
    final = nn.functional.mse_loss(model(X), Y).item()
    assert final < 0.5 * losses[0], (losses[0], final)
    if method in PROJECTED_METHODS:
        # the raw step really leaves the manifold (so project_ does the work) ...
        assert max(pre_errors) > 1e-2
        # ... but stays in the near-orthogonal regime this test is about
        assert max(pre_errors) < 0.2
    else:
        assert max(pre_errors) < TOL32  # orthogonal by construction


# --------------------------------------------------------------------------- #
# Projection in place
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("method", PROJECTED_METHODS)
def test_projection_keeps_parameter_identity_and_optimizer_state(method):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 8), nn.Tanh(), nn.Linear(8, 6))
    for m in model:
        if isinstance(m, nn.Linear):
            make_orthogonal(m, method)
    weights = [model[0].weight, model[2].weight]
    ids = [id(w) for w in weights]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    group_ids = [id(p) for p in optimizer.param_groups[0]["params"]]
    X, Y = torch.randn(32, 10), torch.randn(32, 6)
    for _ in range(5):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(X), Y).backward()
        optimizer.step()
        before = [w.detach().clone() for w in weights]
        project_(model)
        assert all(not torch.equal(b, w) for b, w in zip(before, weights, strict=True))  # it did change them
    assert [id(model[0].weight), id(model[2].weight)] == ids
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == group_ids
    for w in weights:
        assert w in optimizer.state and optimizer.state[w]["exp_avg"].abs().sum() > 0
        assert any(k is w for k in optimizer.state.keys())
    assert orthogonality_error(model) < TOL32


def test_project_batches_equal_shapes_and_matches_single_layer_projection():
    torch.manual_seed(0)
    layers = [make_orthogonal(nn.Linear(12, 12), "bjorck", iters=2) for _ in range(3)]
    layers.append(make_orthogonal(nn.Linear(12, 7), "bjorck", iters=2))
    layers.append(make_orthogonal(nn.Linear(12, 12), "polar"))
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for layer in layers:
            layer.weight.add_(0.003 * torch.randn_like(layer.weight))
    expected = [
        bjorck(layer.weight.detach(), 2) if layer._orthogonal_projection.method == "bjorck"
        else polar(layer.weight.detach())
        for layer in layers
    ]
    project_(model)
    for layer, e in zip(layers, expected, strict=True):
        assert torch.allclose(layer.weight, e, atol=1e-6)
    assert orthogonality_error(model) < TOL32


def test_project_is_noop_without_projected_layers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), make_orthogonal(nn.Linear(6, 5), "expm"),
                          make_orthogonal(nn.Linear(5, 5), "cayley"))
    with torch.no_grad():
        model[0].weight.add_(1.0)
        for m in model[1:]:
            m.parametrizations.weight.original.add_(0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    project_(model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# --------------------------------------------------------------------------- #
# Pure functions
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_bjorck_converges_quadratically_to_polar(shape):
    Q = _random_orthogonal(shape, seed=2)
    E = torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    W = Q + 1e-2 * E / torch.linalg.matrix_norm(E, 2)  # relative perturbation 1e-2
    W_copy = W.clone()
    errors = [orthogonality_error(bjorck(W, k)) for k in range(5)]
    assert torch.equal(W, W_copy), "bjorck must not modify its input"
    assert errors[0] > 1e-2
    for a, b in zip(errors[:-1], errors[1:], strict=True):
        assert b < a or b < 1e-13
    # quadratic: each iteration roughly squares the error (e -> 1.5 e^2)
    assert errors[1] < 2 * errors[0] ** 2 and errors[2] < 2 * errors[1] ** 2
    assert errors[3] < 1e-12
    assert torch.allclose(bjorck(W, 8), polar(W), atol=1e-12)
    assert torch.equal(bjorck(W, 0), W)


def test_bjorck_convergence_condition_singular_values_below_sqrt3():
    n = 6
    U = _random_orthogonal((n, n), seed=4)
    V = _random_orthogonal((n, n), seed=5)
    inside = torch.tensor([0.3, 0.7, 1.0, 1.2, 1.5, 1.7], dtype=torch.float64)  # all in (0, sqrt 3)
    W = U @ torch.diag(inside) @ V.T
    assert orthogonality_error(bjorck(W, 15)) < 1e-12
    assert torch.allclose(bjorck(W, 15), U @ V.T, atol=1e-10)
    # s = sqrt 3 maps to 0 (rank lost); just above it the sign flips (s -> 1.5 s - 0.5 s^3 < 0),
    # so the iteration lands on an orthogonal matrix that is NOT the polar factor
    flipped = inside.clone()
    flipped[-1] = 1.05 * math.sqrt(3)
    W_flip = bjorck(U @ torch.diag(flipped) @ V.T, 15)
    assert orthogonality_error(W_flip) < 1e-10
    assert not torch.allclose(W_flip, U @ V.T, atol=1e-2)
    # beyond sqrt 5, |1.5 s - 0.5 s^3| > s: it diverges
    diverging = inside.clone()
    diverging[-1] = 2.5
    with torch.no_grad():
        W_div = bjorck(U @ torch.diag(diverging) @ V.T, 6)
    assert not orthogonality_error(W_div) < 1.0


def test_bjorck_three_iterations_need_a_near_orthogonal_input():
    Q = _random_orthogonal((16, 16), seed=6)
    E = torch.randn(16, 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    E = E / torch.linalg.matrix_norm(E, 2)
    small, large = Q + 0.1 * E, Q + 0.4 * E
    assert orthogonality_error(bjorck(small, 3)) < 1e-5
    assert orthogonality_error(bjorck(large, 3)) > 1e-5
    assert orthogonality_error(bjorck(large, 6)) < 1e-10


def test_bjorck_float32_and_batched():
    Q = _random_orthogonal((4, 10, 6), dtype=torch.float64, seed=8)
    W = (Q + 1e-2 * torch.randn(Q.shape, generator=torch.Generator().manual_seed(9), dtype=Q.dtype)).float()
    P = bjorck(W, 3)
    assert P.dtype == torch.float32 and P.shape == W.shape
    for i in range(4):
        assert orthogonality_error(P[i]) < 1e-6
        assert torch.allclose(P[i], bjorck(W[i], 3), atol=1e-6)
    assert bjorck(W.half(), 3).dtype == torch.float16


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_polar_is_uvt_and_the_nearest_orthogonal_matrix(shape):
    g = torch.Generator().manual_seed(10)
    W = torch.randn(shape, generator=g, dtype=torch.float64)
    U, _, Vh = torch.linalg.svd(W, full_matrices=False)
    P = polar(W)
    assert torch.allclose(P, U @ Vh, atol=1e-12)
    assert orthogonality_error(P) < 1e-12
    d_polar = torch.dist(P, W).item()
    # other (semi-)orthogonal matrices are farther from W
    tall = shape[0] > shape[1]
    Qr = torch.linalg.qr(W if tall or shape[0] == shape[1] else W.T).Q
    Qr = Qr if tall or shape[0] == shape[1] else Qr.T
    scaled = W / (1.01 * torch.linalg.matrix_norm(W, 2))  # singular values in (0, 1): Björck converges
    B = bjorck(scaled, 60)
    assert orthogonality_error(Qr) < 1e-12 and orthogonality_error(B) < 1e-10
    others = [Qr, _random_orthogonal(shape, seed=11), -P, B @ torch.linalg.matrix_exp(_skew(B.shape[1], 12))]
    for Q in others:
        assert d_polar <= torch.dist(Q, W).item() + 1e-12
    assert d_polar < torch.dist(Qr, W).item() - 1e-3
    # Björck from the rescaled matrix converges to the same polar factor
    assert torch.allclose(B, P, atol=1e-8)


def _skew(n, seed):
    A = 0.1 * torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return A - A.T


# --------------------------------------------------------------------------- #
# orthogonality_error
# --------------------------------------------------------------------------- #
def test_orthogonality_error_of_models():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 3))
    assert orthogonality_error(plain) == 0.0
    assert orthogonality_error(nn.ReLU()) == 0.0
    model = nn.Sequential(nn.Linear(5, 5), make_orthogonal(nn.Linear(5, 4), "bjorck"),
                          make_orthogonal(nn.Linear(4, 6), "expm"))
    assert orthogonality_error(model) < TOL32
    with torch.no_grad():
        model[1].weight.add_(1e-2 * torch.randn(4, 5))
    err = orthogonality_error(model)
    assert err > 1e-3
    assert err == pytest.approx(_gram_error_exact(model[1].weight), rel=1e-9)
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    assert orthogonality_error(model) == math.inf
    project_(model)  # polar/Björck of NaN stays NaN: the error must not hide it
    assert orthogonality_error(model) == math.inf


def test_orthogonality_error_uses_the_smaller_gram():
    Q = _random_orthogonal((9, 4), seed=13)  # tall: columns orthonormal, rows cannot be
    assert orthogonality_error(Q) < 1e-12
    assert orthogonality_error(Q.T) < 1e-12
    assert torch.linalg.matrix_norm(Q @ Q.T - torch.eye(9, dtype=Q.dtype), 2) > 0.5
    assert orthogonality_error(2 * Q) == pytest.approx(3.0)


# --------------------------------------------------------------------------- #
# route_weight_grad
# --------------------------------------------------------------------------- #
def _loss_of_weight(layer, X, C):
    def L(W):
        return (C * torch.tanh(nn.functional.linear(X, W, layer.bias))).sum()

    return L


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("method", PARAMETRIZED_METHODS)
def test_route_weight_grad_parametrized_equals_autograd(method, shape):
    layer = _layer(shape, method, dtype=torch.float64)
    original = layer.parametrizations.weight.original
    with torch.no_grad():  # move away from the chart origin so the Jacobian is generic
        original.add_(0.3 * torch.randn_like(original))
    g = torch.Generator().manual_seed(14)
    X = torch.randn(7, shape[1], generator=g, dtype=torch.float64)
    C = torch.randn(7, shape[0], generator=g, dtype=torch.float64)
    L = _loss_of_weight(layer, X, C)
    W_leaf = layer.weight.detach().requires_grad_(True)
    (G,) = torch.autograd.grad(L(W_leaf), W_leaf)
    (expected,) = torch.autograd.grad(L(layer.weight), original)
    assert expected.abs().max() > 1e-3

    original.grad = torch.full_like(original, 123.0)  # must be overwritten
    with torch.no_grad():  # works in an engine's no-grad region
        routed = route_weight_grad(layer, G)
    assert routed is original.grad
    assert torch.allclose(original.grad, expected, atol=1e-12, rtol=0)
    route_weight_grad(layer, G)  # second call: no accumulation
    assert torch.allclose(original.grad, expected, atol=1e-12, rtol=0)
    assert layer.bias.grad is None  # nothing else touched


def test_route_weight_grad_parametrized_inside_cached_context():
    from torch.nn.utils import parametrize

    layer = _layer((5, 5), "expm", dtype=torch.float64)
    G = torch.randn(5, 5, dtype=torch.float64)
    with torch.no_grad():
        expected = route_weight_grad(layer, G).clone()
    with torch.no_grad(), parametrize.cached():
        _ = layer.weight  # fills the cache without a graph
        got = route_weight_grad(layer, G)
    assert torch.allclose(got, expected, atol=1e-14)


@pytest.mark.parametrize("method", [None, *PROJECTED_METHODS, *RETRACTED_METHODS])
def test_route_weight_grad_plain_and_projected(method):
    layer = make_orthogonal(nn.Linear(6, 4).double(), method)
    G = torch.randn(4, 6, dtype=torch.float64)
    layer.weight.grad = torch.ones_like(layer.weight)
    routed = route_weight_grad(layer, G)
    assert routed is layer.weight.grad
    assert torch.equal(layer.weight.grad, G)
    route_weight_grad(layer, G)
    assert torch.equal(layer.weight.grad, G)
    # cast to the weight's dtype
    route_weight_grad(layer, G.float())
    assert layer.weight.grad.dtype == torch.float64 and torch.allclose(layer.weight.grad, G, atol=1e-6)


@pytest.mark.parametrize("method", [None, *METHODS])
def test_route_weight_grad_shape_mismatch(method):
    layer = make_orthogonal(nn.Linear(6, 4), method)
    with pytest.raises(ValueError):
        route_weight_grad(layer, torch.zeros(6, 4))


def test_route_then_step_keeps_parametrized_orthogonal():
    layer = _layer((8, 5), "cayley")
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    for _ in range(10):
        route_weight_grad(layer, torch.randn(8, 5))
        opt.step()
    assert orthogonality_error(layer) < TOL32
    assert trainable_weight(layer).abs().sum() > 0


def test_the_documented_bjorck_limits_and_a_copy_at_zero_iterations():
    """README: make_orthogonal(layer, "bjorck", iters=8) by default, --orthogonal-iters above 100 refused; bjorck
    with 0 iterations returns a copy, never the weight itself (issue 41: each survived a mutation)."""
    layer = nn.Linear(6, 6).double()
    make_orthogonal(layer, "bjorck")
    assert layer._orthogonal_projection == Projection("bjorck", 8)
    make_orthogonal(nn.Linear(6, 6), "bjorck", iters=100)
    with pytest.raises(ModelConfigError, match="from 1 to 100, got 101"):
        make_orthogonal(nn.Linear(6, 6), "bjorck", iters=101)
    W = torch.randn(4, 6, dtype=torch.float64)
    same = bjorck(W, 0)
    assert torch.equal(same, W) and same.data_ptr() != W.data_ptr()


class _Doubled(nn.Module):
    """A parametrization that is not geotorch's: W = 2 X."""

    def forward(self, X):
        return 2 * X


def test_a_parametrization_that_is_not_geotorchs_is_not_an_orthogonal_method():
    """Only geotorch's orthogonal map, alone on the weight, counts (issue 41: a lone other parametrization was
    read as if it had geotorch's ``triv``)."""
    from torch.nn.utils import parametrize

    from gradengines.models.orthogonal import has_parametrized_weight

    layer = nn.Linear(4, 4)
    parametrize.register_parametrization(layer, "weight", _Doubled())
    assert orthogonal_method(layer) is None and has_parametrized_weight(layer)
    bias_only = nn.Linear(4, 4)
    parametrize.register_parametrization(bias_only, "bias", _Doubled())
    assert not has_parametrized_weight(bias_only)  # a parametrized bias is not a parametrized weight
    assert not has_parametrized_weight(nn.Linear(4, 4))
    assert has_parametrized_weight(make_orthogonal(nn.Linear(4, 4), "expm"))


def test_orthogonality_error_takes_a_batch_of_matrices_and_refuses_a_vector():
    Q = torch.linalg.qr(torch.randn(3, 5, 5, dtype=torch.float64)).Q
    assert orthogonality_error(Q) < 1e-12
    Q[1] *= 1.1  # one matrix of the batch off: its error is the batch's
    assert orthogonality_error(Q) == pytest.approx(1.21 - 1, rel=1e-9)
    with pytest.raises(ValueError, match="need a matrix"):
        orthogonality_error(torch.ones(5))


def test_two_gradients_routed_through_one_cached_weight():
    """Inside parametrize.cached() W is computed once with its graph: a second product through it (an engine's
    second layer sharing the weight, or a second pass) must still find the graph (issue 41: retain_graph)."""
    from torch.nn.utils import parametrize

    layer = make_orthogonal(nn.Linear(5, 5).double(), "cayley")
    G1, G2 = torch.randn(5, 5, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)
    alone = route_weight_grad(layer, G2).clone()
    with parametrize.cached(), torch.enable_grad():
        assert layer.weight.grad_fn is not None  # the cached W, with its graph
        route_weight_grad(layer, G1)
        torch.testing.assert_close(route_weight_grad(layer, G2), alone, rtol=1e-12, atol=1e-14)


def test_a_layers_marker_cannot_be_changed_after_marking():
    """The markers say how a layer is kept orthogonal; they are frozen (and hashable), never edited in place."""
    import dataclasses

    from gradengines.models.orthogonal import Retraction

    for mark in (Projection("bjorck", 8), Retraction()):
        with pytest.raises(dataclasses.FrozenInstanceError):
            mark.method = "polar"
        assert hash(mark) == hash(dataclasses.replace(mark))
