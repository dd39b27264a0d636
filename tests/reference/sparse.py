"""Plain NumPy references for the select stages of docs/codecs.md ("Select stages").

Each function follows the numbered semantics of the document literally, favouring the
obviously correct over the fast: no Numba, no histogram, no codec import (only the
bfloat16 dtype).  Every selector takes ``acc`` (the array being selected from, any shape,
any of float16 / bfloat16 / float32 / float64) and returns ``(positions, values)``:
the sorted kept flat positions (int64) and the decoded kept values in ``acc``'s dtype.

The tests compare the codecs against these, bit for bit.
"""

from __future__ import annotations

import hashlib
import math
from statistics import NormalDist

import numpy as np

from codec.dtypes import bfloat16

F16 = np.dtype(np.float16)
BF16 = np.dtype(bfloat16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
MASK64 = (1 << 64) - 1


# ------------------------------------------------------------------ helpers
def wide(acc) -> np.ndarray:
    """Flat float64 copy of ``acc`` (exact for every supported dtype)."""
    return np.asarray(acc).reshape(-1).astype(np.float64)


def check_finite(acc) -> None:
    """ValueError naming the first non-finite position (as the docs require of every sparsifier)."""
    a = np.asarray(acc)
    w = wide(a)
    bad = np.flatnonzero(~np.isfinite(w))
    if bad.size:
        where = tuple(int(v) for v in np.unravel_index(int(bad[0]), a.shape)) if a.ndim else ()
        raise ValueError(f"non-finite value at position {where}")


def k_of(ratio: float, n: int) -> int:
    """``k = max(1, floor(ratio * n))`` in float64, ``min(k, n)``, 0 when ``n == 0``."""
    if n == 0:
        return 0
    return min(max(1, math.floor(float(ratio) * n)), n)


def round_to(x, dtype) -> np.ndarray:
    """float64 ``x`` rounded once (nearest, ties to even) to ``dtype``; returns a ``dtype`` array.

    float32/float64 use NumPy's (correctly rounded) casts; the 16-bit formats are rounded
    in float64 arithmetic (scale to the quantum of each value's binade, ``np.rint``, scale
    back: all exact), so there is no double rounding through float32.
    """
    dtype = np.dtype(dtype)
    x = np.asarray(x, np.float64)
    if dtype in (F32, F64):
        return x.astype(dtype)
    p, qmin, top = {F16: (11, -24, 2.0**16), BF16: (8, -133, 2.0**128)}[dtype]
    with np.errstate(all="ignore"):
        _, e = np.frexp(x)
        q = np.maximum(e - p, qmin).astype(np.int32)
        v = np.ldexp(np.rint(np.ldexp(x, -q)), q)
        v = np.where(np.abs(v) >= top, np.copysign(np.inf, x), v)
        v = np.where(np.isfinite(x), v, x)
    return v.astype(dtype)  # exact: v is representable


def code_values(vals, value_stage: str, dtype) -> np.ndarray:
    """Decoded kept values after value stage ``none`` / ``fp16`` / ``bf16``, in ``dtype``.

    fp16/bf16: rounded once to the 16-bit format, then widened exactly (through float32 for
    16-bit outputs: fp16 -> bfloat16 rounds once more, as docs/codecs.md says)."""
    dtype = np.dtype(dtype)
    vals = np.asarray(vals)
    if value_stage == "none":
        return vals.astype(dtype)
    q = round_to(wide(vals), F16 if value_stage == "fp16" else BF16).astype(np.float64)
    return round_to(q, dtype)


def dense(positions, values, shape, dtype) -> np.ndarray:
    """The decoded array: zeros except ``values`` at the flat ``positions``."""
    out = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype)
    out[np.asarray(positions, np.int64)] = values
    return out.reshape(shape)


def index_bytes(positions, n: int) -> int:
    """Bytes of the shared index coder: min(packed gaps, bitmap), ties to gaps."""
    p = np.asarray(positions, np.int64)
    k = p.size
    if k:
        gaps = np.diff(np.concatenate([[-1], p])) - 1
        w = max(1, int(gaps.max()).bit_length())
    else:
        w = 1
    return min((k * w + 7) // 8, (n + 7) // 8)


def _ordered(acc) -> np.ndarray:
    """Flat indices by decreasing |acc|, ties to the lower index (stable sort)."""
    return np.argsort(-np.abs(wide(acc)), kind="stable")


# ------------------------------------------------------------------ topk
def topk(acc, k: int):
    """The first ``k`` entries of a stable sort by decreasing |acc|, sorted by position."""
    check_finite(acc)
    flat = np.asarray(acc).reshape(-1)
    k = min(int(k), flat.size)
    pos = np.sort(_ordered(flat)[:k]).astype(np.int64)
    return pos, flat[pos].copy()


def topk_brute(acc, k: int):
    """Pure-Python top-k (sorted() with key (-|x|, index)) to validate :func:`topk`."""
    flat = [float(v) for v in np.asarray(acc).reshape(-1).astype(np.float64)]
    order = sorted(range(len(flat)), key=lambda i: (-abs(flat[i]), i))
    pos = np.array(sorted(order[: min(k, len(flat))]), np.int64)
    return pos, np.asarray(acc).reshape(-1)[pos].copy()


# ------------------------------------------------------------------ gaussiank
def gaussiank_threshold(acc, ratio: float) -> float:
    """``t = |mu| + z * sigma``, ``z = Phi^-1(1 - ratio/2)``, mean/std population float64."""
    w = wide(acc)
    mu = float(np.mean(w))
    sigma = float(np.std(w))
    z = NormalDist().inv_cdf(1.0 - ratio / 2.0) if ratio < 1 else 0.0
    return abs(mu) + z * sigma


def gaussiank_bounds(k: int) -> tuple[int, int]:
    """``[ceil(2k/3), floor(4k/3)]``."""
    return (2 * k + 2) // 3, (4 * k) // 3


def gaussiank_count(acc, ratio: float) -> int:
    """k' = min(max(c, ceil(2k/3)), floor(4k/3)), <= n, with c = #{|acc| > t}."""
    w = wide(acc)
    n = w.size
    k = k_of(ratio, n)
    if n == 0:
        return 0
    t = gaussiank_threshold(acc, ratio)
    c = int(np.count_nonzero(np.abs(w) > t))
    lo, hi = gaussiank_bounds(k)
    return min(min(max(c, lo), hi), n)


def gaussiank(acc, ratio: float, exact: bool = False):
    check_finite(acc)
    n = np.asarray(acc).size
    if exact:
        return topk(acc, k_of(ratio, n))
    return topk(acc, gaussiank_count(acc, ratio))


# ------------------------------------------------------------------ dgc
def dgc_sample(acc, sample: float) -> np.ndarray:
    """|acc| (float64) at the sampled positions: all if n <= m, else every (n // m)-th from 0."""
    a = np.abs(wide(acc))
    n = a.size
    m = max(math.ceil(float(sample) * n), 4096)
    if n <= m:
        return a
    return a[:: n // m]


def dgc(acc, ratio: float, sample: float = 0.01, *, trace: list | None = None):
    """DGC's sampled threshold with up to 10 retries at 0.8x (docs/codecs.md, dgc 1-3).

    ``trace`` (a list) receives (thr, count) per count, for tests of the loop itself."""
    check_finite(acc)
    flat = np.asarray(acc).reshape(-1)
    n = flat.size
    if n == 0:
        return np.zeros(0, np.int64), flat[:0].copy()
    k = k_of(ratio, n)
    s = np.sort(dgc_sample(flat, sample))[::-1]
    ks = min(max(1, math.ceil(float(ratio) * s.size)), s.size)
    thr = float(s[ks - 1])
    mags = np.abs(wide(flat))
    retries = 0
    while True:
        c = int(np.count_nonzero(mags >= thr))
        if trace is not None:
            trace.append((thr, c))
        if c > 1.3 * k:
            return topk(flat, k)
        if c < 0.8 * k and retries < 10:
            thr = 0.8 * thr
            retries += 1
            continue
        pos = np.flatnonzero(mags >= thr).astype(np.int64)
        return pos, flat[pos].copy()


# ------------------------------------------------------------------ threshold
def threshold(acc, value: float):
    check_finite(acc)
    flat = np.asarray(acc).reshape(-1)
    pos = np.flatnonzero(np.abs(wide(flat)) >= float(value)).astype(np.int64)
    return pos, flat[pos].copy()


# ------------------------------------------------------------------ randomk
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB


def mix_int(z: int) -> int:
    """SplitMix64's finaliser on a Python int (mod 2**64)."""
    z &= MASK64
    z ^= z >> 30
    z = (z * _C1) & MASK64
    z ^= z >> 27
    z = (z * _C2) & MASK64
    z ^= z >> 31
    return z


def mix_np(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (NumPy wraps uint64 products mod 2**64)."""
    z = np.asarray(z, np.uint64).copy()
    z ^= z >> np.uint64(30)
    z *= np.uint64(_C1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_C2)
    z ^= z >> np.uint64(31)
    return z


def key_hash(key) -> int:
    """First 8 bytes (little-endian) of BLAKE2b-64 of the key's text (str, decimal int, '' for None, repr)."""
    if key is None:
        text = ""
    elif isinstance(key, str):
        text = key
    elif isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        text = str(int(key))
    else:
        text = repr(key)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()[:8], "little")


def randomk_stream(seed: int, key, step: int) -> int:
    return mix_int(mix_int(mix_int(seed) ^ key_hash(key)) ^ (step & MASK64))


def _feistel_params(n: int) -> tuple[int, int]:
    h = max(2, (n - 1).bit_length())
    h += h & 1
    return h // 2, (1 << (h // 2)) - 1


def randomk_perm_scalar(j: int, n: int, stream: int) -> int:
    """perm(j) with Python ints, one element at a time (the literal text of the docs)."""
    half, mask = _feistel_params(n)
    v = j
    while True:
        L, R = v >> half, v & mask
        for r in range(4):
            L, R = R, L ^ (mix_int(stream ^ (r << 48) ^ R) & mask)
        v = (L << half) | R
        if v < n:
            return v


def randomk_positions_scalar(n: int, k: int, seed: int, key, step: int) -> np.ndarray:
    if n == 1:
        return np.zeros(min(k, 1), np.int64)
    stream = randomk_stream(seed, key, step)
    return np.array(sorted(randomk_perm_scalar(j, n, stream) for j in range(k)), np.int64)


def randomk_positions(n: int, k: int, seed: int, key, step: int) -> np.ndarray:
    """Sorted ``perm(j)`` for ``j < k``: 4-round Feistel on ``h`` bits with cycle walking (vectorised)."""
    if n == 1:
        return np.zeros(min(k, 1), np.int64)
    stream = np.uint64(randomk_stream(seed, key, step))
    half, mask = _feistel_params(n)
    sh, mk = np.uint64(half), np.uint64(mask)
    v = np.arange(k, dtype=np.uint64)
    active = np.ones(k, bool)
    while True:
        x = v[active]
        L, R = x >> sh, x & mk
        for r in range(4):
            L, R = R, L ^ (mix_np(stream ^ np.uint64(r << 48) ^ R) & mk)
        v[active] = (L << sh) | R
        active = v >= np.uint64(n)
        if not active.any():
            break
    return np.sort(v.astype(np.int64))


def randomk(acc, ratio: float, seed: int = 0, key=None, step: int = 0, scale: bool = False):
    """Kept positions from the generator; values exact, or times n/k (float64, rounded once)."""
    check_finite(acc)
    flat = np.asarray(acc).reshape(-1)
    n = flat.size
    k = k_of(ratio, n)
    pos = randomk_positions(n, k, seed, key, step)
    vals = flat[pos].copy()
    if scale and k:
        vals = round_to(wide(vals) * (n / k), flat.dtype)
    return pos, vals


# ------------------------------------------------------------------ adacomp
def adacomp_bin(shape) -> int:
    """``bin=auto``: 50 for ndim >= 3, else 500."""
    return 50 if len(shape) >= 3 else 500


def adacomp(dW, R=None, L: int | None = None, value: str = "sign"):
    """AdaComp (Algorithm 1 as docs/codecs.md numbers it) on one tensor.

    ``dW`` the new gradient, ``R`` the residue (zeros for a bare encode), ``L`` the bin
    length (auto from the shape when None).  ``value``: ``"sign"`` (default coding:
    sign(G) * s), or the explicit value stage ``"none"`` / ``"fp16"`` / ``"bf16"`` (the kept
    G themselves).  Returns ``(positions, decoded kept values, new residue)`` with the
    residue in dW's shape and dtype (``G - decoded``, rounded once to the dtype).
    """
    dW = np.asarray(dW)
    dtype = dW.dtype
    shape = dW.shape
    if R is None:
        R = np.zeros_like(dW)
    L = adacomp_bin(shape) if L is None else int(L)
    G = np.add(R, dW, dtype=dtype)  # 1. rounded to the array's dtype
    check_finite(G.reshape(shape))
    Gf = G.reshape(-1)
    n = Gf.size
    work = F64 if dtype == F64 else F32
    H = np.add(Gf.astype(work), dW.reshape(-1).astype(work), dtype=work)  # 2.
    absG = np.abs(Gf.astype(np.float64))
    nbins = -(-n // L)
    gmax = _bin_max(absG, L)  # 3.
    gmax_each = np.repeat(gmax, L)[:n] if n else np.zeros(0)
    send = (Gf != 0) & (np.abs(H.astype(np.float64)) >= gmax_each)  # 4.
    pos = np.flatnonzero(send).astype(np.int64)
    s = adacomp_scale(G, L)
    if value == "sign":
        vals = round_to(np.sign(Gf[pos].astype(np.float64)) * float(s), dtype)  # 5.
    else:
        vals = code_values(Gf[pos], value, dtype)
    newR = Gf.copy()
    newR[pos] = np.subtract(Gf[pos], vals, dtype=dtype)  # 6.
    return pos, vals, newR.reshape(shape)


def _bin_max(absG: np.ndarray, L: int) -> np.ndarray:
    """max over bins of L consecutive elements (the last may be shorter)."""
    if absG.size == 0:
        return np.zeros(0)
    return np.maximum.reduceat(absG, np.arange(0, absG.size, L))


def _bin_max_loop(absG: np.ndarray, L: int) -> np.ndarray:
    return np.array([absG[b * L : (b + 1) * L].max() for b in range(-(-absG.size // L))], np.float64)


def adacomp_scale(G, L: int):
    """``s = sum(gmax) / nbins`` (float64 np.sum), rounded once to the array's dtype."""
    G = np.asarray(G)
    absG = np.abs(G.reshape(-1).astype(np.float64))
    n = absG.size
    nbins = -(-n // L)
    if nbins == 0:
        s = 0.0
    else:
        s = float(np.sum(_bin_max(absG, L))) / nbins
    return round_to(np.float64(s), G.dtype)[()]
