"""Selection kernels (Numba CPU) for the magnitude sparsifiers: candidate extraction (topk,
gaussiank, dgc, threshold) and the segmented selections of a many-tensor run (AdaComp's bins
are the ``adacomp`` family, random-k's positions the ``randomk`` family).

Every kernel walks the flat array in chunks of ``CHUNK`` elements whose
boundaries depend on the array length only, and writes each chunk's finds into that chunk's
own row of a buffer: results never depend on the thread count.  A row holds ``cap``
positions; a chunk that finds more still counts them all, and the caller re-runs the kernel
on just that chunk with a row of the exact size (``chunks=(c, c + 1)``).

One loop forms ``acc = x + residual`` (error feedback) and tests each magnitude once,
``not a < cut``: true at or above the cut and for NaN, so one rarely taken (well predicted)
branch both records candidates and finds non-finite values (measured: a separate
branch-free non-finite count doubled the loop's time).  The whole selection costs one pass
over memory.

A segment's cut (its sample's order statistic) and a threshold in the data's dtype are
``_cut``'s (codec/kernels/cpu/_cut.py).
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._common import U, chunk_sums, prefetch
from codec.kernels.cpu.index import _bit_length
from codec.kernels.cpu._cut import _above, _below, _largest, _sample_cut
from codec.layout import CHUNK

__all__ = ["candidates", "count_at_least", "gather_rows", "kth_largest", "lane_means", "line_sample", "strided_sample", "topk_segments", "dgc_segments", "gaussiank_segments"]


@jit
def _candidates_chunk(x, r, acc, c, cut, buf, vals, row, counts, bad, sums, shift, width):
    """One chunk: with ``r`` of x's size, form ``acc = x + r`` and select from it in the same
    loop; with an empty ``r``, select from ``x`` (``acc`` is not touched).

    The two loops repeat their rare branch on purpose: moved into a helper returning
    ``(found, nbad)`` it measured 1.5x slower (10 -> 15 ms for 25M, best of 21, three runs)."""
    n = x.size
    lo = c * CHUNK
    hi = min(n, lo + CHUNK)
    cap = buf.shape[1]
    found = 0
    nbad = 0
    if r.size:
        for i in range(U(lo), U(hi)):
            v = x[i] + r[i]
            acc[i] = v
            a = abs(v)
            if not a < cut:  # one rarely taken branch: at/above the cut, or NaN
                if a - a != 0:  # inf - inf and NaN - NaN are NaN
                    nbad += 1
                else:
                    if found < cap:
                        buf[row, found] = np.int64(i)
                        vals[row, found] = v
                    found += 1
        if sums.shape[0]:
            sums[c, 0], sums[c, 1] = chunk_sums(acc, lo, hi, shift, width)
    else:
        for i in range(U(lo), U(hi)):
            v = x[i]
            a = abs(v)
            if not a < cut:
                if a - a != 0:
                    nbad += 1
                else:
                    if found < cap:
                        buf[row, found] = np.int64(i)
                        vals[row, found] = v
                    found += 1
        if sums.shape[0]:
            sums[c, 0], sums[c, 1] = chunk_sums(x, lo, hi, shift, width)
    counts[c] = found
    bad[c] = nbad


@jit(parallel=True)
def candidates(x, r, acc, cut, chunks, buf, vals, counts, bad, sums, shift, width):
    """Positions ``i`` with ``|a_i| >= cut``, chunk by chunk, where ``a = x`` or, when ``r`` is
    not empty, ``a = x + r`` written into ``acc`` in the same pass (error feedback; ``acc``
    may be a 0-size array otherwise).  ``cut`` has the arrays' dtype (the smallest subnormal
    selects the non-zeros).

    For chunks ``chunks[0] <= c < chunks[1]``: row ``c - chunks[0]`` of ``buf`` receives the
    first ``buf.shape[1]`` positions in increasing order (and ``vals`` their values),
    ``counts[c]`` the number found, ``bad[c]`` the number of NaN/inf values.  When ``sums``
    has rows, ``sums[c]`` gets the chunk's float64 sum and sum of squares of ``a - shift``
    (re-read from cache in ``width`` column lanes, a fixed order; see
    :func:`codec.kernels.cpu._common.chunk_sums`).
    """
    nchunk = chunks[1] - chunks[0]
    for j in prange(nchunk):
        _candidates_chunk(x, r, acc, chunks[0] + j, cut, buf, vals, j, counts, bad, sums, shift, width)


@jit
def line_sample(x, r, step, out):
    """A sample of magnitudes in runs: run ``q`` of ``out.shape[1]`` values is ``|x + r|``
    (``|x|`` for an empty ``r``), summed in x's dtype, from ``x[q * step]`` on, in float64,
    into ``out[q]``.  A run of one 64-byte line reads one line of each array where a strided
    sample of as many values reads one line per value (the candidate pass's cut,
    ``Magnitudes._line_sample``)."""
    runs, line = out.shape
    ahead = U(16 * step)  # a run's line is far from the last: ask for it 16 runs before
    for q in range(U(runs)):
        at = q * U(step)
        if at + ahead < x.size:
            prefetch(x, at + ahead)
            if r.size:
                prefetch(r, at + ahead)
        if r.size:
            for j in range(U(line)):
                out[q, j] = abs(np.float64(x[at + j] + r[at + j]))
        else:
            for j in range(U(line)):
                out[q, j] = abs(np.float64(x[at + j]))


@jit
def strided_sample(x, r, stride, out):
    """``out[q] = x[q * stride] + r[q * stride]`` (``x[q * stride]`` for an empty ``r``), summed
    in x's dtype, in float64, for ``q < out.size``: the signed strided sample of ``acc`` that
    DGC's threshold and gaussian-k's shift are taken from, before the pass forms ``acc``."""
    for q in range(U(out.size)):
        at = q * U(stride)
        if r.size:
            out[q] = np.float64(x[at] + r[at])
        else:
            out[q] = np.float64(x[at])


@jit(parallel=True)
def lane_means(x, starts, width, out):
    """``out[t]`` = the mean of ``x[starts[t]:starts[t+1]]`` (0 for an empty one): its float64
    sum in ``width`` column lanes per ``CHUNK``-value chunk (``chunk_sums``), chunks added in
    order, divided by its length.  Gaussian-k's shift (the origin of its variance sums), in
    an order a CUDA twin reproduces."""
    for t in prange(out.size):
        lo, hi = starts[t], starts[t + 1]
        s = 0.0
        for c in range(lo, hi, CHUNK):
            s += chunk_sums(x, c, min(hi, c + CHUNK), 0.0, width)[0]
        out[t] = s / (hi - lo) if hi > lo else 0.0


def kth_largest(sample, k: int) -> float:
    """The ``k``-th largest of ``|sample|`` (float32/float64, ``1 <= k <= sample.size``; a NaN
    counts as the largest, as in NumPy's partition): the cut a sample gives.  A radix select
    over the float64 magnitudes' bits (:func:`_kth_largest`), as the CUDA twin's: the value
    ``np.partition`` gives, bit for bit, in 2-3 passes over the sample (65,536 t(2) values:
    720 -> ~110 us)."""
    return float(_kth_largest(np.asarray(sample).reshape(-1), k))


#: bits of the float64 magnitudes' keys per pass of :func:`_kth_largest`
_DIGIT = 12
#: the fewest keys a pass of :func:`_kth_largest` counts; fewer are sorted
_SORT_BELOW = 64


@jit
def _kth_largest(sample, k):
    """The ``k``-th largest of ``|sample|`` as float64: the magnitudes' bit patterns (ordered
    as their values, a NaN above infinity) are counted by the 12 bits below the highest in
    which they differ, the keys in the bin holding the wanted rank kept, and so on (a
    gradient's magnitudes spread over the exponent, then the mantissa: two or three passes;
    keys all equal end it), the last few sorted."""
    n = sample.size
    keys = np.empty(n, np.uint64)
    lo, hi = U(-1), U(0)
    for i in range(n):
        key = np.float64(abs(np.float64(sample[i]))).view(np.uint64)
        keys[i] = key
        lo, hi = min(lo, key), max(hi, key)
    r = n - k  # the rank wanted, counted from the smallest
    m = n
    mask = U((1 << _DIGIT) - 1)
    hist = np.empty(1 << _DIGIT, np.int64)
    while m >= _SORT_BELOW:
        if lo == hi:
            return np.uint64(lo).view(np.float64)
        top = _bit_length(np.int64(lo ^ hi)) - 1  # the highest bit in which the keys left differ (below 2**63: no sign bit)
        shift = U(max(0, top + 1 - _DIGIT))
        hist[:] = 0
        for i in range(m):
            hist[(keys[i] >> shift) & mask] += 1
        b = 0
        while r >= hist[b]:
            r -= hist[b]
            b += 1
        j = 0
        lo, hi = U(-1), U(0)
        for i in range(m):  # branch-free: a bin holding half the keys mispredicted every other one
            key = keys[i]
            keep = (key >> shift) & mask == U(b)
            keys[j] = key
            j += np.int64(keep)
            lo = min(lo, key) if keep else lo
            hi = max(hi, key) if keep else hi
        m = j
    part = np.sort(keys[:m])
    return np.uint64(part[r]).view(np.float64)


def count_at_least(sample, cut: float) -> int:
    """How many of ``|sample|`` are at least ``cut``, compared in float64."""
    return int(np.count_nonzero(np.abs(np.asarray(sample, np.float64).reshape(-1)) >= cut))


@jit(parallel=True)
def gather_rows(buf, vals, counts, starts, out, vout):
    """Concatenate the first ``counts[c]`` entries of each row of ``buf`` (and ``vals`` when
    ``vout`` is not empty) at ``starts[c]``: the chunked finds in increasing order."""
    for c in prange(buf.shape[0]):
        m = counts[c]
        s = starts[c]
        for j in range(U(m)):
            out[U(s) + j] = buf[c, j]
        if vout.size:
            for j in range(U(m)):
                vout[U(s) + j] = vals[c, j]


@jit
def _all_finite(x, lo, n):
    k = 0
    for i in range(lo, lo + n):
        v = x[i]
        k += np.int64(not (v - v == 0))
    return k == 0


@jit(parallel=True)
def topk_segments(x, starts, ks, out_starts, out, bad):
    """The exact top-k of many small tensors at once: segment ``s`` is
    ``x[starts[s]:starts[s + 1]]`` and keeps ``ks[s]`` (at most its length) elements, the
    largest magnitudes (compared in float64), ties to the lower index.  Its sorted positions,
    relative to the segment, go to ``out[out_starts[s]:out_starts[s] + ks[s]]``; a segment
    holding a NaN or inf gets ``bad[s] = 1`` and writes nothing.  Segments are independent
    (one per thread at a time), so the result never depends on the thread count.  The
    shape of a segmented kernel: concatenated data, per-segment offsets and parameters.

    Per segment: a cut from a strided sample; the elements at or above it (in index order,
    found in one pass over the data, which also finds a NaN or inf: ``not a < cut`` holds for
    both); the k-th largest among them (all of the top k are, when there are at least k;
    else every element is a candidate); then the candidates above it, and equal ones from
    the lowest index."""
    for s in prange(starts.size - 1):
        lo = starts[s]
        if not _topk_segment(x, lo, starts[s + 1] - lo, ks[s], out, out_starts[s], -1.0):
            bad[s] = 1


@jit
def _topk_segment(x, lo, n, k, out, o, known):
    """One segment of :func:`topk_segments`: the sorted positions of the ``k`` largest of
    ``|x[lo:lo+n]|`` into ``out[o:o+k]``; False (nothing written) when it holds a NaN or inf.
    ``known >= 0``: a magnitude of x's dtype that at least ``k`` of them reach (the caller
    counted), the cut instead of a sample's (the result is the same, the sample is skipped)."""
    if k >= n or k == 0:
        if not _all_finite(x, lo, n):
            return False
        if k:
            for i in range(n):
                out[o + i] = i
        return True
    # the cut is exact in x's dtype: a magnitude of one of the values (or 0), or the caller's
    cut = x.dtype.type(known) if known >= 0 else x.dtype.type(_sample_cut(x, lo, n, k))
    idx = np.empty(n, np.int64)
    cand = np.empty(n, np.float64)
    count = 0
    finite = True
    xs = x[lo : lo + n]
    for i in range(U(n)):  # compared in x's dtype, unsigned index: no conversion, no wraparound test
        v = abs(xs[i])
        if not v < cut:  # one rarely taken branch: a candidate, or NaN/inf
            a = np.float64(v)
            if a - a != 0:
                finite = False
            idx[count] = i
            cand[count] = a
            count += 1
    if not finite:
        return False
    if count < k:  # the sample misled: every element is a candidate
        for i in range(n):
            idx[i] = i
            cand[i] = abs(np.float64(x[lo + i]))
        count = n
    kth = np.partition(cand[:count], count - k)[count - k]  # (partition works on a copy)
    ties = k
    for j in range(count):
        if cand[j] > kth:
            ties -= 1
    w = o
    for j in range(count):
        m = cand[j]
        if m > kth:
            out[w] = idx[j]
            w += 1
        elif m == kth and ties > 0:
            out[w] = idx[j]
            w += 1
            ties -= 1
    return True


@jit(parallel=True)
def gaussiank_segments(x, starts, shifts, zs, width, ks, out_starts, out, counts, bad):
    """Gaussian-k's selection (docs/codecs.md) of many small tensors at once (each at most
    ``CHUNK`` values: one chunk of sums), each exactly as ``gaussiank.choose`` selects in it
    alone: the float64 sums of ``v - shifts[s]`` and their squares in ``width`` column lanes
    (``chunk_sums``), mean and deviation from them, the threshold ``t = |mean| + zs[s] *
    std``, the count of ``|v| > t`` clamped to ``[ceil(2k/3), floor(4k/3)]`` (``k = ks[s]``)
    and at most ``n``, and that many largest magnitudes (ties to the lower index).  The sorted
    positions go to ``out`` from ``out_starts[s]`` (room for ``min(n, floor(4k/3))``), their
    number to ``counts[s]``; a NaN or inf sets ``bad[s]`` and writes nothing."""
    for s in prange(starts.size - 1):
        lo = starts[s]
        n = starts[s + 1] - lo
        if _opened(x, lo, n, s, counts, bad):
            counts[s] = _gaussiank_segment(x, lo, n, shifts[s], zs[s], width, ks[s], out, out_starts[s])


@jit
def _gaussiank_segment(x, lo, n, shift, z, width, k, out, o):
    """One segment of :func:`gaussiank_segments` (``n > 0``, finite); returns how many
    positions it wrote from ``out[o]``."""
    sm, sq = chunk_sums(x, lo, lo + n, shift, width)
    m1 = sm / n
    m2 = sq / n
    mean = shift + m1
    var = m2 - m1 * m1
    std = np.sqrt(var) if var > 0.0 else 0.0  # Python's max(0.0, var): a NaN gives 0
    t = abs(mean) + z * std
    hi = 4 * k // 3
    count = 0
    xs = x[lo : lo + n]
    below = -1.0
    if t == t:
        below = _below(x, t)  # |v| > t exactly when |v| > below, compared in x's dtype
        for i in range(U(n)):
            count += np.int64(abs(xs[i]) > below)
    else:  # a NaN threshold (sums beyond float64): the stage keeps its candidates, at
        for i in range(n):  # least hi of them or every non-zero, then clamps
            count += np.int64(x[lo + i] != 0)
        count = min(count, hi)
    keep = min(max(count, (2 * k + 2) // 3), hi, n)
    _topk_segment(x, lo, n, keep, out, o, below if count >= keep else -1.0)  # the count's values reach below
    return keep


@jit(parallel=True)
def dgc_segments(x, starts, ks, strides, picks, retries, out_starts, out, counts, bad):
    """DGC's selection (docs/codecs.md) of many small tensors at once, each exactly as
    ``dgc.choose`` selects in it alone: segment ``s`` (``n`` values, ``ks[s]`` wanted) takes
    the ``picks[s]``-th largest of its sample ``|x[::strides[s]]|`` (float64) as threshold;
    while fewer than ``0.8 k`` values reach it (and retries are left) it is lowered by x0.8;
    more than ``1.3 k`` give the exact top-k instead, else the values at or above it
    (all of them for a threshold <= 0).  The sorted positions go to ``out`` from
    ``out_starts[s]`` (room for ``min(n, floor(1.3 k) + 1)``), their number to ``counts[s]``;
    a NaN or inf sets ``bad[s]`` and writes nothing."""
    for s in prange(starts.size - 1):
        lo = starts[s]
        n = starts[s + 1] - lo
        if _opened(x, lo, n, s, counts, bad):
            counts[s] = _dgc_segment(x, lo, n, ks[s], strides[s], picks[s], retries, out, out_starts[s])


@jit
def _dgc_segment(x, lo, n, k, stride, pick, retries, out, o):
    """One segment of :func:`dgc_segments` (``n > 0``, finite); returns how many positions
    it wrote from ``out[o]``."""
    thr = _largest(x, lo, stride, (n + stride - 1) // stride, pick)
    xs = x[lo : lo + n]
    for retry in range(retries + 1):
        count = n
        up = _above(x, thr)  # |v| >= thr exactly when |v| >= up, compared in x's dtype
        if thr > 0:
            count = 0
            for i in range(U(n)):
                count += np.int64(abs(xs[i]) >= up)
        if count > 1.3 * k:
            _topk_segment(x, lo, n, k, out, o, up if thr > 0 else -1.0)  # count > k values reach up
            return k
        if count < 0.8 * k and retry < retries:
            thr *= 0.8
            continue
        w = o
        for i in range(n):
            if thr <= 0 or abs(xs[i]) >= up:
                out[w] = i
                w += 1
        return count
    return 0  # (unreachable: the last retry always returns)


@jit
def _opened(x, lo, n, s, counts, bad):
    """Open segment ``s`` of a counting segmented kernel: ``counts[s] = 0``; whether there is
    anything to select (False for an empty segment, and for one holding a NaN or inf, which
    sets ``bad[s]``)."""
    counts[s] = 0
    if n == 0:
        return False
    if not _all_finite(x, lo, n):
        bad[s] = 1
        return False
    return True
