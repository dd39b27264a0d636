"""The ``select`` twin's segmented kernels (``codec/kernels/cpu/select.py``'s
``topk_segments``, ``gaussiank_segments``, ``dgc_segments``): one block per tensor of a run,
each tensor selected exactly as the CPU kernel selects it.

The exact top-k of a tensor is a radix select (:func:`_kth_key`: the k-th magnitude from
eight 8-bit digits of the float64 magnitude's bits, each digit a histogram in shared memory)
then an ordered compaction keeping the values above it and the first ties
(:func:`_topk_block`); a segment of at most ``_common.SERIAL_UNIT`` values is selected by
one thread of its block with no barrier (:func:`short_top`: each value kept when fewer than
k beat it; the ``spectral`` twin's short rows too), the same answer (an fft run's blocks of
a few coefficients each: a block's barriers cost more than their loop).  Gaussian-k adds its lane sums, moments and clamped count before the
top-k; DGC its sampled threshold (the same radix select over the strided sample) and the
adaptation loop, thread 0 deciding and the block following.  Comparisons run on float64
magnitudes, as the CPU kernel's do (its comparisons in the data's dtype are exact
rewrites of those); products that meet a sum go through ``_common.mul``.
"""

from __future__ import annotations

import math

import numpy as np

from codec._cuda_jit import jit, numba_cuda
from codec.errors import CodecValueError
from codec.kernels.cuda import _common
from codec.kernels.cuda._common import MAX_WIDTH, THREADS, block_scan, chunk_sums, compactor, mul

cuda = numba_cuda()


@jit(device=True)
def _key(v):
    """The bits of ``|v|`` in float64 (exact for float32 too) as an unsigned integer: ordered
    as the magnitudes are (for finite values), equal exactly when they are (-0 and +0 alike),
    so the selection compares in float64 as the CPU kernel does."""
    return np.float64(abs(v)).view(np.uint64)


@jit(device=True)
def _kth_key(x, lo, stride, m, k):
    """The key (:func:`_key`) of the ``k``-th largest of ``|x[lo + j * stride]|`` for ``j <
    m`` (``1 <= k <= m``) and how many values equal to it are among the ``k`` largest: a
    radix select, eight bits a pass from the top, each pass a histogram in shared memory (256
    counts) of the values whose higher bits match the digits chosen so far, thread 0
    choosing the next digit.  Every thread of the block calls it and gets the answer."""
    t = cuda.threadIdx.x
    hist = cuda.shared.array(256, np.int64)
    pick = cuda.shared.array(2, np.int64)  # the digits chosen so far, the rank still wanted
    if t == 0:
        pick[0] = 0  # the digits chosen so far
        pick[1] = k  # the rank still wanted among the values that match them
    for p in range(8):  # (float64 keys: eight digits; a float32 value's last ones are zero)
        shift = np.uint64(56 - 8 * p)
        for d in range(t, 256, cuda.blockDim.x):
            hist[d] = 0
        cuda.syncthreads()
        prefix = np.uint64(pick[0])
        above = np.uint64(0) if p == 0 else ~np.uint64(0) << (shift + np.uint64(8))  # the digits already chosen
        for j in range(t, m, cuda.blockDim.x):
            key = _key(x[lo + j * stride])
            if key & above == prefix:
                cuda.atomic.add(hist, (key >> shift) & np.uint64(255), 1)
        cuda.syncthreads()
        if t == 0:
            want = pick[1]
            d = 255
            while hist[d] < want:  # (the counts from the top reach want at some digit)
                want -= hist[d]
                d -= 1
            pick[0] = np.int64(prefix | (np.uint64(d) << shift))  # (a magnitude's bits: the top bit is clear)
            pick[1] = want
        cuda.syncthreads()
    key, ties = np.uint64(pick[0]), np.int64(pick[1])
    cuda.syncthreads()  # (pick is free again)
    return key, ties


@jit(device=True)
def _topk_block(x, lo, hi, k, out, o, items, tmp):
    """The sorted positions (from ``lo``) of the ``k`` largest magnitudes of ``x[lo:hi]``
    (finite; ties to the lower index) into ``out[o:o + k]``, by the block: the k-th by
    :func:`_kth_key`, then the values above it and the first ``ties`` equal to it, two scans
    a stretch (the (above, equal) counts, then each thread's kept count given the equal ones
    before it)."""
    t = cuda.threadIdx.x
    if k >= hi - lo or k == 0:
        for j in range(t, k, cuda.blockDim.x):
            out[o + j] = j
        return
    kth, ties = _kth_key(x, lo, 1, hi - lo, k)
    w0 = 0
    eq0 = 0
    for base in range(lo, hi, cuda.blockDim.x * items):
        a0 = min(hi, base + t * items)
        a1 = min(hi, a0 + items)
        gt = 0
        eq = 0
        for i in range(a0, a1):
            key = _key(x[i])
            gt += key > kth
            eq += key == kth
        before, total = block_scan(gt + (eq << 32), tmp)
        seen = eq0 + (before >> 32)  # equal values before this thread's run
        mine = gt + min(eq, max(0, ties - seen))
        wbefore, wtotal = block_scan(mine, tmp)
        w = o + w0 + wbefore
        for i in range(a0, a1):
            key = _key(x[i])
            if key > kth or (key == kth and seen < ties):
                out[w] = i - lo
                w += 1
            if key == kth:
                seen += 1
        w0 += wtotal
        eq0 += total >> 32


@jit(device=True)
def _finite(x, lo, hi, s, bad, tmp):
    """Whether ``x[lo:hi]`` holds no NaN or inf (else ``bad[s] = 1``); the same answer for
    every thread of the block."""
    nbad = 0
    for i in range(lo + cuda.threadIdx.x, hi, cuda.blockDim.x):
        v = x[i]
        nbad += v - v != 0
    _, nbad = block_scan(nbad, tmp)
    if nbad and cuda.threadIdx.x == 0:
        bad[s] = 1
    return nbad == 0


@jit(device=True)
def _opened(x, lo, hi, s, counts, bad, tmp):
    """Open segment ``s`` of a counting kernel, as the CPU's ``_opened``: ``counts[s] = 0``;
    whether there is anything to select (False for an empty segment, and for one holding a
    NaN or inf, which sets ``bad[s]``).  The same answer for every thread."""
    if cuda.threadIdx.x == 0:
        counts[s] = 0
    return _finite(x, lo, hi, s, bad, tmp) and hi > lo


@jit(device=True)
def short_top(x, lo, hi, k, out, o, bad, s):
    """:func:`_topk_block` of a short segment by one thread, with no barrier (also the
    ``spectral`` twin's short rows): value ``j`` is
    kept when fewer than ``k`` beat it (a larger key, or an equal one at a lower index), in
    index order; a NaN or inf sets ``bad[s]`` and writes nothing.  The same answer."""
    for i in range(lo, hi):
        v = x[i]
        if v - v != 0:
            bad[s] = 1
            return
    w = o
    for j in range(lo, hi):
        kj = _key(x[j])
        beat = 0
        for i in range(lo, hi):
            ki = _key(x[i])
            beat += ki > kj or (ki == kj and i < j)
        if beat < k:
            out[w] = j - lo
            w += 1


@jit
def _topk_segments(x, starts, ks, out_starts, out, bad, items):
    s = cuda.blockIdx.x
    lo = starts[s]
    hi = starts[s + 1]
    if hi - lo <= _common.SERIAL_UNIT:  # a short segment (a block's barriers cost more than its loop): one thread
        if cuda.threadIdx.x == 0:
            short_top(x, lo, hi, ks[s], out, out_starts[s], bad, s)
        return
    tmp = cuda.shared.array(THREADS, np.int64)
    if _finite(x, lo, hi, s, bad, tmp):  # (the same answer for every thread)
        _topk_block(x, lo, hi, ks[s], out, out_starts[s], items, tmp)


def topk_segments(x, starts, ks, out_starts, out, bad):
    """The CPU kernel's ``topk_segments`` (its docstring has the contract): one block per
    segment (:func:`_topk_block`); every array a device array."""
    if starts.size > 1:
        _topk_segments[starts.size - 1, _common.SCAN_BLOCK](x, starts, ks, out_starts, out, bad, _common.SCAN_ITEMS)


@jit
def _gaussiank_segments(x, starts, shifts, zs, width, ks, out_starts, out, counts, bad, items):
    s = cuda.blockIdx.x
    t = cuda.threadIdx.x
    tmp = cuda.shared.array(THREADS, np.int64)
    got = cuda.shared.array(1, np.float64)  # the threshold, from thread 0
    lo = starts[s]
    hi = starts[s + 1]
    if not _opened(x, lo, hi, s, counts, bad, tmp):
        return
    n = hi - lo
    shift = shifts[s]
    sm, sq = chunk_sums(x, lo, hi, shift, width)
    if t == 0:
        m1 = sm / n
        var = sq / n - mul(m1, m1)
        std = math.sqrt(var) if var > 0.0 else 0.0
        got[0] = abs(shift + m1) + mul(zs[s], std)
    cuda.syncthreads()
    thr = got[0]
    k = ks[s]
    above = 0
    for i in range(lo + t, hi, cuda.blockDim.x):  # |v| > t (a NaN t: the non-zeros, at most 4k/3)
        v = x[i]
        above += (abs(np.float64(v)) > thr) if thr == thr else (v != 0)
    _, above = block_scan(above, tmp)
    hi_k = 4 * k // 3
    if thr != thr:
        above = min(above, hi_k)
    keep = min(max(above, (2 * k + 2) // 3), hi_k, n)
    _topk_block(x, lo, hi, keep, out, out_starts[s], items, tmp)
    if t == 0:
        counts[s] = keep


def gaussiank_segments(x, starts, shifts, zs, width, ks, out_starts, out, counts, bad):
    """The CPU kernel's ``gaussiank_segments`` (its docstring has the contract): one block per
    segment; every array a device array."""
    if not 0 < width <= MAX_WIDTH:
        raise CodecValueError(f"width: expected 1..{MAX_WIDTH} lanes, got {width}")
    if starts.size > 1:
        _gaussiank_segments[starts.size - 1, _common.SCAN_BLOCK](x, starts, shifts, zs, width, ks, out_starts, out, counts, bad, _common.SCAN_ITEMS)


@jit(device=True)
def _find_at_least(p, i, first):
    """DGC's kept values: ``|x_i| >= thr`` in float64 (or every value for ``thr <= 0``)."""
    x, thr = p
    v = x[i]
    return (1 if thr <= 0 or abs(np.float64(v)) >= thr else 0), v


_compact_at_least = compactor(_find_at_least)


@jit
def _dgc_segments(x, starts, ks, strides, picks, retries, out_starts, out, counts, bad, items):
    s = cuda.blockIdx.x
    t = cuda.threadIdx.x
    tmp = cuda.shared.array(THREADS, np.int64)
    lo = starts[s]
    hi = starts[s + 1]
    if not _opened(x, lo, hi, s, counts, bad, tmp):
        return
    n = hi - lo
    k = ks[s]
    o = out_starts[s]
    stride = strides[s]
    key, _ = _kth_key(x, lo, stride, (n + stride - 1) // stride, picks[s])
    thr = key.view(np.float64)  # the picks[s]-th largest sampled magnitude
    for retry in range(retries + 1):
        count = n
        if thr > 0:  # (thr is the same for every thread: they all scan, or none)
            count = 0
            for i in range(lo + t, hi, cuda.blockDim.x):
                count += abs(np.float64(x[i])) >= thr
            _, count = block_scan(count, tmp)
        if count > 1.3 * k:
            _topk_block(x, lo, hi, k, out, o, items, tmp)
            if t == 0:
                counts[s] = k
            return
        if count < 0.8 * k and retry < retries:
            thr *= 0.8
            continue
        _compact_at_least((x, thr), lo, hi, items, o, count, lo, out, x[:0], tmp)  # (count <= 1.3k: its room; no values)
        if t == 0:
            counts[s] = count
        return


def dgc_segments(x, starts, ks, strides, picks, retries, out_starts, out, counts, bad):
    """The CPU kernel's ``dgc_segments`` (its docstring has the contract): one block per
    segment; every array a device array."""
    if starts.size > 1:
        _dgc_segments[starts.size - 1, _common.SCAN_BLOCK](x, starts, ks, strides, picks, retries, out_starts, out, counts, bad, _common.SCAN_ITEMS)
