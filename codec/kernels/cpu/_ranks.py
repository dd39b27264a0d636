"""PowerSGD's products at ranks 1 to :data:`RANKS` with their sums in vector registers (Numba
CPU): what :mod:`codec.kernels.cpu.lowrank` runs for ``project`` and ``back_project`` on
float32 at those ranks (PowerSGD's default 2, ``powerSGD_hook``'s default 1, the usual 4),
the same sums term for term as its loops.

The loops keep their float64 sums in memory (``project``: 64 lanes x r per row;
``back_project``: a block of columns x r per row) and ran at a third of memory speed
(ResNet-50's 54 matrices on one thread, rank 4: 24.3 and 18.5 ms against 6.0 to read them
once).  Here LLVM intrinsics emit ``<8 x double>`` multiply-adds (:func:`muladd`: fused or
not, the same bits on every CPU, as a product of two float32 values is exact in float64):
:func:`lane_sums` sums :data:`ROWS` rows' lanes at once, each value of ``Q`` widened once
per matrix (:func:`widened`) and loaded once for the rows, and :func:`back_sums` a tile of
:data:`TILE` columns down a block of :data:`ROW_BLOCK` rows (rank 4: 10.4-11.6 and 6.6 ms;
issue 33, twentieth and twenty-first stops).  Each rank has its own intrinsic (its
``r`` sums unrolled into registers), picked at run time by the matrix's rank; other dtypes
and layouts take a loop of the same sums (the ``@overload`` picks at compile time), and
ranks above :data:`RANKS` the loops of lowrank.py.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from codec._jit import jit
from codec.kernels.cpu._common import U, emit_prefetch
from codec.kernels.cpu._f16c import nonfinite
from codec.layout import LANES

#: the highest rank whose sums are formed in registers (:data:`ROWS` rows x ``RANKS`` ranks of
#: ``<8 x double>`` sums: 16 of AVX-512's 32 vector registers)
RANKS = 4

#: :func:`lane_sums` asks for the next call's rows ahead in rows of at most this many columns
#: (into L2: ``llvm.prefetch`` locality 2): BERT-base's 30522 x 768 embedding, one thread,
#: 8.7-9.2 -> 6.5-6.6 ms; in rows of 4608 the hardware follows the passes, and asking made
#: them slower (2.7-3.1 -> 3.3-3.5 ms)
PREFETCH_COLUMNS = 2048
PREFETCH_LOCALITY = 2


@jit(inline="always")
def widened(qt, width):
    """``qt`` in float64 when :func:`codec.kernels.cpu._products.project_rows` takes its lane
    sums in registers (rank 1 to :data:`RANKS`, :data:`codec.layout.LANES` lanes, a row of
    at least one block), else an empty array: converted once per matrix, not per chunk of
    rows."""
    r, mm = qt.shape
    fast = 1 <= r <= RANKS and width == LANES and mm >= width
    qw = np.empty((r if fast else 0, mm if fast else 0))
    if fast:
        for c in range(r):
            for j in range(mm):
                qw[c, j] = np.float64(qt[c, j])
    return qw


def muladd(builder, a, b, c):
    """``a * b + c`` of ``<8 x double>`` vectors, fused where the CPU has FMA instructions
    (``llvm.fmuladd``), else a ``fmul`` then a ``fadd``: the same bits either way where ``a``
    and ``b`` are float32 values widened (their product is exact in float64, so rounding it
    before the sum changes nothing), which is all the intrinsics here multiply."""
    t = a.type
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t, t]), f"llvm.fmuladd.v{t.count}f64")
    return builder.call(fn, [a, b, c])


def prefetch_line(builder, ptr):
    """Ask for the cache line at ``ptr`` to be read soon (into L2: :data:`PREFETCH_LOCALITY`;
    a hint)."""
    emit_prefetch(builder, ptr, write=False, locality=PREFETCH_LOCALITY)


#: values per vector of the intrinsics (:data:`codec.layout.LANES` is 8 such groups), and the
#: rows :func:`lane_sums` sums at once (each value of ``Q`` loaded once for all of them)
_GROUP = 8
ROWS = 4


def lane_sums(m, i, nrows, qw, block):
    """``block[r b + c, l] = sum_t m[i + b, 64 t + l] * qw[c, 64 t + l]`` (float64, terms in
    order of ``t``, from 0.0) for the ``nrows`` (1 to :data:`ROWS`) rows ``i + b``, the ranks
    ``c < r`` (``r = qw.shape[0]``, 1 to :data:`RANKS`) and the 64 lanes ``l``, over the rows'
    whole blocks of 64; returns how many of those entries of ``m`` are NaN or infinite.
    :func:`codec.kernels.cpu._products.project_rows`'s lane loop for a few rows at once, the
    same sums term for term."""


def _per_pass(rank):
    """The groups of 8 lanes one pass of :func:`lane_sums` takes at rank ``rank``: as many
    as keep its :data:`ROWS` x ``rank`` x groups sums within 16 registers (rank 1: 4 groups,
    a pass reading two whole lines of each row's block; ranks 3 and 4: 1)."""
    return max(1, 4 // rank)


def _lane_sums_vectors(rank):
    """:func:`lane_sums` at rank ``rank`` for a C-contiguous float32 ``m``, an intrinsic: each
    group of 8 lanes summed over the rows' blocks with the :data:`ROWS` rows' ``rank`` sums in
    vector registers (``<8 x double>``: one AVX-512 register or two AVX2 ones;
    :func:`muladd`; :func:`_per_pass` groups a pass), so a value of ``m`` is loaded and
    converted once, one of ``Q`` once for all the rows, and no sum goes through memory (the loop's 64 x r sums in memory, a
    row at a time, ran at a third of memory speed).  Rows past ``nrows`` repeat row ``i`` and
    are neither counted nor meant to be read from ``block``."""

    @intrinsic
    def vectors(typingctx, m, i, nrows, qw, block):
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
            total = builder.extract_value(mat.shape, 0)
            short = builder.icmp_signed("<=", mm, ir.Constant(i64, PREFETCH_COLUMNS))
            rows, counted, ahead = [], [], []
            for b in range(ROWS):
                real = builder.icmp_signed("<", ir.Constant(i64, b), nrows)
                at = builder.select(real, builder.add(first, ir.Constant(i64, b)), first)
                rows.append(builder.gep(mat.data, [builder.mul(at, mm)]))
                counted.append(builder.zext(real, i64))
                # the row ROWS further on (the next call's), asked for while this call's rows
                # are summed, in rows of at most PREFETCH_COLUMNS: the passes below read each
                # row at a 256-byte stride, too few blocks of a short row for the hardware
                # prefetchers to follow; past the matrix, this call's own row
                later = builder.add(first, ir.Constant(i64, ROWS + b))
                later = builder.select(builder.icmp_signed("<", later, total), later, at)
                ahead.append(builder.gep(mat.data, [builder.mul(later, mm)]))
            blocks = builder.udiv(mm, ir.Constant(i64, LANES))
            # each row's non-finite entries counted per lane in a vector (a scalar count
            # through memory chained every block of every row), added up at the end
            counts = [cgutils.alloca_once_value(builder, ir.Constant(v8i, [0] * _GROUP)) for _ in range(ROWS)]
            per = _per_pass(rank)
            sums = [[[cgutils.alloca_once(builder, v8d) for _ in range(per)] for _ in range(rank)] for _ in range(ROWS)]
            zero = ir.Constant(v8d, [0.0] * _GROUP)
            for g0 in range(0, LANES // _GROUP, per):
                for row in sums:
                    for ranks in row:
                        for slot in ranks:
                            builder.store(zero, slot)
                with cgutils.for_range(builder, blocks) as loop:
                    base = builder.mul(loop.index, ir.Constant(i64, LANES))
                    ats = [builder.add(base, ir.Constant(i64, (g0 + k) * _GROUP)) for k in range(per)]
                    qs = [[builder.load(builder.bitcast(builder.gep(qa.data, [builder.add(builder.mul(ir.Constant(i64, c), mm), at)]), v8d.as_pointer()), align=8) for at in ats] for c in range(rank)]
                    for b in range(ROWS):
                        lines = [at for k, at in enumerate(ats) if (g0 + k) % 2 == 0]  # (a line is two groups: each asked for once)
                        if lines:
                            with builder.if_then(short, likely=True):
                                for at in lines:
                                    prefetch_line(builder, builder.gep(ahead[b], [at]))
                        for k, at in enumerate(ats):
                            raw = builder.load(builder.bitcast(builder.gep(rows[b], [at]), v8f.as_pointer()), align=4)
                            special = nonfinite(builder, raw, _GROUP)
                            builder.store(builder.add(builder.load(counts[b]), builder.zext(special, v8i)), counts[b])
                            v = builder.fpext(raw, v8d)
                            for c in range(rank):
                                builder.store(muladd(builder, v, qs[c][k], builder.load(sums[b][c][k])), sums[b][c][k])
                for b in range(ROWS):
                    for c in range(rank):
                        for k in range(per):
                            ptr = builder.gep(out.data, [ir.Constant(i64, (b * rank + c) * LANES + (g0 + k) * _GROUP)])
                            builder.store(builder.load(sums[b][c][k]), builder.bitcast(ptr, v8d.as_pointer()), align=8)
            total = ir.Constant(i64, 0)
            for b in range(ROWS):
                lanes = builder.load(counts[b])
                row = ir.Constant(i64, 0)
                for l in range(_GROUP):
                    row = builder.add(row, builder.zext(builder.extract_element(lanes, ir.Constant(ir.IntType(32), l)), i64))
                total = builder.add(total, builder.mul(row, counted[b]))
            return total

        return types.int64(m, i, nrows, qw, block), codegen

    return vectors


_lane_sums1, _lane_sums2, _lane_sums3, _lane_sums4 = (_lane_sums_vectors(rank) for rank in range(1, RANKS + 1))


@overload(lane_sums, jit_options={"cache": True})
def _lane_sums_impl(m, i, nrows, qw, block):
    if m.dtype == types.float32 and m.layout == "C" and qw.layout == "C" and block.layout == "C":

        def vectors(m, i, nrows, qw, block):
            r = qw.shape[0]
            if r == 1:
                return _lane_sums1(m, i, nrows, qw, block)
            if r == 2:
                return _lane_sums2(m, i, nrows, qw, block)
            if r == 3:
                return _lane_sums3(m, i, nrows, qw, block)
            return _lane_sums4(m, i, nrows, qw, block)

        return vectors

    def loop(m, i, nrows, qw, block):
        mm = m.shape[1]
        r = qw.shape[0]
        k = np.int64(0)
        block[:] = 0.0
        for b in range(nrows):
            for t in range(U(mm // LANES)):
                base = t * U(LANES)
                for col in range(U(LANES)):
                    v = np.float64(m[i + b, base + col])
                    k += np.int64(not (v - v == 0))
                for c in range(r):
                    for col in range(U(LANES)):
                        block[b * r + c, col] += np.float64(m[i + b, base + col]) * qw[c, base + col]
        return k

    return loop


#: columns of ``M`` a tile of :func:`back_sums` sums at once (4 groups of 8: two cache lines
#: of a float32 row), and the rows it sums per call: a block's rows (32 x 4 KB) stay in cache
#: while its tiles read them (ResNet-50's matrices, one thread, rank 4: 64-row blocks of 128
#: columns 22.5 ms, 32 rows of 1024 columns 8.7, the loop before 18.5)
TILE = 32
ROW_BLOCK = 32


def back_sums(m, p, lo, i0, i1, tile):
    """``tile[c, j] += sum_i m[i, lo + j] * p[i, c]`` (float64, terms in order of ``i`` from
    ``i0`` to ``i1``, added to the tile's sums so far) for the ranks ``c < r`` (``r =
    p.shape[1]``, 1 to :data:`RANKS`) and the :data:`TILE` columns from ``lo``:
    :func:`codec.kernels.cpu._products.back_columns`'s sums for one tile and a block of
    rows."""


def _back_sums_vectors(rank):
    """:func:`back_sums` at rank ``rank`` for C-contiguous float32 ``m`` and ``p``, an
    intrinsic: the tile's 4 groups of 8 columns times ``rank`` ranks summed down the rows in
    vector registers (``<8 x double>``, loaded from ``tile`` and stored back; each ``P[i, c]``
    broadcast; :func:`muladd`), so each value of ``M`` is loaded and
    converted once and no sum goes through memory row by row."""
    groups = TILE // _GROUP

    @intrinsic
    def vectors(typingctx, m, p, lo, i0, i1, tile):
        if not all(isinstance(a, types.Array) and a.ndim == 2 and a.dtype == types.float32 for a in (m, p)) or not all(isinstance(a, types.Integer) for a in (lo, i0, i1)):
            return None
        if not (isinstance(tile, types.Array) and tile.ndim == 2 and tile.dtype == types.float64):
            return None

        def codegen(context, builder, sig, args):
            i32, i64, f64 = ir.IntType(32), ir.IntType(64), ir.DoubleType()
            v8f, v8d = ir.VectorType(ir.FloatType(), _GROUP), ir.VectorType(f64, _GROUP)
            mat = context.make_array(sig.args[0])(context, builder, args[0])
            pa = context.make_array(sig.args[1])(context, builder, args[1])
            out = context.make_array(sig.args[5])(context, builder, args[5])
            mm = builder.extract_value(mat.shape, 1)
            start, first, last = (context.cast(builder, args[k], sig.args[k], types.intp) for k in (2, 3, 4))
            spots = [[builder.bitcast(builder.gep(out.data, [ir.Constant(i64, c * TILE + g * _GROUP)]), v8d.as_pointer()) for c in range(rank)] for g in range(groups)]
            sums = [[cgutils.alloca_once(builder, v8d) for _ in range(rank)] for _ in range(groups)]
            for g in range(groups):
                for c in range(rank):
                    builder.store(builder.load(spots[g][c], align=8), sums[g][c])
            total = builder.extract_value(mat.shape, 0)
            with cgutils.for_range(builder, builder.sub(last, first)) as loop:
                i = builder.add(first, loop.index)
                row = builder.gep(mat.data, [builder.add(builder.mul(i, mm), start)])
                # the tile's lines ROW_BLOCK rows further on (the next block's call), asked for
                # while this block is summed: a tile reads 128 bytes of each of its rows
                later = builder.add(i, ir.Constant(i64, ROW_BLOCK))
                with builder.if_then(builder.icmp_signed("<", later, total), likely=True):
                    ahead = builder.gep(mat.data, [builder.add(builder.mul(later, mm), start)])
                    for line in range(0, TILE, 16):
                        prefetch_line(builder, builder.gep(ahead, [ir.Constant(i64, line)]))
                prow = builder.gep(pa.data, [builder.mul(i, ir.Constant(i64, rank))])
                pcs = []
                for c in range(rank):
                    pc = builder.fpext(builder.load(builder.gep(prow, [ir.Constant(i64, c)])), f64)
                    one = builder.insert_element(ir.Constant(v8d, None), pc, ir.Constant(i32, 0))
                    pcs.append(builder.shuffle_vector(one, ir.Constant(v8d, None), ir.Constant(ir.VectorType(i32, _GROUP), [0] * _GROUP)))
                for g in range(groups):
                    v = builder.fpext(builder.load(builder.bitcast(builder.gep(row, [ir.Constant(i64, g * _GROUP)]), v8f.as_pointer()), align=4), v8d)
                    for c in range(rank):
                        builder.store(muladd(builder, v, pcs[c], builder.load(sums[g][c])), sums[g][c])
            for g in range(groups):
                for c in range(rank):
                    builder.store(builder.load(sums[g][c]), spots[g][c], align=8)
            return context.get_dummy_value()

        return types.none(m, p, lo, i0, i1, tile), codegen

    return vectors


_back_sums1, _back_sums2, _back_sums3, _back_sums4 = (_back_sums_vectors(rank) for rank in range(1, RANKS + 1))


@overload(back_sums, jit_options={"cache": True})
def _back_sums_impl(m, p, lo, i0, i1, tile):
    if m.dtype == types.float32 and p.dtype == types.float32 and m.layout == "C" and p.layout == "C" and tile.layout == "C":

        def vectors(m, p, lo, i0, i1, tile):
            r = p.shape[1]
            if r == 1:
                _back_sums1(m, p, lo, i0, i1, tile)
            elif r == 2:
                _back_sums2(m, p, lo, i0, i1, tile)
            elif r == 3:
                _back_sums3(m, p, lo, i0, i1, tile)
            else:
                _back_sums4(m, p, lo, i0, i1, tile)

        return vectors

    def loop(m, p, lo, i0, i1, tile):
        r = p.shape[1]
        for i in range(i0, i1):
            for c in range(r):
                pc = np.float64(p[i, c])
                for j in range(TILE):
                    tile[c, j] += np.float64(m[i, lo + j]) * pc

    return loop
