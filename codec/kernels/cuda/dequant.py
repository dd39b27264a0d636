"""CUDA twin of ``codec/kernels/cpu/dequant.py``: the quantizers' one decoder, TernGrad's
trit decoder and the decoders' range check, with the CPU file's names, arguments and values.

Every value is decoded on its own (one thread per value, grid-stride loops), so the parallel
shape never shows in a result: ``lut[code] * a[b] (+ off[b])`` in float64, the product
rounded on its own (``_common.mul``: NVVM would fuse it with the offset), then rounded once
to ``out``'s dtype and stored, added or subtracted by the CPU kernel's own ``_put``.  A
code is read from the bytes it spans by the CPU file's own ``_code_at``, compiled again as a
device function (``codec/kernels/cpu/_codes.py``).  ``max_field`` takes a block-wide maximum per block and one atomic maximum
per block into a device word read back at the end (8 bytes cross).  The ``_segments`` forms
find each value's tensor by a binary search over ``starts`` (``_common.owner``).

Tables, factors and offsets may be host arrays (the decoders read them from the frame: a
few numbers per block of values); they are moved to the device once per call
(``_common.dev``).  ``out`` is a device array.
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import device_functions, jit, numba_cuda
from codec.kernels.cpu import _codes, dequant as _cpu
from codec.kernels.cuda._common import THREADS, block_max, constant, dev, launch, mul, owner, views_at
from codec.kernels.cuda._crc import crc_of
from codec.modes import SET

cuda = numba_cuda()

__all__ = list(_cpu.__all__)

_code_at, _store = device_functions(_codes, ["_code_at", "_put"]).values()  # (_store: out[i] (=|+=|-=) v, rounded once)


@jit(device=True)
def _code_bits(data, p, bits, mask):
    """The ``bits``-bit code at bit ``p`` of ``data`` (LSB-first; at most three bytes, those
    past the end read as 0)."""
    j = p >> np.uint64(3)
    w = np.uint64(0)
    for t in range(3):
        if j + np.uint64(t) < np.uint64(data.size):
            w |= np.uint64(data[j + np.uint64(t)]) << np.uint64(8 * t)
    return (w >> (p & np.uint64(7))) & mask


@jit
def _dequantize(data, bits, n, lut, block, a, off, out, mode):
    mask = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    has_off = off.size > 0
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        b = i // block
        v = mul(lut[_code_at(data, i, bits, mask)], a[b])
        if has_off:
            v = v + off[b]
        _store(out, i, v, mode)


def dequantize(data, bits, n, lut, block, a, off, out, mode):
    """``out[i] (=|+=|-=) lut[code_i] * a[b] (+ off[b])``, value ``i`` in block ``b = i //
    block``, each value rounded once to ``out``'s dtype (see the CPU kernel)."""
    if n:
        _dequantize[launch(n)](dev(data), bits, n, constant(lut), block, dev(a), dev(off), out, mode)


def dequantize_checked(data, bits, n, lut, block, a, off, out, fmask, fshift, largest, crc):
    """The CPU kernel's ``(within, crc)``: the fields checked (``fields_within``), then the
    codes decoded (a device decode is handed no payload check, so nothing calls this on the
    device but the twins' tests), the CRC-32C of ``data`` formed on the device."""
    within = fields_within(data, bits, n, fmask, fshift, largest) if fmask else True
    dequantize(data, bits, n, lut, block, a, off, out, SET)
    return within, crc_of(dev(data), crc)


@jit
def _dequantize_segments(data, dstarts, bits, starts, lut, blocks, a, astarts, off, out, mode):
    mask = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    has_off = off.size > 0
    for i in range(cuda.grid(1), starts[starts.size - 1], cuda.gridsize(1)):
        t = owner(starts, i)
        j = i - starts[t]
        b = astarts[t] + j // blocks[t]
        code = _code_bits(data, np.uint64(dstarts[t]) * np.uint64(8) + np.uint64(j) * np.uint64(bits), bits, mask)
        v = mul(lut[code], a[b])
        if has_off:
            v = v + off[b]
        _store(out, i, v, mode)


def dequantize_segments(data, dstarts, bits, starts, lut, blocks, a, astarts, off, out, addrs, mode):
    """:func:`dequantize` of many tensors (see the CPU kernel): tensor ``t``'s codes from byte
    ``dstarts[t]`` of ``data`` into ``out[starts[t]:starts[t+1]]`` in one launch, or, when the
    host array ``addrs`` is not empty, into the device array of ``out``'s dtype at device
    address ``addrs[t]``, one launch per tensor (needs a real device: the simulator cannot
    view an address, CodecTypeError)."""
    if len(addrs):
        for t, lo, hi, dst in views_at(addrs, starts, out):
            d0, s0, s1 = int(dstarts[t]), int(astarts[t]), int(astarts[t + 1])
            dequantize(data[d0 : d0 + ((hi - lo) * bits + 7) // 8], bits, hi - lo, lut, int(blocks[t]), a[s0:s1], off[s0:s1] if len(off) else off, dst, mode)
        return
    n = int(starts[-1]) if len(starts) else 0
    if n:
        _dequantize_segments[launch(n)](dev(data), dev(dstarts), bits, dev(starts), constant(lut), dev(blocks), dev(a), dev(astarts), dev(off), out, mode)


def dequantize_segments_checked(data, dstarts, bits, starts, lut, blocks, a, astarts, off, out, addrs, fmask, fshift, largest, crc):
    """The CPU kernel's ``(within, crc)`` as :func:`dequantize_checked` forms it: the fields
    checked (``fields_within_segments``), then the run decoded, the CRC-32C of all of
    ``data`` formed on the device."""
    within = fields_within_segments(data, dstarts, bits, starts, fmask, fshift, largest) if fmask else True
    dequantize_segments(data, dstarts, bits, starts, lut, blocks, a, astarts, off, out, addrs, SET)
    return within, crc_of(dev(data), crc)


@jit
def _max_field(data, bits, n, fm, top):
    tmp = cuda.shared.array(THREADS, np.uint64)
    mask = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    m = np.uint64(0)
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        m = max(m, _code_at(data, i, bits, mask) & fm)
    m = block_max(m, tmp)
    if cuda.threadIdx.x == 0:
        cuda.atomic.max(top, 0, m)


@jit
def _max_field_segments(data, dstarts, bits, starts, fm, top):
    tmp = cuda.shared.array(THREADS, np.uint64)
    mask = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    m = np.uint64(0)
    for i in range(cuda.grid(1), starts[starts.size - 1], cuda.gridsize(1)):
        t = owner(starts, i)
        p = np.uint64(dstarts[t]) * np.uint64(8) + np.uint64(i - starts[t]) * np.uint64(bits)
        m = max(m, _code_bits(data, p, bits, mask) & fm)
    m = block_max(m, tmp)
    if cuda.threadIdx.x == 0:
        cuda.atomic.max(top, 0, m)


def _field_top(launcher, n, fmask, bits, fshift) -> np.uint64:
    top = cuda.to_device(np.zeros(1, np.uint64))
    if n:
        fm = np.uint64(fmask) & np.uint64((1 << bits) - 1)
        launcher(launch(n), fm, top)
    return np.uint64(top.copy_to_host()[0]) >> np.uint64(fshift)


def max_field(data, bits, n, fmask, fshift):
    """The largest ``(code & fmask) >> fshift`` over the ``n`` codes packed in ``data``."""
    d = dev(data)
    return _field_top(lambda shape, fm, top: _max_field[shape](d, bits, n, fm, top), n, fmask, bits, fshift)


def fields_within(data, bits, n, fmask, fshift, largest):
    """Whether every ``(code & fmask) >> fshift`` is at most ``largest``: :func:`max_field`'s
    maximum, compared (one launch and an 8-byte read-back, as the check was)."""
    return bool(max_field(data, bits, n, fmask, fshift) <= largest)


def fields_within_segments(data, dstarts, bits, starts, fmask, fshift, largest):
    """:func:`fields_within` over many tensors' codes (as :func:`dequantize_segments` reads
    them): their largest field, compared (one launch)."""
    n = int(starts[-1]) if len(starts) else 0
    d, ds, s = dev(data), dev(dstarts), dev(starts)
    return bool(_field_top(lambda shape, fm, top: _max_field_segments[shape](d, ds, bits, s, fm, top), n, fmask, bits, fshift) <= largest)


@jit
def _trits(data, n, vals3, out, mode):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        t = np.int64(data[i // 5])
        for _ in range(i % 5):
            t //= 3
        _store(out, i, vals3[t % 3], mode)


def trits_dequantize(data, n, vals3, out, mode):
    """TernGrad decode: ``out[i] (=|+=|-=) vals3[trit_i]``, trits five per byte."""
    if n:
        _trits[launch(n)](dev(data), n, dev(vals3), out, mode)
