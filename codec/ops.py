"""Array operations the stages share, dispatched to the kernel layer.

Kernels handle float32/float64 buffers; 16-bit floats (float16, bfloat16) are widened to
float32 exactly through a 65,536-entry table and narrowed with round-to-nearest-even.
"""

from __future__ import annotations

import functools

import numpy as np

from codec.dtypes import bfloat16
from codec.kernels import backend
from codec.modes import SET

WIDE = (np.dtype(np.float32), np.dtype(np.float64))
HALF = np.dtype(np.float16)


@functools.cache
def lut(dtype) -> np.ndarray:
    """float32 value of every 16-bit code of ``dtype`` (float16 or bfloat16)."""
    codes = np.arange(1 << 16, dtype=np.uint16)
    if np.dtype(dtype) == HALF:
        return codes.view(np.float16).astype(np.float32)
    return (codes.astype(np.uint32) << 16).view(np.float32)


def widen(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 or float64 (16-bit input is widened exactly to float32; others as is)."""
    if x.dtype in WIDE:
        return x
    out = np.empty(x.shape, np.float32)
    backend("convert", x).lut_decode(x.reshape(-1).view(np.uint16), lut(x.dtype), out.reshape(-1), SET)
    return out


def narrow(x: np.ndarray, dtype) -> tuple[np.ndarray, int]:
    """16-bit codes (uint16) of float ``x`` in ``dtype`` (float16 or bfloat16), round to nearest even.

    Returns ``(codes, nonfinite_count)``.  float64 input is rounded to odd first, so the
    result is correctly rounded (no double rounding).
    """
    dtype = np.dtype(dtype)
    flat = x.reshape(-1)
    kern = backend("convert", flat)
    out = np.empty(flat.size, np.uint16)
    if flat.dtype == dtype:
        out[:] = flat.view(np.uint16)
        bad = kern.count_nonfinite(widen(flat)) if flat.size else 0
        return out, int(bad)
    if flat.dtype == np.float64:  # rounding to odd keeps NaN and inf, and turns no finite value into inf
        bits = np.empty(flat.size, np.uint32)
        kern.f64_to_f32_odd(flat, bits)
    else:
        bits = widen(flat).view(np.uint32)
    encode = kern.f32_to_f16 if dtype == HALF else kern.f32_to_bf16
    return out, int(encode(bits, out))


def store(src: np.ndarray, out: np.ndarray, mode: int) -> None:
    """``out (=|+=|-=) src`` for flat arrays of any supported float dtypes."""
    if out.dtype in WIDE:
        backend("convert", out).combine(widen(src), out, mode)
        return
    if mode == SET and src.dtype == out.dtype:
        out[...] = src
        return
    acc = widen(src).astype(np.float32) if mode == SET else widen(out).copy()
    if mode != SET:
        backend("convert", acc).combine(widen(src), acc, mode)
    codes, _ = narrow(acc, out.dtype)
    out.view(np.uint16)[...] = codes


def scatter(values: np.ndarray, idx: np.ndarray, out: np.ndarray, mode: int) -> None:
    """``out[idx] (=|+=|-=) values`` (unique idx); with SET the rest of ``out`` becomes zero."""
    backend("scatter", out).scatter(values, idx, out, mode)


__all__ = ["lut", "widen", "narrow", "store", "scatter", "bfloat16"]
