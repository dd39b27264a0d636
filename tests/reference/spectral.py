"""Plain NumPy/scipy reference for the ``fft`` transform stage (docs/codecs.md, "Transform stages").

Follows the numbered rules of ``fft(theta=, block=, keep=)`` literally, favouring the
obviously correct over the fast: no Numba, no histogram, no codec import (only the bfloat16
dtype and reference.sparse's once-rounding to 16-bit formats).

* :func:`encode` gives the kept spectrum positions (sorted int64) and the values the value
  stage codes: ``re, im`` of each kept coefficient, interleaved, in position order, in the
  domain dtype (float32 for 16- and 32-bit input, float64 for float64).
* :func:`decode` scatters them into a zero spectrum, inverts every block with
  ``scipy.fft.irfft`` and rounds to the frame's dtype.
* :func:`dropped_energy` is the Parseval energy of the coefficients not kept.

The tests compare the codec against these bit for bit (value stage ``none``).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.fft

from codec.dtypes import bfloat16

from .sparse import round_to

F16 = np.dtype(np.float16)
BF16 = np.dtype(bfloat16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


# ------------------------------------------------------------------ layout
def domain_dtype(dtype) -> np.dtype:
    """float64 for float64 input, float32 for everything else."""
    return F64 if np.dtype(dtype) == F64 else F32


def blocks(n: int, block: int) -> list[tuple[int, int]]:
    """``(start, length)`` of every block: ``n // B`` full blocks of ``B``, then the tail.

    ``block == 0`` or ``block >= n`` is one block of ``n`` (none when ``n == 0``)."""
    if n == 0:
        return []
    b = n if block == 0 or block >= n else block
    full = n // b
    out = [(i * b, b) for i in range(full)]
    if n - full * b:
        out.append((full * b, n - full * b))
    return out


def coefficients(n: int, block: int) -> list[tuple[int, int]]:
    """``(first spectrum index, count)`` of every block's coefficients (L//2 + 1 each)."""
    out, base = [], 0
    for _, length in blocks(n, block):
        c = length // 2 + 1
        out.append((base, c))
        base += c
    return out


def spectrum_size(n: int, block: int) -> int:
    return sum(c for _, c in coefficients(n, block))


def widen(x) -> np.ndarray:
    """Flat ``x`` in the domain dtype (16-bit formats widen exactly to float32)."""
    x = np.asarray(x).reshape(-1)
    return x.astype(domain_dtype(x.dtype))


# ------------------------------------------------------------------ encode
def spectrum(x, block: int) -> np.ndarray:
    """The whole spectrum (complex64 or complex128): every block's ``scipy.fft.rfft``, in order.

    One rfft call per block, on a fresh contiguous copy of the block."""
    w = widen(x)
    ctype = np.complex128 if w.dtype == F64 else np.complex64
    parts = [scipy.fft.rfft(w[s : s + length].copy()) for s, length in blocks(w.size, block)]
    if not parts:
        return np.empty(0, ctype)
    spec = np.concatenate(parts)
    assert spec.dtype == ctype
    return spec


def magnitudes(spec) -> np.ndarray:
    """``float64(re)**2 + float64(im)**2`` (products exact for float32 parts)."""
    re = spec.real.astype(np.float64)
    im = spec.imag.astype(np.float64)
    return re * re + im * im


def top(mag, k: int) -> np.ndarray:
    """Sorted indices of the ``k`` largest of ``mag``, ties to the lower index: the first ``k``
    of a sort by (decreasing magnitude, increasing index)."""
    mag = np.asarray(mag, np.float64)
    order = np.lexsort((np.arange(mag.size), -mag))
    return np.sort(order[:k]).astype(np.int64)


def top_brute(mag, k: int) -> np.ndarray:
    """Pure-Python :func:`top` (``sorted`` with key ``(-m, i)``), to validate it."""
    order = sorted(range(len(mag)), key=lambda i: (-float(mag[i]), i))
    return np.array(sorted(order[:k]), np.int64)


def kept_count(c: int, theta: float) -> int:
    """``c - floor(theta * c)`` with ``theta * c`` in float64."""
    return c - math.floor(float(theta) * c)


def select(spec, n: int, block: int, theta: float, keep: str) -> np.ndarray:
    """Kept spectrum positions (sorted int64)."""
    mag = magnitudes(spec)
    if keep == "global":
        return top(mag, kept_count(mag.size, theta))
    if keep != "per_block":
        raise ValueError(keep)
    parts = [base + top(mag[base : base + c], kept_count(c, theta)) for base, c in coefficients(n, block)]
    return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)


def encode(x, theta: float, block: int, keep: str = "per_block"):
    """``(positions, values)``: what an ``fft(...)+none`` frame holds.

    ``values`` interleaves ``re, im`` of the kept coefficients in position order, in the
    domain dtype.  Raises ValueError for non-finite input."""
    flat = np.asarray(x).reshape(-1)
    if not np.all(np.isfinite(flat.astype(np.float64))):
        raise ValueError("x: non-finite value")
    spec = spectrum(flat, block)
    pos = select(spec, flat.size, block, theta, keep)
    dt = domain_dtype(flat.dtype)
    vals = np.empty(2 * pos.size, dt)
    vals[0::2] = spec.real[pos]
    vals[1::2] = spec.imag[pos]
    return pos, vals


# ------------------------------------------------------------------ decode
def decode(positions, values, n: int, block: int, dtype) -> np.ndarray:
    """The decoded flat array in ``dtype``: zero spectrum, kept coefficients placed, every
    block through ``scipy.fft.irfft(., n=L)`` (float32 or float64 by the values' dtype),
    rounded once to a 16-bit ``dtype``."""
    dtype = np.dtype(dtype)
    values = np.asarray(values)
    ctype = np.complex128 if values.dtype == F64 else np.complex64
    spec = np.zeros(spectrum_size(n, block), ctype)
    pos = np.asarray(positions, np.int64)
    spec.real[pos] = values[0::2]
    spec.imag[pos] = values[1::2]
    out = np.empty(n, domain_dtype(dtype))
    for (s, length), (base, c) in zip(blocks(n, block), coefficients(n, block)):
        y = scipy.fft.irfft(spec[base : base + c].copy(), n=length)
        assert y.dtype == out.dtype
        out[s : s + length] = y
    if dtype in (F32, F64):
        return out.astype(dtype)
    return round_to(out.astype(np.float64), dtype)


# ------------------------------------------------------------------ Parseval
def energy_weights(n: int, block: int) -> np.ndarray:
    """Per spectrum coefficient, its weight in the block's squared L2 norm (Parseval):
    ``1/L`` for c_0 and (L even) c_{L/2}, ``2/L`` for the others."""
    w = np.empty(spectrum_size(n, block), np.float64)
    for (_, length), (base, c) in zip(blocks(n, block), coefficients(n, block)):
        row = np.full(c, 2.0)
        row[0] = 1.0
        if length % 2 == 0:
            row[-1] = 1.0
        w[base : base + c] = row / length
    return w


def dropped_energy(x, positions, block: int) -> float:
    """Squared L2 norm lost by keeping only ``positions`` of the (float64) spectrum of ``x``."""
    flat = np.asarray(x, np.float64).reshape(-1)
    spec = spectrum(flat, block)
    mask = np.ones(spec.size, bool)
    mask[np.asarray(positions, np.int64)] = False
    return float(np.sum(magnitudes(spec)[mask] * energy_weights(flat.size, block)[mask]))
