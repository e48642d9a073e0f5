"""The shared reverse scan u_i = v_i + a_i u_{i+1}: every form against a brute-force sum."""

import pytest
import torch

from gradengines.models.layers.scan import reverse_scan

FORMS = ["sequential", "hillis_steele", "chunked", "auto"]


def brute_force(v, a):
    """u_i = sum_{j >= i} (a_i ... a_{j-1}) v_j along dim 0, by explicit products."""
    n = v.shape[0]
    a = a.expand_as(v)
    u = torch.zeros_like(v)
    for i in range(n):
        factor = torch.ones_like(v[0])
        for j in range(i, n):
            u[i] += factor * v[j]
            factor = factor * a[j]
    return u


@pytest.mark.parametrize("method", FORMS)
@pytest.mark.parametrize("n", [1, 2, 5, 8, 13, 64, 100])
def test_time_varying_diagonal_matches_brute_force(method, n):
    gen = torch.Generator().manual_seed(n)
    v = torch.randn(n, 3, 4, generator=gen, dtype=torch.float64)
    a = torch.rand(n, 3, 4, generator=gen, dtype=torch.float64) * 1.5 - 0.25  # signs and |a| > 1 too
    torch.testing.assert_close(reverse_scan(v, a, method=method), brute_force(v, a), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", FORMS + ["fft"])
@pytest.mark.parametrize("n", [1, 7, 64, 300])
def test_time_invariant_channels_including_zero_and_one(method, n):
    """DSF's A = diag(linspace(0, 1, d)): channel 0 is truncation (a = 0), the last a reverse cumsum (a = 1)."""
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(n, 2, 6, generator=gen, dtype=torch.float64)  # (T, B, d)
    a = torch.linspace(0, 1, 6, dtype=torch.float64).reshape(1, 1, 6)
    u = reverse_scan(v, a, method=method)
    torch.testing.assert_close(u[..., 0], v[..., 0], rtol=0, atol=1e-12)  # a = 0: u = v
    torch.testing.assert_close(u[..., -1], torch.flip(torch.cumsum(torch.flip(v[..., -1], [0]), 0), [0]),
                               rtol=1e-10, atol=1e-10)  # a = 1: reverse cumulative sum
    torch.testing.assert_close(u, reverse_scan(v, a, method="sequential"), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("method", ["hillis_steele", "chunked", "fft"])
def test_long_scans_do_not_overflow(method):
    """No division by powers of a: a = 0.5 over 4096 steps stays finite and exact."""
    v = torch.randn(4096, 3, dtype=torch.float64)
    u = reverse_scan(v, torch.tensor([[0.5, 0.0, 0.99]], dtype=torch.float64), method=method)
    assert torch.isfinite(u).all()
    torch.testing.assert_close(u, reverse_scan(v, torch.tensor([[0.5, 0.0, 0.99]], dtype=torch.float64),
                                               method="sequential"), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("method", FORMS)
def test_dim_argument_and_scalar_coefficient(method):
    v = torch.randn(4, 37, 5, dtype=torch.float64)  # scan along dim 1 (time in (B, T, d))
    u = reverse_scan(v, 0.7, dim=1, method=method)
    ref = brute_force(v.movedim(1, 0), torch.tensor(0.7, dtype=torch.float64)).movedim(0, 1)
    torch.testing.assert_close(u, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", FORMS + ["fft"])
def test_causality_u_i_depends_only_on_later_inputs(method):
    v = torch.randn(50, 4, dtype=torch.float64)
    a = torch.full((1, 4), 0.9, dtype=torch.float64)
    base = reverse_scan(v, a, method=method)
    bumped = v.clone()
    bumped[20] += 1.0
    diff = reverse_scan(bumped, a, method=method) - base
    assert diff[21:].abs().max() < 1e-12  # steps after 20 do not see it
    assert diff[:21].abs().min() > 0  # steps up to 20 do


def test_bad_method_and_fft_needs_constant_coefficient():
    v = torch.randn(5, 2)
    with pytest.raises(ValueError, match="unknown scan method"):
        reverse_scan(v, 0.5, method="blelloch")
    with pytest.raises(ValueError, match="time-invariant"):
        reverse_scan(v, torch.rand(5, 2), method="fft")


def test_hillis_steele_is_differentiable_like_the_loop():
    """The out-of-place form carries gradients to v and a (the recurrent layers rely on it)."""
    gen = torch.Generator().manual_seed(3)
    v = torch.randn(11, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    a = torch.rand(11, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 2, 3, generator=gen, dtype=torch.float64)

    def loop(v, a):
        out = [v[-1]]
        for i in range(v.shape[0] - 2, -1, -1):
            out.append(v[i] + a[i] * out[-1])
        return torch.stack(out[::-1])

    got = torch.autograd.grad((reverse_scan(v, a, method="hillis_steele") * w).sum(), (v, a))
    ref = torch.autograd.grad((loop(v, a) * w).sum(), (v, a))
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("with_s0", [False, True])
def test_forward_scan_is_the_forward_recurrence(with_s0):
    from gradengines.models.layers.scan import forward_scan

    gen = torch.Generator().manual_seed(4)
    u = torch.randn(2, 9, 3, generator=gen, dtype=torch.float64)  # (B, T, d)
    a = torch.rand(2, 9, 3, generator=gen, dtype=torch.float64)
    s0 = torch.randn(2, 3, generator=gen, dtype=torch.float64) if with_s0 else None
    s, ref = torch.zeros(2, 3, dtype=torch.float64) if s0 is None else s0, []
    for t in range(9):
        s = a[:, t] * s + u[:, t]
        ref.append(s)
    torch.testing.assert_close(forward_scan(u, a, s0), torch.stack(ref, 1), rtol=1e-12, atol=1e-12)
