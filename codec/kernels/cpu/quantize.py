"""Quantization encoders (Numba CPU) of the per-block and per-tensor quantizer value stages
(docs/codecs.md, "Quantizers").  The bucketed encoders are ``bucket``, the one decoder of
every quantizer is ``dequant``, QSGD's Elias coder ``elias``.

* ``absmax_units`` / ``minifloat_encode``: custom floats with a per-block exponent window
  (rangefloat, fp8): bit-exact rounding on the float64 bits, nearest-even or stochastic.
  For the error-feedback step, ``feedback_minifloat_encode`` reads ``x + residual``, codes
  it in windows known beforehand and writes ``acc = x + residual - decoded``, in one pass;
  where the windows are the data's (rangefloat's, fp8's with a scale),
  ``feedback_absmax_units`` reads the sum for its maxima first, writing nothing: one or
  two passes instead of four, ``acc`` written once.  The ``_segments`` twins
  code a many-tensor frame's run of small tensors in one call (per-tensor offsets).
* ``tensor_moments``, ``terngrad_encode`` (five trits per byte), ``sign_encode`` (one bit per
  value plus the sums signSGD's scale and 1-bit SGD's means need).

Sums are float64 in ``LANES`` column lanes per ``CHUNK``-value chunk (``codec.layout``),
chunks added in order by the caller: the order is part of the format's semantics, so a NumPy
reference and a CUDA twin reproduce it bit for bit.  Work is cut at boundaries that depend on
the sizes only; random bits come from ``rng`` by value index.  Results never depend on the
thread count.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._common import TRIT_CHUNK, U, bits_of, chunk_sums, copysign, floor_plus, floor_plus_bits, mul, rint, saturated, span_end, summed
from codec.kernels.cpu._crc import crc_piece, crc_pieces, joined
from codec.kernels.cpu.rng import bits32, block_key
from codec.layout import CHUNK, TO_UNIT

__all__ = [
    "absmax_units",
    "absmax_units_segments",
    "feedback_absmax_units",
    "feedback_minifloat_encode",
    "minifloat_encode",
    "minifloat_encode_segments",
    "tensor_moments",
    "terngrad_encode",
    "sign_encode",
]


@jit
def _unit(u, block, upb, n):
    """Values ``[lo, hi)`` of work unit ``u``: piece ``u % upb`` (of at most CHUNK values) of
    block ``u // upb`` (blocks of ``block`` values)."""
    b = u // upb
    lo = b * block + (u % upb) * CHUNK
    hi = min(n, b * block + block, lo + CHUNK)
    return b, lo, max(lo, hi)


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


@jit(parallel=True)
def absmax_units_segments(bits, starts, blocks, ustarts, mask, top):
    """:func:`absmax_units` of many tensors at once (a many-tensor frame's run of small
    tensors): tensor ``t`` is ``bits[starts[t]:starts[t+1]]`` in blocks of ``blocks[t]``
    values, its work units' maxima into ``top[ustarts[t]:ustarts[t+1]]``."""
    for t in prange(starts.size - 1):
        b = bits[starts[t] : starts[t + 1]]
        block = blocks[t]
        upb = (block + CHUNK - 1) // CHUNK
        for u in range(ustarts[t + 1] - ustarts[t]):
            _, lo, hi = _unit(u, block, upb, b.size)
            top[ustarts[t] + u] = _top_bits(b, lo, hi, mask)


@jit(parallel=True)
def feedback_absmax_units(x, r, block, upb, mask, top):
    """:func:`absmax_units` of ``x + r`` (the sum in the arrays' dtype, ``mask`` its bits'
    sign-clearing mask), written nowhere: the step's coding pass forms the sum again where
    it codes it (:func:`feedback_minifloat_encode`) and writes ``acc`` once."""
    n = x.size
    is64 = x.itemsize == 8
    for u in prange(top.size):
        _, lo, hi = _unit(u, block, upb, n)
        m = U(0)
        for i in range(U(lo), U(hi)):
            m = max(m, U(bits_of(x[i] + r[i], is64)) & U(mask))
        top[u] = m


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
    t = mul(a, sub_scale)
    sub = U(rint(t) if u < 0 else floor_plus(t, u))
    mag = min(normal if a >= thr else sub, U(maxmag))
    return mag | ((vb.view(np.uint64) >> U(63)) << U(signpos))


@jit
def _minifloat_value(c, v, m, signpos, off, step):
    """The float64 value of code ``c`` (sign ``v``'s) in the window of ``_minifloat``: a
    subnormal magnitude times the window's quantum ``step = 2**(emin - m)``, a normal one
    the float64 whose bits are ``(mag + off) << (52 - m)`` (the encoder's rounded bits);
    exactly ``lut[c] * 2**emin`` of the decoder's table."""
    mag = U(c) & ((U(1) << U(signpos)) - U(1))
    bits = np.uint64((mag + off) << U(52 - m))
    a = mul(np.float64(mag), step) if mag < (U(1) << U(m)) else bits.view(np.float64)
    return copysign(a, v)


@jit(parallel=True)
def minifloat_encode(x, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, bad, crc=-1):
    """Codes of ``x`` (float32/float64) into ``codes`` (uint8/uint16): value ``i`` of block ``b``
    in the float whose lowest normal binade is ``2**emin[b]`` (see ``_minifloat``); ``bad[u]``
    counts NaN/inf per work unit.  A window below ``2**-1000`` (float64 data only) is coded on
    the values times ``2**K`` and ``emin + K`` (exact, and the same codes).

    Returns the CRC-32C of the codes' bytes continued from ``crc``, each unit's checksummed
    while in cache (``crc < 0``: none, -1; also -1 where the CPU cannot, see
    ``convert.narrow_codes``)."""
    sums, lens = crc_pieces(bad.size, crc)
    for u in prange(bad.size):
        bad[u] = _minifloat_unit(x, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, u, None)
        if sums.size:
            _, lo, hi = _unit(u, block, upb, x.size)
            crc_piece(sums, lens, u, codes, lo, hi)
    return joined(sums, lens, crc)


@jit(parallel=True)
def feedback_minifloat_encode(x, r, acc, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, bad, crc=-1):
    """The whole error-feedback step in one pass, in windows ``emin`` known beforehand (fp8's
    fixed ones, or the data's from :func:`feedback_absmax_units`; none below ``2**-1000``):
    each value ``x + r`` (in the arrays' dtype) is read, coded as :func:`minifloat_encode`
    codes it, and ``acc = x + r - decoded`` written, each code's value (``_minifloat_value``,
    clipped to the dtype's range as a decoder saturates it) rounded to the dtype first,
    exactly as ``dequant.dequantize`` decodes and subtracts it (``SUB``).  ``acc`` is written
    once: forming it first and coding it after in the same work unit took 15.4-17.7 ms for
    25M float32, against 11.1 (its 256 KB of ``acc`` did not stay in the cache beside ``x``
    and ``r``).  NaN/inf counted in ``bad``; returns the codes' CRC-32C continued from
    ``crc``, as ``minifloat_encode``."""
    sums, lens = crc_pieces(bad.size, crc)
    for u in prange(bad.size):
        bad[u] = _minifloat_unit(x, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, u, acc, r)
        if sums.size:
            _, lo, hi = _unit(u, block, upb, x.size)
            crc_piece(sums, lens, u, codes, lo, hi)
    return joined(sums, lens, crc)


@jit(parallel=True)
def minifloat_encode_segments(x, starts, blocks, bstarts, emin, m, maxmag, signpos, stochastic, strms, codes, bad):
    """:func:`minifloat_encode` of many tensors at once (a many-tensor frame's run of small
    tensors): tensor ``t`` is ``x[starts[t]:starts[t+1]]`` in blocks of ``blocks[t]`` values
    with the windows ``emin[bstarts[t]:bstarts[t+1]]`` and its own random stream
    ``strms[t]``; its codes into the same slice of ``codes`` as of ``x``, its NaN/inf count
    into ``bad[t]``.  Exactly what one :func:`minifloat_encode` per tensor gives."""
    for t in prange(starts.size - 1):
        xt = x[starts[t] : starts[t + 1]]
        ct = codes[starts[t] : starts[t + 1]]
        et = emin[bstarts[t] : bstarts[t + 1]]
        block = blocks[t]
        upb = (block + CHUNK - 1) // CHUNK
        nb = np.int64(0)
        for u in range(et.size * upb):
            nb += _minifloat_unit(xt, block, upb, et, m, maxmag, signpos, stochastic, strms[t], ct, u, None)
        bad[t] = nb


@jit(inline="always")
def _minifloat_unit(x, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, u, sub, r=None):
    """Work unit ``u`` of :func:`minifloat_encode` (``sub`` and ``r`` None), or of
    :func:`feedback_minifloat_encode` (the values ``x + r``, ``sub = x + r - decoded``: ``acc``);
    returns its NaN/inf count.  Inlined in Numba's IR: as an ordinary call the fused
    error-feedback pass ran 2.8x slower (12.7 -> 36 ms for 25M float32)."""
    n = x.size
    half = (U(1) << U(51 - m)) - U(1)
    odd0 = U(m == 0)  # no mantissa bits: the kept part is the implicit 1, always odd
    b, lo, hi = _unit(u, block, upb, n)
    k = max(0, -1000 - emin[b])
    em = emin[b] + k
    pre = _pow2(k)
    thr = _pow2(em)
    sub_scale = _pow2(m - em)
    off = U(em + 1022) << U(m)
    step = _pow2(em - m)
    nb = np.int64(0)
    if stochastic:
        i0 = lo
        while i0 < hi:
            i1 = span_end(i0, hi)
            key = block_key(strm, i0)
            for i in range(U(i0), U(i1)):
                xi = summed(x, r, i)
                v = np.float64(xi) * pre
                nb += np.int64(not (v - v == 0))
                rb = bits32(key, i)
                c = _minifloat(v, m, thr, sub_scale, off, maxmag, signpos, U(rb) << U(20 - m), np.float64(rb) * TO_UNIT)
                codes[i] = c
                if sub is not None:
                    sub[i] = xi - sub.dtype.type(saturated(_minifloat_value(c, v, m, signpos, off, step), sub))
            i0 = i1
    else:
        for i in range(U(lo), U(hi)):
            xi = summed(x, r, i)
            v = np.float64(xi) * pre
            nb += np.int64(not (v - v == 0))
            ab = np.float64(abs(v)).view(np.uint64)
            c = _minifloat(v, m, thr, sub_scale, off, maxmag, signpos, half + (((ab >> U(52 - m)) & U(1)) | odd0), -1.0)
            codes[i] = c
            if sub is not None:
                sub[i] = xi - sub.dtype.type(saturated(_minifloat_value(c, v, m, signpos, off, step), sub))
    return nb


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
        s, q = chunk_sums(x, lo, hi, shift, width)
        sums[c, 0] = s
        sums[c, 1] = q
        top[c] = _top_bits(bits, lo, hi, mask)


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
            i1 = span_end(i0, hi)
            key = block_key(strm, i0)
            for i in range(U(i0), U(i1)):
                v = np.float64(x[i])
                p = abs(min(max(v, -clip), clip)) / s if s > 0 else 0.0
                b = floor_plus_bits(p, bits32(key, i))  # (p <= 1: s is at least every clipped |v|)
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
