"""PowerSGD's products (Numba CPU) in a summation order fixed by the shapes alone, so a frame
depends on neither the BLAS nor its thread count nor the device (docs/kernels.md).

* ``project``: ``P = M Q`` (``n x m`` times ``m x r``), each ``P[i, c]`` the float64 sum of
  ``M[i, j] * Q[j, c]`` in ``width`` column lanes (lane ``j % width`` takes its terms in
  order, the lanes are added in order, then the tail), as every other lane sum here
  (``_common.chunk_sums``), rounded once to ``P``'s dtype; the same pass counts the
  non-finite entries of ``M``.
* ``back_project``: ``Q = M^T P``, each ``Q[j, c]`` the float64 sum of ``M[i, j] * P[i, c]``
  over ``i`` in order, rounded once to ``Q``'s dtype; one parallel task per block of
  ``COLUMNS`` columns, rows streamed in order (each row of ``M`` is read once).
* ``orthogonalize``: Gram-Schmidt, twice, on a float64 ``P``, every dot product a sum in
  index order (serial: ``P`` is ``n x r``, a few per cent of ``M`` at most).
* ``expand``: the decoder's ``P Q^T`` (``Q`` given transposed), a chain of fused
  multiply-adds per element in ``P``'s dtype (the order OpenBLAS's FMA kernels take, so frames frozen by earlier versions decode
  unchanged).  ``expand_segments``: the same for many matrices in one call (a many-tensor
  decode), each into its own array, one parallel region over every matrix's rows.
* ``power_segments``: ``project``, ``orthogonalize`` and ``back_project`` of many matrices in
  one call (a many-tensor encode), bit for bit the three calls, each product's rows or
  columns of every matrix in runs of about equal work.

Products of float32 values are exact in float64; float64 products are rounded on their own,
never fused with the sum (the CUDA twin writes them with ``_common.mul``).  A matrix is read
once per product: at rank <= 8 both could be memory-bound.  At ranks 1 to
:data:`~codec.kernels.cpu._ranks.RANKS` on
float32 both products keep their sums in vector registers (LLVM intrinsics emitting
``<8 x double>`` multiply-adds of float32 values, exact products, so fused or not
the same bits on every CPU): ``project`` sums
:data:`~codec.kernels.cpu._ranks.ROWS` rows' lanes at once (:func:`~codec.kernels.cpu._ranks.lane_sums`), ``back_project`` a tile of
:data:`TILE` columns down a block of rows (:func:`~codec.kernels.cpu._ranks.back_sums`); the loops' sums went
through memory and ran at a third of memory speed (issue 33, twentieth and twenty-first
stops).  Each row's and column's sums are :mod:`codec.kernels.cpu._products`'s, whatever
piece of the matrix a task gives them.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._common import U, task_span, view_at
from codec.kernels.cpu._expand import EXPAND_ROWS, apply_block, expand_rows
from codec.kernels.cpu._products import back_columns, project_rows
from codec.kernels.cpu._ranks import TILE, widened
from codec.modes import SET

__all__ = ["project", "back_project", "orthogonalize", "expand", "expand_segments", "power_segments"]

#: columns of ``M`` per parallel task of ``back_project`` (its float64 accumulators: ``r x
#: COLUMNS``, in cache), at most; and the fewest tasks a matrix of enough columns is cut into
#: (a narrow one in blocks of COLUMNS would leave a thread idle)
COLUMNS = 1024
MIN_BLOCKS = 4


#: row chunks of ``project``'s parallel loop (each allocates its lane accumulators once)
ROW_CHUNKS = 64


@jit(parallel=True)
def project(m, qt, p, width):
    """``p[i, c] = sum_j m[i, j] * qt[c, j]`` in ``width`` column lanes (see the module);
    ``qt`` is ``Q`` transposed (``r x m``, contiguous).  Returns how many entries of ``m``
    are NaN or infinite."""
    n = m.shape[0]
    r = qt.shape[0]
    nch = min(n, ROW_CHUNKS)
    bad = np.zeros(max(nch, 1), np.int64)
    qw = widened(qt, width)
    for ch in prange(nch):
        lanes = np.empty((r, width))
        bad[ch] = project_rows(m, qt, qw, p, width, ch * n // nch, (ch + 1) * n // nch, lanes)
    return bad.sum()


@jit(parallel=True)
def back_project(m, p, q):
    """``q[j, c] = sum_i m[i, j] * p[i, c]``, the terms in order of ``i`` (see the module)."""
    mm = m.shape[1]
    # at least MIN_BLOCKS blocks where the matrix has the tiles for them (a narrow matrix,
    # ResNet-50's 2048 x 512, in blocks of COLUMNS would run on one thread); the blocks change
    # nothing in the sums
    nblock = max((mm + COLUMNS - 1) // COLUMNS, min(MIN_BLOCKS, mm // TILE))
    width = (mm + nblock - 1) // nblock
    width = (width + TILE - 1) // TILE * TILE
    for ch in prange((mm + width - 1) // width):
        back_columns(m, p, q, ch * width, min(mm, (ch + 1) * width))


@jit
def _dot(p, a, b):
    s = 0.0
    for k in range(p.shape[0]):
        s += p[k, a] * p[k, b]
    return s


@jit
def orthogonalize(p, tiny):
    """Orthonormalise the columns of float64 ``p`` (``n x r``) in place: each column has the
    earlier ones removed twice ("twice is enough"), then is normalised; a column whose norm
    is then 0 or at most ``tiny`` times its norm before becomes zero instead of amplified
    rounding noise."""
    n, r = p.shape
    for i in range(r):
        before = np.sqrt(_dot(p, i, i))
        for _ in range(2):
            for j in range(i):
                d = _dot(p, j, i)
                for k in range(n):
                    p[k, i] -= p[k, j] * d
        norm = np.sqrt(_dot(p, i, i))
        zero = norm == 0 or norm <= tiny * before
        for k in range(n):
            p[k, i] = 0.0 if zero else p[k, i] / norm


def _expand_work(p, qt, out, mode=SET):
    """:func:`expand`'s size for the serial/parallel choice: its output, not ``p``."""
    return out.size


#: blocks of rows a task of :func:`expand` with ``mode`` ADD or SUB writes through its one
#: scratch block
EXPAND_CHUNK = 16


@jit(parallel=True, work=_expand_work)
def expand(p, qt, out, mode=SET):
    """``out (=|+=|-=) P Q^T`` (``mode`` SET, ADD or SUB; ``n x r`` times ``r x m``, ``qt``
    is ``Q`` transposed: ``r x m``, contiguous), each element of ``P Q^T`` the chain of
    fused multiply-adds ``fma(p[i, r-1], q[j, r-1], ... fma(p[i, 1], q[j, 1], p[i, 0] *
    q[j, 0]))`` in ``p``'s dtype: the order a BLAS micro-kernel with FMA instructions
    (OpenBLAS on AVX2 and AVX-512) takes, so frames frozen with ``P @ Q.T`` decode as they
    did, now on any machine and device.  Each block of
    :data:`~codec.kernels.cpu._expand.EXPAND_ROWS` rows is
    :func:`~codec.kernels.cpu._expand.expand_rows`, written into ``out`` (SET) or into a
    scratch block then added to or subtracted from ``out``'s rows (each element rounded
    once more: what adding or subtracting the stored ``P Q^T`` gives, in one pass over
    ``out``: error feedback's ``acc -= decoded``).  Dispatched by ``out``'s size (``p`` has
    only ``n x r`` items)."""
    n, r = p.shape
    m = qt.shape[1]
    q1 = np.ascontiguousarray(qt).reshape(r * m)
    p1 = np.ascontiguousarray(p).reshape(n * r)
    o1 = out.reshape(n * m)
    nblk = (n + EXPAND_ROWS - 1) // EXPAND_ROWS
    if mode == SET:
        for blk in prange(nblk):
            i = blk * EXPAND_ROWS
            expand_rows(p1, i * r, r, min(EXPAND_ROWS, n - i), q1, 0, m, o1, i * m)
        return
    for ch in prange((nblk + EXPAND_CHUNK - 1) // EXPAND_CHUNK):
        block = np.empty(EXPAND_ROWS * m, out.dtype)
        for blk in range(ch * EXPAND_CHUNK, min(nblk, (ch + 1) * EXPAND_CHUNK)):
            i = blk * EXPAND_ROWS
            nb = min(EXPAND_ROWS, n - i)
            expand_rows(p1, i * r, r, nb, q1, 0, m, block, 0)
            apply_block(block, o1, i * m, nb * m, mode)


#: the parallel tasks of :func:`expand_segments` (runs of blocks of equal work)
EXPAND_TASKS = 64


def _segments_work(values, vstarts, ns, ms, *rest):
    """:func:`expand_segments`' size for the serial/parallel choice: the matrices' items (the coefficients alone sent a model of a few large matrices
    to one thread)."""
    return int(ns @ ms)


@jit(parallel=True, work=_segments_work)
def expand_segments(values, vstarts, ns, ms, rs, addrs, like, mode=SET):
    """:func:`expand` of many matrices in one call: matrix ``t`` is ``P`` (``ns[t] x rs[t]``)
    then ``Q`` (``ms[t] x rs[t]``), both row-major, from ``values[vstarts[t]:]`` (a frame's
    coefficients, in the frame's order), and ``P Q^T`` is stored into (``mode`` SET), added
    to (ADD) or subtracted from (SUB) the ``ns[t] x ms[t]`` array of ``like``'s dtype
    (``values``'s) at the address ``addrs[t]`` (the caller keeps it alive): a many-tensor
    decode, or error feedback's ``acc -= decoded``.  Each element is :func:`expand`'s, bit for
    bit.  Every matrix's ``Q`` is first laid out transposed (``r x m``, as :func:`expand`
    takes it), then one parallel region runs over every matrix's blocks of
    :data:`EXPAND_ROWS` rows (dispatched by the outputs' size), each
    :func:`~codec.kernels.cpu._expand.expand_rows` (with ADD or SUB into a scratch block
    first, as :func:`expand`)."""
    count = ns.size
    tstarts = np.zeros(count + 1, np.int64)
    blocks = np.zeros(count + 1, np.int64)
    for t in range(count):
        tstarts[t + 1] = tstarts[t] + ms[t] * rs[t]
        blocks[t + 1] = blocks[t] + (ns[t] + EXPAND_ROWS - 1) // EXPAND_ROWS
    qt = np.empty(tstarts[count], values.dtype)
    for t in prange(count):
        n, m, r = ns[t], ms[t], rs[t]
        q = vstarts[t] + n * r
        for j in range(m):
            for c in range(r):
                qt[tstarts[t] + c * m + j] = values[q + j * r + c]
    # each block's matrix, and the values written before it: the parallel tasks are runs of
    # blocks of equal work (a static split of the blocks by count gave one thread the late
    # layers' wide rows), a block's matrix looked up, not searched for
    nblk = blocks[count]
    owner = np.empty(nblk, np.int32)
    done = np.zeros(nblk + 1, np.int64)
    for t in range(count):
        for blk in range(blocks[t], blocks[t + 1]):
            owner[blk] = t
            done[blk + 1] = done[blk] + min(EXPAND_ROWS, ns[t] - (blk - blocks[t]) * EXPAND_ROWS) * ms[t]
    widest = np.int64(0)
    for t in range(count):
        widest = max(widest, ms[t])
    tasks = min(nblk, EXPAND_TASKS)
    for task in prange(tasks):
        first, last = task_span(done, task, tasks)
        block = np.empty(EXPAND_ROWS * widest if mode != SET else 0, values.dtype)
        for blk in range(first, last):
            t = owner[blk]
            n, m, r = ns[t], ms[t], rs[t]
            i = (blk - blocks[t]) * EXPAND_ROWS
            nb = min(EXPAND_ROWS, n - i)
            out = view_at(like, addrs[t], n * m)
            if mode == SET:
                expand_rows(values, vstarts[t] + i * r, r, nb, qt, tstarts[t], m, out, i * m)
                continue
            expand_rows(values, vstarts[t] + i * r, r, nb, qt, tstarts[t], m, block, 0)
            apply_block(block, out, i * m, nb * m, mode)


def _power_work(values, addrs, like, firsts, ns, ms, *rest):
    """:func:`power_segments`' size for the serial/parallel choice: the matrices' items."""
    return int(ns @ ms)


#: the parallel tasks of each of :func:`power_segments`' products, at most: runs of pieces
#: of about equal work (one task per matrix left a model's few large layers to one thread)
POWER_TASKS = 64
#: the fewest items of a piece of :func:`power_segments` (unless its matrix has fewer): each
#: piece widens its ``Q`` and allocates its sums (pieces of a 64th of the bundled sample's
#: 35,000 values took its replayed encode from 43 to 69 µs)
POWER_PIECE = 1 << 15
#: the fewest columns of a piece of ``Q = M^T P`` (unless the matrix has fewer): a piece reads
#: its columns of every row, and narrower pieces read a tall matrix in short strided stretches
#: (BERT-base's ``encode_many``, pieces of at least 32 / 128 / 256 / 512 / 1024 columns:
#: 69 / 55 / 53 / 50 / 50 ms; ResNet-50's 10-11 ms up to 512, 11-12 at 1024)
BACK_MIN = 512


@jit(parallel=True, work=_power_work)
def power_segments(values, addrs, like, firsts, ns, ms, rs, qts, qstarts, width, tiny):
    """One power iteration of many matrices in one call (a many-tensor encode), bit for bit
    what :func:`project`, :func:`orthogonalize` and :func:`back_project` give each: matrix
    ``t`` is the ``ns[t] x ms[t]`` array of ``like``'s dtype at the address ``addrs[t]`` (the
    caller keeps it alive), its starting ``Q`` transposed (``rs[t] x ms[t]``, orthonormal) is
    ``qts[qstarts[t]:]``, and its ``P = M Q`` (rounded to ``like``'s dtype, then
    orthonormalised in float64 with ``tiny`` as :func:`orthogonalize` takes it, and rounded
    again) then ``Q = M^T P`` go row-major to ``values[firsts[t]:]`` (a frame's coefficients,
    in ``like``'s dtype).  Three parallel loops: every matrix's ``P`` in pieces of rows, each
    ``P`` orthonormalised, every ``Q`` in pieces of columns; each product's pieces are run
    in at most :data:`POWER_TASKS` tasks of about equal work.  A row's or a column's sums are
    the products' own wherever the pieces fall, so nothing depends on them or on the thread
    count.  Dispatched by the matrices' size.  Returns how many entries of the matrices are
    NaN or infinite (a matrix with one is left with its unnormalised ``P`` and no ``Q``: the
    caller discards the frame and raises)."""
    count = ns.size
    total = np.int64(0)
    for t in range(count):
        total += ns[t] * ms[t]
    share = max(np.int64(POWER_PIECE), total // POWER_TASKS)
    # each matrix's pieces of rows (P) and of columns (Q: whole tiles, at most COLUMNS wide)
    rows = np.zeros(count + 1, np.int64)
    cols = np.zeros(count + 1, np.int64)
    span = np.empty(count, np.int64)
    for t in range(count):
        n, m = ns[t], ms[t]
        rows[t + 1] = rows[t] + max(1, min(n, n * m // share))
        w = min(COLUMNS, max(BACK_MIN, share // max(n, 1) // TILE * TILE))
        span[t] = w
        cols[t + 1] = cols[t] + (m + w - 1) // w
    bad = np.zeros(max(rows[count], 1), np.int64)
    owner, done = _pieces(rows, ns, ms, True)
    tasks = min(rows[count], POWER_TASKS)
    for task in prange(tasks):
        _project_pieces(values, addrs, like, firsts, ns, ms, rs, qts, qstarts, width, rows, owner, done, task, tasks, bad)
    broken = np.zeros(max(count, 1), np.int64)
    for t in range(count):
        broken[t] = bad[rows[t] : rows[t + 1]].sum()
    for t in prange(count):
        if broken[t]:
            continue
        n, r = ns[t], rs[t]
        p = values[firsts[t] : firsts[t] + n * r].reshape((n, r))
        wide = np.empty((n, r))
        for i in range(n):
            for c in range(r):
                wide[i, c] = p[i, c]
        orthogonalize(wide, tiny)
        for i in range(n):
            for c in range(r):
                p[i, c] = wide[i, c]
    owner, done = _pieces(cols, ns, span, False)
    tasks = min(cols[count], POWER_TASKS)
    for task in prange(tasks):
        _back_pieces(values, addrs, like, firsts, ns, ms, rs, cols, span, owner, done, task, tasks, broken)
    return broken.sum()


@jit
def _project_pieces(values, addrs, like, firsts, ns, ms, rs, qts, qstarts, width, rows, owner, done, task, tasks, bad):
    """Task ``task`` of :func:`power_segments`' ``P = M Q``: its pieces of rows.  Out of
    line, as the body of every product's parallel loop in this module (``project_rows``,
    ``back_columns``, ``expand_rows``' block writer): a kernel's threaded and serial
    compilations share one compilation of it, and its parallel loop compiles in a fraction
    of the time (docs/kernels.md, "The jit wrappers")."""
    first, last = task_span(done, task, tasks)
    for k in range(first, last):
        t = owner[k]
        n, m, r = ns[t], ms[t], rs[t]
        runs = rows[t + 1] - rows[t]
        j = k - rows[t]
        mat = view_at(like, addrs[t], n * m).reshape((n, m))
        p = values[firsts[t] : firsts[t] + n * r].reshape((n, r))
        qt = qts[qstarts[t] : qstarts[t] + r * m].reshape((r, m))
        lanes = np.empty((r, width))
        bad[k] = project_rows(mat, qt, widened(qt, width), p, width, j * n // runs, (j + 1) * n // runs, lanes)


@jit
def _back_pieces(values, addrs, like, firsts, ns, ms, rs, cols, span, owner, done, task, tasks, broken):
    """Task ``task`` of :func:`power_segments`' ``Q = M^T P``: its pieces of columns."""
    first, last = task_span(done, task, tasks)
    for k in range(first, last):
        t = owner[k]
        if broken[t]:
            continue
        n, m, r = ns[t], ms[t], rs[t]
        lo = (k - cols[t]) * span[t]
        mat = view_at(like, addrs[t], n * m).reshape((n, m))
        p = values[firsts[t] : firsts[t] + n * r].reshape((n, r))
        q = values[firsts[t] + n * r : firsts[t] + (n + m) * r].reshape((m, r))
        back_columns(mat, p, q, lo, min(m, lo + span[t]))


@jit
def _pieces(cuts, ns, ms, by_rows):
    """Each piece's matrix and the work before it (``done``, one more entry than pieces):
    matrix ``t``'s pieces are ``cuts[t]:cuts[t+1]``, of its rows (``by_rows``: each piece
    ``ms[t]`` items a row) or of ``ms[t]`` columns each (``ns[t]`` items a column)."""
    count = ns.size
    npiece = cuts[count]
    owner = np.empty(npiece, np.int64)
    done = np.zeros(npiece + 1, np.int64)
    for t in range(count):
        runs = cuts[t + 1] - cuts[t]
        for k in range(cuts[t], cuts[t + 1]):
            owner[k] = t
            j = k - cuts[t]
            if by_rows:
                work = ((j + 1) * ns[t] // runs - j * ns[t] // runs) * ms[t]
            else:
                work = ns[t] * ms[t]
            done[k + 1] = done[k] + work
    return owner, done
