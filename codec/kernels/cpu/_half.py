"""fp16 and bf16 codes, value by value and block by block (Numba CPU): the rules every
16-bit kernel of ``convert`` uses (and its CUDA twin compiles as device functions), and the
per-chunk loops its parallel kernels run.

* The scalar rules: ``f32_to_f16_bits`` / ``f32_to_bf16_bits`` (float32 bits to a code,
  nearest even), ``f64_to_f32_odd_bits`` (float64 to float32 rounded to odd, so float64 input
  is never double-rounded), ``sum_odd`` (a float64 sum rounded to odd), ``f16_to_f32`` /
  ``bf16_to_f32`` (a code's exact value).  All branch-free, so the loops over them vectorise.
* The blocks: ``narrow_block`` (encode), ``decode_block``, ``combine_block`` (adding into
  16-bit outputs) and ``feedback_block`` (error feedback's fused step), each one chunk of a
  ``convert`` kernel.  float32 blocks take eight values at a time where that is faster and
  gives the same bits: fp16 through the CPU's F16C instructions (:mod:`codec.kernels.cpu._f16c`;
  eight values with a NaN or an infinity, float64, and CPUs without F16C take the integer
  code), bf16 sixteen at a time through vector operations of the same integer arithmetic
  (:mod:`codec.kernels.cpu._bf16`).  Each ``@overload`` below picks its loop at compile time.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from codec._jit import jit
from codec.kernels.cpu import _bf16, _f16c, _stream
from codec.kernels.cpu._f16c import LANES, NARROW_LANES, feedback8, narrow16, widen8, widen8_stream
from codec.modes import ADD, SET, SUB


@jit
def f32_to_f16_bits(u):
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
def f32_to_bf16_bits(u):
    """bfloat16 bits of the float32 whose bits are ``u``, round to nearest even; NaN stays NaN."""
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        r = (u >> np.uint32(16)) | np.uint32(0x40)
    return np.uint16(r)


@jit
def f64_to_f32_odd_bits(d):
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
def sum_odd(a, b):
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
def narrow_block(xs, os, bf16):
    """One chunk of :func:`narrow_codes`: per format, one loop over contiguous slices that
    converts and counts non-finite values in the same pass (the chunked loop over ``x[i]``
    did not vectorise: 0.2-0.4x memcpy against 1.5-1.8x); returns the count."""
    if bf16:
        return _narrow_bf16(xs, os)
    return _narrow_fp16(xs, os)


def _narrow_bf16(xs, os):
    """bf16 codes of the block ``xs`` into ``os``; returns the non-finite count.  float32
    sixteen values at a time as vector operations (:mod:`codec.kernels.cpu._bf16`, the same
    bits), else (float64, rounded to odd first) one simple loop of the integer code."""


@overload(_narrow_bf16, jit_options={"cache": True})
def _narrow_bf16_impl(xs, os):
    if xs.dtype == types.float32:

        def lanes(xs, os):
            k = np.int64(0)
            m = xs.size - xs.size % _bf16.NARROW_LANES
            for i in range(0, m, _bf16.NARROW_LANES):
                k += _bf16.narrow16(xs, i, os)
            for i in range(m, xs.size):
                v = xs[i]
                os[i] = f32_to_bf16_bits(np.float32(v).view(np.uint32))
                k += np.int64(not (v - v == 0))
            return k

        return lanes

    def integer(xs, os):
        k = np.int64(0)
        for i in range(xs.size):
            v = xs[i]
            os[i] = f32_to_bf16_bits(f64_to_f32_odd_bits(np.float64(v)))
            k += np.int64(not (v - v == 0))
        return k

    return integer


def _narrow_fp16(xs, os):
    """fp16 codes of the block ``xs`` into ``os``; returns the non-finite count.  Compiled as
    the CPU's F16C instructions sixteen values at a time for float32 where the CPU has them
    (:mod:`codec.kernels.cpu._f16c`: sixteen with a NaN or an infinity take the integer code),
    else one simple loop of the integer code (float64, rounded to odd first)."""


@overload(_narrow_fp16, jit_options={"cache": True})
def _narrow_fp16_impl(xs, os):
    if _f16c.HARDWARE and xs.dtype == types.float32:

        def fast(xs, os):
            k = np.int64(0)
            m = xs.size - xs.size % NARROW_LANES
            for i in range(0, m, NARROW_LANES):
                if narrow16(xs, i, os):
                    for j in range(i, i + NARROW_LANES):
                        k += _narrow_one(xs, os, j)
            for j in range(m, xs.size):
                k += _narrow_one(xs, os, j)
            return k

        return fast

    def integer(xs, os):
        k = np.int64(0)
        for i in range(xs.size):
            k += _narrow_one(xs, os, i)
        return k

    return integer


@jit(inline="always")
def _narrow_one(xs, os, i):
    """fp16 code ``i`` by the integer code; 1 when ``xs[i]`` is not finite, else 0."""
    v = xs[i]
    os[i] = f32_to_f16_bits(f64_to_f32_odd_bits(np.float64(v)))
    return np.int64(not (v - v == 0))


@jit
def f16_to_f32(h):
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
def bf16_to_f32(h):
    """The float32 value of bfloat16 code ``h``: its bits are the float32's top half."""
    b = np.uint32(np.uint32(h) << np.uint32(16))
    return b.view(np.float32)


#: ``decode_block``'s mode for a SET whose output is written past the cache with streaming
#: stores (:mod:`codec.kernels.cpu._stream`): what a decode kernel passes from
#: ``_stream.STREAM_MIN`` output values; the bytes are SET's
STREAM = 3


@jit
def decode_block(cs, os, mode, bf16):
    """One chunk of :func:`half_decode`: one simple loop per format and mode, so each
    vectorises (a 65,536-entry table gather did not: 0.23x memcpy against 0.8x); ``mode``
    STREAM: SET, the aligned body of ``os`` with streaming stores, then a fence."""
    if mode == STREAM:
        at = _stream.head(os)
        if at >= 0 and cs.size - at >= LANES:
            m = at + (cs.size - at) // LANES * LANES
            _decode(cs[:at], os[:at], SET, bf16)
            _stream_body(cs[at:m], os[at:m], bf16)
            _decode(cs[m:], os[m:], SET, bf16)
            _stream.fence()
            return
        mode = SET
    _decode(cs, os, mode, bf16)


@jit
def _decode(cs, os, mode, bf16):
    """``os (=|+=|-=) value(cs)``: one simple loop per format and mode."""
    if bf16:
        if mode == SET:
            for i in range(cs.size):
                os[i] = bf16_to_f32(cs[i])
        elif mode == ADD:
            for i in range(cs.size):
                os[i] += bf16_to_f32(cs[i])
        else:
            for i in range(cs.size):
                os[i] -= bf16_to_f32(cs[i])
        return
    _widen_fp16(cs, os, mode)


@jit
def _stream_body(cs, os, bf16):
    """``os = value(cs)`` with streaming stores, eight at a time (``os`` starts at an aligned
    address, ``cs.size`` a multiple of eight); eight fp16 codes with an infinity or a NaN, or
    a CPU without F16C, take the integer code."""
    if bf16:
        for i in range(0, cs.size, LANES):
            _stream.widen8_bf16(cs, i, os)
    else:
        _stream_fp16(cs, os)


def _stream_fp16(cs, os):
    """The fp16 half of :func:`_stream_body`."""


@overload(_stream_fp16, jit_options={"cache": True})
def _stream_fp16_impl(cs, os):
    if _f16c.HARDWARE:

        def fast(cs, os):
            for i in range(0, cs.size, LANES):
                if widen8_stream(cs, i, os):
                    for j in range(i, i + LANES):
                        os[j] = f16_to_f32(cs[j])

        return fast
    return lambda cs, os: _widen_integer(cs, os, SET, 0)


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
                            os[j] = f16_to_f32(cs[j])
            elif mode == ADD:
                for i in range(0, m, LANES):
                    if widen8(cs, i, os, ADD):
                        for j in range(i, i + LANES):
                            os[j] += f16_to_f32(cs[j])
            else:
                for i in range(0, m, LANES):
                    if widen8(cs, i, os, SUB):
                        for j in range(i, i + LANES):
                            os[j] -= f16_to_f32(cs[j])
            _widen_integer(cs, os, mode, m)

        return fast
    return lambda cs, os, mode: _widen_integer(cs, os, mode, 0)


@jit
def _widen_integer(cs, os, mode, lo):
    """``os[lo:] (=|+=|-=) value(cs[lo:])`` by the integer code, one simple loop per mode."""
    if mode == SET:
        for i in range(lo, cs.size):
            os[i] = f16_to_f32(cs[i])
    elif mode == ADD:
        for i in range(lo, cs.size):
            os[i] += f16_to_f32(cs[i])
    else:
        for i in range(lo, cs.size):
            os[i] -= f16_to_f32(cs[i])


@jit
def combine_block(ss, cs, mode, bf16):
    """One chunk of :func:`half_combine`: one simple loop per format and mode (they
    vectorise), the code's value computed arithmetically."""
    if bf16:
        if mode == SUB:  # one loop per mode: see combine_odd (a NaN's sign bit)
            for j in range(cs.size):
                cs[j] = f32_to_bf16_bits(f64_to_f32_odd_bits(sum_odd(np.float64(bf16_to_f32(cs[j])), -np.float64(ss[j]))))
        else:
            for j in range(cs.size):
                cs[j] = f32_to_bf16_bits(f64_to_f32_odd_bits(sum_odd(np.float64(bf16_to_f32(cs[j])), np.float64(ss[j]))))
    elif mode == SUB:
        for j in range(cs.size):
            cs[j] = f32_to_f16_bits(f64_to_f32_odd_bits(sum_odd(np.float64(f16_to_f32(cs[j])), -np.float64(ss[j]))))
    else:
        for j in range(cs.size):
            cs[j] = f32_to_f16_bits(f64_to_f32_odd_bits(sum_odd(np.float64(f16_to_f32(cs[j])), np.float64(ss[j]))))


@jit
def feedback_block(xs, rs, accs, cs, bf16):
    """One chunk of :func:`half_feedback`: one simple loop per format, forming ``x + r``,
    its code, the new residual and the non-finite count in one pass (it vectorises)."""
    if not bf16:
        return _feedback_fp16(xs, rs, accs, cs)
    k = np.int64(0)
    m = xs.size - xs.size % _bf16.FEEDBACK_LANES
    for i in range(0, m, _bf16.FEEDBACK_LANES):  # eight at a time as vector operations (codec.kernels.cpu._bf16)
        k += _bf16.feedback8(xs, rs, accs, cs, i)
    for i in range(m, xs.size):
        a = np.float32(xs[i] + rs[i])
        h = f32_to_bf16_bits(a.view(np.uint32))
        cs[i] = h
        accs[i] = a - bf16_to_f32(h)
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
            k += _feedback_one(xs, rs, accs, cs, i)
        return k

    return integer


@jit(inline="always")
def _feedback_one(xs, rs, accs, cs, i):
    """Error feedback's fp16 step of item ``i`` by the integer code; 1 when ``x + r`` is not
    finite, else 0."""
    a = np.float32(xs[i] + rs[i])
    h = f32_to_f16_bits(a.view(np.uint32))
    cs[i] = h
    accs[i] = a - f16_to_f32(h)
    return np.int64(not (a - a == 0))
