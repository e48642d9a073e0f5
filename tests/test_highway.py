"""Highway-BP: the paper's identities (float64), batched == reference, the zoo, bad input.

Identities (highway_bp.md Sec. 12): k >= L equals backprop (T1); after k iterations the
top k+1 positions are exact (T2); w^k equals the brute-force sum over paths crossing at
most k branches (T3); the scalar closed form (T6) and the paper's non-monotone example
(T9); k = 0 with the gamma split is (1 - gamma)^(L-i) dL/dh_L (T5); gamma = 1 is FPI (T8).
"""

import itertools
import math

import pytest
import test_dsf
import torch
from engine_contract import EngineContract
from helpers import engine_grads, max_relative

from gradengines import models, trainers
from gradengines.models.zoo.resnet import downsample, upsample
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy
from gradengines.trainers.engines.highway import highway_iterations

# ---- the iteration itself, on explicit matrices ------------------------------------------


def random_instance(L=5, d=3, seed=0):
    """Dense J_i, diagonal K_i (i = 1..L) and local errors e_i at every position 0..L."""
    gen = torch.Generator().manual_seed(seed)
    J = [None] + [0.6 * torch.randn(d, d, generator=gen, dtype=torch.float64) for _ in range(L)]
    K = [None] + [torch.rand(d, generator=gen, dtype=torch.float64) * 2 - 0.5 for _ in range(L)]
    e = torch.randn(L + 1, d, generator=gen, dtype=torch.float64)
    return J, K, e


def iterate(J, K, e, k, **kw):
    """highway_iterations on the instance: positions 0..L, a_j = K_{j+1}, v_j = w_{j+1} J_{j+1}."""
    L = len(J) - 1
    carry = torch.stack(K[1:] + [torch.zeros_like(K[1])])

    def back(w):
        return torch.stack([w[j + 1] @ J[j + 1] for j in range(L)] + [torch.zeros_like(w[0])])

    return highway_iterations(e, carry, back, k=k, **kw)


def brute_force(J, K, e, k):
    """w_i^k = sum over j >= i and subsets S of {i+1..j}, |S| <= k, of e_j prod_{m=j..i+1} (J_m if m in S else K_m)."""
    L = len(J) - 1
    out = torch.zeros_like(e)
    for i in range(L + 1):
        for j in range(i, L + 1):
            layers = list(range(j, i, -1))
            for size in range(min(k, len(layers)) + 1):
                for S in itertools.combinations(layers, size):
                    v = e[j]
                    for m in layers:
                        v = v @ J[m] if m in S else v * K[m]
                    out[i] += v
    return out


def exact(J, K, e):
    L = len(J) - 1
    w = torch.zeros_like(e)
    w[L] = e[L]
    for i in range(L - 1, -1, -1):
        w[i] = e[i] + w[i + 1] @ (J[i + 1] + torch.diag(K[i + 1]))
    return w


@pytest.mark.parametrize("k", range(7))
def test_path_sums_brute_force(k):
    J, K, e = random_instance()
    w, used, _ = iterate(J, K, e, k)
    assert used == min(k, 5)
    torch.testing.assert_close(w, brute_force(J, K, e, k), rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", range(6))
def test_top_positions_exact_after_k_and_finite_termination(k):
    J, K, e = random_instance()
    w, _, _ = iterate(J, K, e, k)
    true = exact(J, K, e)
    L = 5
    for i in range(L + 1):
        err = (w[i] - true[i]).abs().max().item()
        if i >= L - k:
            assert err < 1e-12, (i, err)
        else:
            assert err > 1e-6, (i, err)  # not exact below: the identity is not trivial


@pytest.mark.parametrize("method", ["sequential", "hillis_steele", "chunked"])
def test_scan_forms_agree(method):
    J, K, e = random_instance(L=9, seed=3)
    ref = iterate(J, K, e, 4, method="sequential")[0]
    torch.testing.assert_close(iterate(J, K, e, 4, method=method)[0], ref, rtol=0, atol=1e-12)


def test_scalar_closed_form():
    """K = 1, J = a, loss at the top only: w_i^k = g sum_{m <= k} C(L - i, m) a^m."""
    L, a, g = 6, 0.7, 1.3
    J = [None] + [torch.full((1, 1), a, dtype=torch.float64)] * L
    K = [None] + [torch.ones(1, dtype=torch.float64)] * L
    e = torch.zeros(L + 1, 1, dtype=torch.float64)
    e[L] = g
    for k in range(L + 1):
        w = iterate(J, K, e, k)[0][:, 0]
        expected = [g * sum(math.comb(L - i, m) * a**m for m in range(min(k, L - i) + 1)) for i in range(L + 1)]
        torch.testing.assert_close(w, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)


def test_error_is_not_monotone_in_k():
    """The paper-notes counter-example: L - i = 4, K = 1, J = -0.9: |w^k - exact| = 0.9999, 2.6001,
    2.2599, 0.6561, 0 at i = 0, so an implementation must not be tested for monotone convergence."""
    L, a = 4, -0.9
    J = [None] + [torch.full((1, 1), a, dtype=torch.float64)] * L
    K = [None] + [torch.ones(1, dtype=torch.float64)] * L
    e = torch.zeros(L + 1, 1, dtype=torch.float64)
    e[L] = 1.0
    errors = [abs(iterate(J, K, e, k)[0][0, 0].item() - (1 + a) ** 4) for k in range(5)]
    assert errors == pytest.approx([0.9999, 2.6001, 2.2599, 0.6561, 0.0], abs=1e-12)


def test_fpi_sums_whole_layer_jacobians_over_at_most_k_steps():
    """FPI (K = 0, J + K in place of J): w_i^k = sum_{j = i}^{min(L, i + k)} e_j (J+K)_j ... (J+K)_{i+1}."""
    J, K, e = random_instance()
    L = 5
    for k in range(L + 1):
        w = iterate(J, K, e, k, fpi=True)[0]
        for i in range(L + 1):
            expected = torch.zeros_like(e[0])
            for j in range(i, min(L, i + k) + 1):
                v = e[j]
                for m in range(j, i, -1):
                    v = v @ (J[m] + torch.diag(K[m]))
                expected += v
            torch.testing.assert_close(w[i], expected, rtol=0, atol=1e-12)


def test_tolerance_stops_early_and_cap_holds():
    J, K, e = random_instance(L=8, seed=1)
    J = [None] + [0.01 * j for j in J[1:]]  # small branches: increments shrink fast
    w, used, rel = iterate(J, K, e, 8, tol=1e-3)
    assert 1 <= used < 8 and rel <= 1e-3
    torch.testing.assert_close(w, iterate(J, K, e, used)[0], rtol=0, atol=0)
    assert iterate(J, K, e, 100)[1] == 8  # no path crosses more than L branches


# ---- the engine on the zoo, float64 --------------------------------------------------------


def image_model(variant, depth=8):
    torch.manual_seed(0)
    return models.build("resnet", in_features=64, out_features=4, depth=depth, width=4, variant=variant).double()


def zoo_case(name):
    """(model, x, y, loss_fn, L) in float64; L = blocks (depth) or sequence length (time)."""
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    if name == "residual_mlp":
        m = models.build("residual_mlp", in_features=12, out_features=4, depth=5, width=8)
        x, y = torch.randn(16, 12, generator=gen), torch.randint(0, 4, (16,), generator=gen)
        loss, L = cross_entropy_loss, 5
    elif name in ("resnet_preact", "resnet_post"):
        m = models.build("resnet", in_features=64, out_features=4, depth=8, width=4, variant=name[7:])
        x, y = torch.randn(8, 64, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        loss, L = cross_entropy_loss, 3
    elif name == "gpt":
        m = models.build("gpt", in_features=6, out_features=13, depth=2, width=8, heads=2)
        x, y, loss, L = (torch.randint(0, 13, (3, 6), generator=gen), torch.randint(0, 13, (3, 6), generator=gen),
                         sequence_cross_entropy, 4)
    else:  # rnn_lm_gru, rnn_lm_lstm, rnn_block_lm_gru: time is the depth
        shape, cell = name.rsplit("_", 1)
        m = models.build(shape, in_features=7, out_features=11, cell=cell, hidden=6, depth=2)
        x, y, loss, L = (torch.randint(0, 11, (3, 7), generator=gen), torch.randint(0, 11, (3, 7), generator=gen),
                         sequence_cross_entropy, 7)
    x = x.double() if x.is_floating_point() else x
    return m.double(), x, y, loss, L


ZOO = ["residual_mlp", "resnet_preact", "resnet_post", "gpt", "rnn_lm_gru", "rnn_lm_lstm", "rnn_block_lm_gru"]


@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("path", ["batched", "reference"])
def test_k_at_least_L_is_backprop(name, path):
    model, x, y, loss, L = zoo_case(name)
    ref = engine_grads(model, trainers.build_engine("backprop"), x, y, loss)
    for k in (L, L + 3):
        got = engine_grads(model, trainers.build_engine("highway", k=k, path=path), x, y, loss)
        assert max_relative(got, ref) < 1e-10
    assert max_relative(engine_grads(model, trainers.build_engine("highway", k=0, path=path), x, y, loss), ref) > 1e-4


@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("mode", ["highway", "fpi"])
def test_batched_path_equals_reference_path(name, mode):
    model, x, y, loss, L = zoo_case(name)
    for k in (0, 1, 2):
        a = engine_grads(model, trainers.build_engine("highway", k=k, mode=mode, path="batched"), x, y, loss)
        b = engine_grads(model, trainers.build_engine("highway", k=k, mode=mode, path="reference"), x, y, loss)
        assert max_relative(a, b) < 1e-12, k


@pytest.mark.parametrize("name", ["resnet_post", "rnn_lm_gru"])
@pytest.mark.parametrize("scan", ["hillis_steele", "chunked"])
def test_scan_forms_agree_on_the_zoo(name, scan):
    model, x, y, loss, _ = zoo_case(name)
    a = engine_grads(model, trainers.build_engine("highway", k=2, scan="sequential"), x, y, loss)
    b = engine_grads(model, trainers.build_engine("highway", k=2, scan=scan), x, y, loss)
    assert max_relative(a, b) < 1e-12


@pytest.mark.parametrize("name", ["residual_mlp", "resnet_post", "gpt"])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_top_blocks_exact_after_k(name, k):
    """Block i's parameters use w_i, exact once k >= L - i: the top k + 1 blocks (and the head)
    are exact, the block below is not."""
    model, x, y, loss, L = zoo_case(name)
    ref = engine_grads(model, trainers.build_engine("backprop"), x, y, loss)
    got = engine_grads(model, trainers.build_engine("highway", k=k), x, y, loss)
    for i, block in enumerate(model.blocks, start=1):
        names = [f"blocks.{i - 1}.{n}" for n, p in block.named_parameters()]
        diff = max_relative({n: got[n] for n in names}, {n: ref[n] for n in names})
        if i >= L - k:
            assert diff < 1e-10, (i, diff)
        elif i == L - k - 1:
            assert diff > 1e-6, (i, diff)


def capture_w(engine):
    """Record every w^k the engine computes (wraps its private ``_iterate``)."""
    seen = []
    inner = engine._iterate

    def spy(*args, **kw):
        w = inner(*args, **kw)
        seen.append(w.detach().clone())
        return w

    engine._iterate = spy
    return seen


def true_state_grads(model, x, y):
    """dL/ds_t of a 1-layer rnn_lm by BPTT through the cell in a loop: (B, T, state)."""
    from gradengines.trainers.core.protocols import recurrent_forwards

    states = []

    def looped(index, layer):
        def forward(x, h0=None):
            h = x.new_zeros(x.shape[0], layer.state_size)
            for t in range(x.shape[1]):
                h = layer.cell(x[:, t], h)
                states.append(h)
            return layer.output(torch.stack(states, dim=1))
        return forward

    with recurrent_forwards(model, looped):
        loss = sequence_cross_entropy(model(x), y)
    return torch.stack(torch.autograd.grad(loss, states), dim=1)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("k", [0, 1, 3])
def test_last_k_time_steps_exact(cell, k):
    """One layer, a loss at every step: w_t^k = dL/ds_t for the last k + 1 steps, not before."""
    torch.manual_seed(0)
    model = models.build("rnn_lm", in_features=7, out_features=11, cell=cell, hidden=5, depth=1).double()
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randint(0, 11, (3, 7), generator=gen), torch.randint(0, 11, (3, 7), generator=gen)
    engine = trainers.build_engine("highway", k=k)
    seen = capture_w(engine)
    engine.compute_grads(model, x, y, sequence_cross_entropy)
    (w,) = seen
    true = true_state_grads(model, x, y)
    T = 7
    for t in range(T):
        err = (w[:, t] - true[:, t]).abs().max().item()
        assert (err < 1e-12) if t >= T - 1 - k else (err > 1e-8), (t, err)


def test_residual_mlp_w_matches_brute_force_path_sums():
    """On the model: explicit J_i (Jacobians of the branches, one sample) and K = I; the
    engine's w^k equals the brute-force sum over paths with at most k branches."""
    torch.manual_seed(0)
    L = 4
    model = models.build("residual_mlp", in_features=5, out_features=3, depth=L, width=4).double()
    x, y = torch.randn(1, 5, dtype=torch.float64), torch.tensor([2])
    with torch.no_grad():
        hs = [model.stem(x)]
        for block in model.blocks:
            hs.append(block(hs[-1]))
    # row-vector convention: v -> v @ J_i with J_i[a, b] = d g_a / d h_b
    J = [None] + [torch.autograd.functional.jacobian(b.branch, h)[0, :, 0] for b, h in
                  zip(model.blocks, hs[:-1], strict=True)]
    K = [None] + [torch.ones(4, dtype=torch.float64)] * L
    top = hs[-1].clone().requires_grad_()
    e = torch.zeros(L + 1, 4, dtype=torch.float64)
    e[L] = torch.autograd.grad(cross_entropy_loss(model.head(top), y), top)[0][0]
    for k in range(L + 1):
        engine = trainers.build_engine("highway", k=k)
        seen = capture_w(engine)
        engine.compute_grads(model, x, y, cross_entropy_loss)
        torch.testing.assert_close(seen[0][:, 0], brute_force(J, K, e, k), rtol=0, atol=1e-12)


def test_gpt_k0_closed_form_and_gamma_invariance():
    """k = 0: w_i^0 = (1 - gamma)^(L - i) dL/dh_L (T5); k >= L: any gamma is exact backprop (T8)."""
    for gamma in (0.0, 0.2, 0.5):
        torch.manual_seed(0)
        model = models.build("gpt", in_features=5, out_features=9, depth=2, width=8, heads=2,
                             split_gamma=gamma).double()
        gen = torch.Generator().manual_seed(1)
        x, y = torch.randint(0, 9, (2, 5), generator=gen), torch.randint(0, 9, (2, 5), generator=gen)
        engine = trainers.build_engine("highway", k=0)
        seen = capture_w(engine)
        engine.compute_grads(model, x, y, sequence_cross_entropy)
        w = seen[0]
        L = 4
        for i in range(L + 1):
            torch.testing.assert_close(w[i], (1 - gamma) ** (L - i) * w[L], rtol=1e-14, atol=0)
        ref = engine_grads(model, trainers.build_engine("backprop"), x, y, sequence_cross_entropy)
        assert max_relative(engine_grads(model, trainers.build_engine("highway", k=L), x, y, sequence_cross_entropy),
                            ref) < 1e-10


def test_gamma_one_is_fpi():
    """gamma = 1 (K = 0, g = the whole sublayer) is the fixed-point iteration of a gamma = 0.2 model."""
    def gpt(gamma):
        torch.manual_seed(0)
        return models.build("gpt", in_features=5, out_features=9, depth=2, width=8, heads=2,
                            split_gamma=gamma).double()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 9, (2, 5), generator=gen), torch.randint(0, 9, (2, 5), generator=gen)
    for k in (0, 1, 2):
        a = engine_grads(gpt(1.0), trainers.build_engine("highway", k=k), x, y, sequence_cross_entropy)
        b = engine_grads(gpt(0.2), trainers.build_engine("highway", k=k, mode="fpi"), x, y, sequence_cross_entropy)
        assert max_relative(a, b) < 1e-12


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_fpi_k0_is_ftbptt_on_rnns(cell):
    model, x, y, loss, _ = zoo_case(f"rnn_lm_{cell}")
    a = engine_grads(model, trainers.build_engine("highway", k=0, mode="fpi"), x, y, loss)
    b = engine_grads(model, trainers.build_engine("ftbptt"), x, y, loss)
    assert max_relative(a, b) < 1e-12


def test_adaptive_k_logged_and_equal_to_fixed_k():
    model, x, y, loss, L = zoo_case("rnn_lm_gru")
    engine = trainers.build_engine("highway", k=L, tol=1e-3)
    adaptive = engine_grads(model, engine, x, y, loss)
    metrics = engine.metrics()
    used = metrics["highway_k"]
    assert used < L and metrics["highway_delta"] <= 1e-3  # two layers, each stopped early
    at_used = engine_grads(model, trainers.build_engine("highway", k=int(used)), x, y, loss)
    assert used == int(used) and max_relative(adaptive, at_used) < 1e-12  # what a fixed k = used computes
    assert engine.metrics().keys() == {"highway_k", "highway_delta"}
    fixed = trainers.build_engine("highway", k=L)
    engine_grads(model, fixed, x, y, loss)
    assert fixed.metrics() == {"highway_k": L - 1}  # no path crosses more than T - 1 steps


def test_batched_path_updates_batchnorm_statistics_once():
    model = image_model("post")
    x = torch.randn(8, 64, dtype=torch.float64)
    y = torch.randint(0, 4, (8,))
    other = image_model("post")
    trainers.build_engine("backprop").compute_grads(other, x, y, cross_entropy_loss)
    trainers.build_engine("highway", k=1, path="batched").compute_grads(model, x, y, cross_entropy_loss)
    for (n, a), (_, b) in zip(model.named_buffers(), other.named_buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14, msg=n)


def test_dropout_falls_back_to_the_reference_path_and_is_exact_at_k_L():
    torch.manual_seed(0)
    model = models.build("residual_mlp", in_features=6, out_features=3, depth=3, width=5, dropout=0.3).double()
    x, y = torch.randn(10, 6, dtype=torch.float64), torch.randint(0, 3, (10,))
    torch.manual_seed(5)
    ref = engine_grads(model, trainers.build_engine("backprop"), x, y, cross_entropy_loss)
    torch.manual_seed(5)
    got = engine_grads(model, trainers.build_engine("highway", k=3), x, y, cross_entropy_loss)
    assert max_relative(got, ref) < 1e-10
    with pytest.raises(RuntimeError):  # a recompute under vmap cannot redraw the same masks
        trainers.build_engine("highway", k=3, path="batched").compute_grads(model, x, y, cross_entropy_loss)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_dropout_with_k_below_L_is_not_backprop_and_the_top_k_plus_one_blocks_are_exact(k):
    """The contrast to the test above, under the same masks: below k = L the stem and the block below the top
    k + 1 get w^k, not the exact error, while the top k + 1 blocks and the head are exact (T2)."""
    torch.manual_seed(0)
    model = models.build("residual_mlp", in_features=6, out_features=3, depth=3, width=5, dropout=0.3).double()
    x, y, L = torch.randn(10, 6, dtype=torch.float64), torch.randint(0, 3, (10,)), 3
    torch.manual_seed(5)
    ref = engine_grads(model, trainers.build_engine("backprop"), x, y, cross_entropy_loss)
    torch.manual_seed(5)
    got = engine_grads(model, trainers.build_engine("highway", k=k), x, y, cross_entropy_loss)
    stem = [n for n in ref if n.startswith("stem.")]
    assert max_relative({n: got[n] for n in stem}, {n: ref[n] for n in stem}) > 1e-4
    for i in range(1, L + 1):
        names = [n for n in ref if n.startswith(f"blocks.{i - 1}.")]
        diff = max_relative({n: got[n] for n in names}, {n: ref[n] for n in names})
        assert (diff < 1e-10) if i >= L - k else (diff > 1e-3) if i == L - k - 1 else True, (i, diff)
    assert max_relative({n: got[n] for n in ref if n.startswith("head")},
                        {n: ref[n] for n in ref if n.startswith("head")}) < 1e-10


# ---- zoo -----------------------------------------------------------------------------------


@pytest.mark.parametrize("s", [2, 4])
def test_downsample_right_inverse_and_shapes(s):
    y = torch.randn(2, 8 * s, 16 // s, 16 // s, dtype=torch.float64)
    up = upsample(y, s)
    assert up.shape == (2, 8, 16, 16)
    torch.testing.assert_close(downsample(up, s), y, rtol=0, atol=0)
    x = torch.randn(2, 8, 16, 16, dtype=torch.float64)
    assert downsample(x, s).shape == (2, 8 * s, 16 // s, 16 // s)
    assert not torch.allclose(upsample(downsample(x, s), s), x)  # only a right inverse


def test_preact_block_equals_the_unwrapped_block_on_the_downsampled_stream():
    """Eq. 14: Down_s(h + Up_s(Block(Down_s h))) = Down_s h + Block(Down_s h)."""
    model = image_model("preact")
    block = model.blocks[-1]  # a stage-3 block, s = 4
    h = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    d = downsample(h, 4)
    torch.testing.assert_close(downsample(block(h), 4), d + block.body(d), rtol=1e-12, atol=1e-12)


def test_resnet_stream_keeps_one_shape_and_stage_widths():
    model = image_model("preact", depth=14)
    assert len(model.blocks) == 6
    x = torch.randn(3, 64, dtype=torch.float64)
    h = model.stem(x)
    for block in model.blocks:
        assert block.branch(h).shape == h.shape == (3, 4, 8, 8)
    assert [b.body[2].in_channels for b in model.blocks] == [4, 4, 8, 8, 16, 16]
    assert model(x).shape == (3, 4)


def test_gpt_is_causal_and_gamma_does_not_change_the_function():
    def gpt(gamma):
        torch.manual_seed(0)
        return models.build("gpt", in_features=6, out_features=9, depth=2, width=8, heads=2,
                            split_gamma=gamma).double()
    x = torch.randint(0, 9, (2, 6))
    x2 = x.clone()
    x2[:, 4:] = (x2[:, 4:] + 1) % 9
    out, out2 = gpt(0.2)(x), gpt(0.2)(x2)
    torch.testing.assert_close(out[:, :4], out2[:, :4], rtol=0, atol=1e-14)
    assert not torch.allclose(out[:, 4:], out2[:, 4:])
    torch.testing.assert_close(gpt(0.0)(x), out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("options, match", [
    ({"depth": 9}, "6n \\+ 2"),
    ({"variant": "wide"}, "variant"),
    ({"in_features": 36}, "divisible by 4"),
])
def test_resnet_bad_options(options, match):
    with pytest.raises(models.ModelConfigError, match=match):
        models.build("resnet", **{"in_features": 64, "out_features": 4, **options})


@pytest.mark.parametrize("options, match", [
    ({"width": 10, "heads": 3}, "divisible"),
    ({"split_gamma": 1.5}, "split_gamma"),
    ({"depth": 0}, "depth"),
])
def test_gpt_bad_options(options, match):
    with pytest.raises(models.ModelConfigError, match=match):
        models.build("gpt", **{"in_features": 8, "out_features": 5, **options})


# ---- contract and bad input ----------------------------------------------------------------


class TestHighwayContract(EngineContract):
    engine_name = "highway"
    engine_options = {"k": 1}

    def make_models(self, dtype=torch.float32):
        torch.manual_seed(0)
        return [models.build("residual_mlp", in_features=12, out_features=4, depth=3, width=10, dropout=0.1),
                models.build("residual_mlp", in_features=12, out_features=4, depth=4, width=10)]


class TestHighwayAdaptiveFPIContract(TestHighwayContract):
    engine_options = {"k": 3, "tol": 0.05, "mode": "fpi"}


@pytest.mark.parametrize("options", [{"k": -1}, {"tol": -0.1}, {"mode": "dsf"}, {"path": "fast"}])
def test_bad_options(options):
    with pytest.raises(trainers.ConfigError):
        trainers.build_engine("highway", **options)


def test_refuses_models_without_residual_or_recurrent_structure():
    engine = trainers.build_engine("highway")
    with pytest.raises(trainers.IncompatibleModelError, match="residual_mlp, resnet, gpt"):
        engine.check(models.build("mlp", in_features=4, out_features=2))


def test_cli_bad_k_exits_2(tmp_path):
    from gradengines.trainers.cli import train_main

    assert train_main(["--model", "residual_mlp", "--trainer", "highway", "--highway-k", "-2",
                       "--logdir", str(tmp_path), "--steps", "1"]) == 2


def test_trainer_trains_resnet_on_digits_and_logs_k(tmp_path):
    import json

    from gradengines.trainers.cli import train_main

    rc = train_main(["--model", "resnet", "--depth", "8", "--width", "4", "--trainer", "highway",
                     "--highway-k", "1", "--highway-tol", "0.5", "--steps", "12", "--batch-size", "32",
                     "--lr", "0.03", "--logdir", str(tmp_path)])
    assert rc == 0
    (metrics,) = tmp_path.rglob("metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    ks = [r["engine/highway_k"] for r in rows if "engine/highway_k" in r]
    assert ks and all(0 <= k <= 1 for k in ks)
    (result,) = tmp_path.rglob("result.json")
    record = json.loads(result.read_text())  # it trained: 12 steps take 10 classes well above chance
    assert record["final_val"]["loss"] < 0.8 * math.log(10) and record["test"]["accuracy"] > 0.3, record["test"]


@pytest.mark.parametrize("shape", ["rnn_lm", "rnn_block_lm"])
@pytest.mark.parametrize("cell", ["gru", "diagonal"])
def test_k0_exact_when_the_time_jacobian_is_its_gate(shape, cell):
    """GRU with W_hh = 0 (d h_t / d h_{t-1} = diag z_t) and the diagonal linear RNN: J_t = 0, so
    the residual path alone (k = 0) is BPTT. Fails if K_t is paired with the wrong step."""
    torch.manual_seed(0)
    model = models.build(shape, in_features=7, out_features=11, cell=cell, hidden=6, depth=2).double()
    if cell == "gru":
        with torch.no_grad():
            for layer in model.recurrent_layers:
                layer.rnn.weight_hh_l0.zero_()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 11, (3, 7), generator=gen), torch.randint(0, 11, (3, 7), generator=gen)
    ref = engine_grads(model, trainers.build_engine("backprop"), x, y, sequence_cross_entropy)
    for path in ("batched", "reference"):
        got = engine_grads(model, trainers.build_engine("highway", k=0, path=path), x, y, sequence_cross_entropy)
        assert max_relative(got, ref) < 1e-10  # W_hh's gradient too
    assert max_relative(engine_grads(model, trainers.build_engine("ftbptt"), x, y, sequence_cross_entropy), ref) > 1e-3


@pytest.mark.parametrize("shape", ["rnn_lm", "rnn_block_lm"])
def test_k0_on_a_gru_is_dsf_with_the_tied_feedback(shape):
    """w^0 = CumSumProd(e, z_{t+1}) is DSF's g_t = e_t + z_{t+1} g_{t+1}: two engines, one number."""
    model, x, y, loss, _ = zoo_case(f"{shape}_gru")
    a = engine_grads(model, trainers.build_engine("highway", k=0), x, y, loss)
    b = engine_grads(model, trainers.build_engine("dsf", feedback="tied"), x, y, loss)
    assert max_relative(a, b) < 1e-12


def test_k0_on_an_lstm_is_ftbptt():
    """The paper's LSTM split (K = [0; f] on [h; c]): the errors arrive on the h half only and K
    carries nothing along h, so k = 0 gives no gradient through time; from k = 1 it does."""
    model, x, y, loss, _ = zoo_case("rnn_lm_lstm")
    ft = engine_grads(model, trainers.build_engine("ftbptt"), x, y, loss)
    assert max_relative(engine_grads(model, trainers.build_engine("highway", k=0), x, y, loss), ft) < 1e-12
    assert max_relative(engine_grads(model, trainers.build_engine("highway", k=1), x, y, loss), ft) > 1e-3


class TestHighwayRecurrentContract(test_dsf.TestDSFContract):
    """The contract on rnn_lm (GRU) and rnn_block_lm (LSTM), with DSF's per-step toy task."""

    engine_name = "highway"
    engine_options = {"k": 2}


def test_tol_stops_at_the_iteration_a_hand_computation_gives_and_reports_its_ratio():
    """A fixed linear case (n = 4 positions, K = 0.5, J = 0.3 I): d^0 = scan(e), d^{m+1} = scan(back(d^m)),
    w^m = d^0 + ... + d^m; with tol between the hand ratios ||d^m|| / ||w^m|| of m = 1 and m = 2 the loop stops
    after 2 iterations and reports the ratio of m = 2 (issue 41: the stopping test squared, not doubled)."""
    from gradengines.models.layers.scan import reverse_scan
    from gradengines.trainers.engines.highway import highway_iterations

    e = torch.zeros(4, 1, 2, dtype=torch.float64)
    e[-1] = torch.tensor([1.0, -2.0], dtype=torch.float64)
    carry = torch.tensor(0.5, dtype=torch.float64)

    def back(W):  # v_j = w_{j+1} J, J = 0.3 I; zero at the last position
        return torch.cat([0.3 * W[1:], torch.zeros_like(W[:1])])

    def scan(v):
        return reverse_scan(v, carry, dim=0)

    d = scan(e)
    w, ratios = d.clone(), []
    for _ in range(3):
        d = scan(back(d))
        w = w + d
        ratios.append(float(d.norm() / w.norm()))
    assert ratios[0] > ratios[1] > ratios[2]
    tol = (ratios[0] + ratios[1]) / 2
    got, used, rel = highway_iterations(e, carry, back, k=3, tol=tol)
    assert used == 2 and rel == pytest.approx(ratios[1], rel=1e-12)
    assert torch.allclose(got, w - d, rtol=1e-12, atol=0)  # w^2: the third iteration not run
    # no error at all: nothing to carry, converged at once (0 / 0 is taken as converged, not as 100% apart)
    got, used, rel = highway_iterations(torch.zeros_like(e), carry, back, k=3, tol=tol)
    assert (used, rel) == (1, 0.0) and not got.any()  # stopped at the first check
