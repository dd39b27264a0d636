"""AdaComp's selection kernels (Numba CPU): residual binning with localized selection
(docs/codecs.md, "adacomp").

Per bin of ``length`` values: ``gmax = max |g|`` and the positions where ``g != 0`` and
``|g + dw| >= gmax`` (``g = residual + dw`` under error feedback).  ``adacomp_bins`` and
``feedback_adacomp_bins`` walk chunks of whole bins whose boundaries depend on the array
length only, each chunk writing its sends into its own row of a buffer (as the ``select``
family's ``candidates``: a fuller row is run again alone); ``adacomp_segments`` bins a
many-tensor run's tensors, one per task.  Results never depend on the thread count.

``bin_sums`` adds each tensor's bin maxima (its scale's numerator) exactly as
``np.sum(gmax, dtype=np.float64)`` does, so that a device adds them as the host always
has: NumPy's pairwise summation (leaves of ``PW_BLOCK`` values in eight lanes, halves split
at multiples of eight), of the whole array for float64 and, for float32, of each buffer of
``NP_BUFFER`` values that its casting reduction takes, those added in order from 0.  The
recursion runs on a small explicit stack (``_pairwise``), so the CUDA twin compiles the
same source.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._common import U

__all__ = ["adacomp_bins", "adacomp_segments", "bin_sums", "feedback_adacomp_bins"]

#: values NumPy's casting reductions take at a time (its default buffer): ``np.sum`` of a
#: float32 array in float64 adds the pairwise sums of such blocks in order
NP_BUFFER = 8192
#: the stack of :func:`_pairwise`: enough for any array below 2**60 values
STACK = 64


@jit
def _bin_max(g, b, e):
    """max |g[b:e]| (``b < e``) in four independent lanes (a single running max is one long
    dependency chain), in g's dtype; a NaN is skipped unless it comes first (then the max is
    NaN): either way the caller counts it and raises.

    The lanes start at ``|g[b]|``, not at ``abs(...) * 0``: an integer literal made that a
    float64 for float32 data, and every comparison after it, here and in the caller's test
    against the max, ran in float64 at half the vector width."""
    t0 = t1 = t2 = t3 = abs(g[b])
    m = b + (e - b) // 4 * 4
    for i in range(U(b), U(m), U(4)):
        a0 = abs(g[i])
        a1 = abs(g[i + U(1)])
        a2 = abs(g[i + U(2)])
        a3 = abs(g[i + U(3)])
        t0 = a0 if a0 > t0 else t0
        t1 = a1 if a1 > t1 else t1
        t2 = a2 if a2 > t2 else t2
        t3 = a3 if a3 > t3 else t3
    for i in range(U(m), U(e)):
        a0 = abs(g[i])
        t0 = a0 if a0 > t0 else t0
    t0 = t1 if t1 > t0 else t0
    t2 = t3 if t3 > t2 else t2
    return t2 if t2 > t0 else t0


@jit
def _form_bin_max(dw, r, g, b, e):
    """``g[b:e] = r + dw`` and max |g| in the same loop, four lanes (see :func:`_bin_max`)."""
    t0 = t1 = t2 = t3 = abs(r[b] + dw[b])
    m = b + (e - b) // 4 * 4
    for i in range(U(b), U(m), U(4)):
        v0 = r[i] + dw[i]
        v1 = r[i + U(1)] + dw[i + U(1)]
        v2 = r[i + U(2)] + dw[i + U(2)]
        v3 = r[i + U(3)] + dw[i + U(3)]
        g[i] = v0
        g[i + U(1)] = v1
        g[i + U(2)] = v2
        g[i + U(3)] = v3
        a0 = abs(v0)
        a1 = abs(v1)
        a2 = abs(v2)
        a3 = abs(v3)
        t0 = a0 if a0 > t0 else t0
        t1 = a1 if a1 > t1 else t1
        t2 = a2 if a2 > t2 else t2
        t3 = a3 if a3 > t3 else t3
    for i in range(U(m), U(e)):
        v0 = r[i] + dw[i]
        g[i] = v0
        a0 = abs(v0)
        t0 = a0 if a0 > t0 else t0
    t0 = t1 if t1 > t0 else t0
    t2 = t3 if t3 > t2 else t2
    return t2 if t2 > t0 else t0


#: values flagged at once by :func:`_adacomp_bin` (a bin is flagged piece by piece, so the
#: flag buffer stays 4 KiB whatever the bin length)
_FLAGS = 4096


@jit
def _adacomp_bin(dw, g, b, e, length, top, flags, buf, vals, row, found, gmax):
    """Bin ``[b, e)`` whose max |g| is ``top``: its sends into row ``row`` of ``buf`` (positions)
    and ``vals`` (their g); returns (found, non-finite count).

    One loop flags every value with ``not |g + dw| < top`` (at or above the bin's max, or NaN)
    as a byte; it has no branch, so it vectorises.  The flags are then read eight at a time
    as words, and only a non-zero word is looked at value by value: a few sends per bin of
    hundreds cost a few branches instead of one per value (the branchy per-value loop
    measured 4.4 of the 10.9 ms of a 25M error-feedback pass on Student-t(3) data).  Pieces
    of at most ``flags.size`` values are flagged at a time.
    """
    gmax[b // length] = top
    words = flags.view(np.uint64)
    cap = buf.shape[1]
    nbad = 0
    for p in range(b, e, flags.size):
        m = min(e - p, flags.size)
        for j in range(U(m)):
            flags[j] = np.uint8(not abs(g[U(p) + j] + dw[U(p) + j]) < top)
        for j in range(U(m), U(-(-m // 8) * 8)):  # a short piece: the last word's tail
            flags[j] = np.uint8(0)
        for w in range(U(-(-m // 8))):
            if words[w]:
                for j in range(w * U(8), w * U(8) + U(8)):
                    if flags[j]:
                        i = U(p) + j
                        gi = g[i]
                        if gi - gi != 0:
                            nbad += 1
                        elif gi != 0:
                            if found < cap:
                                buf[row, found] = np.int64(i)
                                vals[row, found] = gi
                            found += 1
    return found, nbad


@jit
def _flags(length):
    """The flag bytes of a bin of ``length`` values (at most ``_FLAGS``), whole words of them."""
    return np.zeros(-(-min(length, _FLAGS) // 8) * 8, np.uint8)


@jit(parallel=True)
def adacomp_bins(dw, g, length, per_chunk, chunks, buf, vals, counts, bad, gmax):
    """AdaComp's selection over chunks of ``per_chunk`` bins of ``length`` elements.

    Per bin ``b``: ``gmax[b] = max |g|``; position ``i`` is sent when ``g_i != 0`` and
    ``|g_i + dw_i| >= gmax[b]`` (the sum in the arrays' dtype).  Rows of ``buf`` (positions),
    ``vals`` (their ``g``), ``counts`` and ``bad`` as in :func:`candidates`, a chunk being
    ``per_chunk`` bins.
    """
    n = dw.size
    span = length * per_chunk
    for j in prange(chunks[1] - chunks[0]):
        c = chunks[0] + j
        counts[c], bad[c] = _bins(dw, None, g, c * span, min(n, (c + 1) * span), length, buf, vals, j, gmax)


@jit(parallel=True)
def feedback_adacomp_bins(dw, r, g, length, per_chunk, chunks, buf, vals, counts, bad, gmax):
    """:func:`adacomp_bins` with ``g = r + dw`` written bin by bin in the same pass."""
    n = dw.size
    span = length * per_chunk
    for j in prange(chunks[1] - chunks[0]):
        c = chunks[0] + j
        counts[c], bad[c] = _bins(dw, r, g, c * span, min(n, (c + 1) * span), length, buf, vals, j, gmax)


@jit(inline="always")
def _bins(dw, r, g, lo, hi, length, buf, vals, row, gmax):
    """The bins of ``[lo, hi)`` (whole bins of ``length`` values from ``lo``, the last maybe
    shorter): each one's maximum into ``gmax`` (with ``r``, not None: ``g = r + dw`` formed
    in the same loop) and its sends into row ``row`` of ``buf`` and ``vals``; returns ``(found,
    non-finite count)``.  Inlined in Numba's IR, as the kernels' loops were."""
    flags = _flags(length)
    found = nbad = 0
    for b in range(lo, hi, length):
        e = min(hi, b + length)
        if r is not None:
            top = _form_bin_max(dw, r, g, b, e)
        else:
            top = _bin_max(g, b, e)
        found, nb = _adacomp_bin(dw, g, b, e, length, top, flags, buf, vals, row, found, gmax)
        nbad += nb
    return found, nbad


@jit(parallel=True)
def adacomp_segments(dw, g, starts, lengths, bstarts, pos, vals, counts, bad, gmax):
    """:func:`adacomp_bins` of many small tensors at once: segment ``s`` is
    ``g[starts[s]:starts[s+1]]`` (and its gradient the same slice of ``dw``: ``g = dw``
    without error feedback, ``g = r + dw`` formed by the caller under it) in bins of
    ``lengths[s]`` values, its bins' maxima go to ``gmax[bstarts[s]:bstarts[s+1]]``, its
    sends' positions (from the segment's start) and values to ``pos`` and ``vals`` from
    ``starts[s]`` (room for every value), their number to ``counts[s]`` and its NaN/inf count
    to ``bad[s]``; each exactly as the tensor alone."""
    for s in prange(starts.size - 1):
        lo = starts[s]
        n = starts[s + 1] - lo
        gs = g[lo : lo + n]
        gm = gmax[bstarts[s] : bstarts[s + 1]]
        counts[s], bad[s] = _bins(dw[lo : lo + n], None, gs, 0, n, lengths[s], pos[lo : lo + n].reshape((1, n)), vals[lo : lo + n].reshape((1, n)), 0, gm)


@jit
def _leaf(a, lo, n):
    """NumPy's pairwise sum of ``float64(a[lo:lo+n])`` for ``n <= 128`` (its ``PW_BLOCK``): a
    plain sum below 8 values, else eight lanes combined as ((0+1)+(2+3))+((4+5)+(6+7)), then the
    rest in order."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += np.float64(a[lo + i])
        return res
    r0, r1, r2, r3 = np.float64(a[lo]), np.float64(a[lo + 1]), np.float64(a[lo + 2]), np.float64(a[lo + 3])
    r4, r5, r6, r7 = np.float64(a[lo + 4]), np.float64(a[lo + 5]), np.float64(a[lo + 6]), np.float64(a[lo + 7])
    i = 8
    whole = n - n % 8
    while i < whole:
        r0 += np.float64(a[lo + i])
        r1 += np.float64(a[lo + i + 1])
        r2 += np.float64(a[lo + i + 2])
        r3 += np.float64(a[lo + i + 3])
        r4 += np.float64(a[lo + i + 4])
        r5 += np.float64(a[lo + i + 5])
        r6 += np.float64(a[lo + i + 6])
        r7 += np.float64(a[lo + i + 7])
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += np.float64(a[lo + i])
        i += 1
    return res


@jit
def _pairwise(a, lo, n, los, ns, stage, vals):
    """NumPy's pairwise sum of ``float64(a[lo:lo+n])``: up to 128 values a leaf (:func:`_leaf`),
    else the sum of the halves split at ``h = n // 2 - (n // 2) % 8``.  Its recursion walked on
    the stack ``los``, ``ns``, ``stage`` (``STACK`` entries each; the node's start, length and
    how many halves are done) with the partial sums on ``vals``."""
    los[0], ns[0], stage[0] = lo, n, 0
    top = 1
    held = 0
    while top > 0:
        at, m, st = los[top - 1], ns[top - 1], stage[top - 1]
        if m <= 128:
            top -= 1
            vals[held] = _leaf(a, at, m)
            held += 1
        elif st < 2:
            stage[top - 1] = st + 1
            h = m // 2
            h -= h % 8
            los[top], ns[top], stage[top] = (at, h, 0) if st == 0 else (at + h, m - h, 0)
            top += 1
        else:
            top -= 1
            held -= 1
            vals[held - 1] = vals[held - 1] + vals[held]
    return vals[0]


@jit(parallel=True)
def _bin_sums(gmax, bstarts, block, out):
    for t in prange(out.size):
        los, ns, stage = np.empty(STACK, np.int64), np.empty(STACK, np.int64), np.empty(STACK, np.int64)
        vals = np.empty(STACK, np.float64)
        lo, hi = bstarts[t], bstarts[t + 1]
        acc = 0.0
        for b in range(lo, hi, block):
            acc += _pairwise(gmax, b, min(block, hi - b), los, ns, stage, vals)
        out[t] = acc


def _sum_block(dtype) -> int:
    """The values :func:`bin_sums` sums pairwise at a time: ``NP_BUFFER`` for float32, all of
    them (one block) for float64."""
    return NP_BUFFER if np.dtype(dtype) == np.float32 else 1 << 62


def bin_sums(gmax, bstarts, out):
    """``out[t] = np.sum(gmax[bstarts[t]:bstarts[t+1]], dtype=np.float64)``, bit for bit, for
    every tensor ``t`` of a run (float32 or float64 ``gmax``; one tensor: ``bstarts = [0,
    nbins]``).  ``out`` is float64, a value per tensor."""
    if out.size:
        _bin_sums(gmax, bstarts, _sum_block(gmax.dtype), out)
