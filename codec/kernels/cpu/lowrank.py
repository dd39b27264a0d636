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
  one call (a many-tensor encode), each matrix on one thread, bit for bit the three calls.

Products of float32 values are exact in float64; float64 products are rounded on their own,
never fused with the sum (the CUDA twin writes them with ``_common.mul``).  A matrix is read
once per product: at rank <= 8 both could be memory-bound.  At rank 4 (:data:`RANK4`) on
float32 both products keep their sums in vector registers (LLVM intrinsics emitting
``<8 x double>`` ``fmul`` and ``fadd``, so on every CPU the same bits): ``project`` sums
:data:`ROWS4` rows' lanes at once (:func:`_lane_sums4`), ``back_project`` a tile of
:data:`TILE4` columns down a block of rows (:func:`_back_sums4`); the loops' sums went
through memory and ran at a third of memory speed (issue 33, twentieth stop).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from codec._jit import jit, prange
from codec.kernels.cpu._common import U, fma, view_at
from codec.layout import LANES

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
    qw = _widened(qt, width)
    for ch in prange(nch):
        lanes = np.empty((r, width))
        bad[ch] = _project_rows(m, qt, qw, p, width, ch * n // nch, (ch + 1) * n // nch, lanes)
    return bad.sum()


@jit(inline="always")
def _widened(qt, width):
    """``qt`` in float64 when :func:`_project_rows` takes its rank-4 lane sums (rank
    :data:`RANK4`, :data:`codec.layout.LANES` lanes, a row of at least one block), else an
    empty array: converted once per matrix, not per chunk of rows."""
    r, mm = qt.shape
    four = r == RANK4 and width == LANES and mm >= width
    qw = np.empty((r if four else 0, mm if four else 0))
    if four:
        for c in range(r):
            for j in range(mm):
                qw[c, j] = np.float64(qt[c, j])
    return qw


@jit(inline="always")
def _project_rows(m, qt, qw, p, width, lo, hi, lanes):
    """Rows ``lo:hi`` of :func:`project` (``lanes``: an ``r x width`` float64 scratch);
    returns how many of their entries are NaN or infinite.  With ``qw`` (``qt`` in float64:
    :func:`_widened`, at rank :data:`RANK4` with :data:`codec.layout.LANES` lanes), each
    row's lane sums are :func:`_lane_sums4`'s; else the loop below (the same sums, term for
    term)."""
    mm = m.shape[1]
    r = qt.shape[0]
    rows = mm // width
    k = np.int64(0)
    four = qw.shape[0] == RANK4
    block = np.empty((ROWS4 * RANK4 if four else 0, LANES))
    for i in range(lo, hi):
        if four:
            b = (i - lo) % ROWS4
            if b == 0:  # the lane sums of this row and the next ROWS4 - 1 at once
                k += _lane_sums4(m, i, min(ROWS4, hi - i), qw, block)
            # the four ranks' sums side by side (four chains of additions, each in its order:
            # one after another they cost a row of 64 columns more than its products)
            o = b * RANK4
            s0, s1, s2, s3 = 0.0, 0.0, 0.0, 0.0
            for col in range(width):
                s0 += block[o, col]
                s1 += block[o + 1, col]
                s2 += block[o + 2, col]
                s3 += block[o + 3, col]
            for j in range(U(rows * width), U(mm)):
                v = np.float64(m[i, j])
                k += np.int64(not (v - v == 0))
                s0 += v * qw[0, j]
                s1 += v * qw[1, j]
                s2 += v * qw[2, j]
                s3 += v * qw[3, j]
            p[i, 0] = s0
            p[i, 1] = s1
            p[i, 2] = s2
            p[i, 3] = s3
            continue
        lanes[:] = 0.0
        for t in range(U(rows)):
            base = t * U(width)
            for col in range(U(width)):
                v = np.float64(m[i, base + col])
                k += np.int64(not (v - v == 0))
            for c in range(r):
                for col in range(U(width)):
                    lanes[c, col] += np.float64(m[i, base + col]) * np.float64(qt[c, base + col])
        for j in range(U(rows * width), U(mm)):
            v = np.float64(m[i, j])
            k += np.int64(not (v - v == 0))
        for c in range(r):
            s = 0.0
            for col in range(width):
                s += lanes[c, col]
            for j in range(U(rows * width), U(mm)):
                s += np.float64(m[i, j]) * np.float64(qt[c, j])
            p[i, c] = s
    return k


#: the rank whose lane sums :func:`_lane_sums4` forms in registers (PowerSGD's usual rank,
#: and the rank of ``powerSGD_hook``'s default comparison)
RANK4 = 4


def _lane_sums4(m, i, nrows, qw, block):
    """``block[4 b + c, l] = sum_t m[i + b, 64 t + l] * qw[c, 64 t + l]`` (float64, terms in
    order of ``t``, from 0.0) for the ``nrows`` (1 to :data:`ROWS4`) rows ``i + b``, ranks
    ``c < 4`` and the 64 lanes ``l``, over the rows' whole blocks of 64; returns how many of
    those entries of ``m`` are NaN or infinite.  :func:`_project_rows`'s lane loop at rank 4
    for a few rows at once, the same sums term for term."""


@overload(_lane_sums4, jit_options={"cache": True})
def _lane_sums4_impl(m, i, nrows, qw, block):
    if m.dtype == types.float32 and m.layout == "C" and qw.layout == "C" and block.layout == "C":
        return lambda m, i, nrows, qw, block: _lane_sums4_vectors(m, i, nrows, qw, block)

    def loop(m, i, nrows, qw, block):
        mm = m.shape[1]
        k = np.int64(0)
        block[:] = 0.0
        for b in range(nrows):
            for t in range(U(mm // LANES)):
                base = t * U(LANES)
                for col in range(U(LANES)):
                    v = np.float64(m[i + b, base + col])
                    k += np.int64(not (v - v == 0))
                for c in range(RANK4):
                    for col in range(U(LANES)):
                        block[b * RANK4 + c, col] += np.float64(m[i + b, base + col]) * qw[c, base + col]
        return k

    return loop


#: values per vector of :func:`_lane_sums4_vectors` (its 64 lanes are 8 such groups), and the
#: rows it sums at once (each value of ``Q`` loaded once for all of them)
_GROUP = 8
ROWS4 = 4


@intrinsic
def _lane_sums4_vectors(typingctx, m, i, nrows, qw, block):
    """:func:`_lane_sums4` for a C-contiguous float32 ``m``: each group of 8 lanes summed over
    the rows' blocks with the :data:`ROWS4` rows' 4 ranks' sums in vector registers (``<8 x
    double>``: one AVX-512 register or two AVX2 ones; a ``fmul`` then a ``fadd``, never
    fused), so a value of ``m`` is loaded and converted once, one of ``Q`` once for all the
    rows, and no sum goes through memory (the loop's 64 x 4 sums in memory, a row at a time,
    ran at a third of memory speed: ResNet-50's matrices, one thread, 25.7 ms for 102 MB
    against 6.0 to read them).  Rows past ``nrows`` repeat row ``i`` and are neither counted
    nor meant to be read from ``block``."""
    if not (isinstance(m, types.Array) and m.ndim == 2 and m.dtype == types.float32 and isinstance(i, types.Integer) and isinstance(nrows, types.Integer)):
        return None
    if not all(isinstance(a, types.Array) and a.ndim == 2 and a.dtype == types.float64 for a in (qw, block)):
        return None

    def codegen(context, builder, sig, args):
        i64, f64 = ir.IntType(64), ir.DoubleType()
        v8f, v8d, v8i = ir.VectorType(ir.FloatType(), _GROUP), ir.VectorType(f64, _GROUP), ir.VectorType(ir.IntType(32), _GROUP)
        mat = context.make_array(sig.args[0])(context, builder, args[0])
        qa = context.make_array(sig.args[3])(context, builder, args[3])
        out = context.make_array(sig.args[4])(context, builder, args[4])
        mm = builder.extract_value(mat.shape, 1)
        first = context.cast(builder, args[1], sig.args[1], types.intp)
        nrows = context.cast(builder, args[2], sig.args[2], types.intp)
        rows, counted = [], []
        for b in range(ROWS4):
            real = builder.icmp_signed("<", ir.Constant(i64, b), nrows)
            at = builder.select(real, builder.add(first, ir.Constant(i64, b)), first)
            rows.append(builder.gep(mat.data, [builder.mul(at, mm)]))
            counted.append(builder.zext(real, i64))
        blocks = builder.udiv(mm, ir.Constant(i64, LANES))
        exp = ir.Constant(v8i, [0x7F800000] * _GROUP)
        # each row's non-finite entries counted per lane in a vector (a scalar count through
        # memory chained every block of every row), added up at the end
        counts = [cgutils.alloca_once_value(builder, ir.Constant(v8i, [0] * _GROUP)) for _ in range(ROWS4)]
        sums = [[cgutils.alloca_once(builder, v8d) for _ in range(RANK4)] for _ in range(ROWS4)]
        zero = ir.Constant(v8d, [0.0] * _GROUP)
        for g in range(LANES // _GROUP):
            for row in sums:
                for slot in row:
                    builder.store(zero, slot)
            with cgutils.for_range(builder, blocks) as loop:
                at = builder.add(builder.mul(loop.index, ir.Constant(i64, LANES)), ir.Constant(i64, g * _GROUP))
                qs = [builder.load(builder.bitcast(builder.gep(qa.data, [builder.add(builder.mul(ir.Constant(i64, c), mm), at)]), v8d.as_pointer()), align=8) for c in range(RANK4)]
                for b in range(ROWS4):
                    raw = builder.load(builder.bitcast(builder.gep(rows[b], [at]), v8f.as_pointer()), align=4)
                    special = builder.icmp_unsigned("==", builder.and_(builder.bitcast(raw, v8i), exp), exp)
                    builder.store(builder.add(builder.load(counts[b]), builder.zext(special, v8i)), counts[b])
                    v = builder.fpext(raw, v8d)
                    for c in range(RANK4):
                        builder.store(builder.fadd(builder.load(sums[b][c]), builder.fmul(v, qs[c])), sums[b][c])
            for b in range(ROWS4):
                for c in range(RANK4):
                    ptr = builder.gep(out.data, [ir.Constant(i64, (b * RANK4 + c) * LANES + g * _GROUP)])
                    builder.store(builder.load(sums[b][c]), builder.bitcast(ptr, v8d.as_pointer()), align=8)
        total = ir.Constant(i64, 0)
        for b in range(ROWS4):
            lanes = builder.load(counts[b])
            row = ir.Constant(i64, 0)
            for l in range(_GROUP):
                row = builder.add(row, builder.zext(builder.extract_element(lanes, ir.Constant(ir.IntType(32), l)), i64))
            total = builder.add(total, builder.mul(row, counted[b]))
        return total

    return types.int64(m, i, nrows, qw, block), codegen


@jit(parallel=True)
def back_project(m, p, q):
    """``q[j, c] = sum_i m[i, j] * p[i, c]``, the terms in order of ``i`` (see the module)."""
    mm = m.shape[1]
    # at least MIN_BLOCKS blocks where the matrix has the tiles for them (a narrow matrix,
    # ResNet-50's 2048 x 512, in blocks of COLUMNS would run on one thread); the blocks change
    # nothing in the sums
    nblock = max((mm + COLUMNS - 1) // COLUMNS, min(MIN_BLOCKS, mm // TILE4))
    width = (mm + nblock - 1) // nblock
    width = (width + TILE4 - 1) // TILE4 * TILE4
    for ch in prange((mm + width - 1) // width):
        _back_project_columns(m, p, q, ch * width, min(mm, (ch + 1) * width))


@jit(inline="always")
def _back_project_columns(m, p, q, lo, hi):
    """Columns ``lo:hi`` of :func:`back_project` (their float64 sums in cache).  At rank
    :data:`RANK4`, each whole tile of :data:`TILE4` columns is :func:`_back_sums4`'s; the
    rest the loop below (the same sums, term for term)."""
    n = m.shape[0]
    r = p.shape[1]
    if r == RANK4 and n > 0 and hi - lo >= TILE4:
        # the tiles' sums kept across blocks of ROW_BLOCK rows, so a block's rows stay in
        # cache while every tile reads them
        ntile = (hi - lo) // TILE4
        tiles = np.zeros((ntile, RANK4, TILE4))
        for i0 in range(0, n, ROW_BLOCK):
            for t in range(ntile):
                _back_sums4(m, p, lo + t * TILE4, i0, min(n, i0 + ROW_BLOCK), tiles[t])
        for t in range(ntile):
            for j in range(TILE4):
                for c in range(RANK4):
                    q[lo + t * TILE4 + j, c] = tiles[t, c, j]
        lo += ntile * TILE4
    acc = np.zeros((r, hi - lo))
    for i in range(n):
        for c in range(r):
            pc = np.float64(p[i, c])
            for j in range(U(lo), U(hi)):
                acc[c, j - U(lo)] += np.float64(m[i, j]) * pc
    for j in range(lo, hi):
        for c in range(r):
            q[j, c] = acc[c, j - lo]


#: columns of ``M`` a tile of :func:`_back_sums4` sums at once (4 groups of 8: two cache
#: lines of a float32 row), and the rows it sums per call: a block's rows (32 x 4 KB) stay in
#: cache while its tiles read them (ResNet-50's matrices, one thread: 64-row blocks of 128
#: columns 22.5 ms, 32 rows of 1024 columns 8.7, the loop before 18.5)
TILE4 = 32
ROW_BLOCK = 32


def _back_sums4(m, p, lo, i0, i1, tile):
    """``tile[c, j] += sum_i m[i, lo + j] * p[i, c]`` (float64, terms in order of ``i`` from
    ``i0`` to ``i1``, added to the tile's sums so far) for ``c < 4`` and the :data:`TILE4`
    columns from ``lo``: :func:`_back_project_columns`'s sums at rank 4 for one tile and a
    block of rows."""


@overload(_back_sums4, jit_options={"cache": True})
def _back_sums4_impl(m, p, lo, i0, i1, tile):
    if m.dtype == types.float32 and p.dtype == types.float32 and m.layout == "C" and p.layout == "C" and tile.layout == "C":
        return lambda m, p, lo, i0, i1, tile: _back_sums4_vectors(m, p, lo, i0, i1, tile)

    def loop(m, p, lo, i0, i1, tile):
        for i in range(i0, i1):
            for c in range(RANK4):
                pc = np.float64(p[i, c])
                for j in range(TILE4):
                    tile[c, j] += np.float64(m[i, lo + j]) * pc

    return loop


@intrinsic
def _back_sums4_vectors(typingctx, m, p, lo, i0, i1, tile):
    """:func:`_back_sums4` for C-contiguous float32 ``m`` and ``p``: the tile's 4 groups of 8
    columns times 4 ranks summed down the rows in 16 vector registers (``<8 x double>``,
    loaded from ``tile`` and stored back; each ``P[i, c]`` broadcast, a ``fmul`` then a
    ``fadd``, never fused), so each value of ``M`` is loaded and converted once and no sum
    goes through memory row by row."""
    if not all(isinstance(a, types.Array) and a.ndim == 2 and a.dtype == types.float32 for a in (m, p)) or not all(isinstance(a, types.Integer) for a in (lo, i0, i1)):
        return None
    if not (isinstance(tile, types.Array) and tile.ndim == 2 and tile.dtype == types.float64):
        return None
    groups = TILE4 // _GROUP

    def codegen(context, builder, sig, args):
        i32, i64, f64 = ir.IntType(32), ir.IntType(64), ir.DoubleType()
        v8f, v8d = ir.VectorType(ir.FloatType(), _GROUP), ir.VectorType(f64, _GROUP)
        mat = context.make_array(sig.args[0])(context, builder, args[0])
        pa = context.make_array(sig.args[1])(context, builder, args[1])
        out = context.make_array(sig.args[5])(context, builder, args[5])
        mm = builder.extract_value(mat.shape, 1)
        start, first, last = (context.cast(builder, args[k], sig.args[k], types.intp) for k in (2, 3, 4))
        spots = [[builder.bitcast(builder.gep(out.data, [ir.Constant(i64, c * TILE4 + g * _GROUP)]), v8d.as_pointer()) for c in range(RANK4)] for g in range(groups)]
        sums = [[cgutils.alloca_once(builder, v8d) for _ in range(RANK4)] for _ in range(groups)]
        for g in range(groups):
            for c in range(RANK4):
                builder.store(builder.load(spots[g][c], align=8), sums[g][c])
        with cgutils.for_range(builder, builder.sub(last, first)) as loop:
            i = builder.add(first, loop.index)
            row = builder.gep(mat.data, [builder.add(builder.mul(i, mm), start)])
            prow = builder.gep(pa.data, [builder.mul(i, ir.Constant(i64, RANK4))])
            pcs = []
            for c in range(RANK4):
                pc = builder.fpext(builder.load(builder.gep(prow, [ir.Constant(i64, c)])), f64)
                one = builder.insert_element(ir.Constant(v8d, None), pc, ir.Constant(i32, 0))
                pcs.append(builder.shuffle_vector(one, ir.Constant(v8d, None), ir.Constant(ir.VectorType(i32, _GROUP), [0] * _GROUP)))
            for g in range(groups):
                v = builder.fpext(builder.load(builder.bitcast(builder.gep(row, [ir.Constant(i64, g * _GROUP)]), v8f.as_pointer()), align=4), v8d)
                for c in range(RANK4):
                    builder.store(builder.fadd(builder.load(sums[g][c]), builder.fmul(v, pcs[c])), sums[g][c])
        for g in range(groups):
            for c in range(RANK4):
                builder.store(builder.load(sums[g][c]), spots[g][c], align=8)
        return context.get_dummy_value()

    return types.none(m, p, lo, i0, i1, tile), codegen


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


@jit(parallel=True)
def expand(p, qt, out):
    """``out = P Q^T`` (``n x r`` times ``r x m``, ``qt`` is ``Q`` transposed: ``r x m``,
    contiguous), each element the chain of fused multiply-adds ``fma(p[i, r-1], q[j, r-1],
    ... fma(p[i, 1], q[j, 1], p[i, 0] * q[j, 0]))`` in ``p``'s dtype: the order a BLAS
    micro-kernel with FMA instructions (OpenBLAS on AVX2 and AVX-512) takes, so frames frozen
    with ``P @ Q.T`` decode as they did, now on any machine and device.  Each row is
    :func:`_expand_row`."""
    n, r = p.shape
    m = qt.shape[1]
    q1 = np.ascontiguousarray(qt).reshape(r * m)
    for i in prange(n):
        _expand_row(p[i], 0, r, q1, 0, m, out[i])


#: ranks a pass of :func:`_expand_row` takes at once (one fused chain per element)
EXPAND_RANKS = 4


@jit(inline="always")
def _expand_row(coef, p, r, qt, q, m, row):
    """``row[j] = sum_c coef[p + c] * qt[q + c*m + j]`` over ``c < r``, each element the chain
    ``fma(a[r-1], b[r-1], ... fma(a[1], b[1], a[0] * b[0]))``: up to :data:`EXPAND_RANKS`
    ranks a pass, their chain in registers, each later pass continuing it from the row
    (the same chain, the same rounding).  At rank 4, one pass of one store per element
    instead of four passes of a load and a store each: ResNet-50's 54 matrices (25.5M
    values) 11.6 -> ~6 ms on two threads."""
    c = 0
    while c < r:
        k = min(EXPAND_RANKS, r - c)
        a0 = coef[p + c]
        b0 = U(q + c * m)  # (unsigned indices: no negative-index wraparound, so the loops vectorise)
        a1 = coef[p + c + 1] if k > 1 else a0
        a2 = coef[p + c + 2] if k > 2 else a0
        a3 = coef[p + c + 3] if k > 3 else a0
        b1, b2, b3 = b0 + U(m), b0 + U(2 * m), b0 + U(3 * m)
        if c == 0:
            if k == 1:
                for j in range(U(m)):
                    row[j] = a0 * qt[b0 + j]
            elif k == 2:
                for j in range(U(m)):
                    row[j] = fma(a1, qt[b1 + j], a0 * qt[b0 + j])
            elif k == 3:
                for j in range(U(m)):
                    row[j] = fma(a2, qt[b2 + j], fma(a1, qt[b1 + j], a0 * qt[b0 + j]))
            else:
                for j in range(U(m)):
                    row[j] = fma(a3, qt[b3 + j], fma(a2, qt[b2 + j], fma(a1, qt[b1 + j], a0 * qt[b0 + j])))
        elif k == 1:
            for j in range(U(m)):
                row[j] = fma(a0, qt[b0 + j], row[j])
        elif k == 2:
            for j in range(U(m)):
                row[j] = fma(a1, qt[b1 + j], fma(a0, qt[b0 + j], row[j]))
        elif k == 3:
            for j in range(U(m)):
                row[j] = fma(a2, qt[b2 + j], fma(a1, qt[b1 + j], fma(a0, qt[b0 + j], row[j])))
        else:
            for j in range(U(m)):
                row[j] = fma(a3, qt[b3 + j], fma(a2, qt[b2 + j], fma(a1, qt[b1 + j], fma(a0, qt[b0 + j], row[j]))))
        c += k


@jit(parallel=True)
def expand_segments(values, vstarts, ns, ms, rs, addrs, like):
    """:func:`expand` of many matrices in one call: matrix ``t`` is ``P`` (``ns[t] x rs[t]``)
    then ``Q`` (``ms[t] x rs[t]``), both row-major, from ``values[vstarts[t]:]`` (a frame's
    coefficients, in the frame's order), and ``P Q^T`` goes into the ``ns[t] x ms[t]`` array
    of ``like``'s dtype (``values``'s) at the address ``addrs[t]`` (the caller keeps it
    alive).  Each element is :func:`expand`'s chain, bit for bit.  Every matrix's ``Q`` is
    first laid out transposed (``r x m``, as :func:`expand` takes it), then one parallel
    region runs over every matrix's rows (dispatched, as :func:`expand`, by the coefficients'
    count), each row :func:`_expand_row`."""
    count = ns.size
    tstarts = np.zeros(count + 1, np.int64)
    rows = np.zeros(count + 1, np.int64)
    for t in range(count):
        tstarts[t + 1] = tstarts[t] + ms[t] * rs[t]
        rows[t + 1] = rows[t] + ns[t]
    qt = np.empty(tstarts[count], values.dtype)
    for t in prange(count):
        n, m, r = ns[t], ms[t], rs[t]
        q = vstarts[t] + n * r
        for j in range(m):
            for c in range(r):
                qt[tstarts[t] + c * m + j] = values[q + j * r + c]
    for row in prange(rows[count]):
        t = np.searchsorted(rows, row, side="right") - 1
        m = ms[t]
        i = row - rows[t]
        out = view_at(like, addrs[t], ns[t] * m)
        _expand_row(values, vstarts[t] + i * rs[t], rs[t], qt, tstarts[t], m, out[i * m : (i + 1) * m])


@jit(parallel=True)
def power_segments(values, addrs, like, firsts, ns, ms, rs, qts, qstarts, width, tiny):
    """One power iteration of many matrices in one call (a many-tensor encode), bit for bit
    what :func:`project`, :func:`orthogonalize` and :func:`back_project` give each: matrix
    ``t`` is the ``ns[t] x ms[t]`` array of ``like``'s dtype at the address ``addrs[t]`` (the
    caller keeps it alive), its starting ``Q`` transposed (``rs[t] x ms[t]``, orthonormal) is
    ``qts[qstarts[t]:]``, and its ``P = M Q`` (rounded to ``like``'s dtype, then
    orthonormalised in float64 with ``tiny`` as :func:`orthogonalize` takes it, and rounded
    again) then ``Q = M^T P`` go row-major to ``values[firsts[t]:]`` (a frame's coefficients,
    in ``like``'s dtype).  One parallel task per matrix (a matrix's products run on one
    thread, so nothing depends on the thread count); dispatched by ``values``' size (the
    frame's coefficients and the values of the tensors passed through).
    Returns how many entries of the matrices are NaN or infinite (a matrix with one is left
    with its unnormalised ``P`` and no ``Q``: the caller discards the frame and raises)."""
    count = ns.size
    bad = np.zeros(max(count, 1), np.int64)
    for t in prange(count):
        n, m, r = ns[t], ms[t], rs[t]
        mat = view_at(like, addrs[t], n * m).reshape((n, m))
        p = values[firsts[t] : firsts[t] + n * r].reshape((n, r))
        lanes = np.empty((r, width))
        qt = qts[qstarts[t] : qstarts[t] + r * m].reshape((r, m))
        k = _project_rows(mat, qt, _widened(qt, width), p, width, 0, n, lanes)
        bad[t] = k
        if k:
            continue
        wide = np.empty((n, r))
        for i in range(n):
            for c in range(r):
                wide[i, c] = p[i, c]
        orthogonalize(wide, tiny)
        for i in range(n):
            for c in range(r):
                p[i, c] = wide[i, c]
        q = values[firsts[t] + n * r : firsts[t] + (n + m) * r].reshape((m, r))
        for lo in range(0, m, COLUMNS):
            _back_project_columns(mat, p, q, lo, min(m, lo + COLUMNS))
    return bad.sum()
