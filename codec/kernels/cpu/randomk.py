"""Random-k's positions (Numba CPU): the images of ``0..k-1`` under a keyed 4-round Feistel
permutation of ``[0, n)`` (docs/codecs.md, "randomk"), for one tensor or a many-tensor run.
Each position depends on its index and the stream alone, so results never depend on the
thread count.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._common import U, chunk_segments, chunks, feistel_half
from codec.kernels.cpu.rng import mix, stream
from codec.layout import CHUNK

__all__ = ["random_positions", "random_positions_run", "random_positions_segments", "sorted_positions"]



@jit
def _permute(v, strm, half, mask, n):
    """The 4-round Feistel permutation of ``[0, 2**(2*half))``, cycle-walked into ``[0, n)``."""
    while True:
        left = v >> half
        right = v & mask
        for rnd in range(4):
            f = mix(strm ^ (np.uint64(rnd) << np.uint64(48)) ^ right) & mask
            left, right = right, left ^ f
        v = (left << half) | right
        if v < n:
            return v


@jit
def _draw(out, lo, hi, strm, half, n):
    """``out[j] = perm(j)`` for ``lo <= j < hi`` (the permutation of :func:`_permute` on
    ``half``-bit halves, keyed by ``strm``, into ``[0, n)``)."""
    mask = (np.uint64(1) << half) - np.uint64(1)
    for j in range(U(lo), U(hi)):
        out[j] = np.int64(_permute(np.uint64(j), strm, half, mask, np.uint64(n)))


@jit(parallel=True)
def random_positions(out, seed, khash, step, half, n):
    """``out[j] = perm(j)``: distinct positions in ``[0, n)`` (n >= 2) drawn by the stream
    ``mix(mix(mix(seed) ^ khash) ^ step)`` (all uint64), through a Feistel permutation of
    ``[0, 4**half)`` (``4**half >= n``)."""
    strm = stream(seed, khash, step)
    k = out.size
    for c in prange(chunks(k)):
        _draw(out, c * CHUNK, min(k, (c + 1) * CHUNK), strm, half, n)


@jit(parallel=True)
def random_positions_run(out, kstarts, sizes, seeds, khashes, steps):
    """:func:`random_positions` of many tensors at once, in draw order: segment ``s`` of
    ``out`` (``out[kstarts[s]:kstarts[s+1]]``) gets ``perm(j)`` of its own stream (``seeds``,
    ``khashes``, ``steps``: uint64) into ``[0, sizes[s])`` for each of its indices ``j``.  One
    parallel pass in chunks of ``out`` (cut by its length alone, a chunk crossing segments
    draws each one's share), for the large tensors of a many-tensor decode: one parallel
    region for all of them, where each tensor's own :func:`random_positions` was one (their
    sort is NumPy's, per tensor: faster than Numba's for tens of thousands of positions)."""
    n = out.size
    for c in prange(chunks(n)):
        lo = c * CHUNK
        rows = chunk_segments(kstarts, lo, min(n, lo + CHUNK))
        for j in range(rows.shape[0]):
            s, a, b = rows[j, 0], rows[j, 1], rows[j, 2]
            m = sizes[s]
            seg = out[kstarts[s] : kstarts[s + 1]]
            if m == 1:
                seg[a - kstarts[s] : b - kstarts[s]] = 0
            else:
                _draw(seg, a - kstarts[s], b - kstarts[s], stream(seeds[s], khashes[s], steps[s]), np.uint64(feistel_half(m)), m)


@jit(parallel=True)
def random_positions_segments(out, kstarts, sizes, seeds, khashes, steps):
    """:func:`random_positions` of many tensors at once, each sorted: segment ``s`` draws
    ``kstarts[s+1] - kstarts[s]`` distinct positions in ``[0, sizes[s])`` from its own stream
    (``seeds``, ``khashes``, ``steps``: uint64) into ``out[kstarts[s]:kstarts[s+1]]``, in
    increasing order; exactly ``codec.stages.select.randomk.positions`` per tensor.  ``out``
    comes first: the thread pool is woken by the number of positions drawn."""
    for s in prange(sizes.size):
        n = sizes[s]
        o = out[kstarts[s] : kstarts[s + 1]]
        if o.size == 0:
            continue
        if n == 1:
            o[0] = 0
            continue
        _draw(o, 0, o.size, stream(seeds[s], khashes[s], steps[s]), np.uint64(feistel_half(n)), n)
        o.sort()


def sorted_positions(out, seed, khash, step, half, n):
    """:func:`random_positions`, in increasing order: the kept positions as a frame codes them
    (the CUDA twin marks them in a bitmap and reads it back in order instead of sorting)."""
    random_positions(out, seed, khash, step, half, n)
    out.sort()
