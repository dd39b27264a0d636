"""Bucketed quantization encoders (Numba CPU): QSGD and min-max (docs/codecs.md,
"Quantizers"); their decoder is ``dequant``, QSGD's Elias coder ``elias``.

One parallel task per bucket group (whole buckets, about ``CHUNK`` values: see
``codec.layout.bucket_groups``); a bucket's statistics and its codes are made while the
bucket sits in cache.  A bucket's squared norm is a float64 sum in ``width`` (``LANES``)
column lanes per ``CHUNK``-value piece, pieces added in order, so a NumPy reference and a
CUDA twin reproduce it bit for bit; random bits come from ``rng`` by value index.  Results
never depend on the thread count.
"""

from __future__ import annotations

import math

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._common import U, bits_of, floor_plus_bits, form, group_buckets, saturated, span_end, summed, top_of
from codec.kernels.cpu._crc import crc_piece, crc_pieces, joined
from codec.kernels.cpu.rng import bits32, block_key
from codec.layout import CHUNK

__all__ = ["qsgd_encode", "qsgd_encode_segments", "minmax_encode", "minmax_encode_segments"]


@jit
def _sumsq(x, lo, hi, width, e, r=None):
    """float64 sum of squares of ``x[lo:hi] * 2**e`` (of ``x + r``: :func:`summed`) (``e = 0``: as they are; the scaling is
    exact) in ``width`` column lanes (lanes in order, then the tail), and the NaN/inf count."""
    cq = np.zeros(width)
    rows = (hi - lo) // width
    k = np.int64(0)
    for row in range(U(rows)):
        base = U(lo) + row * U(width)
        for col in range(U(width)):
            v = np.float64(summed(x, r, base + col))
            v = math.ldexp(v, e) if e != 0 else v
            cq[col] += v * v
            k += np.int64(not (v - v == 0))
    q = 0.0
    for col in range(width):
        q += cq[col]
    for i in range(U(lo + rows * width), U(hi)):
        v = np.float64(summed(x, r, i))
        v = math.ldexp(v, e) if e != 0 else v
        q += v * v
        k += np.int64(not (v - v == 0))
    return q, k


@jit
def _norm(x, lo, hi, width, r=None):
    """L2 norm of ``x[lo:hi]`` (of ``x + r``: :func:`summed`; float64) and its NaN/inf count: ``sqrt`` of the lane sum of
    squares over 65,536-value chunks of the bucket, chunk results added in order.  When that
    sum overflows or could have lost terms to underflow (float64 data only), it is recomputed
    on the values times ``2**-E`` (exact, ``E = floor(log2 max|v|)``) and scaled back."""
    q = 0.0
    k = np.int64(0)
    for c in range(lo, hi, CHUNK):
        qc, kc = _sumsq(x, c, min(hi, c + CHUNK), width, 0, r)
        q += qc
        k += kc
    if k or (q >= 2.0**-960 and q < np.inf):
        return np.sqrt(q), k
    top = _absmax(x, lo, hi, r)
    if top == 0.0:
        return 0.0, k
    e = _exponent(top)
    s = 0.0
    for c in range(lo, hi, CHUNK):
        s += _sumsq(x, c, min(hi, c + CHUNK), width, -e, r)[0]
    return math.ldexp(np.sqrt(s), e), k


@jit
def _exponent(v):
    """``floor(log2(v))`` of a finite float64 ``v > 0``, exactly, from its bits (a libm's
    ``log2`` may round up to the next integer just below a power of two, and no two libms
    need agree there)."""
    b = np.float64(v).view(np.uint64)
    biased = np.int64(b >> U(52))
    if biased:
        return biased - 1023
    e = np.int64(-1075)  # a subnormal: 2**-1074 times its mantissa
    m = b & U(0xFFFFFFFFFFFFF)
    while m:
        e += 1
        m >>= U(1)
    return e


@jit
def _absmax(x, lo, hi, r=None):
    m = 0.0
    for i in range(U(lo), U(hi)):
        m = max(m, abs(np.float64(summed(x, r, i))))
    return m


@jit
def _up32(v):
    """``v`` (finite, >= 0) rounded up to float32, as float64; inf when that overflows."""
    f = np.float32(v)
    if np.float64(f) < v:
        f = np.nextafter(f, np.float32(np.inf))
    return np.float64(f)


@jit
def _down32(v):
    """``v`` (finite) rounded down to float32, as float64; -inf when that overflows."""
    f = np.float32(v)
    if np.float64(f) > v:
        f = np.nextafter(f, np.float32(-np.inf))
    return np.float64(f)


@jit(inline="always")
def _level(t, fs, stochastic, key, i):
    """``t >= 0`` rounded, half to even or stochastically (``floor(t + u_i)``, ``u_i =
    bits32(key, i) / 2**32``, in integers: ``_common.floor_plus_bits``), capped at the integer
    ``fs < 2**32``, as an integer (0 for NaN ``t``)."""
    tc = t if t < fs else fs
    lv = floor_plus_bits(tc, bits32(key, i)) if stochastic else U(np.rint(tc))
    return lv if t == t else U(0)


@jit(inline="always")
def _qsgd_code(v, scale, fs, stochastic, key, i, codes):
    """Value ``i`` (``v``, float64) coded into ``codes[i] = level << 1 | sign``; returns
    ``(level, sign)`` (NaN: level 0, reported through the non-finite count)."""
    lv = _level(abs(v) * scale, fs, stochastic, key, i)
    neg = (v < 0) & (lv > 0)
    codes[i] = (lv << U(1)) | U(neg)
    return lv, neg


@jit
def _qsgd_spans(x, r, lo, hi, scale, fs, inv, stochastic, strm, codes, sub, norm):
    """The codes of values ``lo..hi`` (``x + r`` with ``r``; :func:`summed`), span by span of
    one random key; with ``sub`` (not None) also ``sub[i] = value - level * inv * norm`` (the
    decoded value where ``inv = 1 / s`` is exact and the product needs no clipping)."""
    i0 = lo
    while i0 < hi:
        i1 = span_end(i0, hi)
        key = block_key(strm, i0) if stochastic else np.uint32(0)
        if sub is not None:
            for i in range(U(i0), U(i1)):
                xi = summed(x, r, i)
                lv, neg = _qsgd_code(np.float64(xi), scale, fs, stochastic, key, i, codes)
                q = np.float64(lv) * inv
                sub[i] = xi - sub.dtype.type((-q if neg else q) * norm)
        else:
            for i in range(U(i0), U(i1)):
                _qsgd_code(np.float64(summed(x, r, i)), scale, fs, stochastic, key, i, codes)
        i0 = i1


@jit
def _qsgd_bucket(x, lo, hi, s, stochastic, strm, width, codes, sub, r=None):
    """One bucket of :func:`qsgd_encode`: its codes, and ``(norm, non-finite count)``; with
    ``r`` and ``sub`` (not None) the bucket's values are ``x + r`` and ``sub`` gets them minus
    each code's value (see there; ``x + r`` itself where one is NaN/inf, to say where)."""
    norm, k = _norm(x, lo, hi, width, r)
    up = _up32(norm)
    norm = up if up < np.inf else norm
    scale = s / norm if norm > 0 else 0.0
    fs = np.float64(s)
    inv = 1.0 / fs
    pow2 = (s & (s - 1)) == 0
    # where s is a power of two (its 1/s exact: level * (1/s) is level / s) and nothing
    # clips, each residual is formed in the coding loop (one loop against two: 25M float32
    # 23.5 -> 21.3 ms); a division there ran the fused step 2.3x slower, so other s, and a
    # norm that clips (float64 values near the top of their range), form theirs in a loop of
    # its own, which vectorises
    if sub is not None and not k and pow2 and norm <= top_of(sub):
        _qsgd_spans(x, r, lo, hi, scale, fs, inv, stochastic, strm, codes, sub, norm)
        return norm, k
    _qsgd_spans(x, r, lo, hi, scale, fs, inv, stochastic, strm, codes, None, norm)
    if sub is not None and not k:  # with a NaN/inf the step fails: sub keeps x + r to say where
        if norm <= top_of(sub):  # |value| <= norm: nothing to clip (the loop without it is ~4% faster)
            for i in range(U(lo), U(hi)):
                c = U(codes[i])
                q = np.float64(c >> U(1)) / fs
                sub[i] = summed(x, r, i) - sub.dtype.type((-q if c & U(1) else q) * norm)
        else:
            for i in range(U(lo), U(hi)):
                c = U(codes[i])
                q = np.float64(c >> U(1)) / fs
                sub[i] = summed(x, r, i) - sub.dtype.type(saturated((-q if c & U(1) else q) * norm, sub))
    elif sub is not None:
        form(x, r, sub, lo, hi)
    return norm, k


@jit(parallel=True)
def qsgd_encode(x, bucket, s, stochastic, strm, width, norms, codes, bad, r=None, acc=None):
    """QSGD: per bucket ``norms[b]`` (float32 rounded up when that fits, else float64) and
    codes ``level << 1 | sign`` with ``level = round(|v| * (s / norm))`` clamped to ``s``.

    With ``r`` and ``acc`` (the error-feedback step, fused; compiled out when None): each
    bucket's values are ``x + r`` (in the arrays' dtype, summed where they are read: the bucket
    is in cache after its norm's loop), and ``acc`` gets them minus each code's value
    ``+-(level / s) * norm`` in float64 rounded to the dtype first, exactly as
    ``dequant.dequantize`` decodes and subtracts it: one pass over memory reads x and r and
    writes the codes and acc, once (forming ``acc`` first and subtracting from it after
    took 25.7-26.0 ms for 25M float32, against 20.5-20.7)."""
    per = group_buckets(bucket)
    for g in prange(bad.size):
        bad[g] = _qsgd_group(x, bucket, s, stochastic, strm, width, norms, codes, g * per, min(norms.size, (g + 1) * per), r, acc)


@jit(parallel=True)
def qsgd_encode_segments(x, starts, bstarts, bucket, s, stochastic, strms, width, norms, codes, bad):
    """:func:`qsgd_encode` of many tensors at once (a many-tensor frame's run of small
    tensors): tensor ``t`` is ``x[starts[t]:starts[t+1]]``, coded with its own random stream
    ``strms[t]`` and value indices, its norms into ``norms[bstarts[t]:bstarts[t+1]]``, its
    codes into the same slice of ``codes`` as of ``x``, its NaN/inf count into ``bad[t]``.
    Exactly what one :func:`qsgd_encode` per tensor gives."""
    for t in prange(starts.size - 1):
        xt = x[starts[t] : starts[t + 1]]
        nt = norms[bstarts[t] : bstarts[t + 1]]
        bad[t] = _qsgd_group(xt, bucket, s, stochastic, strms[t], width, nt, codes[starts[t] : starts[t + 1]], 0, nt.size, None, None)


@jit
def _qsgd_group(x, bucket, s, stochastic, strm, width, norms, codes, b0, b1, r, acc):
    """Buckets ``b0..b1`` of :func:`qsgd_encode`; returns their NaN/inf count."""
    n = x.size
    nbad = np.int64(0)
    for b in range(b0, b1):
        lo = b * bucket
        hi = min(n, lo + bucket)
        if r is not None:
            norms[b], k = _qsgd_bucket(x, lo, hi, s, stochastic, strm, width, codes, acc, r)
        else:
            norms[b], k = _qsgd_bucket(x, lo, hi, s, stochastic, strm, width, codes, None)
        nbad += k
    return nbad


@jit
def _key(b, low):
    """An integer that orders like the float whose (signed) bit pattern is ``b``; its own inverse."""
    b = np.int64(b)
    return b ^ ((b >> 63) & low)


@jit
def _key_value(k, low, is64):
    """The float64 value of the float32 (or, with ``is64``, float64) whose key is ``k``."""
    b = _key(k, low)
    if is64:
        v = np.int64(b)
        return v.view(np.float64)
    w = np.int32(b)
    return np.float64(w.view(np.float32))


@jit
def _bounds(kmin, kmax, low, inf, is64):
    """A bucket's ``(min, max, non-finite)`` from the least and greatest keys of its values:
    float32 rounded down / up when both fit, else float64; ``(0, 0, 1)`` when a key is NaN
    or inf (reported through ``bad``).  The CUDA twin compiles this from its source."""
    nbad = 0
    if kmax >= inf or kmin < -inf:
        nbad = 1
        kmin = kmax = 0
    mn = _key_value(kmin, low, is64)
    mx = _key_value(kmax, low, is64)
    dn = _down32(mn)
    up = _up32(mx)
    if dn > -np.inf and up < np.inf:
        mn, mx = dn, up
    return mn, mx, nbad


@jit(inline="always")
def _key_at(x, r, ibits, i, low, is64):
    """The key of value ``i``: of its bits ``ibits[i]``, or (``r`` not None) of ``x[i] + r[i]``'s."""
    if r is None:
        return _key(ibits[i], low)
    return _key(bits_of(x[i] + r[i], is64), low)


@jit
def _minmax_bucket(x, ibits, lo, hi, low, inf, is64, levels, stochastic, strm, codes, sub, r=None):
    """One bucket of :func:`minmax_encode`: its codes, and ``(min, max, non-finite)``; with
    ``r`` and ``sub`` (not None) the bucket's values are ``x + r`` and ``sub`` gets them minus
    each code's value (see there; a bucket with NaN/inf has bounds 0, so ``x + r`` itself)."""
    kmin = _key_at(x, r, ibits, lo, low, is64)
    kmax = kmin
    for i in range(U(lo), U(hi)):
        k = _key_at(x, r, ibits, i, low, is64)
        kmin = min(kmin, k)
        kmax = max(kmax, k)
    mn, mx, nbad = _bounds(kmin, kmax, low, inf, is64)
    inv = levels / (mx - mn) if mx > mn else 0.0
    fl = np.float64(levels)
    step = (mx - mn) / levels
    i0 = lo
    while i0 < hi:
        i1 = span_end(i0, hi)
        key = block_key(strm, i0) if stochastic else np.uint32(0)
        if sub is not None:  # each residual formed where its value is coded (one loop, not two: 25M float32
            # EF step 17.0-17.3 -> 15.4-15.8 ms, stochastic 20.9-21.1 -> 17.3-18.4)
            for i in range(U(i0), U(i1)):
                xi = summed(x, r, i)
                c = _level(max((np.float64(xi) - mn) * inv, 0.0), fl, stochastic, key, i)
                codes[i] = np.int32(c)
                sub[i] = xi - sub.dtype.type(saturated(np.float64(c) * step + mn, sub))
        else:
            for i in range(U(i0), U(i1)):
                codes[i] = np.int32(_level(max((np.float64(summed(x, r, i)) - mn) * inv, 0.0), fl, stochastic, key, i))
        i0 = i1
    return mn, mx, nbad


@jit(parallel=True)
def minmax_encode(x, ibits, low, inf, bucket, levels, stochastic, strm, lows, highs, codes, bad, r=None, acc=None, crc=-1):
    """Min-max: per bucket ``lows[b]`` / ``highs[b]`` (float32 rounded down / up when they fit,
    else float64) and codes ``round((v - lo) * (levels / (hi - lo)))`` clamped to ``[0, levels]``.
    The bounds come from integer keys of ``ibits`` (``x``'s bits as int32/int64; ``low`` the
    mask below the sign, ``inf`` the infinity pattern): an integer min/max vectorises.

    With ``r`` and ``acc`` (the error-feedback step, fused; compiled out when None; the keys
    are then of ``x + r``'s bits, and ``ibits`` is not read): each bucket's values are ``x +
    r`` (in the arrays' dtype, summed where they are read), and ``acc`` gets them minus each
    code's value ``code * ((hi - lo) / levels) + lo`` in float64 (clipped to the dtype's
    range, as a decoder saturates it) rounded to the dtype first, exactly as
    ``dequant.dequantize`` decodes and subtracts it: one pass over memory, ``acc`` written
    once (forming it first and subtracting from it after took 15.8 ms for 25M float32,
    against 10.5-11.2).

    Returns the CRC-32C of the codes' bytes continued from ``crc``, each group's checksummed
    while in cache (-1 when none is asked, ``crc < 0``, or the CPU cannot: see
    ``convert.narrow_codes``)."""
    per = group_buckets(bucket)
    sums, lens = crc_pieces(bad.size, crc)
    for g in prange(bad.size):
        b0, b1 = g * per, min(lows.size, (g + 1) * per)
        bad[g] = _minmax_group(x, ibits, low, inf, bucket, levels, stochastic, strm, lows, highs, codes, b0, b1, r, acc)
        if sums.size:
            crc_piece(sums, lens, g, codes, b0 * bucket, min(codes.size, b1 * bucket))
    return joined(sums, lens, crc)


@jit(parallel=True)
def minmax_encode_segments(x, ibits, low, inf, starts, bstarts, bucket, levels, stochastic, strms, lows, highs, codes, bad):
    """:func:`minmax_encode` of many tensors at once (a many-tensor frame's run of small
    tensors): tensor ``t`` is ``x[starts[t]:starts[t+1]]`` (``ibits`` its bits), coded with its
    own random stream ``strms[t]`` and value indices, its bounds into
    ``lows/highs[bstarts[t]:bstarts[t+1]]``, its codes into the same slice of ``codes`` as of
    ``x``, its NaN/inf count into ``bad[t]``.  Exactly what one :func:`minmax_encode` per
    tensor gives."""
    for t in prange(starts.size - 1):
        lo, hi, b0, b1 = starts[t], starts[t + 1], bstarts[t], bstarts[t + 1]
        bad[t] = _minmax_group(
            x[lo:hi], ibits[lo:hi], low, inf, bucket, levels, stochastic, strms[t], lows[b0:b1], highs[b0:b1], codes[lo:hi], 0, b1 - b0, None, None
        )


@jit
def _minmax_group(x, ibits, low, inf, bucket, levels, stochastic, strm, lows, highs, codes, b0, b1, r, acc):
    """Buckets ``b0..b1`` of :func:`minmax_encode`; returns their NaN/inf count."""
    n = x.size
    is64 = ibits.itemsize == 8
    nbad = np.int64(0)
    for b in range(b0, b1):
        lo = b * bucket
        hi = min(n, lo + bucket)
        if r is not None:
            lows[b], highs[b], k = _minmax_bucket(x, ibits, lo, hi, low, inf, is64, levels, stochastic, strm, codes, acc, r)
        else:
            lows[b], highs[b], k = _minmax_bucket(x, ibits, lo, hi, low, inf, is64, levels, stochastic, strm, codes, None)
        nbad += k
    return nbad
