"""Plain NumPy reference for the ``powersgd`` transform stage and the Pufferfish helpers
(docs/codecs.md, "powersgd" and "Pufferfish factorization helpers").

Follows the numbered rules literally, with the same NumPy operations as the codec where the
result must agree bit for bit (``P @ Q.T``; ``M Q``, Gram-Schmidt and ``M^T P`` in their fixed
orders), and no
``codec`` import except the bfloat16 dtype; reference.sparse's once-rounding to 16-bit formats and key hash.

* :func:`matrix_of`, :func:`initial_q`, :func:`orthogonalize`: rules 1-3.
* :func:`encode` returns the values the value stage codes (``P.ravel()`` then ``Q.ravel()``
  in the domain dtype; the tensor itself for a pass-through) and the new ``Q``.
* :func:`decode` is ``P @ Q.T`` rounded once to the frame's dtype.
* :class:`ErrorFeedback` is the residual/warm-start loop of ``codec.ErrorFeedback`` for
  float32/float64 tensors (value stage ``none``).
* :func:`svd_error` is the truncated-SVD optimum ``||M - M_r||_F``; :func:`factor_rank`,
  :func:`layer_params` and :func:`plan_counts` restate Pufferfish's formulas.
"""

from __future__ import annotations

import math

import numpy as np

from codec.dtypes import bfloat16

from .sparse import key_hash, round_to

F16 = np.dtype(np.float16)
BF16 = np.dtype(bfloat16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

#: docs/codecs.md defaults of ``powersgd``
DEFAULTS = {"rank": 2, "warm_start": True, "min_compression_rate": 2.0, "seed": 0}


# ------------------------------------------------------------------ rules 1-2
def domain_dtype(dtype) -> np.dtype:
    """float64 for float64 input, float32 for float16/bfloat16/float32."""
    return F64 if np.dtype(dtype) == F64 else F32


def matrix_of(shape, rank: int, min_compression_rate: float):
    """``(n, m, r)``, or None when the tensor passes through (ndim <= 1, an empty matrix, or
    ``(n + m) * r * min_compression_rate >= n * m``)."""
    shape = tuple(shape)
    if len(shape) <= 1:
        return None
    n = int(shape[0])
    m = int(np.prod(shape[1:], dtype=np.int64))
    r = min(int(rank), n, m)
    if r == 0:
        return None
    if (n + m) * r * float(min_compression_rate) >= n * m:
        return None
    return n, m, r


def initial_q(m: int, r: int, dtype, seed: int, key=None, step: int = 0) -> np.ndarray:
    """Standard normal ``m x r`` in ``dtype`` from PCG64 seeded with ``[seed, key_hash(key), step]``."""
    rng = np.random.default_rng([int(seed), key_hash(key), int(step)])
    return rng.standard_normal((m, r), dtype=np.dtype(dtype).type)


# ------------------------------------------------------------------ rule 3
#: column lanes of the product ``M Q`` (codec.layout.LANES)
LANES = 64


def seqsum(a, axis=-1):
    """The sum along ``axis`` in index order (``np.cumsum`` adds strictly in order; ``np.sum``
    is pairwise)."""
    a = np.asarray(a, np.float64)
    if a.shape[axis] == 0:
        return np.zeros(np.delete(a.shape, axis if axis >= 0 else a.ndim + axis))
    return np.take(np.cumsum(a, axis=axis), -1, axis=axis)


def project(mat, q) -> np.ndarray:
    """``P = M Q`` in the fixed order: each ``P[i, c]`` the float64 sum of ``M[i, j] * Q[j, c]``
    in LANES column lanes (lane ``j % LANES`` adds its terms in order of ``j``; the lanes are
    added in order, then the tail ``j >= (m // LANES) * LANES`` in order), rounded once to
    ``M``'s dtype."""
    n, m = mat.shape
    m64, q64 = mat.astype(np.float64), q.astype(np.float64)
    rows = m // LANES
    full = rows * LANES
    out = np.empty((n, q.shape[1]))
    for c in range(q.shape[1]):
        prod = m64 * q64[:, c]  # (the products, rounded each on its own)
        lanes = seqsum(prod[:, :full].reshape(n, rows, LANES), axis=1)  # (n, LANES)
        out[:, c] = seqsum(np.concatenate([np.zeros((n, 1)), lanes, prod[:, full:]], axis=1), axis=1)
    return out.astype(mat.dtype)


def back_project(mat, p) -> np.ndarray:
    """``Q = M^T P``: each ``Q[j, c]`` the float64 sum of ``M[i, j] * P[i, c]`` in order of
    ``i``, rounded once to ``M``'s dtype."""
    prod = mat.astype(np.float64)[:, :, None] * p.astype(np.float64)[:, None, :]  # (n, m, r)
    return seqsum(np.concatenate([np.zeros((1,) + prod.shape[1:]), prod]), axis=0).astype(mat.dtype)


def orthogonalize(p) -> np.ndarray:
    """A new array: the columns of ``p`` orthonormalised by Gram-Schmidt in float64 (every dot
    product a sum in index order), the earlier columns removed twice, with the epsilon guard:
    a column whose norm after removing the earlier columns is 0 or ``<= 16 * eps * (its norm
    before)`` (eps of ``p``'s dtype) becomes zero; rounded once to ``p``'s dtype."""
    w = np.array(p, np.float64)
    tiny = 16 * np.finfo(np.asarray(p).dtype).eps
    for i in range(w.shape[1]):
        before = np.sqrt(seqsum(w[:, i] * w[:, i]))
        for _ in range(2):  # the earlier columns removed twice
            for j in range(i):
                w[:, i] -= w[:, j] * seqsum(w[:, j] * w[:, i])
        norm = np.sqrt(seqsum(w[:, i] * w[:, i]))
        w[:, i] = 0.0 if norm == 0 or norm <= tiny * before else w[:, i] / norm
    return w.astype(np.asarray(p).dtype)


# ------------------------------------------------------------------ encode / decode
def widen(x) -> np.ndarray:
    """``x`` in the domain dtype (16-bit formats widen exactly to float32)."""
    x = np.asarray(x)
    return x.astype(domain_dtype(x.dtype))


def encode(x, *, rank=2, warm_start=True, min_compression_rate=2.0, seed=0, key=None, step=0, q=None):
    """One PowerSGD step on ``x``.

    Returns ``(values, q_new)``: the values the value stage codes (the flat tensor in its own
    dtype for a pass-through; ``P.ravel()`` then ``Q.ravel()`` otherwise) and the ``Q`` to keep
    for the next step (None for a pass-through or without warm start).  ``q`` is the key's
    previous ``Q`` (used only with ``warm_start`` when its shape and dtype fit)."""
    x = np.asarray(x)
    plan = matrix_of(x.shape, rank, min_compression_rate)
    if plan is None:
        return x.reshape(-1).copy(), None
    n, m, r = plan
    dt = domain_dtype(x.dtype)
    mat = widen(x).reshape(n, m)
    if not np.isfinite(mat).all():
        bad = int(np.flatnonzero(~np.isfinite(mat.reshape(-1)))[0])
        raise ValueError(f"x: non-finite value at position {tuple(int(v) for v in np.unravel_index(bad, x.shape))}")
    # the start Q, orthonormalised: a fresh draw of (seed, key, step) without warm start; the
    # key's last Q with it (the draw of step 0 when there is none that fits), replaced by the
    # draw of (seed, key, step) when it has a zero column after orthogonalisation
    if not warm_start:
        q = orthogonalize(initial_q(m, r, dt, seed, key, step))
    elif q is None or q.shape != (m, r) or q.dtype != dt:
        q = orthogonalize(initial_q(m, r, dt, seed, key, 0))
    else:
        q = orthogonalize(q)
        if not np.all(np.any(q != 0, axis=0)):
            q = orthogonalize(initial_q(m, r, dt, seed, key, step))
    p = orthogonalize(project(mat, q))
    q = back_project(mat, p)
    return np.concatenate((p.reshape(-1), q.reshape(-1))), (q if warm_start else None)


def factors(values, shape, rank=2, min_compression_rate=2.0):
    """``(P, Q)`` read back from the coded values (None for a pass-through)."""
    plan = matrix_of(shape, rank, min_compression_rate)
    if plan is None:
        return None
    n, m, r = plan
    values = np.ascontiguousarray(values)
    return values[: n * r].reshape(n, r), values[n * r :].reshape(m, r)


def product(p, q) -> np.ndarray:
    """``P Q^T`` in ``p``'s dtype, each element the chain docs/codecs.md fixes: ``p[i,0]*q[j,0]``
    rounded, then one fused multiply-add (one rounding) per further rank, in order.  Not
    ``p @ q.T``: a BLAS picks its own order, and a newer OpenBLAS picked another one for
    40 x 30 at rank 8."""
    y = p[:, :1] * q[:, 0][None, :]
    for c in range(1, p.shape[1]):
        y = fma(p[:, c][:, None], q[:, c][None, :], y)
    return y


def fma(a, b, c) -> np.ndarray:
    """``a * b + c`` rounded once to the arrays' dtype (float32 or float64), elementwise."""
    a, b, c = np.broadcast_arrays(a, b, c)
    if a.dtype == np.float64:  # exactly, in rationals: a float64 product needs 106 bits
        from fractions import Fraction

        flat = [float(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in zip(a.ravel().tolist(), b.ravel().tolist(), c.ravel().tolist())]
        return np.array(flat, np.float64).reshape(a.shape)
    # float32: the product is exact in float64; the sum rounded to odd there (TwoSum's error
    # as a sticky bit), then to float32, is the exact sum rounded once
    x, y = a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64)
    s = x + y
    bb = s - x
    err = (x - (s - bb)) + (y - bb)
    u = s.view(np.uint64).copy()
    inexact = err != 0
    u[inexact & ((err > 0) != (s > 0))] -= np.uint64(1)  # truncated toward zero where s passed the exact sum
    u[inexact] |= np.uint64(1)
    return u.view(np.float64).astype(np.float32)


def decode(values, shape, dtype, *, rank=2, min_compression_rate=2.0) -> np.ndarray:
    """The decoded tensor: ``P @ Q.T`` in the domain dtype, rounded once to ``dtype`` when that
    is 16-bit; a pass-through's values as they are."""
    dtype = np.dtype(dtype)
    pq = factors(values, shape, rank, min_compression_rate)
    if pq is None:
        return np.asarray(values).astype(dtype).reshape(shape)
    p, q = pq
    y = product(p, q)
    if dtype in (F16, BF16):
        y = round_to(y.astype(np.float64), dtype)
    return y.reshape(shape)


def wire_payload(shape, dtype, rank=2, min_compression_rate=2.0) -> int:
    """Payload bytes with value stage ``none``: ``itemsize(domain) * r * (n + m)``, or the
    tensor's own bytes for a pass-through."""
    plan = matrix_of(shape, rank, min_compression_rate)
    if plan is None:
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    n, m, r = plan
    return domain_dtype(dtype).itemsize * r * (n + m)


class ErrorFeedback:
    """``acc = x + residual; frame = encode(acc); residual = acc - decode(frame)`` per key,
    with the warm-started ``Q`` and the step count per key (float32/float64 tensors)."""

    def __init__(self, **params):
        self.params = {**DEFAULTS, **params}
        self.residual, self.q, self.steps = {}, {}, {}

    def encode(self, x, key=None):
        """``(values, decoded)`` of the step."""
        x = np.asarray(x)
        assert x.dtype in (F32, F64), "reference error feedback: float32/float64 only"
        acc = x + self.residual.get(key, np.zeros_like(x))
        p = self.params
        values, q = encode(
            acc,
            rank=p["rank"],
            warm_start=p["warm_start"],
            min_compression_rate=p["min_compression_rate"],
            seed=p["seed"],
            key=key,
            step=self.steps.get(key, 0),
            q=self.q.get(key),
        )
        dec = decode(values, x.shape, x.dtype, rank=p["rank"], min_compression_rate=p["min_compression_rate"])
        self.residual[key] = acc - dec
        if q is not None:
            self.q[key] = q
        self.steps[key] = self.steps.get(key, 0) + 1
        return values, dec


# ------------------------------------------------------------------ SVD
def as_matrix(x) -> np.ndarray:
    """``x`` as the float64 ``shape[0] x rest`` matrix."""
    x = np.asarray(x)
    return x.astype(np.float64).reshape(x.shape[0], -1)


def svd_error(x, r: int) -> float:
    """``||M - M_r||_F``, the best rank-``r`` error (Eckart-Young): the dropped singular values."""
    s = np.linalg.svd(as_matrix(x), compute_uv=False)
    return float(np.sqrt(np.sum(s[r:] ** 2)))


def dropped_energy_ratio(x, r: int) -> float:
    """``sqrt(sum_{i>=r} s_i^2 / sum_i s_i^2)`` in float64 (0 for a zero matrix)."""
    s = np.linalg.svd(as_matrix(x), compute_uv=False)
    total = float(np.sum(s**2))
    return math.sqrt(float(np.sum(s[r:] ** 2)) / total) if total > 0 else 0.0


# ------------------------------------------------------------------ Pufferfish
def factor_rank(shape, rank=None, rank_ratio=0.25) -> int:
    """``max(1, floor(out * rank_ratio))`` (or ``rank``), at most ``min(out, in*kh*kw)``."""
    out = int(shape[0])
    cols = int(np.prod(shape[1:], dtype=np.int64))
    r = max(1, math.floor(out * rank_ratio)) if rank is None else int(rank)
    return min(r, out, cols)


def layer_params(shape, r: int) -> int:
    """Parameters of a factorized layer: ``r * (in*kh*kw + out)``."""
    out = int(shape[0])
    cols = int(np.prod(shape[1:], dtype=np.int64))
    return r * (cols + out)


def plan_counts(shapes: dict, rank_ratio=0.25, keep_first=1, keep_last=1, min_size=4096):
    """``(params, params_after, {name: rank})`` under Pufferfish's policy, restated: weights are
    2-D/4-D shapes; the first ``keep_first`` and last ``keep_last`` weights, those with fewer
    than ``min_size`` elements and those whose factors would not be smaller stay full rank."""
    names = list(shapes)
    weights = [k for k in names if len(shapes[k]) in (2, 4)]
    kept = set(weights[: int(keep_first)]) | set(weights[len(weights) - int(keep_last) :] if keep_last else [])
    before = after = 0
    ranks = {}
    for k in names:
        shape = shapes[k]
        size = int(np.prod(shape, dtype=np.int64))
        before += size
        if k not in weights or k in kept or size < min_size:
            after += size
            continue
        r = factor_rank(shape, None, rank_ratio)
        fact = layer_params(shape, r)
        if fact >= size:
            after += size
            continue
        ranks[k] = r
        after += fact
    return before, after, ranks


def conv2d(x, w, padding: int = 0) -> np.ndarray:
    """Direct 2-D convolution (cross-correlation, stride 1) in float64: ``x`` (N, C, H, W),
    ``w`` (O, C, kh, kw) -> (N, O, H', W')."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    if padding:
        x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    kh, kw = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))  # N, C, H', W', kh, kw
    return np.einsum("nchwij,ocij->nohw", win, w)
