"""CUDA twin of ``codec/kernels/cpu/adacomp.py`` for one tensor: ``adacomp_bins`` and
``feedback_adacomp_bins``, and the many-tensor ``adacomp_segments``, with the CPU file's
arguments and results.

One block per chunk of ``per_chunk`` whole bins, the unit the CPU kernel gives one thread,
so each chunk's row, count and non-finite count are the CPU's numbers.  The block first
takes its bins' maxima, one thread per bin (forming ``g = r + dw`` in that loop under error
feedback), into ``gmax``; after a barrier it walks the chunk as the ``select`` twin's
``candidates`` does (``SCAN_ITEMS`` consecutive values per thread, a block-wide scan of the
counts, each thread writing its sends in increasing position), testing each value against
its bin's maximum.  A maximum is exact in any order for finite values; a bin holding a NaN
or inf counts it, and the stage raises.  ``_common.SCAN_BLOCK`` and ``SCAN_ITEMS`` are read
when a call is
made (the simulator tests take small blocks).  ``adacomp_segments`` runs the same block
over each segment (one block per tensor of a run), with the segment's own bin length.

``bin_sums`` runs the CPU's own NumPy-order summation (``_pairwise``, compiled again as a
device function): one block per tensor, a thread per block of ``NP_BUFFER`` maxima (its
pairwise sum), then thread 0 adding those in order, as NumPy does: a float per tensor
comes back, not its bins' maxima.
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import device_functions, jit, numba_cuda
from codec.kernels.cpu import adacomp as _cpu
from codec.kernels.cuda import _common
from codec.kernels.cuda._common import THREADS, compactor

cuda = numba_cuda()

__all__ = ["adacomp_bins", "adacomp_segments", "bin_sums", "feedback_adacomp_bins"]

_pairwise = device_functions(_cpu, ["_leaf", "_pairwise"])["_pairwise"]
STACK = _cpu.STACK  # (a global int: a constant to the compiler, as local arrays' sizes must be)



@jit(device=True)
def _find(p, i, first):
    """AdaComp's test of value ``i`` (``_common.compactor``): ``not |g + dw| < gmax`` of its
    bin (bins counted from ``lo``, their maxima from ``gmax[b0]``) and ``g != 0``: 1, or 2
    when ``g`` is NaN or inf."""
    g, dw, gmax, length, lo, b0 = p
    gi = g[i]
    if not abs(gi + dw[i]) < gmax[b0 + (i - lo) // length]:
        if gi - gi != 0:
            return 2, gi
        if gi != 0:
            return 1, gi
    return 0, gi


_compact = compactor(_find)


@jit(device=True)
def _bin_maxima(dw, r, g, lo, hi, length, gmax, b0):
    """The block's bins of ``[lo, hi)`` (whole bins of ``length`` from ``lo``), a thread per
    bin: each one's max |g| into ``gmax[b0 + b]`` (with a non-empty ``r``, ``g = r + dw``
    formed in the same loop), then a barrier, so the whole block sees them (and g)."""
    form = r.size > 0
    for b in range(cuda.threadIdx.x, (hi - lo + length - 1) // length, cuda.blockDim.x):
        bs = lo + b * length
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
        gmax[b0 + b] = top
    cuda.syncthreads()


@jit
def _bins(dw, r, g, length, per_chunk, c0, items, buf, vals, cap, counts, bad, gmax):  # (buf, vals: flat views of the rows)
    c = c0 + cuda.blockIdx.x
    span = length * per_chunk
    lo = c * span
    hi = min(dw.size, lo + span)
    _bin_maxima(dw, r, g, lo, hi, length, gmax, lo // length)
    tmp = cuda.shared.array(THREADS, np.int64)
    found, nbad = _compact((g, dw, gmax, length, 0, 0), lo, hi, items, cuda.blockIdx.x * cap, cap, 0, buf, vals, tmp)
    if cuda.threadIdx.x == 0:
        counts[c] = found
        bad[c] = nbad


@jit
def _segments(dw, g, starts, lengths, bstarts, items, pos, vals, counts, bad, gmax):
    s = cuda.blockIdx.x
    lo = starts[s]
    hi = starts[s + 1]
    _bin_maxima(dw, dw[:0], g, lo, hi, lengths[s], gmax, bstarts[s])
    tmp = cuda.shared.array(THREADS, np.int64)
    found, nbad = _compact((g, dw, gmax, lengths[s], lo, bstarts[s]), lo, hi, items, lo, hi - lo, lo, pos, vals, tmp)
    if cuda.threadIdx.x == 0:
        counts[s] = found
        bad[s] = nbad


def adacomp_segments(dw, g, starts, lengths, bstarts, pos, vals, counts, bad, gmax):
    """The CPU kernel's ``adacomp_segments`` (its docstring has the contract): one block per
    segment; every array a device array."""
    if starts.size > 1:
        _segments[starts.size - 1, _common.SCAN_BLOCK](dw, g, starts, lengths, bstarts, _common.SCAN_ITEMS, pos, vals, counts, bad, gmax)


def _launch(dw, r, g, length, per_chunk, chunks, buf, vals, counts, bad, gmax):
    c0, c1 = int(chunks[0]), int(chunks[1])
    if c1 > c0:
        _bins[c1 - c0, _common.SCAN_BLOCK](dw, r, g, length, per_chunk, c0, _common.SCAN_ITEMS, buf.reshape(buf.size), vals.reshape(vals.size), buf.shape[1], counts, bad, gmax)


def adacomp_bins(dw, g, length, per_chunk, chunks, buf, vals, counts, bad, gmax):
    """The CPU kernel's ``adacomp_bins`` (its docstring has the contract); ``chunks`` is a host
    array, the other arrays device arrays."""
    _launch(dw, g[:0], g, length, per_chunk, chunks, buf, vals, counts, bad, gmax)


def feedback_adacomp_bins(dw, r, g, length, per_chunk, chunks, buf, vals, counts, bad, gmax):
    """:func:`adacomp_bins` with ``g = r + dw`` written in the same pass."""
    _launch(dw, r, g, length, per_chunk, chunks, buf, vals, counts, bad, gmax)


@jit
def _bin_sums(gmax, bstarts, pstarts, block, parts, out):
    t = cuda.blockIdx.x
    los = cuda.local.array(STACK, np.int64)
    ns = cuda.local.array(STACK, np.int64)
    stage = cuda.local.array(STACK, np.int64)
    vals = cuda.local.array(STACK, np.float64)
    lo, hi = bstarts[t], bstarts[t + 1]
    for j in range(cuda.threadIdx.x, pstarts[t + 1] - pstarts[t], cuda.blockDim.x):
        b = lo + j * block
        parts[pstarts[t] + j] = _pairwise(gmax, b, min(block, hi - b), los, ns, stage, vals)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        acc = 0.0
        for j in range(pstarts[t], pstarts[t + 1]):
            acc += parts[j]
        out[t] = acc


def bin_sums(gmax, bstarts, out):
    """The CPU kernel's ``bin_sums`` (``np.sum(..., dtype=np.float64)`` of each tensor's
    maxima, bit for bit); ``bstarts`` a host array, ``out`` host or device."""
    bstarts = np.asarray(bstarts, np.int64)
    if not out.size:
        return
    block = _cpu._sum_block(gmax.dtype)
    pstarts = np.concatenate([[0], np.cumsum(-(-np.diff(bstarts) // block))]).astype(np.int64)
    res = _common.Results()
    o = res(out)
    parts = cuda.device_array(max(1, int(pstarts[-1])), np.float64)
    _bin_sums[out.size, THREADS](gmax, _common.dev(bstarts), _common.dev(pstarts), block, parts, o)
    res.done()
