"""PowerSGD's products at rank 4 with their sums in vector registers (Numba CPU): what
:mod:`codec.kernels.cpu.lowrank` runs for ``project`` and ``back_project`` at rank
:data:`RANK4` on float32, the same sums term for term as its loops.

The loops keep their float64 sums in memory (``project``: 64 lanes x r per row;
``back_project``: a block of columns x r per row) and ran at a third of memory speed
(ResNet-50's 54 matrices on one thread: 24.3 and 18.5 ms against 6.0 to read them once).
Here LLVM intrinsics emit ``<8 x double>`` ``fmul`` then ``fadd`` (never fused: the same bits
on every CPU): :func:`lane_sums4` sums :data:`ROWS4` rows' lanes at once, each value of ``Q``
widened once per matrix (:func:`widened`) and loaded once for the rows, and
:func:`back_sums4` a tile of :data:`TILE4` columns down a block of :data:`ROW_BLOCK` rows
(14.4 and 10.0 ms; issue 33, twentieth stop).  Other dtypes and layouts take a loop of the
same sums (the ``@overload`` picks at compile time).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from codec._jit import jit
from codec.kernels.cpu._common import U
from codec.kernels.cpu._f16c import nonfinite
from codec.layout import LANES

#: the rank whose sums are formed in registers (the rank of ``powerSGD_hook``'s usual
#: comparison; PowerSGD's default rank 2 keeps the loops)
RANK4 = 4


@jit(inline="always")
def widened(qt, width):
    """``qt`` in float64 when :func:`codec.kernels.cpu.lowrank._project_rows` takes its rank-4 lane sums (rank
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


def lane_sums4(m, i, nrows, qw, block):
    """``block[4 b + c, l] = sum_t m[i + b, 64 t + l] * qw[c, 64 t + l]`` (float64, terms in
    order of ``t``, from 0.0) for the ``nrows`` (1 to :data:`ROWS4`) rows ``i + b``, ranks
    ``c < 4`` and the 64 lanes ``l``, over the rows' whole blocks of 64; returns how many of
    those entries of ``m`` are NaN or infinite.  :func:`codec.kernels.cpu.lowrank._project_rows`'s lane loop at rank 4
    for a few rows at once, the same sums term for term."""


@overload(lane_sums4, jit_options={"cache": True})
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
    """:func:`lane_sums4` for a C-contiguous float32 ``m``: each group of 8 lanes summed over
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
                    special = nonfinite(builder, raw, _GROUP)
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


#: columns of ``M`` a tile of :func:`back_sums4` sums at once (4 groups of 8: two cache
#: lines of a float32 row), and the rows it sums per call: a block's rows (32 x 4 KB) stay in
#: cache while its tiles read them (ResNet-50's matrices, one thread: 64-row blocks of 128
#: columns 22.5 ms, 32 rows of 1024 columns 8.7, the loop before 18.5)
TILE4 = 32
ROW_BLOCK = 32


def back_sums4(m, p, lo, i0, i1, tile):
    """``tile[c, j] += sum_i m[i, lo + j] * p[i, c]`` (float64, terms in order of ``i`` from
    ``i0`` to ``i1``, added to the tile's sums so far) for ``c < 4`` and the :data:`TILE4`
    columns from ``lo``: :func:`codec.kernels.cpu.lowrank._back_project_columns`'s sums at rank 4 for one tile and a
    block of rows."""


@overload(back_sums4, jit_options={"cache": True})
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
    """:func:`back_sums4` for C-contiguous float32 ``m`` and ``p``: the tile's 4 groups of 8
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
