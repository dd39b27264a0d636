"""A sample's order statistics and cuts, shared by the ``select`` family's segmented kernels
(codec/kernels/cpu/select.py): the ``c``-th largest magnitude of a strided sample
(:func:`_largest`, narrowed first for a large sample), the cut a segment's top-k starts
from (:func:`_sample_cut`), and a float64 threshold as a value of the data's own dtype
(:func:`_below`, :func:`_above`), so counts against it run in that dtype.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit
from codec.kernels.cpu._common import U, sample_rank


#: a sample's cut keeps up to this many largest values in a small sorted buffer (one
#: comparison per sampled value); a larger rank takes np.partition of the sample
_SMALL_RANK = 64
#: from this many elements a segment's sample holds about 16 n / k values (at most n / 8)
#: instead of 512, so that ~16 of the top k are expected in it: 512 values of a 32,768-element segment at k =
#: 327 hold ~5, and the cut their margin allows (:func:`codec.layout.sample_rank`) left
#: 2,300-3,500 candidates (heavy-tailed data, fresh each call) to compare and partition;
#: this sample leaves ~1,000, and the sample's 8 segments select in 77-87 µs instead of
#: 125-143.  Below it the larger sample costs what the fewer candidates save (small200: the
#: same within noise, 10-15% slower without the threshold).
LARGE_SEGMENT = 1 << 14


@jit
def _sample_cut(x, lo, n, k):
    """A magnitude at or below the k-th largest of ``|x[lo:lo+n]|`` (in float64) that few
    elements reach: the order statistic :func:`codec.layout.sample_rank` picks in a strided
    sample (512 values, or ~16 n / k up to n / 8 from :data:`LARGE_SEGMENT` elements; 0 when the sample
    cannot narrow it), the very value ``np.partition`` of the sample gives (a NaN, which
    makes the segment bad anyway, is skipped)."""
    stride = max(1, n // (512 if n < LARGE_SEGMENT else max(512, min(16 * (n // max(k, 1)), n // 8))))
    m = (n + stride - 1) // stride
    c = sample_rank(k, m, n)
    if c >= m:
        return 0.0
    return _largest(x, lo, stride, m, c)


#: from this many sampled values (and at least 16 per rank) :func:`_largest` first narrows the
#: sample to its candidates: DGC's tensors of 1,000-10,000 elements sample them whole, and
#: their cut took ~19 us a tensor (5,000 values, rank 55) by the sorted buffer, ~15 by
#: np.partition
_NARROW_MIN = 2048
#: ... and from this rank: below it the buffer's few insertions cost less than the narrowing
#: (5,000 values: rank 1 3.5 us by the buffer, ~7 narrowed; rank 25 ~11.5 both ways)
_NARROW_RANK = 25


@jit
def _largest(x, lo, stride, m, c):
    """The ``c``-th largest (``1 <= c <= m``) of ``|x[lo + j * stride]|`` for ``j < m``, in
    float64: the value ``np.partition`` of them gives (for finite values: a NaN, which makes
    a caller's segment bad anyway, is skipped by the narrowing and the buffer).  A large
    sample is narrowed first: a sub-sample of ~512 of its values gives a cut (the order
    statistic :func:`codec.layout.sample_rank` picks) at or below the ``c``-th largest, very
    likely; the values reaching it (branch-free, into a buffer) hold the ``c``-th largest,
    the same value, when there are at least ``c`` of them (else the whole sample is used)."""
    if m >= _NARROW_MIN and _NARROW_RANK <= c and 16 * c <= m:
        step = m // 512
        m2 = (m + step - 1) // step
        c2 = sample_rank(c, m2, m)
        if c2 < m2:
            cut = _largest_of(x, lo, stride * step, m2, c2)
            cand = np.empty(m, np.float64)
            count = 0
            low = _above(x, cut)  # |v| >= cut exactly when |v| >= low, compared in x's dtype
            for j in range(U(m)):
                v = abs(x[U(lo) + j * U(stride)])
                if v >= low:  # rarely taken: well predicted
                    cand[count] = v
                    count += 1
            if count >= c:
                return np.partition(cand[:count], count - c)[count - c]
    return _largest_of(x, lo, stride, m, c)


@jit
def _largest_of(x, lo, stride, m, c):
    """:func:`_largest` over the whole sample: from a small sorted buffer of the largest so far
    (one comparison per value) up to rank ``_SMALL_RANK``, by np.partition above it (a NaN is
    skipped by the buffer)."""
    if c > _SMALL_RANK:  # in x's dtype: the order, and so the value, is the float64 one's
        samp = np.empty(m, x.dtype)
        for j in range(U(m)):
            samp[j] = abs(x[U(lo) + j * U(stride)])
        return np.float64(np.partition(samp, m - c)[m - c])
    top = np.full(c, -1.0)  # the c largest so far, ascending: top[0] is the c-th largest
    for j in range(U(m)):  # unsigned: no wraparound test per read
        a = abs(np.float64(x[U(lo) + j * U(stride)]))
        if a > top[0]:
            t = 0
            while t + 1 < c and top[t + 1] < a:
                top[t] = top[t + 1]
                t += 1
            top[t] = a
    return top[0]



@jit
def _below(x, t):
    """The largest value of ``x``'s dtype at most ``t`` (float64, not NaN): for every ``v`` of
    that dtype, ``v > t`` exactly when ``v > _below(x, t)``, so a count against a float64
    threshold runs in the data's own dtype (float32: twice the vector width, no conversion)."""
    f = x.dtype.type(t)
    if np.float64(f) > t:
        f = np.nextafter(f, x.dtype.type(-np.inf))
    return f


@jit
def _above(x, t):
    """The smallest value of ``x``'s dtype at least ``t`` (float64, not NaN): ``v >= t``
    exactly when ``v >= _above(x, t)`` (see :func:`_below`)."""
    f = x.dtype.type(t)
    if np.float64(f) < t:
        f = np.nextafter(f, x.dtype.type(np.inf))
    return f
