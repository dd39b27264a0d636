"""Scatter kernels (Numba CPU): write or accumulate sparse values into a dense buffer, and
the inverse, gather the values at sparse positions."""

from __future__ import annotations

from codec._jit import jit, prange
from codec.kernels.cpu._common import prefetch, view_at
from codec.kernels.cpu._stream import STREAM_MIN, zero
from codec.modes import ADD, SET

__all__ = ["gather", "put", "scatter", "scatter_segments"]

_CHUNK = 1 << 14
#: how many values ahead the scatter asks for the cache line it will write (``_common.prefetch``)
_AHEAD = 64


@jit(parallel=True)
def scatter(values, idx, out, mode):
    """``out[idx] (=|+=|-=) values`` for unique ``idx``; with SET the rest of ``out`` is zeroed.

    Sparse positions touch a new cache line per value, which the hardware cannot predict:
    each loop asks for the line ``_AHEAD`` values ahead (an error-feedback step's subtraction
    at 217k sorted positions of a cold 100 MB residual: 1.18 -> 0.49 ms).  From
    ``STREAM_MIN`` elements the zeroing streams (:mod:`codec.kernels.cpu._stream`)."""
    if mode == SET:
        if out.size >= STREAM_MIN:
            zero(out)
        else:
            out[:] = 0
    k = idx.size
    nchunk = (k + _CHUNK - 1) // _CHUNK
    for c in prange(nchunk):
        lo = c * _CHUNK
        hi = min(k, lo + _CHUNK)
        if mode == SET:
            for i in range(lo, hi):
                if i + _AHEAD < hi:
                    prefetch(out, idx[i + _AHEAD])
                out[idx[i]] = values[i]
        elif mode == ADD:
            for i in range(lo, hi):
                if i + _AHEAD < hi:
                    prefetch(out, idx[i + _AHEAD])
                out[idx[i]] += values[i]
        else:
            for i in range(lo, hi):
                if i + _AHEAD < hi:
                    prefetch(out, idx[i + _AHEAD])
                out[idx[i]] -= values[i]


@jit
def scatter_segments(values, idx, kstarts, addrs, starts, like, mode):
    """:func:`scatter` of many tensors' sparse values, each into its own array: tensor
    ``t`` holds the elements ``[starts[t], starts[t+1])`` of a run, its pairs are
    ``values[kstarts[t]:kstarts[t+1]]`` at the run positions ``idx[kstarts[t]:kstarts[t+1]]``
    (unique, within the tensor's elements), and its array is the one of ``like``'s dtype at
    the address ``addrs[t]`` (the caller keeps them alive).  One call for a run of small
    tensors (or a joint frame's tensors), serial: the work each tensor's own scatter did,
    without a call per tensor.  Not on the threads: zeroing a whole model's outputs there
    lost beside busy processes (docs/benchmarks.md, "Against issue 33's targets").  From
    ``STREAM_MIN`` elements in all the arrays are zeroed with streaming stores
    (:mod:`codec.kernels.cpu._stream`)."""
    stream = starts[-1] - starts[0] >= STREAM_MIN
    for t in range(addrs.size):
        first = starts[t]
        out = view_at(like, addrs[t], starts[t + 1] - first)
        if mode == SET:
            if stream:
                zero(out)
            else:
                out[:] = 0
        for i in range(kstarts[t], kstarts[t + 1]):
            _store_at(out, idx[i] - first, values[i], mode)


@jit(inline="always")
def _store_at(out, at, value, mode):
    """``out[at] (=|+=|-=) value`` (the CUDA twins compile it again as a device function)."""
    if mode == SET:
        out[at] = value
    elif mode == ADD:
        out[at] += value
    else:
        out[at] -= value


@jit(parallel=True)
def gather(src, idx, out):
    """``out[i] = src[idx[i]]`` for positions in ``range(src.size)`` (random-k's kept values:
    one kernel on either backend)."""
    k = idx.size
    for c in prange((k + _CHUNK - 1) // _CHUNK):
        for i in range(c * _CHUNK, min(k, (c + 1) * _CHUNK)):
            out[i] = src[idx[i]]


@jit(parallel=True)
def put(values, idx, out):
    """``out[idx] = values``, the rest of ``out`` untouched (a gathered, combined and rounded
    share written back)."""
    k = idx.size
    for c in prange((k + _CHUNK - 1) // _CHUNK):
        for i in range(c * _CHUNK, min(k, (c + 1) * _CHUNK)):
            out[idx[i]] = values[i]
