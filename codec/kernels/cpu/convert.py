"""Float format conversion kernels (Numba CPU): float32/float64 -> fp16/bf16 codes and back.

The encoder (``narrow_codes``) works on float32 bits (float64 is first rounded to odd in
float32), rounds to nearest, ties to even, and counts non-finite inputs, one chunk at a time
in simple branch-free loops that vectorise.  The decoder (``half_decode``) computes each
code's float32 value arithmetically (exact, NaN payloads included), also in vectorising
loops, and stores, adds or subtracts it into the output; ``half_feedback`` (the fused
error-feedback step) and ``half_combine`` (adding into 16-bit outputs) use the same
conversions.  The two kernels that write a frame's codes (``narrow_codes``,
``half_feedback``) can also return their CRC-32C, each chunk checksummed while it is in
cache (``codec/kernels/cpu/_crc.py``), so the frame needs no second pass for its checksum;
``half_decode`` likewise checksums the codes it reads, for the decode's check of the frame.

float32 blocks take eight values at a time where that is faster and gives the same bits:
fp16 through the CPU's F16C instructions (:mod:`codec.kernels.cpu._f16c`; eight values with a
NaN or an infinity, float64, and CPUs without F16C take the integer code), bf16 through
vector operations of the same integer arithmetic (:mod:`codec.kernels.cpu._bf16`).  Each
``@overload`` below picks the loop at compile time.

Work is cut into chunks whose boundaries depend only on the array length, so results never
depend on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from codec._jit import jit, prange
from codec.kernels.cpu._common import chunk_segments, chunks, view_at
from codec.kernels.cpu._crc import crc_piece, crc_pieces, joined
from codec.kernels.cpu import _bf16, _f16c
from codec.kernels.cpu._f16c import LANES, feedback8, narrow8, widen8
from codec.layout import CHUNK
from codec.modes import ADD, SET, SUB

__all__ = [
    "narrow_codes",
    "narrow_codes_segments",
    "half_decode",
    "half_decode_segments",
    "combine",
    "momentum",
    "combine_odd",
    "half_combine",
    "half_feedback",
    "scale",
    "divide",
]


@jit
def _f32_to_f16_bits(u):
    """IEEE binary16 bits of the float32 whose bits are ``u`` (uint32), round to nearest even.

    Branch-free (three candidates and two selects), so a loop of it vectorises: a normal half
    rebiases the exponent and rounds the 13 dropped bits to nearest even in integer
    arithmetic; a subnormal half (|x| < 2**-14) is ``|x| + 0.5`` in float32, whose rounding
    (nearest even, at 2**-24: the half's subnormal quantum) leaves the code in the low bits
    (the carry into the smallest normal included); |x| >= 65520 gives inf, NaN a quiet NaN
    with the top payload bits.
    """
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    normal = (a + np.uint32(0xC8000FFF) + ((a >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)  # a - 0x38000000 + 0xFFF + odd
    f = np.uint32(a).view(np.float32)  # Numba's scalar .view() wants a variable defined by np.<dtype>()
    s = np.float32(f + np.float32(0.5))
    sub = s.view(np.uint32) - np.uint32(0x3F000000)  # minus the bits of 0.5
    big = np.uint32(0x7E00) | ((a >> np.uint32(13)) & np.uint32(0x3FF)) if a > np.uint32(0x7F800000) else np.uint32(0x7C00)
    h = sub if a < np.uint32(0x38800000) else normal
    h = big if a >= np.uint32(0x47800000) else h
    return np.uint16(h | sign)


@jit
def _f32_to_bf16_bits(u):
    """bfloat16 bits of the float32 whose bits are ``u``, round to nearest even; NaN stays NaN."""
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        r = (u >> np.uint32(16)) | np.uint32(0x40)
    return np.uint16(r)


@jit
def _f64_to_f32_odd_bits(d):
    """float32 bits of float64 ``d`` rounded to odd (toward zero, then the last bit set if inexact).

    Rounding to odd first and to nearest-even second gives the correctly rounded result for
    any narrower format with at least two fewer significand bits (fp16, bf16), so float64
    input is converted without double-rounding errors.  NaN and inf stay as they are; a finite
    value beyond float32 becomes the largest float32 (odd), which every 16-bit format rounds to inf.
    """
    v = np.float32(d)  # nearest; Numba's scalar .view() wants a variable defined once by np.<dtype>()
    vd = np.float64(v)
    u = v.view(np.uint32)
    # branch-free: one step toward zero where nearest went past d (never from 0; inf -> max),
    # then the sticky bit where d was not exact (NaN stays as it is)
    u -= np.uint32(abs(vd) > abs(d))
    u |= np.uint32((vd != d) & (d == d))
    return u


@jit
def _sum_odd(a, b):
    """float64 ``a + b`` rounded to odd: the exact sum truncated, last bit set if anything was dropped.

    The dropped part comes from TwoSum (exact without fastmath).  Round to odd keeps a sticky
    bit, so one more rounding to any format at least two bits narrower (float32, and through
    float32 fp16/bf16) is correct, where the float64 sum rounded to nearest could land exactly
    on a tie of the narrow format and then round the wrong way.  Non-finite sums stay as they are.
    """
    s = np.float64(a + b)  # Numba's scalar .view() wants a variable defined once by np.<dtype>()
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    inexact = (err != 0.0) & (s - s == 0.0)
    u = s.view(np.uint64)
    # branch-free: where |s| > |exact| step toward zero (s is finite and nonzero when inexact),
    # then set the sticky bit
    u -= np.uint64(inexact & ((err > 0.0) != (s > 0.0)))
    u |= np.uint64(inexact)
    r = np.uint64(u)
    return r.view(np.float64)


@jit
def _narrow_block(xs, os, bf16):
    """One chunk of :func:`narrow_codes`: per format, one loop over contiguous slices that
    converts and counts non-finite values in the same pass (the chunked loop over ``x[i]``
    did not vectorise: 0.2-0.4x memcpy against 1.5-1.8x); returns the count."""
    if bf16:
        return _narrow_bf16(xs, os)
    return _narrow_fp16(xs, os)


def _narrow_bf16(xs, os):
    """bf16 codes of the block ``xs`` into ``os``; returns the non-finite count.  float32
    eight values at a time as vector operations (:mod:`codec.kernels.cpu._bf16`, the same
    bits), else (float64, rounded to odd first) one simple loop of the integer code."""


@overload(_narrow_bf16, jit_options={"cache": True})
def _narrow_bf16_impl(xs, os):
    if xs.dtype == types.float32:

        def lanes(xs, os):
            k = np.int64(0)
            m = xs.size - xs.size % LANES
            for i in range(0, m, LANES):
                k += _bf16.narrow8(xs, i, os)
            for i in range(m, xs.size):
                v = xs[i]
                os[i] = _f32_to_bf16_bits(np.float32(v).view(np.uint32))
                k += np.int64(not (v - v == 0))
            return k

        return lanes

    def integer(xs, os):
        k = np.int64(0)
        for i in range(xs.size):
            v = xs[i]
            os[i] = _f32_to_bf16_bits(_f64_to_f32_odd_bits(np.float64(v)))
            k += np.int64(not (v - v == 0))
        return k

    return integer


def _narrow_fp16(xs, os):
    """fp16 codes of the block ``xs`` into ``os``; returns the non-finite count.  Compiled as
    the CPU's F16C instructions eight values at a time for float32 where the CPU has them
    (:mod:`codec.kernels.cpu._f16c`: eight with a NaN or an infinity take the integer code),
    else one simple loop of the integer code (float64, rounded to odd first)."""


@overload(_narrow_fp16, jit_options={"cache": True})
def _narrow_fp16_impl(xs, os):
    if _f16c.HARDWARE and xs.dtype == types.float32:

        def fast(xs, os):
            k = np.int64(0)
            m = xs.size - xs.size % LANES
            for i in range(0, m, LANES):
                if narrow8(xs, i, os):
                    for j in range(i, i + LANES):
                        k += _narrow_one(xs, os, j)
            for j in range(m, xs.size):
                k += _narrow_one(xs, os, j)
            return k

        return fast

    def integer(xs, os):
        k = np.int64(0)
        for i in range(xs.size):
            v = xs[i]
            os[i] = _f32_to_f16_bits(_f64_to_f32_odd_bits(np.float64(v)))
            k += np.int64(not (v - v == 0))
        return k

    return integer


@jit(inline="always")
def _narrow_one(xs, os, i):
    """fp16 code ``i`` by the integer code; 1 when ``xs[i]`` is not finite, else 0."""
    v = xs[i]
    os[i] = _f32_to_f16_bits(_f64_to_f32_odd_bits(np.float64(v)))
    return np.int64(not (v - v == 0))


@jit(parallel=True)
def narrow_codes(x, out, bf16, crc):
    """fp16 (``bf16=False``) or bf16 codes of float32/float64 ``x``, correctly rounded to nearest
    even.  Every value goes through float32 rounded to odd (exact for float32 input), so
    float64 input is not double-rounded.

    Returns ``(non-finite count, crc)``: with ``crc >= 0`` the CRC-32C of the codes' bytes
    continued from ``crc`` (each chunk checksummed as it is written), or -1 when this CPU
    cannot (the caller then checksums ``out``); ``crc < 0`` asks for none (-1)."""
    n = x.size
    nchunk = chunks(n)
    bad = np.zeros(nchunk, np.int64)
    sums, lens = crc_pieces(nchunk, crc)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        bad[c] = _narrow_block(x[lo:hi], out[lo:hi], bf16)
        if sums.size:
            crc_piece(sums, lens, c, out, lo, hi)
    return bad.sum(), joined(sums, lens, crc)


@jit(parallel=True)
def narrow_codes_segments(out, addrs, starts, like, bf16, crc=-1):
    """:func:`narrow_codes` of many tensors into one run of codes: tensor ``t`` is the array of
    ``starts[t+1] - starts[t]`` values of ``like``'s dtype (float32 or float64) at address
    ``addrs[t]`` (the caller keeps them alive), and its codes are ``out[starts[t]:starts[t+1]]``.
    One parallel pass over the whole run in chunks of the run, so a many-tensor frame of a
    whole model costs what one tensor of its size costs.  Returns ``(non-finite count, crc)``
    as :func:`narrow_codes` does."""
    n = out.size
    nchunk = chunks(n)
    bad = np.zeros(nchunk, np.int64)
    sums, lens = crc_pieces(nchunk, crc)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        rows = chunk_segments(starts, lo, hi)
        for j in range(rows.shape[0]):
            t, a, b = rows[j, 0], rows[j, 1], rows[j, 2]
            x = view_at(like, addrs[t], starts[t + 1] - starts[t])
            bad[c] += _narrow_block(x[a - starts[t] : b - starts[t]], out[a:b], bf16)
        if sums.size:
            crc_piece(sums, lens, c, out, lo, hi)
    return bad.sum(), joined(sums, lens, crc)


@jit
def _f16_to_f32(h):
    """The float32 value of IEEE binary16 code ``h``, exact (NaN payloads kept, as NumPy's
    cast does).  Branch-free, so a loop of it vectorises: shift the exponent and significand
    into place and rebias; inf/NaN rebias once more; a subnormal half is renormalised by one
    float32 subtraction of 2**-14."""
    u = (np.uint32(h) & np.uint32(0x7FFF)) << np.uint32(13)
    e = u & np.uint32(0x0F800000)
    u += np.uint32(112 << 23)
    special = u + np.uint32(112 << 23)
    f = np.uint32(u + np.uint32(1 << 23)).view(np.float32)  # Numba's scalar .view() wants np.<dtype>()
    sub = np.float32(f - np.float32(6.103515625e-05)).view(np.uint32)
    r = special if e == np.uint32(0x0F800000) else u
    r = sub if e == np.uint32(0) else r
    r |= (np.uint32(h) & np.uint32(0x8000)) << np.uint32(16)
    return np.uint32(r).view(np.float32)


@jit
def _bf16_to_f32(h):
    """The float32 value of bfloat16 code ``h``: its bits are the float32's top half."""
    b = np.uint32(np.uint32(h) << np.uint32(16))
    return b.view(np.float32)


@jit
def _decode_block(cs, os, mode, bf16):
    """One chunk of :func:`half_decode`: one simple loop per format and mode, so each
    vectorises (a 65,536-entry table gather did not: 0.23x memcpy against 0.8x)."""
    if bf16:
        if mode == SET:
            for i in range(cs.size):
                os[i] = _bf16_to_f32(cs[i])
        elif mode == ADD:
            for i in range(cs.size):
                os[i] += _bf16_to_f32(cs[i])
        else:
            for i in range(cs.size):
                os[i] -= _bf16_to_f32(cs[i])
        return
    _widen_fp16(cs, os, mode)


def _widen_fp16(cs, os, mode):
    """``os (=|+=|-=) value(cs)`` for the fp16 codes ``cs`` (``mode`` SET, ADD or SUB): by the
    CPU's F16C instructions eight codes at a time where it has them (eight with an infinity
    or a NaN take the integer code: :mod:`codec.kernels.cpu._f16c`), else one simple loop
    per mode of the integer code."""


@overload(_widen_fp16, jit_options={"cache": True})
def _widen_fp16_impl(cs, os, mode):
    if _f16c.HARDWARE:

        def fast(cs, os, mode):
            m = cs.size - cs.size % LANES
            if mode == SET:
                for i in range(0, m, LANES):
                    if widen8(cs, i, os, SET):
                        for j in range(i, i + LANES):
                            os[j] = _f16_to_f32(cs[j])
            elif mode == ADD:
                for i in range(0, m, LANES):
                    if widen8(cs, i, os, ADD):
                        for j in range(i, i + LANES):
                            os[j] += _f16_to_f32(cs[j])
            else:
                for i in range(0, m, LANES):
                    if widen8(cs, i, os, SUB):
                        for j in range(i, i + LANES):
                            os[j] -= _f16_to_f32(cs[j])
            _widen_integer(cs, os, mode, m)

        return fast
    return lambda cs, os, mode: _widen_integer(cs, os, mode, 0)


@jit
def _widen_integer(cs, os, mode, lo):
    """``os[lo:] (=|+=|-=) value(cs[lo:])`` by the integer code, one simple loop per mode."""
    if mode == SET:
        for i in range(lo, cs.size):
            os[i] = _f16_to_f32(cs[i])
    elif mode == ADD:
        for i in range(lo, cs.size):
            os[i] += _f16_to_f32(cs[i])
    else:
        for i in range(lo, cs.size):
            os[i] -= _f16_to_f32(cs[i])


@jit(parallel=True)
def half_decode(codes, out, mode, bf16, crc=-1):
    """``out (=|+=|-=) value(codes)`` for fp16 (``bf16=False``) or bf16 codes into a
    float32/float64 ``out``; ``mode`` is SET, ADD or SUB.  Values are exact (NumPy's cast of
    every code, NaN payloads included).

    Returns, with ``crc >= 0``, the CRC-32C of the codes' bytes continued from ``crc``, each
    chunk checksummed right after it is read (a decode verifies its frame's payload in the
    same pass: :class:`codec.payloadcheck.PayloadCheck`), or -1 when this CPU cannot; ``crc < 0``
    (the default) asks for none (-1)."""
    n = codes.size
    nchunk = chunks(n)
    sums, lens = crc_pieces(nchunk, crc)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        _decode_block(codes[lo:hi], out[lo:hi], mode, bf16)
        if sums.size:
            crc_piece(sums, lens, c, codes, lo, hi)
    return joined(sums, lens, crc)


@jit(parallel=True)
def half_decode_segments(codes, addrs, starts, like, mode, bf16, crc=-1):
    """:func:`half_decode` of the codes of many tensors end to end, each into its own array:
    tensor ``t``'s codes are ``codes[starts[t]:starts[t+1]]`` and its output is the array of
    ``like``'s dtype at address ``addrs[t]`` (float32 or float64; the caller keeps them
    alive).  One parallel pass over the whole run, in chunks of the run (a many-tensor
    decode of a whole model costs what one tensor of its size costs), the codes checksummed
    as with ``half_decode``."""
    n = codes.size
    nchunk = chunks(n)
    sums, lens = crc_pieces(nchunk, crc)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        rows = chunk_segments(starts, lo, hi)
        for j in range(rows.shape[0]):
            t, a, b = rows[j, 0], rows[j, 1], rows[j, 2]
            o = view_at(like, addrs[t], starts[t + 1] - starts[t])
            _decode_block(codes[a:b], o[a - starts[t] : b - starts[t]], mode, bf16)
        if sums.size:
            crc_piece(sums, lens, c, codes, lo, hi)
    return joined(sums, lens, crc)


@jit(parallel=True)
def combine(src, out, mode):
    """``out (=|+=|-=) src`` elementwise (same length); casting to ``out``'s dtype."""
    n = src.size
    nchunk = chunks(n)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        if mode == SET:
            for i in range(lo, hi):
                out[i] = src[i]
        elif mode == ADD:
            for i in range(lo, hi):
                out[i] += src[i]
        else:
            for i in range(lo, hi):
                out[i] -= src[i]


@jit(parallel=True)
def momentum(u, m, x, out):
    """``out = u * m + x`` elementwise in the arrays' dtype, the product rounded before the
    sum (DGC's momentum ``u = m*u + x``, as NumPy's two operations give it); ``m`` a scalar of
    that dtype."""
    n = x.size
    for c in prange(chunks(n)):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            out[i] = u[i] * m + x[i]


@jit(parallel=True)
def combine_odd(src, out, mode):
    """``out (+|-)= src`` for ADD/SUB: the float64 sum rounded to odd (``_sum_odd``), cast to ``out``.

    Into a float32 ``out`` the cast then rounds the exact sum once; a float64 ``out`` keeps the
    round-to-odd value, ready for a correct narrowing to fp16/bf16.
    """
    n = src.size
    nchunk = chunks(n)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        # one loop per mode, no ``src * sign``: LLVM may turn a multiply by a visible -1.0/1.0
        # select into a sign flip in one compilation and not the other, and a NaN's sign bit
        # then differs between the serial and the parallel twin
        if mode == SUB:
            for i in range(lo, hi):
                out[i] = _sum_odd(np.float64(out[i]), -np.float64(src[i]))
        else:
            for i in range(lo, hi):
                out[i] = _sum_odd(np.float64(out[i]), np.float64(src[i]))




@jit
def _combine_block(ss, cs, mode, bf16):
    """One chunk of :func:`half_combine`: one simple loop per format and mode (they
    vectorise), the code's value computed arithmetically."""
    if bf16:
        if mode == SUB:  # one loop per mode: see combine_odd (a NaN's sign bit)
            for j in range(cs.size):
                cs[j] = _f32_to_bf16_bits(_f64_to_f32_odd_bits(_sum_odd(np.float64(_bf16_to_f32(cs[j])), -np.float64(ss[j]))))
        else:
            for j in range(cs.size):
                cs[j] = _f32_to_bf16_bits(_f64_to_f32_odd_bits(_sum_odd(np.float64(_bf16_to_f32(cs[j])), np.float64(ss[j]))))
    elif mode == SUB:
        for j in range(cs.size):
            cs[j] = _f32_to_f16_bits(_f64_to_f32_odd_bits(_sum_odd(np.float64(_f16_to_f32(cs[j])), -np.float64(ss[j]))))
    else:
        for j in range(cs.size):
            cs[j] = _f32_to_f16_bits(_f64_to_f32_odd_bits(_sum_odd(np.float64(_f16_to_f32(cs[j])), np.float64(ss[j]))))


@jit(parallel=True)
def half_combine(src, codes, mode, bf16):
    """16-bit output in place: ``codes = round(value(codes) (+|-) src)`` for ADD/SUB, rounded once.

    ``codes`` are the output's fp16 (``bf16=False``) or bf16 codes; the sum is formed in
    float64 rounded to odd, then rounded to odd again to float32 and to nearest-even to 16
    bits: the exact sum, correctly rounded.
    """
    n = src.size
    nchunk = chunks(n)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        _combine_block(src[lo:hi], codes[lo:hi], mode, bf16)


@jit
def _feedback_block(xs, rs, accs, cs, bf16):
    """One chunk of :func:`half_feedback`: one simple loop per format, forming ``x + r``,
    its code, the new residual and the non-finite count in one pass (it vectorises)."""
    if not bf16:
        return _feedback_fp16(xs, rs, accs, cs)
    k = np.int64(0)
    m = xs.size - xs.size % LANES
    for i in range(0, m, LANES):  # eight at a time as vector operations (codec.kernels.cpu._bf16)
        k += _bf16.feedback8(xs, rs, accs, cs, i)
    for i in range(m, xs.size):
        a = np.float32(xs[i] + rs[i])
        h = _f32_to_bf16_bits(a.view(np.uint32))
        cs[i] = h
        accs[i] = a - _bf16_to_f32(h)
        k += np.int64(not (a - a == 0))
    return k


def _feedback_fp16(xs, rs, accs, cs):
    """Error feedback's fp16 step of a float32 block (``a = x + r``, its codes, ``a -
    value(codes)``); returns the non-finite count of ``a``.  By the CPU's F16C instructions
    eight at a time where it has them (eight with a non-finite ``a`` take the integer code),
    else one simple loop of the integer code."""


@overload(_feedback_fp16, jit_options={"cache": True})
def _feedback_fp16_impl(xs, rs, accs, cs):
    if _f16c.HARDWARE:

        def fast(xs, rs, accs, cs):
            k = np.int64(0)
            m = xs.size - xs.size % LANES
            for i in range(0, m, LANES):
                if feedback8(xs, rs, accs, cs, i):
                    for j in range(i, i + LANES):
                        k += _feedback_one(xs, rs, accs, cs, j)
            for j in range(m, xs.size):
                k += _feedback_one(xs, rs, accs, cs, j)
            return k

        return fast

    def integer(xs, rs, accs, cs):
        k = np.int64(0)
        for i in range(xs.size):
            a = np.float32(xs[i] + rs[i])
            h = _f32_to_f16_bits(a.view(np.uint32))
            cs[i] = h
            accs[i] = a - _f16_to_f32(h)
            k += np.int64(not (a - a == 0))
        return k

    return integer


@jit(inline="always")
def _feedback_one(xs, rs, accs, cs, i):
    """Error feedback's fp16 step of item ``i`` by the integer code; 1 when ``x + r`` is not
    finite, else 0."""
    a = np.float32(xs[i] + rs[i])
    h = _f32_to_f16_bits(a.view(np.uint32))
    cs[i] = h
    accs[i] = a - _f16_to_f32(h)
    return np.int64(not (a - a == 0))


@jit(parallel=True)
def half_feedback(x, r, acc, codes, bf16, crc):
    """Fused error-feedback step into fp16 (``bf16=False``) or bf16 codes, float32 only.

    a = x + r;  codes = round(a);  acc = a - value(codes)  (the new residual).  One pass per
    chunk: reads x and r, writes acc and codes (and checksums the chunk's codes while they
    are in cache).  ``acc`` must not alias ``r``: the caller keeps ``r`` intact until the
    step succeeds.  Returns ``(non-finite count of x + r, crc)``, ``crc`` as for
    :func:`narrow_codes`.
    """
    n = x.size
    nchunk = chunks(n)
    bad = np.zeros(nchunk, np.int64)
    sums, lens = crc_pieces(nchunk, crc)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        bad[c] = _feedback_block(x[lo:hi], r[lo:hi], acc[lo:hi], codes[lo:hi], bf16)
        if sums.size:
            crc_piece(sums, lens, c, codes, lo, hi)
    return bad.sum(), joined(sums, lens, crc)


@jit(parallel=True)
def scale(x, starts, factors, out):
    """``out[i] = float64(x[i]) * factors[t]`` for ``i`` in segment ``t`` (``starts``: one
    tensor ``[0, n]``, or a run's), rounded once to ``out``'s dtype (float32 or float64): the
    product NumPy's ``x.astype(np.float64) * factor`` gives, then its cast (random-k's
    unbiased values, ``scale=true``)."""
    for t in prange(starts.size - 1):
        f = factors[t]
        for i in range(starts[t], starts[t + 1]):
            out[i] = np.float64(x[i]) * f


@jit(parallel=True)
def divide(x, d, out):
    """``out = x / d`` elementwise in ``x``'s dtype (float32 or float64; ``d`` a scalar of it),
    correctly rounded: NumPy's ``np.divide(x, x.dtype.type(d))`` (an allreduce's average)."""
    n = x.size
    for c in prange(chunks(n)):
        lo = c * CHUNK
        for i in range(lo, min(n, lo + CHUNK)):
            out[i] = x[i] / d
