"""CUDA twin of ``codec/kernels/cpu/select.py`` for one tensor: ``candidates``,
``line_sample``, ``strided_sample`` and ``gather_rows``, with the CPU file's arguments and
results (the segmented many-tensor kernels come with the device ``encode_many``).

``candidates`` runs one block per chunk of ``CHUNK`` values, the chunk the CPU kernel gives
one thread: the block walks the chunk a stretch of ``THREADS * ITEMS`` values at a time,
each thread counting the finds in its run of ``ITEMS`` consecutive values (forming ``acc =
x + r`` first under error feedback), a block-wide exclusive scan of the counts
(``_common.block_scan``) giving each run its place in the chunk's row, and each thread
writing its finds there, in increasing position: stream compaction in index order, so the row, its
count and the chunk's non-finite count are the CPU's exactly.  The chunk's sums (gaussian-k's
moments) run as a second launch, one block per chunk and one thread per column lane, each
lane summing its rows in order as ``chunk_sums`` does, then lane 0 adding the lanes and the
tail in the CPU's order; the squares are rounded on their own (``_common.mul``).

``CHUNK`` is read when a call is made (a kernel argument), so the tests run several chunks
on the simulator's small sizes by setting this module's ``CHUNK``.
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import jit, numba_cuda
from codec.kernels.cuda import _common
from codec.kernels.cuda._common import THREADS, block_scan, compactor, launch, mul
from codec.layout import CHUNK

cuda = numba_cuda()

__all__ = ["candidates", "gather_rows", "line_sample", "strided_sample", "topk_segments"]

#: the most column lanes ``chunk_sums`` may use (shared memory per block)
MAX_WIDTH = 1024
#: consecutive values one thread of a ``candidates`` block tests per stretch (one 64-byte
#: line of float32): a stretch of ``THREADS * ITEMS`` values takes one block-wide scan
ITEMS = 16
#: threads of a ``candidates`` block, at most ``THREADS``; read when a call is made, like
#: ``CHUNK`` and ``ITEMS`` (the simulator tests take fewer: it runs each thread as a Python
#: thread, and a block-wide scan's barriers cost it about 0.1 ms per thread)
BLOCK = THREADS


@jit(device=True)
def _find(p, i, first):
    """The candidates' test of value ``i`` (``_common.compactor``): ``not |a| < cut`` for
    ``a = x + r`` (formed into ``acc`` on the first pass) or ``x``: 1, or 2 when ``a`` is
    NaN or inf."""
    x, r, acc, cut = p
    if r.size == 0:
        v = x[i]
    elif first:
        v = x[i] + r[i]
        acc[i] = v
    else:
        v = acc[i]
    a = abs(v)
    if not a < cut:  # at/above the cut, or NaN
        return (2 if a - a != 0 else 1), v
    return 0, v


_compact = compactor(_find)


@jit
def _candidates(x, r, acc, cut, c0, chunk, items, buf, vals, cap, counts, bad):  # (buf, vals: flat views of the rows)
    c = c0 + cuda.blockIdx.x
    lo = c * chunk
    tmp = cuda.shared.array(THREADS, np.int64)
    found, nbad = _compact((x, r, acc, cut), lo, min(x.size, lo + chunk), items, cuda.blockIdx.x * cap, cap, 0, buf, vals, tmp)
    if cuda.threadIdx.x == 0:
        counts[c] = found
        bad[c] = nbad


@jit
def _chunk_sums(src, c0, chunk, shift, sums):
    c = c0 + cuda.blockIdx.x
    col = cuda.threadIdx.x
    width = cuda.blockDim.x
    lo = c * chunk
    hi = min(src.size, lo + chunk)
    rows = (hi - lo) // width
    cs = cuda.shared.array(MAX_WIDTH, np.float64)
    cq = cuda.shared.array(MAX_WIDTH, np.float64)
    s = 0.0
    q = 0.0
    for k in range(rows):
        v = np.float64(src[lo + k * width + col]) - shift
        s += v
        q += mul(v, v)
    cs[col] = s
    cq[col] = q
    cuda.syncthreads()
    if col == 0:
        s = 0.0
        q = 0.0
        for j in range(width):
            s += cs[j]
            q += cq[j]
        for i in range(lo + rows * width, hi):
            v = np.float64(src[i]) - shift
            s += v
            q += mul(v, v)
        sums[c, 0] = s
        sums[c, 1] = q


def candidates(x, r, acc, cut, chunks, buf, vals, counts, bad, sums, shift, width):
    """The CPU kernel's ``candidates`` (its docstring has the contract); ``chunks`` is a host
    array, the other arrays device arrays."""
    c0, c1 = int(chunks[0]), int(chunks[1])
    if c1 <= c0:
        return
    if not 0 < width <= MAX_WIDTH:
        raise ValueError(f"width: expected 1..{MAX_WIDTH} lanes, got {width}")
    _candidates[c1 - c0, BLOCK](x, r, acc, cut, c0, CHUNK, ITEMS, buf.reshape(buf.size), vals.reshape(vals.size), buf.shape[1], counts, bad)
    if sums.shape[0]:
        _chunk_sums[c1 - c0, int(width)](acc if r.size else x, c0, CHUNK, np.float64(shift), sums)


@jit
def _line_sample(x, r, step, out):
    line = out.shape[1]
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        at = (k // line) * step + k % line
        if r.size:
            out[k // line, k % line] = abs(np.float64(x[at] + r[at]))
        else:
            out[k // line, k % line] = abs(np.float64(x[at]))


def line_sample(x, r, step, out):
    """The CPU kernel's ``line_sample``: ``out[q, j] = |x + r|`` at ``q * step + j``, float64."""
    if out.size:
        _line_sample[launch(out.size)](x, r, step, out)


@jit
def _strided_sample(x, r, stride, out):
    for q in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        at = q * stride
        if r.size:
            out[q] = np.float64(x[at] + r[at])
        else:
            out[q] = np.float64(x[at])


def strided_sample(x, r, stride, out):
    """The CPU kernel's ``strided_sample``: ``out[q] = x + r`` at ``q * stride``, float64."""
    if out.size:
        _strided_sample[launch(out.size)](x, r, stride, out)


@jit
def _gather_rows(buf, vals, counts, starts, out, vout):
    c = cuda.blockIdx.x
    m = counts[c]
    s = starts[c]
    for j in range(cuda.threadIdx.x, m, cuda.blockDim.x):
        out[s + j] = buf[c, j]
        if vout.size:
            vout[s + j] = vals[c, j]


def gather_rows(buf, vals, counts, starts, out, vout):
    """The CPU kernel's ``gather_rows``: row ``c``'s first ``counts[c]`` entries at ``starts[c]``."""
    if buf.shape[0]:
        _gather_rows[buf.shape[0], _common.THREADS](buf, vals, counts, starts, out, vout)


@jit(device=True)
def _key(v):
    """The bits of ``|v|`` in float64 (exact for float32 too) as an unsigned integer: ordered
    as the magnitudes are (for finite values), equal exactly when they are (-0 and +0 alike),
    so the selection compares in float64 as the CPU kernel does."""
    return np.float64(abs(v)).view(np.uint64)


@jit(device=True)
def _kth_key(x, lo, hi, k, hist, pick):
    """The key (:func:`_key`) of the ``k``-th largest magnitude of ``x[lo:hi]`` (``1 <= k <=
    hi - lo``) and how many values equal to it are among the ``k`` largest: a radix select,
    eight bits a pass from the top, each pass a histogram in shared ``hist`` (256 counts) of
    the values whose higher bits match the digits chosen so far, thread 0 choosing the next
    digit into shared ``pick`` (two int64).  Every thread of the block calls it and gets the answer."""
    t = cuda.threadIdx.x
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
        for i in range(lo + t, hi, cuda.blockDim.x):
            key = _key(x[i])
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


@jit
def _topk_segments(x, starts, ks, out_starts, out, bad, items):
    s = cuda.blockIdx.x
    t = cuda.threadIdx.x
    lo = starts[s]
    hi = starts[s + 1]
    k = ks[s]
    o = out_starts[s]
    tmp = cuda.shared.array(THREADS, np.int64)
    hist = cuda.shared.array(256, np.int64)
    pick = cuda.shared.array(2, np.int64)
    nbad = 0
    for i in range(lo + t, hi, cuda.blockDim.x):
        v = x[i]
        nbad += v - v != 0
    _, nbad = block_scan(nbad, tmp)
    if nbad:  # (the same for every thread: they all leave)
        if t == 0:
            bad[s] = 1
        return
    if k >= hi - lo or k == 0:
        for j in range(t, k, cuda.blockDim.x):
            out[o + j] = j
        return
    kth, ties = _kth_key(x, lo, hi, k, hist, pick)
    # the values above the k-th, and the first ``ties`` equal to it: two scans a stretch, one
    # for the (above, equal) counts, one for each thread's kept count given the equal ones before it
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


def topk_segments(x, starts, ks, out_starts, out, bad):
    """The CPU kernel's ``topk_segments`` (its docstring has the contract): one block per
    segment, its k-th magnitude by a radix select (:func:`_kth_key`), its positions by
    stream compaction in index order; every array a device array."""
    if starts.size > 1:
        _topk_segments[starts.size - 1, BLOCK](x, starts, ks, out_starts, out, bad, ITEMS)
