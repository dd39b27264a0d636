"""Selection kernels (Numba CPU) for the sparsifiers: candidate extraction, AdaComp bins, random-k.

Every kernel walks the flat array in chunks of ``CHUNK`` elements (AdaComp: whole bins) whose
boundaries depend on the array length only, and writes each chunk's finds into that chunk's
own row of a buffer: results never depend on the thread count.  A row holds ``cap``
positions; a chunk that finds more still counts them all, and the caller re-runs the kernel
on just that chunk with a row of the exact size (``chunks=(c, c + 1)``).

One loop forms ``acc = x + residual`` (error feedback), counts the non-finite values
branch-free and records the positions at or above a cut; with a cut near the top-k
threshold the recording branch is almost never taken (so it is well predicted), and the
whole selection costs one pass over memory.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange

CHUNK = 1 << 16


@jit
def _chunk_sums(src, lo, hi):
    """float64 sum and sum of squares of ``src[lo:hi]`` in four interleaved lanes (so the
    additions pipeline), the lanes added in a fixed order."""
    s0 = s1 = s2 = s3 = 0.0
    q0 = q1 = q2 = q3 = 0.0
    m = lo + (hi - lo) // 4 * 4
    for i in range(lo, m, 4):
        v0 = np.float64(src[i])
        v1 = np.float64(src[i + 1])
        v2 = np.float64(src[i + 2])
        v3 = np.float64(src[i + 3])
        s0 += v0
        s1 += v1
        s2 += v2
        s3 += v3
        q0 += v0 * v0
        q1 += v1 * v1
        q2 += v2 * v2
        q3 += v3 * v3
    for i in range(m, hi):
        v0 = np.float64(src[i])
        s0 += v0
        q0 += v0 * v0
    return (s0 + s1) + (s2 + s3), (q0 + q1) + (q2 + q3)


@jit
def _candidates_chunk(x, r, acc, c, cut, buf, row, counts, bad, sums):
    """One chunk: with ``r`` of x's size, form ``acc = x + r`` and select from it in the same
    loop; with an empty ``r``, select from ``x`` (``acc`` is not touched)."""
    n = x.size
    lo = c * CHUNK
    hi = min(n, lo + CHUNK)
    cap = buf.shape[1]
    found = 0
    nbad = 0
    if r.size:
        for i in range(lo, hi):
            v = x[i] + r[i]
            acc[i] = v
            a = abs(v)
            nbad += (a - a) != 0  # inf - inf and NaN - NaN are NaN
            if a >= cut:
                if found < cap:
                    buf[row, found] = i
                found += 1
        if sums.shape[0]:
            sums[c, 0], sums[c, 1] = _chunk_sums(acc, lo, hi)
    else:
        for i in range(lo, hi):
            a = abs(x[i])
            nbad += (a - a) != 0
            if a >= cut:
                if found < cap:
                    buf[row, found] = i
                found += 1
        if sums.shape[0]:
            sums[c, 0], sums[c, 1] = _chunk_sums(x, lo, hi)
    counts[c] = found
    bad[c] = nbad


@jit(parallel=True)
def candidates(x, r, acc, cut, chunks, buf, counts, bad, sums):
    """Positions ``i`` with ``|a_i| >= cut``, chunk by chunk, where ``a = x`` or, when ``r`` is
    not empty, ``a = x + r`` written into ``acc`` in the same pass (error feedback; ``acc``
    may be a 0-size array otherwise).  ``cut`` has the arrays' dtype (the smallest subnormal
    selects the non-zeros).

    For chunks ``chunks[0] <= c < chunks[1]``: row ``c - chunks[0]`` of ``buf`` receives the
    first ``buf.shape[1]`` positions in increasing order, ``counts[c]`` the number found,
    ``bad[c]`` the number of NaN/inf values.  When ``sums`` has rows, ``sums[c]`` gets the
    chunk's float64 sum and sum of squares (re-read from cache; four lanes, fixed order).
    """
    nchunk = chunks[1] - chunks[0]
    for j in prange(nchunk):
        _candidates_chunk(x, r, acc, chunks[0] + j, cut, buf, j, counts, bad, sums)


@jit
def _adacomp_chunk(dw, g, c, length, per_chunk, buf, row, counts, bad, gmax):
    n = dw.size
    lo = c * length * per_chunk
    hi = min(n, lo + length * per_chunk)
    found = 0
    nbad = 0
    cap = buf.shape[1]
    for b in range(lo, hi, length):
        e = min(hi, b + length)
        top = abs(g[b]) * 0  # 0 of g's dtype
        for i in range(b, e):
            a = abs(g[i])
            nbad += (a - a) != 0
            top = a if a > top else top
        gmax[b // length] = top
        if top > 0:
            for i in range(b, e):
                gi = g[i]
                if gi != 0 and abs(gi + dw[i]) >= top:
                    if found < cap:
                        buf[row, found] = i
                    found += 1
    counts[c] = found
    bad[c] = nbad


@jit(parallel=True)
def adacomp_bins(dw, g, length, per_chunk, chunks, buf, counts, bad, gmax):
    """AdaComp's selection over chunks of ``per_chunk`` bins of ``length`` elements.

    Per bin ``b``: ``gmax[b] = max |g|``; position ``i`` is sent when ``g_i != 0`` and
    ``|g_i + dw_i| >= gmax[b]`` (the sum in the arrays' dtype).  Rows of ``buf``, ``counts``
    and ``bad`` as in :func:`candidates`, a chunk being ``per_chunk`` bins.
    """
    nchunk = chunks[1] - chunks[0]
    for j in prange(nchunk):
        _adacomp_chunk(dw, g, chunks[0] + j, length, per_chunk, buf, j, counts, bad, gmax)


@jit(parallel=True)
def feedback_adacomp_bins(dw, r, g, length, per_chunk, chunks, buf, counts, bad, gmax):
    """:func:`adacomp_bins` with ``g = r + dw`` written first, bin by bin, in the same pass."""
    n = dw.size
    nchunk = chunks[1] - chunks[0]
    span = length * per_chunk
    for j in prange(nchunk):
        c = chunks[0] + j
        lo = c * span
        hi = min(n, lo + span)
        for i in range(lo, hi):
            g[i] = r[i] + dw[i]
        _adacomp_chunk(dw, g, c, length, per_chunk, buf, j, counts, bad, gmax)


@jit
def _mix(z):
    """SplitMix64's finaliser (uint64 in, uint64 out)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@jit
def _permute(v, stream, half, mask, n):
    """The 4-round Feistel permutation of ``[0, 2**(2*half))``, cycle-walked into ``[0, n)``."""
    while True:
        left = v >> half
        right = v & mask
        for rnd in range(4):
            f = _mix(stream ^ (np.uint64(rnd) << np.uint64(48)) ^ right) & mask
            left, right = right, left ^ f
        v = (left << half) | right
        if v < n:
            return v


@jit(parallel=True)
def random_positions(out, stream, n):
    """``out[j] = perm(j)``: distinct positions in ``[0, n)`` (n >= 2) drawn by ``stream``."""
    un = np.uint64(n)
    h = 64 - _leading_zeros(np.uint64(n - 1))
    h += h & 1
    h = max(h, 2)
    half = np.uint64(h // 2)
    mask = (np.uint64(1) << half) - np.uint64(1)
    k = out.size
    nchunk = (k + CHUNK - 1) // CHUNK
    for c in prange(nchunk):
        for j in range(c * CHUNK, min(k, (c + 1) * CHUNK)):
            out[j] = np.int64(_permute(np.uint64(j), stream, half, mask, un))


@jit
def _leading_zeros(v):
    count = 0
    bit = np.uint64(1) << np.uint64(63)
    while count < 64 and (v & bit) == np.uint64(0):
        count += 1
        bit >>= np.uint64(1)
    return count
