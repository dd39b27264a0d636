"""CUDA twin of ``codec/kernels/cpu/scatter.py``: ``out[idx] (=|+=|-=) values`` for unique
``idx`` and its inverse ``gather``, one grid-stride loop (unique positions: no two threads write one value, so no
atomics); with SET, ``out`` is zeroed by a launch before it (launches on one stream run in
order)."""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import device_functions, jit, numba_cuda
from codec.kernels.cpu import scatter as _cpu
from codec.kernels.cuda._common import launch, views_at, zero
from codec.modes import SET

cuda = numba_cuda()

__all__ = list(_cpu.__all__)


_store_at = device_functions(_cpu, ["_store_at"])["_store_at"]


@jit
def _scatter(values, idx, out, mode):
    for i in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        _store_at(out, idx[i], values[i], mode)


def scatter(values, idx, out, mode):
    """``out[idx] (=|+=|-=) values`` for unique ``idx``; with SET the rest of ``out`` is zeroed."""
    if mode == SET and out.size:
        zero[launch(out.size)](out)
    if idx.size:
        _scatter[launch(idx.size)](values, idx, out, mode)


@jit
def _scatter_from(values, idx, first, out, mode):
    for i in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        _store_at(out, idx[i] - first, values[i], mode)


def scatter_segments(values, idx, kstarts, addrs, starts, like, mode):
    """:func:`scatter` of many tensors' pairs, tensor ``t``'s (run positions
    ``idx[kstarts[t]:kstarts[t+1]]``, host int64 ``kstarts``, ``addrs`` and ``starts``) into
    the device array of ``like``'s dtype at device address ``addrs[t]``, one or two launches
    per tensor.  Needs a real device: the simulator cannot view an address (CodecTypeError)."""
    for t, lo, _, out in views_at(addrs, starts, like):
        if mode == SET:
            zero[launch(out.size)](out)
        a, b = int(kstarts[t]), int(kstarts[t + 1])
        if b > a:
            _scatter_from[launch(b - a)](values[a:b], idx[a:b], lo, out, mode)


@jit
def _gather(src, idx, out):
    for i in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        out[i] = src[idx[i]]


def gather(src, idx, out):
    """``out[i] = src[idx[i]]``."""
    if idx.size:
        _gather[launch(idx.size)](src, idx, out)


def put(values, idx, out):
    """``out[idx] = values``, the rest untouched."""
    if idx.size:
        _scatter[launch(idx.size)](values, idx, out, SET)


def index_scatter_segments(data, sections, values_at, counts, addrs, starts, like):
    """The CPU kernel's frame read and written into device arrays (tensor ``t``'s the device
    array of ``like``'s dtype at device address ``addrs[t]``): the index sections checked and
    read on the host by the CPU ``index`` kernels (they are frame content, a few bytes a
    position), the same refusals (the first refused tensor, nothing written), then the pairs
    written by :func:`scatter_segments`.  Needs a real device: the simulator cannot view an
    address (CodecTypeError)."""
    from codec.device import host_copy, to_device
    from codec.dtypes import on_device
    from codec.kernels.cpu import index as _index

    host = host_copy(data) if on_device(data) else np.asarray(data)
    starts = np.asarray(starts, np.int64)
    sizes = np.diff(starts)
    item = np.dtype(like.dtype).itemsize
    found = np.empty(sizes.size, np.int64)
    _index.index_counts(host, sections, sizes, found)
    for t in range(sizes.size):
        k = int(found[t])
        if k < 0 or k != counts[t] or values_at[t] < 0 or values_at[t] > host.size - k * item:
            return t
    kstarts = np.concatenate([[0], np.cumsum(found)]).astype(np.int64)
    pos = np.empty(int(kstarts[-1]), np.int64)
    bad = np.zeros(sizes.size, np.uint8)
    _index.index_read(host, sections, sizes, kstarts, pos, bad)
    if bad.any():
        return int(np.argmax(bad))
    pos += np.repeat(starts[:-1], found)
    values = np.concatenate([host[int(a) : int(a) + int(k) * item] for a, k in zip(values_at, found)] or [np.empty(0, np.uint8)]).view(like.dtype)
    scatter_segments(to_device(values), to_device(pos), kstarts, addrs, starts, like, SET)
    return -1
