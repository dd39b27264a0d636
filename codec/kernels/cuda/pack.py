"""CUDA twin of ``codec/kernels/cpu/pack.py``: the same names, arguments and bytes.

The byte-level helpers (``_mask``, ``_get``, ``_get8``, ``_put``, ``_item``, ``_item_bits``, ``_code_at``; the first four from cpu/_bytes.py) are the
CPU file's own, compiled again as device functions from their Python source
(:func:`codec._cuda_jit.device_functions`), so both backends read and write a code's bytes
with one statement of the rule.  The parallel shape differs, the bytes do not:

* ``pack_codes``: one thread per OUTPUT byte, which ORs in the bits of the (at most nine)
  codes that overlap it: no byte is shared between threads, so no atomics, and every byte
  is written (the CPU's zeroed tail included).  ``pack_segments``: one block per tensor,
  its threads over the tensor's bytes.
* ``sign_bits``: one thread per output byte, the CPU's ``_sign_out`` (codec/kernels/cpu/_signs.py).
* ``unpack_codes``: one thread per code, reading the (at most nine) bytes it spans.
* ``put_items`` / ``take_items`` / ``interleave``: one block per tensor, its threads over
  the tensor's items or bytes.

Arguments may be device arrays or host NumPy arrays (Numba then copies them in and out, as
the kernel tests do).
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import device_functions, jit, numba_cuda
from codec.errors import CodecValueError
from codec.kernels.cpu import _signs as _cpu_signs, pack as _cpu
from codec.kernels.cuda import _common
from codec.kernels.cuda._common import launch

cuda = numba_cuda()

__all__ = list(_cpu.__all__)

_twins = device_functions(_cpu, ["_mask", "_get8", "_get", "_put", "_item", "_item_bits", "_code_at"])
_sign_out = device_functions(_cpu_signs, ["_sign_byte", "_sign_out"], {"owner": _common.owner})["_sign_out"]
_mask, _get, _put, _item, _item_bits, _code_at = (_twins[k] for k in ("_mask", "_get", "_put", "_item", "_item_bits", "_code_at"))


@jit(device=True)
def _byte(src, base, size, bits, n, j):
    """Byte ``j`` of the LSB-first packing of the ``n`` codes of ``size`` bytes each that start
    at byte ``base`` of ``src``, ``bits`` bits each: the bits of every code overlapping it."""
    b = np.uint64(bits)
    lo = np.uint64(j) * np.uint64(8)
    first = lo // b
    last = (lo + np.uint64(7)) // b
    if last > np.uint64(n - 1):
        last = np.uint64(n - 1)
    m = _mask(bits)
    acc = np.uint64(0)
    i = first
    while i <= last:
        v = _get(src, np.uint64(base) + i * np.uint64(size), size) & m
        at = i * b
        if at >= lo:
            acc |= v << (at - lo)
        else:
            acc |= v >> (lo - at)
        i += np.uint64(1)
    return np.uint8(acc & np.uint64(0xFF))


@jit
def _pack(src, size, bits, n, out):
    for j in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[j] = _byte(src, 0, size, bits, n, j)


def pack_codes(codes, bits, out, crc=-1):
    """Pack ``codes`` (contiguous unsigned ints, ``bits`` <= 8 * itemsize, only the low ``bits``
    of each used) into ``out``, uint8 of exactly ``ceil(n*bits/8)`` bytes, every byte written:
    the CPU kernel's bytes.  Returns -1: a device payload is checksummed in one pass on the
    device (``codec.payload``), whatever ``crc`` asks."""
    if not 1 <= bits <= 8 * np.dtype(codes.dtype).itemsize or out.size != (codes.size * bits + 7) // 8:
        raise CodecValueError(f"pack_codes: {codes.size} codes of dtype {codes.dtype}, {bits} bits, {out.size} bytes out")
    if out.size:
        _pack[launch(out.size)](codes.reshape(codes.size).view(np.uint8), np.dtype(codes.dtype).itemsize, bits, codes.size, out)
    return -1


@jit
def _pack_segments(src, size, starts, bits, out, ostarts):
    t = cuda.blockIdx.x
    n = starts[t + 1] - starts[t]
    nbytes = (n * bits + 7) // 8
    for j in range(cuda.threadIdx.x, nbytes, cuda.blockDim.x):
        out[ostarts[t] + j] = _byte(src, starts[t] * size, size, bits, n, j)


def pack_segments(codes, starts, bits, out, ostarts):
    """``pack_codes`` of many tensors' codes at once (a many-tensor frame's run): tensor ``t``'s
    codes ``codes[starts[t]:starts[t+1]]`` packed into exactly ``ceil(n_t*bits/8)`` bytes of
    ``out`` from byte ``ostarts[t]``; the bytes between tensors are left as they are.  Host
    ``starts`` and ``ostarts`` are checked as the CPU kernel checks them."""
    s, o = np.asarray(starts if isinstance(starts, np.ndarray) else starts.copy_to_host()), np.asarray(ostarts if isinstance(ostarts, np.ndarray) else ostarts.copy_to_host())
    ends = o + (np.diff(s) * bits + 7) // 8
    if not 1 <= bits <= 8 * np.dtype(codes.dtype).itemsize or s.size != o.size + 1 or (ends.size and (ends.max() > out.size or o.min() < 0)):
        raise CodecValueError(f"pack_segments: codes of dtype {codes.dtype}, {bits} bits, {s.size - 1} tensors, {o.size} offsets, {out.size} bytes out")
    if o.size:
        _pack_segments[o.size, _common.THREADS](codes.reshape(codes.size).view(np.uint8), np.dtype(codes.dtype).itemsize, starts, bits, out, ostarts)


@jit
def _unpack(data, bits, out, size):
    m = _mask(bits)
    for i in range(cuda.grid(1), out.size // size, cuda.gridsize(1)):
        _put(out, np.uint64(i) * np.uint64(size), _code_at(data, i, bits, m), size)


def unpack_codes(data, bits, out):
    """Inverse of ``pack_codes``: fill ``out`` (contiguous unsigned ints, ``bits`` <= 8 *
    itemsize) with ``out.size`` codes from the uint8 array ``data``."""
    if not 1 <= bits <= 8 * np.dtype(out.dtype).itemsize or data.size < (out.size * bits + 7) // 8:
        raise CodecValueError(f"unpack_codes: {out.size} codes of dtype {out.dtype}, {bits} bits, {data.size} bytes in")
    if out.size:
        _unpack[launch(out.size)](data, bits, out.reshape(out.size).view(np.uint8), np.dtype(out.dtype).itemsize)


@jit
def _put_items(values, vstarts, widths, out, ostarts):
    t = cuda.blockIdx.x
    w = widths[t]
    for i in range(vstarts[t] + cuda.threadIdx.x, vstarts[t + 1], cuda.blockDim.x):
        _put(out, np.uint64(ostarts[t]) + np.uint64(i - vstarts[t]) * np.uint64(w), _item_bits(values[i], w), w)


def put_items(values, vstarts, widths, out, ostarts):
    """Tensor ``t``'s float64 ``values[vstarts[t]:vstarts[t+1]]`` written from byte
    ``ostarts[t]`` of ``out`` as little-endian items of ``widths[t]`` bytes: 8 float64, 4
    float32 (rounded to nearest), 2 int16 (integers in its range): the CPU kernel's bytes."""
    if vstarts.size > 1:
        _put_items[vstarts.size - 1, _common.THREADS](values, vstarts, widths, out, ostarts)


@jit
def _take_items(data, offsets, widths, vstarts, out):
    t = cuda.blockIdx.x
    w = widths[t]
    for i in range(vstarts[t] + cuda.threadIdx.x, vstarts[t + 1], cuda.blockDim.x):
        out[i] = _item(_get(data, np.uint64(offsets[t]) + np.uint64(i - vstarts[t]) * np.uint64(w), w), w)


def take_items(data, offsets, widths, vstarts, out):
    """The inverse of ``put_items``: tensor ``t``'s items of ``widths[t]`` bytes from byte
    ``offsets[t]`` of ``data``, as float64 into ``out[vstarts[t]:vstarts[t+1]]`` (exact)."""
    if vstarts.size > 1:
        _take_items[vstarts.size - 1, _common.THREADS](data, offsets, widths, vstarts, out)


@jit
def _interleave(first, fstarts, second, sstarts, out):
    t = cuda.blockIdx.x
    p = fstarts[t] + sstarts[t]
    nf = fstarts[t + 1] - fstarts[t]
    for i in range(cuda.threadIdx.x, nf + sstarts[t + 1] - sstarts[t], cuda.blockDim.x):
        out[p + i] = first[fstarts[t] + i] if i < nf else second[sstarts[t] + i - nf]


def interleave(first, fstarts, second, sstarts, out):
    """``out`` = segment 0 of ``first``, segment 0 of ``second``, segment 1 of ``first``, ...
    (bytes; segment ``t`` of ``first`` is ``first[fstarts[t]:fstarts[t+1]]``, of ``second``
    likewise): a sparse run's index sections and value codes, each tensor's two in turn."""
    if fstarts.size > 1:
        _interleave[fstarts.size - 1, _common.THREADS](first, fstarts, second, sstarts, out)


@jit
def _sign_bits(words, starts, ostarts, top, out):
    for b in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        ok, v = _sign_out(words, starts, ostarts, top, b)
        if ok:
            out[b] = v


def sign_bits(words, starts, out, ostarts):
    """The CPU's ``sign_bits``: a thread per output byte, its tensor found by the CPU's own
    binary search (``_sign_out``); ``starts`` and ``ostarts`` device or host arrays."""
    if np.dtype(words.dtype).kind != "u" or starts.size != ostarts.size + 1:
        raise CodecValueError(f"sign_bits: words of dtype {words.dtype}, {starts.size - 1} tensors, {ostarts.size} offsets")
    if out.size and ostarts.size:
        _sign_bits[launch(out.size)](words.reshape(words.size), starts, ostarts, np.uint64(8 * np.dtype(words.dtype).itemsize - 1), out)
