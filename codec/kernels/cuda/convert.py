"""CUDA twin of ``codec/kernels/cpu/convert.py``: the same names, arguments and results.

Each value's conversion is the CPU's own scalar function (``_half.f32_to_f16_bits`` and the
rest, compiled again as device functions from their Python source), so both backends round
with one statement of the rule and agree bit for bit.  Grid-stride loops (``_common.launch``);
the one reduction is the non-finite count, summed per block in shared memory into a
per-block buffer that is read back and added on the host.  Asked
for a CRC-32C (``crc >= 0``), ``narrow_codes`` and ``half_feedback`` form it over their codes
on the device (``_crc.crc32c``), so the host only copies the frame's bytes.

Arguments may be device arrays or host NumPy arrays (Numba then copies them in and out, as
the kernel tests do); the stages pass device arrays.
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import device_functions, jit, numba_cuda
from codec.kernels.cpu import _half, convert as _cpu
from codec.kernels.cuda import _common
from codec.kernels.cuda._common import launch, mul, mul32, owner, views_at
from codec.kernels.cuda._crc import crc_of
from codec.modes import SET, SUB

cuda = numba_cuda()

__all__ = list(_cpu.__all__)

# the CPU's scalar conversions (codec.kernels.cpu._half), as device functions compiled from their Python source
_f32_to_f16_bits, _f32_to_bf16_bits, _f64_to_f32_odd_bits, _sum_odd, _f16_to_f32, _bf16_to_f32 = device_functions(
    _half, ["f32_to_f16_bits", "f32_to_bf16_bits", "f64_to_f32_odd_bits", "sum_odd", "f16_to_f32", "bf16_to_f32"]
).values()


def _counts(blocks: int):
    """The per-block non-finite counts of a launch, ``blocks`` long: a device buffer and the
    pinned host buffer it is read back into, kept per thread and context
    (``_common.per_context``; a longer grid, as a test makes, gets its own)."""
    size = max(blocks, _common.MAX_BLOCKS)
    dev, host = _common.per_context(("counts", size), lambda: (cuda.device_array(size, np.int64), cuda.pinned_array(size, np.int64)))
    return dev[:blocks], host[:blocks]


def _total(counts) -> int:
    """The sum of the per-block counts (a pair from :func:`_counts`), read back into its
    pinned buffer: the one host round trip of a call."""
    bad, host = counts
    bad.copy_to_host(host)
    return int(host.sum())


@jit(device=True)
def _block_count(k, bad):
    """Add thread counts ``k`` over the block (shared memory) and store the block's total in
    ``bad[blockIdx]``; every thread of the block calls it."""
    seen = cuda.shared.array(1, np.int64)
    if cuda.threadIdx.x == 0:
        seen[0] = 0
    cuda.syncthreads()
    if k:
        cuda.atomic.add(seen, 0, k)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        bad[cuda.blockIdx.x] = seen[0]


@jit(device=True)
def _code(a, bf16):
    """The 16-bit code of float64 ``a`` (through float32 rounded to odd)."""
    u = _f64_to_f32_odd_bits(a)
    return _f32_to_bf16_bits(u) if bf16 else _f32_to_f16_bits(u)


@jit(device=True)
def _value(h, bf16):
    return _bf16_to_f32(h) if bf16 else _f16_to_f32(h)


@jit
def _narrow(x, out, bf16, bad):
    k = np.int64(0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = x[i]
        out[i] = _code(np.float64(v), bf16)
        k += not (v - v == 0)
    _block_count(k, bad)


@jit
def _narrow32(x, out, bf16, bad):
    """:func:`_narrow` for float32 ``x``: its bits are already float32's (rounding to odd
    through float64 gives them back), so the float64 step is skipped."""
    k = np.int64(0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = x[i]
        u = v.view(np.uint32)
        out[i] = _f32_to_bf16_bits(u) if bf16 else _f32_to_f16_bits(u)
        k += not (v - v == 0)
    _block_count(k, bad)


@jit
def _specials(codes, mask, bad):
    """Count the codes whose exponent bits (``mask``) are all set: NaN and inf."""
    k = np.int64(0)
    for i in range(cuda.grid(1), codes.size, cuda.gridsize(1)):
        k += (codes[i] & mask) == mask
    _block_count(k, bad)


def narrow_codes(x, out, bf16, crc):
    """fp16 (``bf16=False``) or bf16 codes of float32/float64 ``x`` into ``out`` (uint16), as
    the CPU kernel; returns ``(non-finite count, crc)``: with ``crc >= 0`` the codes' CRC-32C
    continued from it, formed on the device; -1 when ``crc < 0``.  A float16 ``x`` (a device
    array; on the host ``codec.ops.narrow`` does this before the kernel) is coded as the host
    codes it: its bits are the fp16 codes (NaN payloads kept), and its bf16 codes are those of
    its exact float32 widening."""
    if not x.size:
        return 0, -1 if crc < 0 else int(crc)
    shape = launch(x.size)
    counts = _counts(shape[0])
    if np.dtype(x.dtype) == np.float16:
        bits = x.reshape(x.size).view(np.uint16)
        if not bf16:
            out.copy_to_device(bits)
            _specials[shape](out, np.uint16(0x7C00), counts[0])
            return _total(counts), crc_of(out, crc)
        x = cuda.device_array(x.size, np.float32)
        _decode[shape](bits, x, SET, False)
    (_narrow32 if np.dtype(x.dtype) == np.float32 else _narrow)[shape](x, out, bool(bf16), counts[0])
    return _total(counts), crc_of(out, crc)


@jit
def _decode(codes, out, mode, bf16):
    for i in range(cuda.grid(1), codes.size, cuda.gridsize(1)):
        v = _value(codes[i], bf16)
        if mode == SET:
            out[i] = v
        elif mode == SUB:
            out[i] -= v
        else:
            out[i] += v


def half_decode(codes, out, mode, bf16, crc=-1):
    """``out (=|+=|-=) value(codes)`` (fp16 or bf16 codes, float32/float64 ``out``).  Returns -1:
    the CPU twin's checksum of the codes is not formed here (a device frame's CRC-32C is
    verified on the device when it is parsed: codec.devframe)."""
    if codes.size:
        _decode[launch(codes.size)](codes, out, mode, bool(bf16))
    return -1


def narrow_codes_segments(out, addrs, starts, like, bf16, crc=-1):
    """:func:`narrow_codes` of many tensors, tensor ``t`` the device array of ``like``'s dtype
    at device address ``addrs[t]`` and its codes ``out[starts[t]:starts[t+1]]``, one launch per
    tensor; ``(non-finite count, crc)``, the CRC-32C continued over ``out`` in order."""
    bad = 0
    for _, lo, hi, x in views_at(addrs, starts, like):
        k, crc = narrow_codes(x, out[lo:hi], bf16, crc)
        bad += int(k)
    return bad, crc


def half_decode_segments(codes, addrs, starts, like, mode, bf16, crc=-1):
    """:func:`half_decode` of many tensors' codes end to end, tensor ``t``'s into the device
    array of ``like``'s dtype at device address ``addrs[t]`` (host int64 arrays ``addrs`` and
    ``starts``), one launch per tensor.  Returns -1, as ``half_decode``.  Needs a real
    device: the simulator cannot view an address (CodecTypeError)."""
    for _, lo, hi, out in views_at(addrs, starts, like):
        half_decode(codes[lo:hi], out, mode, bf16)
    return -1


@jit
def _combine(src, out, mode):
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        if mode == SET:
            out[i] = src[i]
        elif mode == SUB:
            out[i] -= src[i]
        else:
            out[i] += src[i]


def combine(src, out, mode):
    """``out (=|+=|-=) src`` elementwise, cast to ``out``'s dtype."""
    if src.size:
        _combine[launch(src.size)](src, out, mode)


@jit
def _add(x, r, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = x[i] + r[i]


def add(x, r, out):
    """``out = x + r`` elementwise in the arrays' dtype (float16 too), one pass."""
    if x.size:
        _add[launch(x.size)](x, r, out)


@jit
def _combine_odd(src, out, mode):
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        s = np.float64(src[i])
        out[i] = _sum_odd(np.float64(out[i]), -s if mode == SUB else s)


def combine_odd(src, out, mode):
    """``out (+|-)= src``, the float64 sum rounded to odd, then cast to ``out``."""
    if src.size:
        _combine_odd[launch(src.size)](src, out, mode)


@jit
def _half_combine(src, codes, mode, bf16):
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        s = np.float64(src[i])
        codes[i] = _code(_sum_odd(np.float64(_value(codes[i], bf16)), -s if mode == SUB else s), bf16)


def half_combine(src, codes, mode, bf16):
    """16-bit output in place: ``codes = round(value(codes) (+|-) src)``, rounded once."""
    if src.size:
        _half_combine[launch(src.size)](src, codes, mode, bool(bf16))


@jit
def _feedback(x, r, acc, codes, bf16, bad):
    k = np.int64(0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        a = np.float32(x[i] + r[i])
        h = _f32_to_bf16_bits(a.view(np.uint32)) if bf16 else _f32_to_f16_bits(a.view(np.uint32))
        codes[i] = h
        acc[i] = a - _value(h, bf16)
        k += not (a - a == 0)
    _block_count(k, bad)


def half_feedback(x, r, acc, codes, bf16, crc):
    """Fused error-feedback step into fp16/bf16 codes, float32 only: ``a = x + r``, ``codes =
    round(a)``, ``acc = a - value(codes)``; returns ``(non-finite count of x + r, crc)``,
    ``crc`` as for :func:`narrow_codes`."""
    if not x.size:
        return 0, -1 if crc < 0 else int(crc)
    shape = launch(x.size)
    counts = _counts(shape[0])
    _feedback[shape](x, r, acc, codes, bool(bf16), counts[0])
    return _total(counts), crc_of(codes, crc)


@jit
def _momentum64(u, m, x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = mul(u[i], m) + x[i]


@jit
def _momentum32(u, m, x, out):  # (its own kernel: a float64 product in a shared one would round the sum twice)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = mul32(u[i], m) + x[i]


@jit
def _momentum16(u, m, x, out):
    """float16: the float32 product of two float16 values is exact, so its cast rounds once;
    the float32 sum of two float16 values then cast rounds as one float16 sum would (float32
    has 24 bits, at least 2 x 11 + 2: the double rounding is innocuous), as NumPy's float16
    operations round."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        p = np.float16(np.float32(u[i]) * np.float32(m))
        out[i] = np.float16(np.float32(p) + np.float32(x[i]))


def momentum(u, m, x, out):
    """``out = u * m + x``, the product rounded before the sum (never fused); float16 arrays
    too, as NumPy's two float16 operations give it (the CPU kernel takes float32/float64)."""
    if x.size:
        dt = np.dtype(x.dtype)
        (_momentum64 if dt == np.float64 else _momentum16 if dt == np.float16 else _momentum32)[launch(x.size)](u, m, x, out)


@jit
def _scale(x, starts, factors, out):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = mul(np.float64(x[i]), factors[owner(starts, i)])


def scale(x, starts, factors, out):
    """The CPU kernel's ``scale``: a thread per value, its segment's factor found by a binary
    search of ``starts`` (host or device arrays)."""
    if out.size:
        _scale[launch(out.size)](x, _common.dev(starts), _common.dev(factors), out)


@jit
def _divide(x, d, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = x[i] / d


def divide(x, d, out):
    """The CPU kernel's ``divide``: ``out = x / d`` in ``x``'s dtype, a division (IEEE, correctly
    rounded on the device as on the host), never a product by ``1 / d``."""
    if x.size:
        _divide[launch(x.size)](x, np.dtype(x.dtype).type(d), out)
