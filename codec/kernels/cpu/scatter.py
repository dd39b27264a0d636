"""Scatter kernels (Numba CPU): write or accumulate sparse values into a dense buffer."""

from __future__ import annotations

from codec._jit import jit, prange
from codec.modes import ADD, SET

__all__ = ["scatter"]

_CHUNK = 1 << 14


@jit(parallel=True)
def scatter(values, idx, out, mode):
    """``out[idx] (=|+=|-=) values`` for unique ``idx``; with SET the rest of ``out`` is zeroed."""
    if mode == SET:
        out[:] = 0
    k = idx.size
    nchunk = (k + _CHUNK - 1) // _CHUNK
    for c in prange(nchunk):
        lo = c * _CHUNK
        hi = min(k, lo + _CHUNK)
        if mode == SET:
            for i in range(lo, hi):
                out[idx[i]] = values[i]
        elif mode == ADD:
            for i in range(lo, hi):
                out[idx[i]] += values[i]
        else:
            for i in range(lo, hi):
                out[idx[i]] -= values[i]
