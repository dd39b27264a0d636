"""A many-tensor frame's per-tensor items and bytes (Numba CPU), the ``pack`` family's
``put_items`` / ``take_items`` (each tensor's per-block numbers, float64, float32 or int16
items, written and read at its own byte offset) and ``interleave`` (a sparse run's index
sections and value codes, tensor by tensor); codec/kernels/cpu/pack.py exports them with
the family's bit packing."""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._bytes import _get, _put

__all__ = ["interleave", "put_items", "take_items"]


@jit
def _item(w, width):
    """The float64 value of the little-endian ``width``-byte item whose bits are ``w``: 2 an
    int16, 4 a float32, 8 a float64."""
    if width == 8:
        return np.uint64(w).view(np.float64)
    if width == 4:
        return np.float64(np.uint32(w).view(np.float32))
    return np.float64(np.uint16(w).view(np.int16))


@jit
def _item_bits(v, width):
    """The bits of float64 ``v`` as a little-endian ``width``-byte item (``_item``'s inverse): 8
    a float64, 4 a float32 (rounded to nearest, as NumPy casts), 2 an int16."""
    if width == 8:
        return np.float64(v).view(np.uint64)
    if width == 4:
        return np.uint64(np.float32(v).view(np.uint32))
    return np.uint64(np.uint16(np.int16(v)))


@jit(parallel=True)
def put_items(values, vstarts, widths, out, ostarts):
    """Tensor ``t``'s float64 ``values[vstarts[t]:vstarts[t+1]]`` written from byte
    ``ostarts[t]`` of ``out`` as little-endian items of ``widths[t]`` bytes: 8 float64, 4
    float32 (rounded to nearest, as NumPy casts), 2 int16 (integers in its range)."""
    for t in prange(vstarts.size - 1):
        w = widths[t]
        p = np.uint64(ostarts[t])
        for i in range(vstarts[t], vstarts[t + 1]):
            _put(out, p, _item_bits(values[i], w), w)
            p += np.uint64(w)


@jit(parallel=True)
def take_items(data, offsets, widths, vstarts, out):
    """The inverse of ``put_items``: tensor ``t``'s ``vstarts[t+1] - vstarts[t]`` items of
    ``widths[t]`` bytes from byte ``offsets[t]`` of ``data``, as float64 into the same slice
    of ``out`` (exact)."""
    for t in prange(vstarts.size - 1):
        w = widths[t]
        p = np.uint64(offsets[t])
        for i in range(vstarts[t], vstarts[t + 1]):
            out[i] = _item(_get(data, p, w), w)
            p += np.uint64(w)


@jit(parallel=True)
def interleave(first, fstarts, second, sstarts, out):
    """``out`` = segment 0 of ``first``, segment 0 of ``second``, segment 1 of ``first``, ...:
    segment ``t`` of ``first`` is ``first[fstarts[t]:fstarts[t+1]]`` (bytes), of ``second``
    likewise; a sparse run's index sections and value codes, each tensor's two in turn."""
    for t in prange(fstarts.size - 1):
        p = fstarts[t] + sstarts[t]
        for i in range(fstarts[t], fstarts[t + 1]):
            out[p] = first[i]
            p += 1
        for i in range(sstarts[t], sstarts[t + 1]):
            out[p] = second[i]
            p += 1
