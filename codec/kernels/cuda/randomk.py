"""CUDA twin of ``codec/kernels/cpu/randomk.py``: random-k's positions drawn on the device.

A position is the image of its index under the keyed Feistel permutation, the CPU file's own
``_permute``, ``_hashed`` and ``_round`` compiled again as device functions (the ``rng``
twin's ``mix`` and ``stream`` bound in), so each value is the CPU's by construction (the
CPU's tabulated rounds are the same values, read from a table).  The frame codes them
sorted; instead of a device sort, the drawn positions are marked in a bitmap of the ``n``
positions (an atomic OR per draw: they are distinct) and read back in order by the
``index`` twin's ``bitmap_count`` / ``bitmap_decode``.  A run of tensors marks one bitmap
over their concatenation and subtracts each tensor's start.
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import device_functions, jit, numba_cuda
from codec.kernels.cpu import randomk as _cpu
from codec.kernels.cuda import _common, index, rng
from codec.kernels.cuda._common import Results, dev, launch, owner, zero
from codec.layout import feistel_half

cuda = numba_cuda()

__all__ = list(_cpu.__all__)


def _offsets(counts):
    """Where each of ``counts`` starts, then the total: ``codec.ops.offsets``, which a kernel
    module cannot import (no kernel imports the layers above it)."""
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out

_permute = device_functions(_cpu, ["_round", "_hashed", "_permute"], extra={"mix": rng.mix, **_common.MATH})["_permute"]


@jit
def _draw(out, strm, half, n):
    mask = (np.uint64(1) << half) - np.uint64(1)
    for j in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[j] = np.int64(_permute(np.uint64(j), strm, half, mask, np.uint64(n)))


def random_positions(out, seed, khash, step, half, n):
    """The CPU kernel's ``random_positions`` (``out[j] = perm(j)``, in draw order); ``out``
    may be a host array (copied back)."""
    res = Results()
    o = res(out)
    if out.size:
        _draw[launch(out.size)](o, _stream(seed, khash, step), half, n)
    res.done()


def _stream(seed, khash, step):
    """The stream key ``mix(mix(mix(seed) ^ khash) ^ step)`` (the CPU's ``rng.stream``, on the
    host: three integer mixes)."""
    from codec.kernels.cpu.rng import stream

    return np.uint64(stream(np.uint64(seed), np.uint64(khash), np.uint64(step)))  # (the jit returns a Python int: a kernel would type it int64)


@jit
def _mark(words, lo, strm, half, n, k):
    """Set bit ``lo + perm(j)`` of ``words`` (uint32, LSB-first) for ``j < k``."""
    mask = (np.uint64(1) << half) - np.uint64(1)
    for j in range(cuda.grid(1), k, cuda.gridsize(1)):
        p = lo + np.int64(_permute(np.uint64(j), strm, half, mask, np.uint64(n)))
        cuda.atomic.or_(words, p >> 5, np.uint32(1) << np.uint32(p & 31))


@jit
def _mark_segments(words, starts, kstarts, streams, halves, k):
    """:func:`_mark` of every segment: draw ``i`` of the run belongs to segment ``s``
    (``kstarts``) and marks ``starts[s] + perm_s(i - kstarts[s])`` (a one-element segment: 0)."""
    for i in range(cuda.grid(1), k, cuda.gridsize(1)):
        s = owner(kstarts, i)
        n = starts[s + 1] - starts[s]
        p = starts[s]
        if n > 1:
            half = halves[s]
            mask = (np.uint64(1) << half) - np.uint64(1)
            p += np.int64(_permute(np.uint64(i - kstarts[s]), streams[s], half, mask, np.uint64(n)))
        cuda.atomic.or_(words, p >> 5, np.uint32(1) << np.uint32(p & 31))


@jit
def _relative(pos, starts, kstarts):
    for i in range(cuda.grid(1), pos.size, cuda.gridsize(1)):
        pos[i] -= starts[owner(kstarts, i)]


def _read_marked(words, n, out):
    """The set bits of the first ``n`` bits of ``words``, in order, into ``out`` (the index
    twin's bitmap reader: a count per chunk, back to the host, then the positions)."""
    bitmap = words.view(np.uint8)[: (n + 7) // 8]
    starts = _offsets(index.bitmap_count(bitmap)[:-1])
    index.bitmap_decode(bitmap, dev(starts), out)


def _bitmap(bits):
    words = cuda.device_array((bits + 31) // 32 or 1, np.uint32)
    zero[launch(words.size)](words)
    return words


def sorted_positions(out, seed, khash, step, half, n):
    """The CPU kernel's ``sorted_positions``: the drawn positions in increasing order, marked
    in a bitmap of ``n`` bits and read back in order (no sort); ``out`` may be a host array."""
    res = Results()
    o = res(out)
    if out.size:
        words = _bitmap(n)
        _mark[launch(out.size)](words, 0, _stream(seed, khash, step), half, n, out.size)
        _read_marked(words, n, o)
    res.done()


def random_positions_segments(out, kstarts, sizes, seeds, khashes, steps):
    """The CPU kernel's ``random_positions_segments`` (each segment's positions sorted,
    relative to it): one bitmap over the run's concatenated tensors, read back in order,
    each tensor's start subtracted; ``out`` may be a host array, the others are host arrays."""
    res = Results()
    o = res(out)
    if out.size:
        dstarts, dk = _run_positions(o, kstarts, sizes, seeds, khashes, steps)
        _relative[launch(out.size)](o, dstarts, dk)
    res.done()


def _run_positions(o, kstarts, sizes, seeds, khashes, steps):
    """Every tensor's drawn positions, sorted, as positions in the run of the tensors (one
    bitmap over their concatenation, read back in order) into the device array ``o`` (not
    empty); returns the run's tensor starts and ``kstarts`` on the device."""
    sizes = np.asarray(sizes, np.int64)
    starts = _offsets(sizes)
    halves = np.array([feistel_half(m) for m in sizes.tolist()], np.uint64)
    streams = np.array([_stream(a, b, c) for a, b, c in zip(seeds.tolist(), khashes.tolist(), steps.tolist())], np.uint64)
    total = int(starts[-1])
    words = _bitmap(total)
    dstarts, dk = dev(starts), dev(np.asarray(kstarts, np.int64))
    _mark_segments[launch(o.size)](words, dstarts, dk, dev(streams), dev(halves), o.size)
    _read_marked(words, total, o)
    return dstarts, dk


def random_scatter_segments(values, kstarts, sizes, seeds, khashes, steps, addrs, starts, like, mode):
    """The CPU kernel's ``random_scatter_segments``: the run's positions drawn as
    :func:`random_positions_segments` draws them (before each tensor's start is subtracted),
    then the ``scatter`` twin's ``scatter_segments`` into the device arrays at ``addrs``
    (host ``kstarts``, ``addrs`` and ``starts``; like it, this needs a real device)."""
    from codec.kernels.cuda import scatter

    pos = cuda.device_array(max(values.size, 1), np.int64)[: values.size]
    if values.size:
        _run_positions(pos, kstarts, sizes, seeds, khashes, steps)
    scatter.scatter_segments(values, pos, kstarts, addrs, starts, like, mode)
