"""Scatter kernels (Numba CPU): write or accumulate sparse values into a dense buffer, and
the inverse, gather the values at sparse positions."""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._common import address_of, chunk_segments, copy_bytes, prefetch, view_at
from codec.kernels.cpu._stream import pairs_threads, spread, zero_arrays, zero_for
from codec.kernels.cpu.index import BEGIN, BITMAP, BITS, COUNT, KIND, LENGTH, _read_section, _section_count
from codec.modes import ADD, SET

__all__ = ["gather", "index_scatter_segments", "put", "scatter", "scatter_segments"]

_CHUNK = 1 << 14
#: how many values ahead the scatter asks for the cache line it will write (``_common.prefetch``)
_AHEAD = 64


def scatter(values, idx, out, mode):
    """``out[idx] (=|+=|-=) values`` for unique ``idx``; with SET the rest of ``out`` is zeroed:
    an output of more than ``_stream.ZERO_SPAN`` elements on the thread budget's threads
    (:func:`_put_pairs`), a smaller one by the kernel (:func:`_scatter`)."""
    if mode == SET and spread((0, out.size)):
        k = np.array([0, idx.size], np.int64)
        _put_pairs(values, idx, k, np.array([address_of(out)], np.int64), np.array([0, out.size], np.int64), out, mode, False)
        return
    _scatter(values, idx, out, mode, mode == SET)


def _put_pairs(values, idx, kstarts, addrs, starts, like, mode, run):
    """Tensor ``t``'s pairs (``values[kstarts[t]:kstarts[t+1]]`` at the positions
    ``idx[kstarts[t]:kstarts[t+1]]``, run positions when ``run``, else its own) written
    (``mode``) into its array (the one of ``like``'s dtype at ``addrs[t]``, ``starts[t+1] -
    starts[t]`` items).  With SET the arrays are zeroed: a large run's (``_stream.spread``)
    and its pairs in one pass of streaming stores on the budget's threads when each tensor's
    positions increase, as every sparse frame's do (``_stream.pairs_threads``: one 25M
    array, 250k pairs 2.14-2.39 -> 1.72-1.92 ms), else zeroed first on those threads
    (``_stream.zero_for``; a 25M top-k decode 6.4 -> 4.6 ms) and the pairs written after
    (:func:`_write_pairs`); a small run's by that kernel, on the calling thread."""
    if mode == SET and spread(starts) and _increasing(idx, kstarts):
        pairs_threads(values, idx, kstarts, addrs, starts, like, run)
        return
    _write_pairs(values, idx, kstarts, addrs, starts, like, mode, run, zero_for(mode, addrs, starts, like))


@jit
def _increasing(idx, kstarts):
    """Whether each segment of ``idx`` (``kstarts``) increases strictly; no branch a position,
    so the loop vectorises (250k positions 0.23 -> 0.03 ms with an early exit's branch)."""
    ok = True
    for t in range(kstarts.size - 1):
        ok &= _increases(idx[kstarts[t] : kstarts[t + 1]])
    return ok


@jit
def _increases(seg):
    """Whether ``seg`` increases strictly (:func:`_increasing`' loop, a function of its own so
    that it vectorises: inlined in the segments' loop it did not, 0.22 ms against 0.03)."""
    ok = True
    for i in range(1, seg.size):
        ok &= seg[i] > seg[i - 1]
    return ok


@jit(parallel=True)
def _scatter(values, idx, out, mode, zero_first):
    """:func:`scatter`'s kernel, ``out`` (a small one) zeroed first when ``zero_first``.

    Sparse positions touch a new cache line per value, which the hardware cannot predict:
    each loop asks for the line ``_AHEAD`` values ahead (an error-feedback step's subtraction
    at 217k sorted positions of a cold 100 MB residual: 1.18 -> 0.49 ms)."""
    if zero_first:
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


def scatter_segments(values, idx, kstarts, addrs, starts, like, mode):
    """:func:`scatter` of many tensors' sparse values, each into its own array: tensor
    ``t`` holds the elements ``[starts[t], starts[t+1])`` of a run, its pairs are
    ``values[kstarts[t]:kstarts[t+1]]`` at the run positions ``idx[kstarts[t]:kstarts[t+1]]``
    (unique, within the tensor's elements), and its array is the one of ``like``'s dtype at
    the address ``addrs[t]`` (the caller keeps them alive).  One call for a run of small
    tensors (or a joint frame's tensors): the work each tensor's own scatter did, without a
    call per tensor (:func:`_put_pairs`).  With SET a large run's arrays are written on the
    budget's threads (``codec.threads.each``, nothing spinning, no barrier: a parallel
    region's zeroing lost beside busy processes, docs/benchmarks.md, "Against issue 33's
    targets"), zeros and pairs in one streamed pass; a small run's are zeroed by the kernel on
    the calling thread and the pairs written after (:func:`_write_pairs`)."""
    _put_pairs(values, idx, kstarts, addrs, starts, like, mode, True)


def index_scatter_segments(data, sections, values_at, counts, addrs, starts, like):
    """A sparse many-tensor frame decoded into each tensor's array (SET): tensor ``t``'s
    index section is row ``t`` of the section table ``sections`` (kind, bits, count, first
    byte and byte length in ``data``, the payload, as ``index.index_counts`` takes it), its
    ``counts[t]`` kept values, one per position, are stored raw in ``like``'s dtype from
    byte ``values_at[t]`` of ``data``, and its array is the one of ``like``'s dtype at the
    address ``addrs[t]`` (``starts[t+1] - starts[t]`` elements; the caller keeps it alive).
    What ``index_counts``, ``index_read``, ``absolute_positions`` and
    :func:`scatter_segments` do in four calls: every section is checked (the index section
    as ``index_counts`` checks it, as many positions as values, the values inside ``data``)
    and read (a position reaching its tensor's size is refused) before anything is written
    (:func:`_read_pairs`); then the arrays are zeroed and the pairs written.  A large run's
    in a second call, on the budget's threads (:func:`_put_pairs`: zeros and pairs in one
    streamed pass); a small one's in the same call, on the calling thread
    (the zeroing and the pairs' loop of :func:`_write_pairs` written again in
    :func:`_read_pairs`: Numba makes no parallel loop of a ``prange`` in a function it
    inlines, and the one call saves ~1 µs of the bundled sample's decode).
    Returns -1, or the first tensor whose sections are refused (nothing written)."""
    small = not spread(starts)
    bad, idx, values, kst = _read_pairs(data, sections, values_at, counts, addrs, starts, like, small)
    if bad < 0 and not small:
        _put_pairs(values, idx, kst, addrs, starts, like, SET, False)
    return bad


@jit(parallel=True)
def _read_pairs(data, sections, values_at, counts, addrs, starts, like, write):
    """:func:`index_scatter_segments`' first step: every tensor's index section counted and
    checked, then read into ``idx`` (each tensor's own positions) and its values copied into
    ``values`` (``like``'s dtype), tensor ``t``'s pairs at ``kst[t]:kst[t+1]``; with
    ``write`` the arrays are then zeroed on the calling thread and the pairs written
    (:func:`_pairs`).  Returns ``(bad, idx, values, kst)``: ``bad`` the first refused
    tensor (nothing written), or -1; the pairs are allocated only once every section's
    count is checked against the payload."""
    count = starts.size - 1
    item = like.itemsize
    found = np.empty(count, np.int64)
    for t in prange(count):  # (a bitmap's count is a pass over its bytes)
        found[t] = _section_count(data, sections[t, KIND], sections[t, BITS], sections[t, COUNT], sections[t, BEGIN], sections[t, LENGTH], starts[t + 1] - starts[t])
    kst = np.zeros(count + 1, np.int64)
    for t in range(count):
        k = found[t]
        if k < 0 or k != counts[t] or values_at[t] < 0 or values_at[t] > data.size - k * item:
            return t, np.empty(0, np.int64), np.empty(0, like.dtype), kst
        kst[t + 1] = kst[t] + k
    total = kst[count]
    idx = np.empty(total, np.int64)
    values = np.empty(total, like.dtype)
    raw = values.view(np.uint8)
    bad = np.zeros(max(count, 1), np.uint8)
    for t in prange(count):
        lo = sections[t, BEGIN]
        if not _read_section(data, lo, lo + sections[t, LENGTH], sections[t, KIND] == BITMAP, sections[t, BITS], starts[t + 1] - starts[t], idx, kst[t], kst[t + 1]):
            bad[t] = 1
        copy_bytes(raw, item * kst[t], data, values_at[t], item * (kst[t + 1] - kst[t]))
    for t in range(count):
        if bad[t]:
            return t, idx, values, kst
    if write:
        zero_arrays(addrs, starts, like)
        for c in prange((total + _CHUNK - 1) // _CHUNK):
            _pairs(values, idx, kst, addrs, starts, like, SET, c * _CHUNK, min(total, (c + 1) * _CHUNK), False)
    return -1, idx, values, kst


def _pairs_work(values, *rest):
    """:func:`_write_pairs`' size for the serial/parallel choice: two items a pair (a store
    that misses the cache), so pairs run on the threads from 65,536: 100k pairs into a cold
    40 MB took 1.10 ms on one thread and 0.78 on two, 40k into 16 MB the same either way."""
    return 2 * values.size


@jit(parallel=True, work=_pairs_work)
def _write_pairs(values, idx, kstarts, addrs, starts, like, mode, run, zero_first):
    """Tensor ``t``'s pairs (``values[kstarts[t]:kstarts[t+1]]`` at the positions
    ``idx[kstarts[t]:kstarts[t+1]]``, run positions when ``run``, else its own) written
    (``mode``) into its array (``addrs[t]``), on the threads in chunks of the pairs
    (:func:`_pairs`); every array zeroed first on the calling thread when ``zero_first``
    (a small run: ``_stream.zero_for``)."""
    if zero_first:
        zero_arrays(addrs, starts, like)
    k = idx.size
    for c in prange((k + _CHUNK - 1) // _CHUNK):
        _pairs(values, idx, kstarts, addrs, starts, like, mode, c * _CHUNK, min(k, (c + 1) * _CHUNK), run)


@jit
def _pairs(values, idx, kstarts, addrs, starts, like, mode, lo, hi, run):
    """Pairs ``lo:hi`` of :func:`_write_pairs` written (``mode``) into their tensors'
    arrays: ``idx`` run positions (``run``) or each tensor's own (random-k's drawn ones, or
    those :func:`index_scatter_segments` read), each line asked for ``_AHEAD`` pairs ahead
    as :func:`scatter` asks (ResNet-50's 255k top-k pairs into its freshly zeroed 102 MB of
    outputs on this Intel Xeon: 2.4 -> 1.9 ms; an earlier AMD EPYC measured no gain)."""
    rows = chunk_segments(kstarts, lo, hi)
    for j in range(rows.shape[0]):
        t, a, b = rows[j, 0], rows[j, 1], rows[j, 2]
        first = starts[t]
        out = view_at(like, addrs[t], starts[t + 1] - first)
        shift = first if run else 0
        for i in range(a, b):
            if i + _AHEAD < b:
                prefetch(out, idx[i + _AHEAD] - shift)
            _store_at(out, idx[i] - shift, values[i], mode)


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
