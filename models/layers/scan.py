"""Reverse linear-recurrence scan with a diagonal (or scalar) coefficient.

    u_{n-1} = v_{n-1},   u_i = v_i + a_i * u_{i+1}      (i = n-2 .. 0)

element-wise, i.e. u_i = sum_{j >= i} (a_i a_{i+1} ... a_{j-1}) v_j. ``a_i``
is the coefficient that carries ``u_{i+1}`` back to step i (its last entry is
unused). One scan serves two engines:

* Highway-BP (Fagnou et al., ICLR 2025, Eq. 9 and App. B): the reverse
  CumSumProd along depth or time, ``u_i = v_i + u_{i+1} K_{i+1}`` with
  diagonal K, i.e. ``a_i = K_{i+1}`` (the paper's Algorithm 1 must start
  from ``P_i = K_{i+1}``; starting from ``K_i`` is the known off-by-one);
* DSF (Caillon et al., arXiv 2503.23104): the stationary feedback
  ``g_t = e_t + A g_{t+1}`` with a fixed diagonal A, i.e. a constant ``a``.

The forward recurrence s_t = a_t s_{t-1} + u_t is the same scan in reversed
time (``forward_scan``).

Forms (``method``), all exact up to rounding:
* ``sequential``: n element-wise steps (the reference).
* ``hillis_steele``: ceil(log2 n) rounds of ``u_i += P_i u_{i+s}``,
  ``P_i *= P_{i+s}`` for s = 1, 2, 4, ...: O(n log n) work, O(log n) depth;
  out of place, so it is the form to use under autograd (the recurrent
  layers' forward passes); the others write in place and serve engines,
  which never differentiate through the scan.
* ``chunked``: blocks of c ~ sqrt(n) steps: local scans inside all blocks at
  once, a sequential carry across blocks, then the carries pushed into the
  blocks with reverse cumulative products: O(n) work, O(sqrt n) sequential steps.
* ``fft``: only for a time-invariant ``a``: a causal convolution in reversed
  time with the kernel a^k, by real FFTs of length 2n: O(n log n).
No form divides by powers of ``a`` (that trick overflows for long sequences
and divides by zero at a = 0).
"""

import math

import torch

__all__ = ["reverse_scan", "forward_scan", "METHODS"]

METHODS = ("auto", "sequential", "hillis_steele", "chunked", "fft")


def _sequential(v, a):
    a = a.expand_as(v)
    u = torch.empty_like(v)
    u[-1] = v[-1]
    for i in range(v.shape[0] - 2, -1, -1):
        u[i] = v[i] + a[i] * u[i + 1]
    return u


def _hillis_steele(v, a):
    """Out of place, so autograd can differentiate it (in v and a)."""
    n = v.shape[0]
    u, P = v, a.expand_as(v)  # P_i: product carrying u_{i+s} back to i
    s = 1
    while s < n:
        u = torch.cat([u[: n - s] + P[: n - s] * u[s:], u[n - s:]])
        if 2 * s < n:  # the last round's products are never read
            P = torch.cat([P[: n - s] * P[s:], P[n - s:]])
        s *= 2
    return u


def _chunked(v, a, chunk: int | None = None):
    n = v.shape[0]
    c = chunk or max(1, math.isqrt(n))
    blocks = -(-n // c)
    pad = blocks * c - n
    invariant = a.shape[0] == 1
    if pad:  # zero-padded tail: v = 0 there (and a = 0) changes nothing
        v = torch.cat([v, v.new_zeros(pad, *v.shape[1:])])
        if not invariant:
            a = torch.cat([a.expand(n, *a.shape[1:]), a.new_zeros(pad, *a.shape[1:])])
    # step-major layout (c, blocks, ...): every step of the local scans is one contiguous slice
    v = v.reshape(blocks, c, *v.shape[1:]).transpose(0, 1).contiguous()
    if invariant:
        # a_i ... a_{c-1} = a^(c - i): powers, never materialized over the batch
        reach = torch.cumprod(a.expand(c, *a.shape[1:]), 0).flip(0).unsqueeze(1)  # (c, 1, ...)
        step = [a[0]] * c
    else:
        a = a.expand(blocks * c, *a.shape[1:]).reshape(blocks, c, *a.shape[1:]).transpose(0, 1).contiguous()
        reach = torch.cumprod(a.flip(0), 0).flip(0)  # (c, blocks, ...): a_i ... a_{end of block}
        step = a
    # 1. local scans inside every block at once (c sequential steps)
    local = torch.empty_like(v)
    local[-1] = v[-1]
    for i in range(c - 2, -1, -1):
        torch.addcmul(v[i], step[i], local[i + 1], out=local[i])
    # 2. carries across blocks (blocks sequential steps): u at every block start
    starts = torch.empty_like(local[0])  # (blocks, ...)
    starts[-1] = local[0, -1]
    for b in range(blocks - 2, -1, -1):
        torch.addcmul(local[0, b], reach[0, 0 if invariant else b], starts[b + 1], out=starts[b])
    # 3. push each next block's start into its predecessor's positions
    carry = torch.cat([starts[1:], torch.zeros_like(starts[:1])])  # (blocks, ...)
    u = local + reach * carry.unsqueeze(0)  # (c, blocks, ...)
    return u.transpose(0, 1).reshape(blocks * c, *u.shape[2:])[:n]


def _fft(v, a):
    n = v.shape[0]
    if a.shape[0] != 1:
        raise ValueError("the fft form needs a time-invariant coefficient (a of length 1 along the scan dim)")
    powers = torch.cumprod(torch.cat([torch.ones_like(a), a.expand(n - 1, *a.shape[1:])]), 0)  # a^0 .. a^{n-1}
    rev = torch.flip(v, [0])  # reversed time: g_rev = causal conv(e_rev, a^k)
    size = 2 * n
    out = torch.fft.irfft(torch.fft.rfft(rev, size, dim=0) * torch.fft.rfft(powers.expand_as(v), size, dim=0),
                          size, dim=0)[:n]
    return torch.flip(out, [0])


def reverse_scan(v: torch.Tensor, a: torch.Tensor | float, *, dim: int = 0, method: str = "auto") -> torch.Tensor:
    """u_i = v_i + a_i * u_{i+1} along ``dim`` (module docstring).

    Args:
        v: (..., n, ...) the inputs, n along ``dim``.
        a: the coefficients, broadcastable to ``v``: the same shape (time-varying
           diagonal), length 1 along ``dim`` (time-invariant, e.g. a per-channel
           decay), or a Python number.
        method: one of ``METHODS``; ``auto`` picks ``sequential`` on the CPU or for
           short scans (n < 64) and ``chunked`` otherwise (GPU).
    """
    if method not in METHODS:
        raise ValueError(f"unknown scan method {method!r}; choose one of {', '.join(METHODS)}")
    a = torch.as_tensor(a, dtype=v.dtype, device=v.device)
    if a.dim() < v.dim():
        a = a.reshape((1,) * (v.dim() - a.dim()) + tuple(a.shape))
    v, a = v.movedim(dim, 0), a.movedim(dim, 0)  # scan dim first: (n, ...)
    if method == "auto":  # measured: on the CPU the element-wise loop wins; on a GPU its launches dominate
        method = "sequential" if v.device.type == "cpu" or v.shape[0] < 64 else "chunked"
    u = {"sequential": _sequential, "hillis_steele": _hillis_steele, "chunked": _chunked, "fft": _fft}[method](v, a)
    return u.movedim(0, dim)


def forward_scan(u: torch.Tensor, a: torch.Tensor | float, s0: torch.Tensor | None = None, *, dim: int = 1,
                 method: str = "hillis_steele") -> torch.Tensor:
    """s_t = a_t * s_{t-1} + u_t along ``dim`` (t = 0 .. T-1), with s_{-1} = ``s0`` (zeros when None).

    The reverse scan in reversed time: with tau = T-1-t, s_tau = u_tau + a_tau s_{tau+1}.
    ``u``: (B, T, d) by default; ``a`` broadcastable to it; ``s0``: ``u`` without ``dim``.
    Differentiable with the default (``hillis_steele``) form.
    """
    a = torch.as_tensor(a, dtype=u.dtype, device=u.device)
    if a.dim() < u.dim():
        a = a.reshape((1,) * (u.dim() - a.dim()) + tuple(a.shape))
    a = a.expand_as(u)
    if s0 is not None:  # fold the initial state into the first step
        first = u.narrow(dim, 0, 1) + a.narrow(dim, 0, 1) * s0.unsqueeze(dim)
        u = torch.cat([first, u.narrow(dim, 1, u.shape[dim] - 1)], dim=dim)
    return reverse_scan(u.flip(dim), a.flip(dim), dim=dim, method=method).flip(dim)
