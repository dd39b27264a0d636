"""CUDA twin of ``codec/kernels/cpu/select.py``: ``candidates``, ``line_sample``,
``strided_sample`` and ``gather_rows`` here, the segmented (many-tensor) ``topk_segments``,
``gaussiank_segments`` and ``dgc_segments`` in ``_segments.py``, with the CPU file's
arguments and results.

``candidates`` runs one block per chunk of ``CHUNK`` values, the chunk the CPU kernel gives
one thread: the block walks the chunk a stretch of ``SCAN_BLOCK * SCAN_ITEMS`` values at a
time (``_common``), each thread counting the finds in its run of ``SCAN_ITEMS`` consecutive
values (forming ``acc =
x + r`` first under error feedback), a block-wide exclusive scan of the counts
(``_common.block_scan``) giving each run its place in the chunk's row, and each thread
writing its finds there, in increasing position: stream compaction in index order, so the row, its
count and the chunk's non-finite count are the CPU's exactly.  The chunk's sums (gaussian-k's
moments) run as a second launch, one block per chunk and one thread per column lane, each
lane summing its rows in order as ``chunk_sums`` does, then lane 0 adding the lanes and the
tail in the CPU's order; the squares are rounded on their own (``_common.mul``).

``CHUNK`` is read when a call is made (a kernel argument), so the tests run several chunks
on the simulator's small sizes by setting this module's ``CHUNK``.
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import jit, numba_cuda
from codec.errors import CodecValueError
from codec.kernels.cuda import _common
from codec.kernels.cuda._common import MAX_WIDTH, THREADS, chunk_sums, compactor, launch
from codec.layout import CHUNK

cuda = numba_cuda()

__all__ = ["candidates", "count_at_least", "dgc_segments", "gather_rows", "gaussiank_segments", "kth_largest", "lane_means", "line_sample", "strided_sample", "topk_segments"]



@jit(device=True)
def _find(p, i, first):
    """The candidates' test of value ``i`` (``_common.compactor``): ``not |a| < cut`` for
    ``a = x + r`` (formed into ``acc`` on the first pass) or ``x``: 1, or 2 when ``a`` is
    NaN or inf."""
    x, r, acc, cut = p
    if r.size == 0:
        v = x[i]
    elif first:
        v = x[i] + r[i]
        acc[i] = v
    else:
        v = acc[i]
    a = abs(v)
    if not a < cut:  # at/above the cut, or NaN
        return (2 if a - a != 0 else 1), v
    return 0, v


_compact = compactor(_find)


@jit
def _candidates(x, r, acc, cut, c0, chunk, items, buf, vals, cap, counts, bad):  # (buf, vals: flat views of the rows)
    c = c0 + cuda.blockIdx.x
    lo = c * chunk
    tmp = cuda.shared.array(THREADS, np.int64)
    found, nbad = _compact((x, r, acc, cut), lo, min(x.size, lo + chunk), items, cuda.blockIdx.x * cap, cap, 0, buf, vals, tmp)
    if cuda.threadIdx.x == 0:
        counts[c] = found
        bad[c] = nbad


@jit
def _chunk_sums(src, c0, chunk, shift, sums):
    c = c0 + cuda.blockIdx.x
    lo = c * chunk
    s, q = chunk_sums(src, lo, min(src.size, lo + chunk), shift, cuda.blockDim.x)
    if cuda.threadIdx.x == 0:
        sums[c, 0] = s
        sums[c, 1] = q


def candidates(x, r, acc, cut, chunks, buf, vals, counts, bad, sums, shift, width):
    """The CPU kernel's ``candidates`` (its docstring has the contract); ``chunks`` is a host
    array, the other arrays device arrays."""
    c0, c1 = int(chunks[0]), int(chunks[1])
    if c1 <= c0:
        return
    if not 0 < width <= MAX_WIDTH:
        raise CodecValueError(f"width: expected 1..{MAX_WIDTH} lanes, got {width}")
    _candidates[c1 - c0, _common.SCAN_BLOCK](x, r, acc, cut, c0, CHUNK, _common.SCAN_ITEMS, buf.reshape(buf.size), vals.reshape(vals.size), buf.shape[1], counts, bad)
    if sums.shape[0]:
        _chunk_sums[c1 - c0, int(width)](acc if r.size else x, c0, CHUNK, np.float64(shift), sums)


@jit
def _line_sample(x, r, step, out):
    line = out.shape[1]
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        at = (k // line) * step + k % line
        if r.size:
            out[k // line, k % line] = abs(np.float64(x[at] + r[at]))
        else:
            out[k // line, k % line] = abs(np.float64(x[at]))


def line_sample(x, r, step, out):
    """The CPU kernel's ``line_sample``: ``out[q, j] = |x + r|`` at ``q * step + j``, float64."""
    if out.size:
        _line_sample[launch(out.size)](x, r, step, out)


@jit
def _strided_sample(x, r, stride, out):
    for q in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        at = q * stride
        if r.size:
            out[q] = np.float64(x[at] + r[at])
        else:
            out[q] = np.float64(x[at])


def strided_sample(x, r, stride, out):
    """The CPU kernel's ``strided_sample``: ``out[q] = x + r`` at ``q * stride``, float64."""
    if out.size:
        _strided_sample[launch(out.size)](x, r, stride, out)


@jit
def _gather_rows(buf, vals, counts, starts, out, vout):
    c = cuda.blockIdx.x
    m = counts[c]
    s = starts[c]
    for j in range(cuda.threadIdx.x, m, cuda.blockDim.x):
        out[s + j] = buf[c, j]
        if vout.size:
            vout[s + j] = vals[c, j]


def gather_rows(buf, vals, counts, starts, out, vout):
    """The CPU kernel's ``gather_rows``: row ``c``'s first ``counts[c]`` entries at ``starts[c]``."""
    if buf.shape[0]:
        _gather_rows[buf.shape[0], _common.THREADS](buf, vals, counts, starts, out, vout)


# the segmented (many-tensor) kernels live in their own module; they are this family's names
from codec.kernels.cuda import _segments  # noqa: E402
from codec.kernels.cuda._segments import dgc_segments, gaussiank_segments, topk_segments  # noqa: E402


@jit
def _kth(x, k, out):
    key, _ = _segments._kth_key(x, 0, 1, x.size, k)
    if cuda.threadIdx.x == 0:
        out[0] = key


def kth_largest(sample, k: int) -> float:
    """The ``k``-th largest of ``|sample|`` (a device array), by one block's radix select over
    the float64 magnitudes' bits (``_segments._kth_key``): 8 bytes come back, not the sample."""
    out = cuda.device_array(1, np.uint64)
    flat = sample.reshape(sample.size)
    _kth[1, _common.SCAN_BLOCK](flat, k, out)
    return float(out.copy_to_host().view(np.float64)[0])


@jit
def _count(x, cut, out):
    k = 0
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        k += abs(np.float64(x[i])) >= cut
    if k:
        cuda.atomic.add(out, 0, k)


def count_at_least(sample, cut: float) -> int:
    """How many of ``|sample|`` (a device array) are at least ``cut``: 8 bytes come back."""
    out = cuda.to_device(np.zeros(1, np.int64))
    if sample.size:
        _count[launch(sample.size)](sample.reshape(sample.size), np.float64(cut), out)
    return int(out.copy_to_host()[0])


@jit
def _lane_means(x, starts, width, out):
    for t in range(cuda.blockIdx.x, out.size, cuda.gridDim.x):
        lo, hi = starts[t], starts[t + 1]
        s = 0.0
        for c in range(lo, hi, CHUNK):
            s += chunk_sums(x, c, min(hi, c + CHUNK), 0.0, width)[0]
        if cuda.threadIdx.x == 0:
            out[t] = s / (hi - lo) if hi > lo else 0.0


def lane_means(x, starts, width, out):
    """Each segment's mean in the CPU kernel's lanes (one block per segment); ``out`` may be
    a host array (a number per tensor comes back)."""
    _common.check_width(width)
    res = _common.Results()
    o = res(out)
    if o.size:
        _lane_means[_common.per_unit(o.size)](x.reshape(x.size), _common.dev(starts), width, o)
    res.done()
