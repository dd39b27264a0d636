"""Quantization kernels (Numba CPU): the encoders of the quantizer value stages and one
table-driven decoder for all of them (docs/codecs.md, "Quantizers").

* ``absmax_units`` / ``minifloat_encode``: custom floats with a per-block exponent window
  (rangefloat, fp8): bit-exact rounding on the float64 bits, nearest-even or stochastic.
* ``qsgd_encode``, ``minmax_encode``: one pass per bucket group; a bucket's statistics and
  its codes are made while the bucket sits in cache.
* ``tensor_moments``, ``terngrad_encode`` (five trits per byte), ``sign_encode`` (one bit per
  value plus the sums signSGD's scale and 1-bit SGD's means need).
* ``dequantize``: ``out (=|+=|-=) lut[code] * a[block] (+ off[block])`` from packed codes of
  any width, every value rounded once to ``out``'s dtype; ``trits_dequantize``; ``max_field``
  (the decoders' check that no code exceeds what an encoder writes).
* ``elias_sizes`` / ``elias_encode`` / ``elias_decode``: QSGD's run-length Elias-gamma streams.

Sums are float64 in ``LANES`` column lanes per 65,536-value chunk, chunks added in order by
the caller: the order is part of the format's semantics, so a NumPy reference and
a CUDA twin reproduce it bit for bit.  Work is cut at boundaries that depend on the sizes
only; random bits come from ``rng`` by value index.  Results never depend on the thread count.
"""

from __future__ import annotations

import math

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu.rng import SPAN, TO_UNIT, bits32, block_key, uniform
from codec.kernels.cpu.select import _chunk_sums
from codec.modes import SET, SUB

CHUNK = 1 << 16
#: column lanes of every float64 sum (a runtime value, so the loop vectoriser packs them)
LANES = 64
U = np.uint64



@jit
def _unit(u, block, upb, n):
    """Values ``[lo, hi)`` of work unit ``u``: piece ``u % upb`` (of at most CHUNK values) of
    block ``u // upb`` (blocks of ``block`` values)."""
    b = u // upb
    lo = b * block + (u % upb) * CHUNK
    hi = min(n, b * block + block, lo + CHUNK)
    return b, lo, max(lo, hi)


@jit
def _span_end(i, hi):
    """End of the run from ``i`` that shares ``i``'s random block key (at most ``hi``)."""
    return min(hi, (i | (SPAN - 1)) + 1)


@jit(inline="always")
def _top_bits(bits, lo, hi, mask):
    """``max(bits[lo:hi] & mask)`` as uint64: the largest magnitude's bit pattern (see
    ``absmax_units``)."""
    m = np.uint64(0)
    for i in range(U(lo), U(hi)):
        m = max(m, np.uint64(bits[i] & mask))
    return m


# ---------------------------------------------------------------------------- custom floats
@jit(parallel=True)
def absmax_units(bits, block, upb, mask, top):
    """``top[u] = max(bits & mask)`` over work unit ``u`` (see ``_unit``): the largest magnitude's
    bits, ``bits`` being the float32 (uint32) or float64 (uint64) bit patterns and ``mask``
    their sign-clearing mask.  Non-negative floats order like their bits, and an integer max
    vectorises where a float max (NaN rules, no fastmath) does not; a result at or above
    the infinity pattern means a NaN or inf was seen."""
    n = bits.size
    for u in prange(top.size):
        _, lo, hi = _unit(u, block, upb, n)
        top[u] = _top_bits(bits, lo, hi, mask)


@jit
def _floor_plus(t, u):
    """``floor(t + u)`` for ``t >= 0`` and ``u`` in [0, 1), exactly: ``floor(t) + (frac(t) >= 1 - u)``
    (each step is exact in float64, where ``t + u`` itself may round)."""
    f = np.floor(t)
    return f + np.float64(t - f >= 1.0 - u)


@jit
def _pow2(k):
    """``2.0**k`` for an integer ``-1022 <= k <= 1023`` (built from its bits)."""
    b = np.uint64(np.uint64(k + 1023) << U(52))
    return b.view(np.float64)


@jit
def _minifloat(v, m, thr, sub_scale, off, maxmag, signpos, rn, u):
    """The code of float64 ``v`` in a float with ``m`` mantissa bits whose lowest normal binade
    starts at ``thr = 2**emin`` (exponent code 0: subnormals), magnitude capped at ``maxmag``,
    sign at bit ``signpos``.  At or above ``thr`` the float64 bits are rounded at bit ``52 - m``
    (adding ``rn``: half minus one plus the kept lsb for nearest-even, or random bits below the
    kept ones) and rebased by ``off = (emin + 1022) << m``, so a mantissa carry steps into the
    exponent; below, ``t = |v| * 2**(m - emin)`` is rounded (``u < 0``: half to even, else
    ``floor(t + u)``).  ``emin >= -1000``: the callers rescale tiny windows."""
    vb = np.float64(v)
    a = abs(vb)
    ab = np.float64(a).view(np.uint64)
    normal = ((ab + rn) >> U(52 - m)) - off
    t = a * sub_scale
    sub = U(np.rint(t) if u < 0 else _floor_plus(t, u))
    mag = min(normal if a >= thr else sub, U(maxmag))
    return mag | ((vb.view(np.uint64) >> U(63)) << U(signpos))


@jit(parallel=True)
def minifloat_encode(x, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, bad):
    """Codes of ``x`` (float32/float64) into ``codes`` (uint8/uint16): value ``i`` of block ``b``
    in the float whose lowest normal binade is ``2**emin[b]`` (see ``_minifloat``); ``bad[u]``
    counts NaN/inf per work unit.  A window below ``2**-1000`` (float64 data only) is coded on
    the values times ``2**K`` and ``emin + K`` (exact, and the same codes)."""
    n = x.size
    half = (U(1) << U(51 - m)) - U(1)
    odd0 = U(m == 0)  # no mantissa bits: the kept part is the implicit 1, always odd
    for u in prange(bad.size):
        b, lo, hi = _unit(u, block, upb, n)
        k = max(0, -1000 - emin[b])
        em = emin[b] + k
        pre = _pow2(k)
        thr = _pow2(em)
        sub_scale = _pow2(m - em)
        off = U(em + 1022) << U(m)
        nb = np.int64(0)
        if stochastic:
            i0 = lo
            while i0 < hi:
                i1 = _span_end(i0, hi)
                key = block_key(strm, i0)
                for i in range(U(i0), U(i1)):
                    v = np.float64(x[i]) * pre
                    nb += np.int64(not (v - v == 0))
                    r = bits32(key, i)
                    codes[i] = _minifloat(v, m, thr, sub_scale, off, maxmag, signpos, U(r) << U(20 - m), np.float64(r) * TO_UNIT)
                i0 = i1
        else:
            for i in range(U(lo), U(hi)):
                v = np.float64(x[i]) * pre
                nb += np.int64(not (v - v == 0))
                ab = np.float64(abs(v)).view(np.uint64)
                codes[i] = _minifloat(v, m, thr, sub_scale, off, maxmag, signpos, half + (((ab >> U(52 - m)) & U(1)) | odd0), -1.0)
        bad[u] = nb


# ---------------------------------------------------------------------------- bucketed
@jit
def _sumsq(x, lo, hi, width, e):
    """float64 sum of squares of ``x[lo:hi] * 2**e`` (``e = 0``: as they are; the scaling is
    exact) in ``width`` column lanes (lanes in order, then the tail), and the NaN/inf count."""
    cq = np.zeros(width)
    rows = (hi - lo) // width
    k = np.int64(0)
    for row in range(U(rows)):
        base = U(lo) + row * U(width)
        for col in range(U(width)):
            v = np.float64(x[base + col])
            v = math.ldexp(v, e) if e != 0 else v
            cq[col] += v * v
            k += np.int64(not (v - v == 0))
    q = 0.0
    for col in range(width):
        q += cq[col]
    for i in range(U(lo + rows * width), U(hi)):
        v = np.float64(x[i])
        v = math.ldexp(v, e) if e != 0 else v
        q += v * v
        k += np.int64(not (v - v == 0))
    return q, k


@jit
def _norm(x, lo, hi, width):
    """L2 norm of ``x[lo:hi]`` (float64) and its NaN/inf count: ``sqrt`` of the lane sum of
    squares over 65,536-value chunks of the bucket, chunk results added in order.  When that
    sum overflows or could have lost terms to underflow (float64 data only), it is recomputed
    on the values times ``2**-E`` (exact, ``E = floor(log2 max|v|)``) and scaled back."""
    q = 0.0
    k = np.int64(0)
    for c in range(lo, hi, CHUNK):
        qc, kc = _sumsq(x, c, min(hi, c + CHUNK), width, 0)
        q += qc
        k += kc
    if k or (q >= 2.0**-960 and q < np.inf):
        return np.sqrt(q), k
    top = _absmax(x, lo, hi)
    if top == 0.0:
        return 0.0, k
    e = np.int64(np.floor(np.log2(top)))
    s = 0.0
    for c in range(lo, hi, CHUNK):
        s += _sumsq(x, c, min(hi, c + CHUNK), width, -e)[0]
    return math.ldexp(np.sqrt(s), e), k


@jit
def _absmax(x, lo, hi):
    m = 0.0
    for i in range(U(lo), U(hi)):
        m = max(m, abs(np.float64(x[i])))
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


@jit
def _round(t, stochastic, key, i):
    """``t >= 0`` rounded to an integer-valued float64: half to even, or ``floor(t + u_i)``."""
    if stochastic:
        return _floor_plus(t, uniform(key, i))
    return np.rint(t)


@jit(parallel=True)
def qsgd_encode(x, bucket, s, stochastic, strm, width, norms, codes, bad):
    """QSGD: per bucket ``norms[b]`` (float32 rounded up when that fits, else float64) and
    codes ``level << 1 | sign`` with ``level = round(|v| * (s / norm))`` clamped to ``s``."""
    n = x.size
    nb = norms.size
    per = max(1, CHUNK // bucket)
    for g in prange((nb + per - 1) // per):
        nbad = np.int64(0)
        for b in range(g * per, min(nb, (g + 1) * per)):
            lo = b * bucket
            hi = min(n, lo + bucket)
            norm, k = _norm(x, lo, hi, width)
            nbad += k
            up = _up32(norm)
            norm = up if up < np.inf else norm
            norms[b] = norm
            scale = s / norm if norm > 0 else 0.0
            i0 = lo
            while i0 < hi:
                i1 = _span_end(i0, hi)
                key = block_key(strm, i0) if stochastic else np.uint32(0)
                for i in range(U(i0), U(i1)):
                    v = np.float64(x[i])
                    level = min(_round(abs(v) * scale, stochastic, key, i), np.float64(s))
                    lv = U(level) if level == level else U(0)  # NaN input (reported through bad)
                    codes[i] = (lv << U(1)) | U((v < 0) & (lv > 0))
                i0 = i1
        bad[g] = nbad


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


@jit(parallel=True)
def minmax_encode(x, ibits, low, inf, bucket, levels, stochastic, strm, lows, highs, codes, bad):
    """Min-max: per bucket ``lows[b]`` / ``highs[b]`` (float32 rounded down / up when they fit,
    else float64) and codes ``round((v - lo) * (levels / (hi - lo)))`` clamped to ``[0, levels]``.
    The bounds come from integer keys of ``ibits`` (``x``'s bits as int32/int64; ``low`` the
    mask below the sign, ``inf`` the infinity pattern): an integer min/max vectorises."""
    n = x.size
    nb = lows.size
    is64 = ibits.itemsize == 8
    per = max(1, CHUNK // bucket)
    for g in prange((nb + per - 1) // per):
        nbad = np.int64(0)
        for b in range(g * per, min(nb, (g + 1) * per)):
            lo = b * bucket
            hi = min(n, lo + bucket)
            kmin = _key(ibits[lo], low)
            kmax = kmin
            for i in range(U(lo), U(hi)):
                k = _key(ibits[i], low)
                kmin = min(kmin, k)
                kmax = max(kmax, k)
            if kmax >= inf or kmin < -inf:
                nbad += 1  # NaN or inf: reported through bad
                kmin = kmax = 0
            mn = _key_value(kmin, low, is64)
            mx = _key_value(kmax, low, is64)
            dn = _down32(mn)
            up = _up32(mx)
            if dn > -np.inf and up < np.inf:
                mn, mx = dn, up
            lows[b] = mn
            highs[b] = mx
            inv = levels / (mx - mn) if mx > mn else 0.0
            i0 = lo
            while i0 < hi:
                i1 = _span_end(i0, hi)
                key = block_key(strm, i0) if stochastic else np.uint32(0)
                for i in range(U(i0), U(i1)):
                    t = _round((np.float64(x[i]) - mn) * inv, stochastic, key, i)
                    codes[i] = np.int32(min(max(t, 0.0), np.float64(levels)))
                i0 = i1
        bad[g] = nbad


# ---------------------------------------------------------------------------- per tensor
@jit(parallel=True)
def tensor_moments(x, bits, mask, shift, width, sums, top):
    """Per chunk of CHUNK values: ``sums[c] = (sum(v - shift), sum((v - shift)**2))`` in column
    lanes and ``top[c] = max(bits & mask)``, the largest magnitude's bit pattern (see
    ``absmax_units``)."""
    n = x.size
    for c in prange(sums.shape[0]):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        s, q = _chunk_sums(x, lo, hi, shift, width)
        sums[c, 0] = s
        sums[c, 1] = q
        top[c] = _top_bits(bits, lo, hi, mask)


#: values per trit chunk (a multiple of 5, so chunks fill whole bytes)
TRIT_CHUNK = 65535


@jit(parallel=True)
def terngrad_encode(x, clip, s, strm, out):
    """TernGrad: value ``i`` becomes trit ``b * (1 if v >= 0 else 2)`` with
    ``b = floor(|min(max(v, -clip), clip)| / s + u_i)`` (0 when ``s == 0``); five trits per
    byte, ``t0 + 3*t1 + 9*t2 + 27*t3 + 81*t4``."""
    n = x.size
    nchunk = (n + TRIT_CHUNK - 1) // TRIT_CHUNK
    for c in prange(nchunk):
        lo = c * TRIT_CHUNK
        hi = min(n, lo + TRIT_CHUNK)
        trits = np.zeros(TRIT_CHUNK, np.uint8)
        i0 = lo
        while i0 < hi:
            i1 = _span_end(i0, hi)
            key = block_key(strm, i0)
            for i in range(U(i0), U(i1)):
                v = np.float64(x[i])
                p = abs(min(max(v, -clip), clip)) / s if s > 0 else 0.0
                b = _floor_plus(p, uniform(key, i))
                trits[i - U(lo)] = np.uint8(b) * np.uint8(2 if v < 0 else 1)
            i0 = i1
        for j in range(U((hi - lo + 4) // 5)):
            t = U(5) * j
            out[U(lo // 5) + j] = np.uint8(
                trits[t] + 3 * trits[t + U(1)] + 9 * trits[t + U(2)] + 27 * trits[t + U(3)] + 81 * trits[t + U(4)]
            )


@jit(parallel=True)
def sign_encode(x, out, width, sums, nneg, bad):
    """One bit per value (LSB-first, 1 for ``v < 0``) into ``out``; per chunk of CHUNK values,
    in column lanes: ``sums[c] = (sum |v|, sum of the negative v, sum of the others)``,
    ``nneg[c]`` = how many are negative, ``bad[c]`` the NaN/inf count."""
    n = x.size
    for c in prange(sums.shape[0]):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        ca = np.zeros(width)
        cn = np.zeros(width)
        cp = np.zeros(width)
        rows = (hi - lo) // width
        k = np.int64(0)
        neg = np.int64(0)
        for row in range(U(rows)):
            base = U(lo) + row * U(width)
            for col in range(U(width)):
                v = np.float64(x[base + col])
                ca[col] += abs(v)
                cn[col] += v if v < 0 else 0.0
                cp[col] += 0.0 if v < 0 else v
                neg += np.int64(v < 0)
                k += np.int64(not (v - v == 0))
        sa = 0.0
        sn = 0.0
        sp = 0.0
        for col in range(width):
            sa += ca[col]
            sn += cn[col]
            sp += cp[col]
        for i in range(U(lo + rows * width), U(hi)):
            v = np.float64(x[i])
            sa += abs(v)
            sn += v if v < 0 else 0.0
            sp += 0.0 if v < 0 else v
            neg += np.int64(v < 0)
            k += np.int64(not (v - v == 0))
        sums[c, 0] = sa
        sums[c, 1] = sn
        sums[c, 2] = sp
        nneg[c] = neg
        bad[c] = k
        for j in range(U(lo // 8), U(hi // 8)):  # whole bytes: no bounds test per bit
            t = j * U(8)
            byte = U(0)
            for bit in range(U(8)):
                byte |= U(x[t + bit] < 0) << bit
            out[j] = np.uint8(byte)
        if hi % 8:
            t = U(hi - hi % 8)
            byte = U(0)
            for bit in range(U(hi % 8)):
                byte |= U(x[t + bit] < 0) << bit
            out[t // U(8)] = np.uint8(byte)


# ---------------------------------------------------------------------------- decode
#: groups of 8 codes per parallel chunk (65,536 values)
_GROUPS = CHUNK // 8


@jit
def _load8(data, p):
    """uint64 from ``data[p:p+8]``, little-endian (LLVM merges this into one load)."""
    w = U(0)
    for t in range(8):
        w |= U(data[p + U(t)]) << U(8 * t)
    return w


@jit
def _code_at(data, i, bits, mask):
    """Code ``i`` of the ``bits``-bit codes packed LSB-first in ``data`` (any position)."""
    p = U(i) * U(bits)
    j = p >> U(3)
    w = U(0)
    for t in range(3):
        if j + U(t) < U(data.size):
            w |= U(data[j + U(t)]) << U(8 * t)
    return (w >> (p & U(7))) & mask


@jit
def _code_of_group(w0, w1, j, bits, mask):
    """Code ``j`` (0..7) of a group of 8 codes whose 16 bytes are ``w0``, ``w1``."""
    off = U(j) * U(bits)
    lo = (w0 >> (off & U(63))) if off < U(64) else (w1 >> ((off - U(64)) & U(63)))
    spill = off < U(64) and off + U(bits) > U(64)
    hi = (w1 << ((U(64) - off) & U(63))) if spill else U(0)
    return (lo | hi) & mask


@jit
def _groups_safe(nbytes, bits):
    """How many leading groups of 8 codes can be read with whole 8-byte words (1 word per group
    up to 8 bits, 2 above) without reading past ``nbytes``."""
    words = 8 if bits <= 8 else 16
    return max(0, (nbytes - words) // bits + 1) if nbytes >= words else 0


@jit(inline="always")
def _group_code(w0, w1, j, bits, mask):
    """Code ``j`` of a group of eight read as ``w0`` (and ``w1`` above 8 bits).  Inlined in
    Numba's IR: as an ordinary call the decode loop ran 7 -> 12 ms for 25M values."""
    return (w0 >> (U(j) * U(bits))) & mask if bits <= 8 else _code_of_group(w0, w1, j, bits, mask)


@jit
def _combine(out, buf, lo, hi, mode):
    """``out[lo:hi] (+|-)= buf[:hi-lo]`` for ADD / SUB (``buf`` holds values of ``out``'s dtype)."""
    if mode == SUB:
        for i in range(U(lo), U(hi)):
            out[i] -= buf[i - U(lo)]
    else:
        for i in range(U(lo), U(hi)):
            out[i] += buf[i - U(lo)]


@jit(parallel=True)
def dequantize(data, bits, n, lut, block, a, off, out, mode):
    """``out[i] (=|+=|-=) lut[code_i] * a[b] (+ off[b])`` for the ``n`` codes of ``bits`` bits
    (1..16) packed LSB-first in ``data``, value ``i`` in block ``b = i // block``.  The
    float64 value is rounded once to ``out``'s dtype before it is added; ``off`` may be
    empty (no offset: a ``-0.0`` stays ``-0.0``).

    Codes are read eight at a time from whole words (``bits`` bytes hold eight codes); the
    block is tracked incrementally (a division per group cost ~4 cycles per value); groups
    that straddle a block boundary and the last few codes take a per-value path.  ADD and
    SUB decode a chunk into a buffer of ``out``'s dtype, then add it."""
    mask = (U(1) << U(bits)) - U(1)
    has_off = off.size > 0
    full = min(n // 8, _groups_safe(data.size, bits))
    ngroup = (n + 7) // 8
    ublock = U(block)
    for c in prange((ngroup + _GROUPS - 1) // _GROUPS):
        g0 = c * _GROUPS
        g1 = min(ngroup, g0 + _GROUPS)
        lo = g0 * 8
        hi = min(n, g1 * 8)
        if mode == SET:
            dst = out
            shift = U(0)
        else:
            dst = np.empty(CHUNK, out.dtype)
            shift = U(lo)
        b = U(lo) // ublock
        nxt = (b + U(1)) * ublock  # where block b ends
        for g in range(U(g0), U(min(g1, full))):
            p = g * U(bits)
            w0 = _load8(data, p)
            w1 = _load8(data, p + U(8)) if bits > 8 else U(0)
            base = g * U(8)
            while base >= nxt:
                b += U(1)
                nxt += ublock
            if base + U(8) <= nxt:
                ab = a[b]
                ob = off[b] if has_off else 0.0
                for j in range(U(8)):
                    code = _group_code(w0, w1, j, bits, mask)
                    v = lut[code] * ab
                    dst[base + j - shift] = v + ob if has_off else v
            else:
                for i in range(base, base + U(8)):
                    bi = i // ublock
                    v = lut[_code_at(data, i, bits, mask)] * a[bi]
                    dst[i - shift] = v + off[bi] if has_off else v
        for i in range(U(max(lo, full * 8)), U(hi)):
            bi = i // ublock
            v = lut[_code_at(data, i, bits, mask)] * a[bi]
            dst[i - shift] = v + off[bi] if has_off else v
        if mode != SET:
            _combine(out, dst, lo, hi, mode)


@jit(parallel=True)
def max_field(data, bits, n, fmask, fshift):
    """The largest ``(code & fmask) >> fshift`` over the ``n`` codes packed in ``data`` (as for
    ``dequantize``): decoders check that no code lies beyond what an encoder writes."""
    mask = (U(1) << U(bits)) - U(1)
    fm = U(fmask) & mask
    fs = U(fshift)
    full = min(n // 8, _groups_safe(data.size, bits))
    ngroup = (n + 7) // 8
    nchunk = (ngroup + _GROUPS - 1) // _GROUPS
    top = np.zeros(nchunk, np.uint64)
    for c in prange(nchunk):
        m = U(0)
        g0 = c * _GROUPS
        g1 = min(ngroup, g0 + _GROUPS)
        for g in range(U(g0), U(min(g1, full))):
            p = g * U(bits)
            w0 = _load8(data, p)
            w1 = _load8(data, p + U(8)) if bits > 8 else U(0)
            for j in range(U(8)):
                code = _group_code(w0, w1, j, bits, mask)
                m = max(m, (code & fm) >> fs)
        for i in range(U(max(g0 * 8, full * 8)), U(min(n, g1 * 8))):
            m = max(m, (_code_at(data, i, bits, mask) & fm) >> fs)
        top[c] = m
    return top.max() if nchunk else U(0)


@jit(parallel=True)
def trits_dequantize(data, n, vals3, out, mode):
    """TernGrad decode: ``out[i] (=|+=|-=) vals3[trit_i]`` (rounded once to ``out``'s dtype),
    trits five per byte, ``t0 + 3*t1 + 9*t2 + 27*t3 + 81*t4``."""
    nbytes = (n + 4) // 5
    per = TRIT_CHUNK // 5
    for c in prange((nbytes + per - 1) // per):
        lo = c * TRIT_CHUNK
        hi = min(n, lo + TRIT_CHUNK)
        if mode == SET:
            dst = out
            shift = U(0)
        else:
            dst = np.empty(TRIT_CHUNK, out.dtype)
            shift = U(lo)
        for j in range(U(c * per), U(min(nbytes, (c + 1) * per))):
            t = data[j]
            base = j * U(5)
            for r in range(U(5)):
                if base + r < U(n):
                    dst[base + r - shift] = vals3[t % np.uint8(3)]
                t //= np.uint8(3)
        if mode != SET:
            _combine(out, dst, lo, hi, mode)


# ---------------------------------------------------------------------------- Elias coding
@jit
def _bitlen(v):
    n = U(0)
    while v:
        n += U(1)
        v >>= U(1)
    return n


@jit
def _put_gamma(out, pos, v):
    """Write Elias-gamma(v >= 1) at bit ``pos`` of ``out`` (zeroed, LSB-first stream): bitlen-1
    zeros, then v's bits from the most significant; returns the next position."""
    nb = _bitlen(v)
    pos += nb - U(1)
    for t in range(nb):
        if (v >> (nb - U(1) - U(t))) & U(1):
            out[pos >> U(3)] |= np.uint8(1) << np.uint8(pos & U(7))
        pos += U(1)
    return pos


@jit
def _elias_chunk(codes, lo, hi, bucket, out, pos, write):
    """The run-length Elias-gamma stream of QSGD codes ``codes[lo:hi]`` (whole buckets) from bit
    ``pos``: per bucket gamma(nnz + 1), then per non-zero level gamma(zeros before it + 1), its
    sign bit and gamma(level).  With ``write`` false only the length is counted."""
    for b in range(lo, hi, bucket):
        e = min(hi, b + bucket)
        nnz = U(0)
        for i in range(b, e):
            nnz += U(codes[i] >> 1 != 0)
        pos = _put_gamma(out, pos, nnz + U(1)) if write else pos + U(2) * _bitlen(nnz + U(1)) - U(1)
        run = U(0)
        for i in range(b, e):
            level = U(codes[i] >> 1)
            if level == 0:
                run += U(1)
                continue
            if write:
                pos = _put_gamma(out, pos, run + U(1))
                if codes[i] & 1:
                    out[pos >> U(3)] |= np.uint8(1) << np.uint8(pos & U(7))
                pos += U(1)
                pos = _put_gamma(out, pos, level)
            else:
                pos += U(2) * _bitlen(run + U(1)) + U(2) * _bitlen(level) - U(1)
            run = U(0)
    return pos


@jit(parallel=True)
def elias_sizes(codes, bucket, per, nbytes):
    """Bytes of each chunk's Elias stream (``per`` buckets per chunk, padded to whole bytes)."""
    n = codes.size
    span = per * bucket
    nothing = np.zeros(1, np.uint8)
    for c in prange(nbytes.size):
        bits = _elias_chunk(codes, c * span, min(n, (c + 1) * span), bucket, nothing, U(0), False)
        nbytes[c] = (bits + U(7)) >> U(3)


@jit(parallel=True)
def elias_encode(codes, bucket, per, starts, out):
    """Write each chunk's Elias stream at byte ``starts[c]`` of ``out`` (zeroed)."""
    n = codes.size
    span = per * bucket
    for c in prange(starts.size):
        _elias_chunk(codes, c * span, min(n, (c + 1) * span), bucket, out, U(starts[c]) * U(8), True)


@jit
def _get_gamma(data, pos, end):
    """Read an Elias-gamma value at bit ``pos`` (stream ends at bit ``end``): (value, next
    position); value 0 when the stream is damaged (runs out, or more than 63 leading zeros)."""
    z = U(0)
    while True:
        if pos >= end or z > U(63):
            return U(0), pos
        bit = (data[pos >> U(3)] >> np.uint8(pos & U(7))) & np.uint8(1)
        pos += U(1)
        if bit:
            break
        z += U(1)
    if pos + z > end:
        return U(0), pos
    v = U(1)
    for _ in range(z):
        v = (v << U(1)) | U((data[pos >> U(3)] >> np.uint8(pos & U(7))) & np.uint8(1))
        pos += U(1)
    return v, pos


@jit(parallel=True)
def elias_decode(data, starts, n, bucket, per, levels, codes, bad):
    """QSGD codes from the chunked Elias streams (``starts``: each chunk's first byte, plus the
    end); ``bad[c]`` = 1 where a chunk's stream is damaged (a count, run or level out of range,
    or bits left over beyond its padding)."""
    span = per * bucket
    for c in prange(bad.size):
        lo = c * span
        hi = min(n, lo + span)
        pos = U(starts[c]) * U(8)
        end = U(starts[c + 1]) * U(8)
        ok = True
        for b in range(lo, hi, bucket):
            e = min(hi, b + bucket)
            nnz, pos = _get_gamma(data, pos, end)
            if nnz == 0 or nnz - U(1) > U(e - b):
                ok = False
                break
            i = U(b)
            for _ in range(nnz - U(1)):
                run, pos = _get_gamma(data, pos, end)
                if run == 0 or pos >= end:
                    ok = False
                    break
                i += run - U(1)
                sign = (data[pos >> U(3)] >> np.uint8(pos & U(7))) & np.uint8(1)
                pos += U(1)
                level, pos = _get_gamma(data, pos, end)
                if level == 0 or level > U(levels) or i >= U(e):
                    ok = False
                    break
                codes[i] = (level << U(1)) | U(sign)
                i += U(1)
            if not ok:
                break
        if ok and end - pos >= U(8):
            ok = False
        while ok and pos < end:  # the padding bits must be zero
            if (data[pos >> U(3)] >> np.uint8(pos & U(7))) & np.uint8(1):
                ok = False
            pos += U(1)
        bad[c] = 0 if ok else 1
