"""Spectral kernels (``fft`` stage): the blocked real FFT and its inverse (scipy's pocketfft),
magnitudes of rfft coefficients, the per-block top-k, and the placement of kept coefficients
into a zero spectrum.

A spectrum is passed as its float view: row ``b`` of ``spec`` holds ``c`` complex
coefficients as ``re, im`` pairs (``spec.shape[1] == 2 * c``).  A coefficient's magnitude is
``re*re + im*im`` in float64 (exact products of float32 parts; the same in the NumPy
reference).  Rows are processed whole by one thread (rows are split into ``ROW_CHUNKS``
chunks that depend on the row count only), so nothing depends on the thread count.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange

__all__ = ["block_top", "irfft", "irfft_rows", "magnitudes", "place", "rfft", "rfft_rows"]

def _workers() -> int:
    """FFT worker threads (scipy.fft ``workers``): this process's share of the cores
    (:func:`codec.threads.budget`, as the parallel kernels take; every core was asked for
    before, whatever the ranks beside it).  Each 1-D transform runs whole on one thread, so
    the result does not depend on the count."""
    from codec import threads

    return threads.budget()

#: a row's magnitudes (float64, >= 0) are binned by the top bits of their bit patterns, which
#: order like the values: 11 exponent and 4 mantissa bits, 1/16 of a binade per bin
BIN_SHIFT = 48
BINS = 1 << (63 - BIN_SHIFT)
#: float64 bits of +inf: a magnitude at or above it (as bits, sign included) is inf or NaN
INF_BITS = 0x7FF0000000000000
#: row chunks of the parallel loops (each chunk allocates its scratch once)
ROW_CHUNKS = 64


@jit(inline="always")
def _row_magnitudes(spec, b, mag):
    """``mag[j] = |spec[b, j]|**2`` (float64); returns the largest magnitude's bit pattern:
    ``>= INF_BITS`` when a coefficient is NaN or infinite (or its square overflows float64).
    Integer max, no branch: the loops vectorise."""
    c = mag.size
    for j in range(c):
        re = np.float64(spec[b, 2 * j])
        im = np.float64(spec[b, 2 * j + 1])
        mag[j] = re * re + im * im
    key = mag.view(np.uint64)
    top = np.uint64(0)
    for j in range(c):
        top = max(top, key[j])
    return top


@jit(inline="always")
def _chunk(rows, i):
    """Rows ``[lo, hi)`` of chunk ``i`` of ``min(rows, ROW_CHUNKS)``."""
    n = min(rows, ROW_CHUNKS)
    return i * rows // n, (i + 1) * rows // n


@jit(parallel=True)
def block_top(spec, k, base, pos, vals, bad):
    """Keep the ``k`` largest magnitudes of every row of ``spec`` (ties to the lower index).

    Row ``b``'s kept coefficients go, in index order, to ``pos[b*k : (b+1)*k]`` (as
    ``base + b*c + j``) and their ``re, im`` to ``vals[2*b*k : 2*(b+1)*k]``.  ``bad[b]`` is
    set to 1 when row ``b`` holds a NaN or infinite coefficient (its output is then unset).

    A histogram of the magnitudes' float64 bit patterns finds the bin that holds the k-th largest;
    everything above that bin is kept, and the k-th itself is found exactly (float64) among
    that one bin's magnitudes.
    """
    rows = spec.shape[0]
    c = spec.shape[1] // 2
    for ch in prange(min(rows, ROW_CHUNKS)):
        lo, hi = _chunk(rows, ch)
        mag = np.empty(c, np.float64)
        key = mag.view(np.uint64)
        inbin = np.empty(c + 1, np.float64)
        kept = np.empty(c + 1, np.int64)
        hist = np.zeros(BINS, np.int64)
        for b in range(lo, hi):
            top = _row_magnitudes(spec, b, mag)
            if top >= INF_BITS:
                bad[b] = 1
                continue
            if k == 0:
                continue
            if k == c:
                for j in range(c):
                    kept[j] = j
            else:
                _row_top(k, mag, key, top, hist, inbin, kept)
            row = b * k
            for i in range(k):
                j = kept[i]
                pos[row + i] = base + b * c + j
                vals[2 * (row + i)] = spec[b, 2 * j]
                vals[2 * (row + i) + 1] = spec[b, 2 * j + 1]


@jit(inline="always")
def _row_top(k, mag, key, top, hist, inbin, kept):
    """The indices of a row's ``k`` (< c) largest magnitudes, in order, into ``kept[:k]``.
    ``hist`` is zero on entry and on exit; ``inbin`` and ``kept`` have room for c + 1 items
    (the branch-free loops write one past the last item they keep)."""
    c = mag.size
    for j in range(c):
        hist[key[j] >> BIN_SHIFT] += 1
    edge = np.int64(top >> BIN_SHIFT)  # the bin holding the k-th largest, and how many lie above it
    above = 0
    while above + hist[edge] < k:
        above += hist[edge]
        edge -= 1
    h = 0  # the boundary bin's magnitudes
    for j in range(c):
        inbin[h] = mag[j]
        h += key[j] >> BIN_SHIFT == edge
    for j in range(c):  # clear only the bins this row touched
        hist[key[j] >> BIN_SHIFT] = 0
    need = k - above  # 1 <= need <= h
    kth = np.partition(inbin[:h], h - need)[h - need]
    ties = need  # how many magnitudes equal to kth are kept: the first ones
    for j in range(h):
        ties -= inbin[j] > kth
    o = 0
    for j in range(c):
        kb = key[j] >> BIN_SHIFT
        m = mag[j]
        take = (kb > edge) | ((kb == edge) & (m > kth))
        if m == kth and kb == edge and ties > 0:
            take = True
            ties -= 1
        kept[o] = j
        o += take


@jit(parallel=True)
def magnitudes(spec, mag, bad):
    """``mag[b*c + j] = |spec[b, j]|**2`` for every row; ``bad[b] = 1`` for a row with NaN/inf."""
    rows = spec.shape[0]
    c = spec.shape[1] // 2
    for ch in prange(min(rows, ROW_CHUNKS)):
        lo, hi = _chunk(rows, ch)
        for b in range(lo, hi):
            if _row_magnitudes(spec, b, mag[b * c : (b + 1) * c]) >= INF_BITS:
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


def rfft(x):
    """The real FFT of every row of ``x`` (``rows x L``, float32 or float64): its ``c = L//2 + 1``
    coefficients as the float view ``rows x 2c`` of ``x``'s dtype (``scipy.fft.rfft``, in
    float32 for float32 rows).  A new array."""
    import scipy.fft

    return scipy.fft.rfft(x, axis=1, workers=_workers()).view(x.dtype)


def irfft(spec, length, threads=None):
    """The inverse of :func:`rfft`: ``rows x length`` real values of ``spec``'s dtype from the
    float view ``rows x 2c`` of each row's ``c = length//2 + 1`` coefficients (the imaginary
    parts of the first, and of the last when ``length`` is even, are ignored).  A new array.
    ``threads``: scipy's workers (default :func:`_workers`; 1 from a caller that runs its
    chunks on threads of its own)."""
    import scipy.fft

    ctype = np.complex128 if spec.dtype == np.float64 else np.complex64
    return scipy.fft.irfft(spec.view(ctype), n=length, axis=1, workers=_workers() if threads is None else threads)


def rfft_rows(x, parts, out):
    """:func:`rfft` of rows of flat ``x`` into flat ``out``, several lengths at once (a run of
    tensors' blocks): ``parts`` (int64, one row per part) ``in at, length, rows, in step, out
    at, out step``: row ``r`` of a part is ``x[in at + r*in step :][:length]`` and its
    ``2*(length//2 + 1)`` floats go to ``out[out at + r*out step :]``.  Each row's result is
    :func:`rfft`'s for it (pocketfft's answer for a row does not depend on the rows beside
    it, see ``codec.stages.transform.fftinverse.chunk_rows``)."""
    for i0, length, rows, istep, o0, ostep in np.asarray(parts, np.int64).reshape(-1, 6).tolist():
        if rows and length:
            got = rfft(np.lib.stride_tricks.as_strided(x[i0:], (rows, length), (istep * x.itemsize, x.itemsize)))
            np.lib.stride_tricks.as_strided(out[o0:], got.shape, (ostep * out.itemsize, out.itemsize))[...] = got


def irfft_rows(spec, parts, out, threads=None):
    """:func:`irfft` of rows of flat ``spec`` into flat ``out``, as :func:`rfft_rows` (``in
    at`` and ``in step`` count ``spec``'s floats, ``out at`` and ``out step`` ``out``'s;
    ``threads`` as :func:`irfft` takes it)."""
    for i0, length, rows, istep, o0, ostep in np.asarray(parts, np.int64).reshape(-1, 6).tolist():
        if rows and length:
            c = length // 2 + 1
            got = irfft(np.ascontiguousarray(np.lib.stride_tricks.as_strided(spec[i0:], (rows, 2 * c), (istep * spec.itemsize, spec.itemsize))), length, threads)
            np.lib.stride_tricks.as_strided(out[o0:], got.shape, (ostep * out.itemsize, out.itemsize))[...] = got
