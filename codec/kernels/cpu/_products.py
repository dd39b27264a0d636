"""The rows and columns of PowerSGD's products (Numba CPU): what
:func:`codec.kernels.cpu.lowrank.project`, ``back_project`` and ``power_segments`` compute
each piece of a matrix with, whatever piece their tasks give it.  :func:`project_rows`: rows
``lo:hi`` of ``P = M Q``, each ``P[i, c]`` its lane sums in the fixed order (in registers at
ranks 1 to :data:`~codec.kernels.cpu._ranks.RANKS`, :func:`_register_rows`), counting the
non-finite entries of ``M``; :func:`back_columns`: columns ``lo:hi`` of ``Q = M^T P``, each
``Q[j, c]`` the sum over the rows in order.  A row's or a column's sums depend on nothing
but the matrix, so any cut of the rows or columns gives the same bits.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit
from codec.kernels.cpu._common import U
from codec.kernels.cpu._ranks import RANKS, ROW_BLOCK, ROWS, TILE, back_sums, lane_sums
from codec.layout import LANES


@jit
def project_rows(m, qt, qw, p, width, lo, hi, lanes):
    """Rows ``lo:hi`` of :func:`~codec.kernels.cpu.lowrank.project` (``lanes``: an ``r x width`` float64 scratch);
    returns how many of their entries are NaN or infinite.  With ``qw`` (``qt`` in float64:
    :func:`~codec.kernels.cpu._ranks.widened`, at ranks 1 to :data:`RANKS` with
    :data:`codec.layout.LANES` lanes), each row's lane sums are
    :func:`~codec.kernels.cpu._ranks.lane_sums`'s; else the loop below (the same sums, term
    for term)."""
    if qw.shape[0] > 0:
        return _register_rows(m, qw, p, lo, hi)
    mm = m.shape[1]
    r = qt.shape[0]
    rows = mm // width
    k = np.int64(0)
    for i in range(lo, hi):
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


#: the chains of additions :func:`_register_rows` runs side by side (a float64 add's
#: latency times the adds a core issues per cycle: 4 x 2)
CHAINS = 8


@jit(inline="always")
def _register_rows(m, qw, p, lo, hi):
    """:func:`project_rows` with its lane sums in registers
    (:func:`~codec.kernels.cpu._ranks.lane_sums`, :data:`ROWS` rows at a time), the same
    sums term for term: each row's and rank's 64 lane sums are then added in order, the
    chains of the rows' ranks :data:`CHAINS` side by side (one after another, a chain of 64
    additions cost more than the row's products), then the columns past the whole blocks."""
    mm = m.shape[1]
    r = qw.shape[0]
    tail = mm // LANES * LANES
    k = np.int64(0)
    block = np.empty((ROWS * r, LANES))
    sums = np.empty(ROWS * r)
    for i in range(lo, hi, ROWS):
        nb = min(ROWS, hi - i)
        k += lane_sums(m, i, nb, qw, block)
        last = nb * r - 1
        for e in range(0, last + 1, CHAINS):
            # chains past the last repeat it and are not written
            e1, e2, e3 = min(e + 1, last), min(e + 2, last), min(e + 3, last)
            e4, e5, e6, e7 = min(e + 4, last), min(e + 5, last), min(e + 6, last), min(e + 7, last)
            s0, s1, s2, s3, s4, s5, s6, s7 = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            for col in range(LANES):
                s0 += block[e, col]
                s1 += block[e1, col]
                s2 += block[e2, col]
                s3 += block[e3, col]
                s4 += block[e4, col]
                s5 += block[e5, col]
                s6 += block[e6, col]
                s7 += block[e7, col]
            sums[e] = s0
            sums[e1] = s1
            sums[e2] = s2
            sums[e3] = s3
            sums[e4] = s4
            sums[e5] = s5
            sums[e6] = s6
            sums[e7] = s7
        for b in range(nb):
            for j in range(U(tail), U(mm)):
                v = np.float64(m[i + b, j])
                k += np.int64(not (v - v == 0))
            for c in range(r):
                s = sums[b * r + c]
                for j in range(U(tail), U(mm)):
                    s += np.float64(m[i + b, j]) * qw[c, j]
                p[i + b, c] = s
    return k


@jit
def back_columns(m, p, q, lo, hi):
    """Columns ``lo:hi`` of :func:`~codec.kernels.cpu.lowrank.back_project` (their float64 sums in cache).  At ranks 1
    to :data:`RANKS` on float32, each whole tile of :data:`TILE` columns is
    :func:`~codec.kernels.cpu._ranks.back_sums`'s; the rest the loop below (the same sums,
    term for term)."""
    n = m.shape[0]
    r = p.shape[1]
    if 1 <= r <= RANKS and n > 0 and hi - lo >= TILE:
        # the tiles' sums kept across blocks of ROW_BLOCK rows, so a block's rows stay in
        # cache while every tile reads them
        ntile = (hi - lo) // TILE
        tiles = np.zeros((ntile, r, TILE))
        for i0 in range(0, n, ROW_BLOCK):
            for t in range(ntile):
                back_sums(m, p, lo + t * TILE, i0, min(n, i0 + ROW_BLOCK), tiles[t])
        for t in range(ntile):
            for j in range(TILE):
                for c in range(r):
                    q[lo + t * TILE + j, c] = tiles[t, c, j]
        lo += ntile * TILE
    acc = np.zeros((r, hi - lo))
    for i in range(n):
        for c in range(r):
            pc = np.float64(p[i, c])
            for j in range(U(lo), U(hi)):
                acc[c, j - U(lo)] += np.float64(m[i, j]) * pc
    for j in range(lo, hi):
        for c in range(r):
            q[j, c] = acc[c, j - lo]
