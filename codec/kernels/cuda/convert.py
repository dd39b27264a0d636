"""CUDA twin of ``codec/kernels/cpu/convert.py``: the same names, arguments and results.

Each value's conversion is the CPU file's own scalar function (``_f32_to_f16_bits`` and the
rest, compiled again as device functions from their Python source), so both backends round
with one statement of the rule and agree bit for bit.  One thread per value, no reductions
but the non-finite count (an atomic add, only where a value is NaN/inf).  The kernels form no
CRC-32C: they return -1 for it, and the frame is checksummed on the host after its one copy
there (docs/kernels.md, "CRC-32C").

Arguments may be device arrays or host NumPy arrays (Numba then copies them in and out, as
the kernel tests do); the stages pass device arrays.
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import jit, numba_cuda
from codec.kernels.cpu import convert as _cpu
from codec.modes import SET, SUB

cuda = numba_cuda()

__all__ = list(_cpu.__all__)

#: threads per block of every kernel here
THREADS = 256


def _device(f):
    """The CPU file's scalar helper ``f`` as a CUDA device function (its Python source)."""
    return jit(device=True)(f.py_func)


_f32_to_f16_bits = _device(_cpu._f32_to_f16_bits)
_f32_to_bf16_bits = _device(_cpu._f32_to_bf16_bits)
_f64_to_f32_odd_bits = _device(_cpu._f64_to_f32_odd_bits)
_sum_odd = _device(_cpu._sum_odd)
_f16_to_f32 = _device(_cpu._f16_to_f32)
_bf16_to_f32 = _device(_cpu._bf16_to_f32)


def _blocks(n: int) -> int:
    return max(1, (n + THREADS - 1) // THREADS)


@jit
def _zero(a):
    if cuda.grid(1) < a.size:
        a[cuda.grid(1)] = 0


def _counter():
    """A device int64 set to 0 by a kernel (queued, no host round trip before the work)."""
    a = cuda.device_array(1, np.int64)
    _zero[1, 32](a)
    return a


@jit(device=True)
def _code(a, bf16):
    """The 16-bit code of float64 ``a`` (through float32 rounded to odd)."""
    u = _f64_to_f32_odd_bits(a)
    return _f32_to_bf16_bits(u) if bf16 else _f32_to_f16_bits(u)


@jit(device=True)
def _value(h, bf16):
    return _bf16_to_f32(h) if bf16 else _f16_to_f32(h)


@jit
def _narrow(x, out, bf16, bad):
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        out[i] = _code(np.float64(v), bf16)
        if not (v - v == 0):
            cuda.atomic.add(bad, 0, 1)


def narrow_codes(x, out, bf16, crc):
    """fp16 (``bf16=False``) or bf16 codes of float32/float64 ``x`` into ``out`` (uint16), as
    the CPU kernel; returns ``(non-finite count, -1)``: no CRC is formed on the device."""
    bad = _counter()
    if x.size:
        _narrow[_blocks(x.size), THREADS](x, out, bool(bf16), bad)
    return int(bad.copy_to_host()[0]), -1


@jit
def _decode(codes, out, mode, bf16):
    i = cuda.grid(1)
    if i < codes.size:
        v = _value(codes[i], bf16)
        if mode == SET:
            out[i] = v
        elif mode == SUB:
            out[i] -= v
        else:
            out[i] += v


def half_decode(codes, out, mode, bf16):
    """``out (=|+=|-=) value(codes)`` (fp16 or bf16 codes, float32/float64 ``out``)."""
    if codes.size:
        _decode[_blocks(codes.size), THREADS](codes, out, mode, bool(bf16))


@jit
def _combine(src, out, mode):
    i = cuda.grid(1)
    if i < src.size:
        if mode == SET:
            out[i] = src[i]
        elif mode == SUB:
            out[i] -= src[i]
        else:
            out[i] += src[i]


def combine(src, out, mode):
    """``out (=|+=|-=) src`` elementwise, cast to ``out``'s dtype."""
    if src.size:
        _combine[_blocks(src.size), THREADS](src, out, mode)


@jit
def _combine_odd(src, out, mode):
    i = cuda.grid(1)
    if i < src.size:
        s = np.float64(src[i])
        out[i] = _sum_odd(np.float64(out[i]), -s if mode == SUB else s)


def combine_odd(src, out, mode):
    """``out (+|-)= src``, the float64 sum rounded to odd, then cast to ``out``."""
    if src.size:
        _combine_odd[_blocks(src.size), THREADS](src, out, mode)


@jit
def _half_combine(src, codes, mode, bf16):
    i = cuda.grid(1)
    if i < src.size:
        s = np.float64(src[i])
        codes[i] = _code(_sum_odd(np.float64(_value(codes[i], bf16)), -s if mode == SUB else s), bf16)


def half_combine(src, codes, mode, bf16):
    """16-bit output in place: ``codes = round(value(codes) (+|-) src)``, rounded once."""
    if src.size:
        _half_combine[_blocks(src.size), THREADS](src, codes, mode, bool(bf16))


@jit
def _feedback(x, r, acc, codes, bf16, bad):
    i = cuda.grid(1)
    if i < x.size:
        a = np.float32(x[i] + r[i])
        h = _f32_to_bf16_bits(a.view(np.uint32)) if bf16 else _f32_to_f16_bits(a.view(np.uint32))
        codes[i] = h
        acc[i] = a - _value(h, bf16)
        if not (a - a == 0):
            cuda.atomic.add(bad, 0, 1)


def half_feedback(x, r, acc, codes, bf16, crc):
    """Fused error-feedback step into fp16/bf16 codes, float32 only: ``a = x + r``, ``codes =
    round(a)``, ``acc = a - value(codes)``; returns ``(non-finite count of x + r, -1)``."""
    bad = _counter()
    if x.size:
        _feedback[_blocks(x.size), THREADS](x, r, acc, codes, bool(bf16), bad)
    return int(bad.copy_to_host()[0]), -1
