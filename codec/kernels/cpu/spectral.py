"""Spectral kernels (``fft`` stage): magnitudes of rfft coefficients and the per-block top-k.

A spectrum is passed as its float view: row ``b`` of ``spec`` holds ``c`` complex
coefficients as ``re, im`` pairs (``spec.shape[1] == 2 * c``).  A coefficient's magnitude is
``re*re + im*im`` in float64 (exact products of float32 parts; the same in the NumPy
reference), so the choice does not depend on the thread count or the vector width.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange


@jit(inline="always")
def _row_magnitudes(spec, b, mag) -> bool:
    """``mag[j] = |spec[b, j]|**2``; False when a coefficient is NaN or infinite."""
    c = mag.size
    total = 0.0
    for j in range(c):
        re = np.float64(spec[b, 2 * j])
        im = np.float64(spec[b, 2 * j + 1])
        m = re * re + im * im
        mag[j] = m
        total += m * 0.0  # NaN when any magnitude is NaN or infinite; no branch in the loop
    return total == 0.0


#: a row's magnitudes are binned by the top bits of their float32 rounding: 8 exponent and 4
#: mantissa bits (1/16 of a binade per bin; rounding to float32 keeps the order)
BIN_SHIFT = 19
BINS = 1 << (31 - BIN_SHIFT)


@jit(parallel=True)
def block_top(spec, k, base, pos, vals, bad):
    """Keep the ``k`` largest magnitudes of every row of ``spec`` (ties to the lower index).

    Row ``b``'s kept coefficients go, in index order, to ``pos[b*k : (b+1)*k]`` (as
    ``base + b*c + j``) and their ``re, im`` to ``vals[2*b*k : 2*(b+1)*k]``.  ``bad[b]`` is
    set to 1 when row ``b`` holds a NaN or infinite coefficient (its output is then unset).

    A histogram of the magnitudes' float32 bits (branch-free) finds the bin that holds the
    k-th largest; everything above it is kept, and the k-th itself is found exactly among
    that one bin's magnitudes (float64).
    """
    rows = spec.shape[0]
    c = spec.shape[1] // 2
    for b in prange(rows):
        mag = np.empty(c, np.float64)
        if not _row_magnitudes(spec, b, mag):
            bad[b] = 1
            continue
        if k == 0:
            continue
        o = b * k
        if k == c:
            for j in range(c):
                pos[o + j] = base + b * c + j
                vals[2 * (o + j)] = spec[b, 2 * j]
                vals[2 * (o + j) + 1] = spec[b, 2 * j + 1]
            continue
        bins = mag.astype(np.float32).view(np.uint32) >> BIN_SHIFT
        hist = np.zeros(BINS, np.int64)
        top = np.uint32(0)
        for j in range(c):
            hist[bins[j]] += 1
            top = max(top, bins[j])
        edge = np.int64(top)  # the bin holding the k-th largest, and how many lie above it
        above = 0
        while above + hist[edge] < k:
            above += hist[edge]
            edge -= 1
        inbin = np.empty(hist[edge], np.float64)
        h = 0
        for j in range(c):
            if bins[j] == edge:
                inbin[h] = mag[j]
                h += 1
        need = k - above  # 1 <= need <= h
        kth = np.partition(inbin, h - need)[h - need]
        ties = need
        for i in range(h):
            ties -= inbin[i] > kth
        for j in range(c):
            take = bins[j] > edge
            if bins[j] == edge:
                m = mag[j]
                take = m > kth
                if m == kth and ties > 0:
                    take = True
                    ties -= 1
            if take:
                pos[o] = base + b * c + j
                vals[2 * o] = spec[b, 2 * j]
                vals[2 * o + 1] = spec[b, 2 * j + 1]
                o += 1


@jit(parallel=True)
def magnitudes(spec, mag, bad):
    """``mag[b*c + j] = |spec[b, j]|**2`` for every row; ``bad[b] = 1`` for a row with NaN/inf."""
    rows = spec.shape[0]
    c = spec.shape[1] // 2
    for b in prange(rows):
        if not _row_magnitudes(spec, b, mag[b * c : (b + 1) * c]):
            bad[b] = 1


@jit(parallel=True)
def place(spec, base, pos, vals):
    """The inverse of ``block_top``'s output: row ``b`` of ``spec`` (float view, ``c``
    coefficients) becomes zero except coefficient ``pos[i] - base - b*c`` = ``vals[2i], vals[2i+1]``
    for every sorted position ``pos[i]`` that falls in the row."""
    rows = spec.shape[0]
    c = spec.shape[1] // 2
    for b in prange(rows):
        lo = base + b * c
        first = np.searchsorted(pos, lo)
        last = np.searchsorted(pos, lo + c)
        for j in range(2 * c):
            spec[b, j] = 0
        for i in range(first, last):
            j = pos[i] - lo
            spec[b, 2 * j] = vals[2 * i]
            spec[b, 2 * j + 1] = vals[2 * i + 1]
