"""CUDA twin of ``codec/kernels/cpu/adacomp.py`` for one tensor: ``adacomp_bins`` and
``feedback_adacomp_bins``, with the CPU file's arguments and results (``adacomp_segments``
comes with the device ``encode_many``).

One block per chunk of ``per_chunk`` whole bins, the unit the CPU kernel gives one thread,
so each chunk's row, count and non-finite count are the CPU's numbers.  The block first
takes its bins' maxima, one thread per bin (forming ``g = r + dw`` in that loop under error
feedback), into ``gmax``; after a barrier it walks the chunk as the ``select`` twin's
``candidates`` does (``ITEMS`` consecutive values per thread, a block-wide scan of the
counts, each thread writing its sends in increasing position), testing each value against
its bin's maximum.  A maximum is exact in any order for finite values; a bin holding a NaN
or inf counts it, and the stage raises.  ``BLOCK`` and ``ITEMS`` are read when a call is
made (the simulator tests take small blocks).
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import jit, numba_cuda
from codec.kernels.cuda._common import THREADS, compactor

cuda = numba_cuda()

__all__ = ["adacomp_bins", "feedback_adacomp_bins"]

#: values per thread per stretch, and threads per block (see the select twin)
ITEMS = 16
BLOCK = THREADS


@jit(device=True)
def _find(p, i, first):
    """AdaComp's test of value ``i`` (``_common.compactor``): ``not |g + dw| < gmax`` of its
    bin and ``g != 0``: 1, or 2 when ``g`` is NaN or inf."""
    g, dw, gmax, length = p
    gi = g[i]
    if not abs(gi + dw[i]) < gmax[i // length]:
        if gi - gi != 0:
            return 2, gi
        if gi != 0:
            return 1, gi
    return 0, gi


_compact = compactor(_find)


@jit
def _bins(dw, r, g, length, per_chunk, c0, items, buf, vals, counts, bad, gmax):
    c = c0 + cuda.blockIdx.x
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    n = dw.size
    span = length * per_chunk
    lo = c * span
    hi = min(n, lo + span)
    form = r.size > 0
    for b in range(lo // length + t, (hi + length - 1) // length, cuda.blockDim.x):  # a bin per thread
        bs = b * length
        be = min(hi, bs + length)
        if form:
            v = r[bs] + dw[bs]
            g[bs] = v
            top = abs(v)
            for i in range(bs + 1, be):
                v = r[i] + dw[i]
                g[i] = v
                a = abs(v)
                top = a if a > top else top
        else:
            top = abs(g[bs])
            for i in range(bs + 1, be):
                a = abs(g[i])
                top = a if a > top else top
        gmax[b] = top
    cuda.syncthreads()  # the bins' maxima (and g) written by the block are seen by all of it
    tmp = cuda.shared.array(THREADS, np.int64)
    found, nbad = _compact((g, dw, gmax, length), lo, hi, items, row, buf, vals, tmp)
    if t == 0:
        counts[c] = found
        bad[c] = nbad


def _launch(dw, r, g, length, per_chunk, chunks, buf, vals, counts, bad, gmax):
    c0, c1 = int(chunks[0]), int(chunks[1])
    if c1 > c0:
        _bins[c1 - c0, BLOCK](dw, r, g, length, per_chunk, c0, ITEMS, buf, vals, counts, bad, gmax)


def adacomp_bins(dw, g, length, per_chunk, chunks, buf, vals, counts, bad, gmax):
    """The CPU kernel's ``adacomp_bins`` (its docstring has the contract); ``chunks`` is a host
    array, the other arrays device arrays."""
    _launch(dw, g[:0], g, length, per_chunk, chunks, buf, vals, counts, bad, gmax)


def feedback_adacomp_bins(dw, r, g, length, per_chunk, chunks, buf, vals, counts, bad, gmax):
    """:func:`adacomp_bins` with ``g = r + dw`` written in the same pass."""
    _launch(dw, r, g, length, per_chunk, chunks, buf, vals, counts, bad, gmax)
