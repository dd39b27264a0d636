"""The rows of PowerSGD's decode ``P Q^T`` (Numba CPU): what
:func:`codec.kernels.cpu.lowrank.expand` and ``expand_segments`` write each row with, every element the chain of fused multiply-adds
``fma(p[r-1], q[r-1], ... fma(p[1], q[1], p[0] * q[0]))`` in the coefficients' dtype (the
order OpenBLAS's FMA kernels took, so frames frozen with ``P @ Q.T`` decode as they did).
:func:`expand_rows` writes a block of :data:`EXPAND_ROWS` rows, together at ranks up to 4
(:func:`_four_rows`, each value of ``Q`` loaded once for the four rows), else row by row
(:func:`_expand_row`, up to :data:`EXPAND_RANKS` ranks a pass).
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit
from codec.kernels.cpu._common import U, fma
from codec.modes import ADD

#: rows :func:`expand_rows` writes at once (each value of ``Q`` loaded once for all of them:
#: one row at a time read 4 rows of ``Q`` per row written, from L2, and took ResNet-50's 54
#: matrices 11.0 ms on one thread; 4 rows at a time 6.9, numpy's ``fill`` of them 6.4)
EXPAND_ROWS = 4


@jit(inline="always")
def _chain(k, a, x0, x1, x2, x3):
    """The first ``k`` (1 to 4, a constant where inlined) terms' chain ``fma(a[k-1], x_{k-1},
    ... fma(a[1], x1, a[0] * x0))``."""
    if k == 1:
        return a[0] * x0
    if k == 2:
        return fma(a[1], x1, a[0] * x0)
    if k == 3:
        return fma(a[2], x2, fma(a[1], x1, a[0] * x0))
    return fma(a[3], x3, fma(a[2], x2, fma(a[1], x1, a[0] * x0)))


@jit(inline="always")
def _four_rows(k, a, b, c, d, qt, q0, q1, q2, q3, out, o, m):
    """Four rows at rank ``k`` (1 to 4, a constant where inlined): ``out[o + j] =
    chain(a, x)``, ``out[o + m + j] = chain(b, x)`` and so on, ``x`` the values ``qt[q0 + j]``
    to ``qt[q3 + j]``, each loaded once for the four rows (unsigned offsets, so the loop
    vectorises)."""
    o0 = U(o)
    o1, o2, o3 = o0 + U(m), o0 + U(2 * m), o0 + U(3 * m)
    p0, p1, p2, p3 = U(q0), U(q1), U(q2), U(q3)
    for j in range(U(m)):
        x0, x1, x2, x3 = qt[p0 + j], qt[p1 + j], qt[p2 + j], qt[p3 + j]
        out[o0 + j] = _chain(k, a, x0, x1, x2, x3)
        out[o1 + j] = _chain(k, b, x0, x1, x2, x3)
        out[o2 + j] = _chain(k, c, x0, x1, x2, x3)
        out[o3 + j] = _chain(k, d, x0, x1, x2, x3)


@jit(inline="always")
def expand_rows(coef, p, r, nb, qt, q, m, out, o):
    """``out[o + b*m + j] = sum_c coef[p + b*r + c] * qt[q + c*m + j]`` for the ``nb`` (1 to
    :data:`EXPAND_ROWS`) rows ``b``, each element the module's chain (:func:`_block_rows`,
    its integers made int64 here: a constant argument is typed a literal, a compilation of
    its own)."""
    i64 = np.int64
    _block_rows(coef, i64(p), i64(r), i64(nb), qt, i64(q), i64(m), out, i64(o))


@jit
def _block_rows(coef, p, r, nb, qt, q, m, out, o):
    """:func:`expand_rows`: a whole block at ranks up to 4 is written together
    (:func:`_four_rows`), else row by row (:func:`_expand_row`).  A function of its own,
    not inlined: the kernels' parallel loops compiled in 18-23 s with it inlined (each of
    ``expand``'s and ``expand_segments``' two compilations held two copies of it), 4-6 s
    calling it, at the same speed (2026-12-04)."""
    if r > EXPAND_RANKS or nb < EXPAND_ROWS:
        for i in range(nb):
            _expand_row(coef, p + i * r, r, qt, q, m, out[o + i * m : o + (i + 1) * m])
        return
    q1, q2, q3 = q + min(1, r - 1) * m, q + min(2, r - 1) * m, q + min(3, r - 1) * m
    a = _coefs(coef, p, r)
    b = _coefs(coef, p + r, r)
    c = _coefs(coef, p + 2 * r, r)
    d = _coefs(coef, p + 3 * r, r)
    if r == 4:
        _four_rows(4, a, b, c, d, qt, q, q1, q2, q3, out, o, m)
    elif r == 3:
        _four_rows(3, a, b, c, d, qt, q, q1, q2, q3, out, o, m)
    elif r == 2:
        _four_rows(2, a, b, c, d, qt, q, q1, q2, q3, out, o, m)
    else:
        _four_rows(1, a, b, c, d, qt, q, q1, q2, q3, out, o, m)


@jit(inline="always")
def _coefs(coef, o, r):
    """A row's ``r`` (1 to 4) coefficients from ``coef[o]``, the last repeated to four."""
    return coef[o], coef[o + min(1, r - 1)], coef[o + min(2, r - 1)], coef[o + min(3, r - 1)]


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


@jit(inline="always")
def apply_block(block, out, o, count, mode):
    """``out[o + k] (+|-)= block[k]`` for ``k < count`` (``mode`` ADD, else SUB): a block of
    rows written through a scratch block into ``out`` (``expand``'s and ``expand_segments``'
    ADD and SUB), each element rounded once more."""
    if mode == ADD:
        for k in range(U(count)):
            out[U(o) + k] += block[k]
    else:
        for k in range(U(count)):
            out[U(o) + k] -= block[k]
