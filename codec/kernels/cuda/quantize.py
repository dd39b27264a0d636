"""CUDA twin of ``codec/kernels/cpu/quantize.py``: the custom floats (rangefloat, fp8), the
per-tensor moments, TernGrad's trits and the sign bits, with the CPU file's names,
arguments and results, byte for byte.

* A value's code is the CPU file's own scalar rule (``_minifloat``, ``_minifloat_value``,
  ``_pow2``, ``floor_plus``, ``saturated``), compiled again as device functions, and its
  random bits the ``rng`` twin's, drawn by value index: one thread per value (grid-stride
  loops), so no result depends on the launch shape.  A non-finite value adds one to its work
  unit's count with an atomic add (counts are integers: any order gives the same).
* Maxima (``absmax_units``, ``tensor_moments``' ``top``): one block per work unit, a
  block-wide maximum of the magnitude bits (exact in any order).
* Sums (``tensor_moments``, ``sign_encode``): one block per ``CHUNK``-value chunk, in the CPU's
  column lanes (each lane its rows in order, then the lanes in order, then the tail), as
  ``_common.chunk_sums``; squares through ``_common.mul`` (never fused).
* CRC-32C: asked for one (``crc >= 0``), the encoders form it over their codes on the device
  (``_crc.crc32c``) and return it, as the ``convert`` twin does.

Small arrays (windows, per-unit counts and maxima, sums, streams, offsets) may be host
arrays: inputs are moved in (``_common.dev``), outputs come back once the kernels ran
(``_common.Results``: a few numbers per block of values); ``x``, the residuals and the
codes are device arrays (codes may also be a host array, the frame's own bytes).
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import device_functions, jit, numba_cuda
from codec.kernels.cpu import _common as _cpu_common, quantize as _cpu
from codec.kernels.cuda import _common
from codec.kernels.cuda._common import MAX_WIDTH, THREADS, Results, block_max, check_width, chunk_sums, dev, launch, mul, nothing, owner, per_unit
from codec.kernels.cuda._crc import crc_of
from codec.kernels.cuda.rng import bits32, block_key, uniform
from codec.layout import CHUNK, TO_UNIT

cuda = numba_cuda()

__all__ = list(_cpu.__all__)

#: the shared rules (``_common``'s) first, then this file's, which call them
_shared = device_functions(_cpu_common, ["floor_plus", "top_of", "saturated", "bits_of"], extra=_common.MATH)
_twins = device_functions(_cpu, ["_unit", "_pow2", "_minifloat", "_minifloat_value"], extra={**_common.MATH, **_shared})
floor_plus, saturated, bits_of = _shared["floor_plus"], _shared["saturated"], _shared["bits_of"]
_unit, _pow2, _minifloat, _minifloat_value = (_twins[k] for k in ("_unit", "_pow2", "_minifloat", "_minifloat_value"))

U = np.uint64


# ---------------------------------------------------------------------------- maxima
@jit(device=True)
def _unit_max(bits, lo, hi, mask, x, r, serial, tmp):
    """The largest ``bits & mask`` over ``[lo, hi)`` by the unit's thread (``serial``) or block
    (every thread gets it); with a non-empty ``r``, of the bits of ``x + r`` instead (formed
    in the loop, written nowhere)."""
    form = r.size > 0
    is64 = x.itemsize == 8
    first, step = (lo, 1) if serial else (lo + cuda.threadIdx.x, cuda.blockDim.x)
    m = U(0)
    for i in range(first, hi, step):
        b = U(bits_of(x[i] + r[i], is64)) if form else U(bits[i])
        m = max(m, b & U(mask))
    return m if serial else block_max(m, tmp)


@jit
def _absmax_units(bits, block, upb, mask, top, x, r, serial):
    """``top[u] = max(bits & mask)`` over work unit ``u``, a block per unit (or a thread per
    unit: ``serial``); with a non-empty ``r``, of the bits of ``x + r`` (``bits`` unused)."""
    tmp = cuda.shared.array(THREADS, np.uint64)
    n = x.size if r.size > 0 else bits.size
    u0, ustep = (cuda.grid(1), cuda.gridsize(1)) if serial else (cuda.blockIdx.x, cuda.gridDim.x)
    for u in range(u0, top.size, ustep):
        _, lo, hi = _unit(u, block, upb, n)
        m = _unit_max(bits, lo, hi, mask, x, r, serial, tmp)
        if serial or cuda.threadIdx.x == 0:
            top[u] = m


def _unit_shape(units: int, block: int):
    """A thread per unit for windows of at most ``_common.SERIAL_UNIT`` values, else a block per unit."""
    serial = block <= _common.SERIAL_UNIT
    return (launch(units) if serial else per_unit(units)), serial


def absmax_units(bits, block, upb, mask, top):
    """``top[u] = max(bits & mask)`` over work unit ``u`` (see the CPU kernel)."""
    out = Results()
    t = out(top)
    if t.size:
        none = nothing(np.float32 if np.dtype(bits.dtype).itemsize == 4 else np.float64)
        shape, serial = _unit_shape(t.size, block)
        _absmax_units[shape](bits, block, upb, mask, t, none, none, serial)
    out.done()


def feedback_absmax_units(x, r, block, upb, mask, top):
    """:func:`absmax_units` of ``x + r``, written nowhere (see the CPU kernel)."""
    out = Results()
    t = out(top)
    if t.size:
        shape, serial = _unit_shape(t.size, block)
        _absmax_units[shape](nothing(np.uint32 if np.dtype(x.dtype).itemsize == 4 else np.uint64), block, upb, mask, t, x, r, serial)
    out.done()


@jit
def _absmax_units_segments(bits, starts, blocks, ustarts, mask, top, serial):
    tmp = cuda.shared.array(THREADS, np.uint64)
    none = bits[:0]
    g0, gstep = (cuda.grid(1), cuda.gridsize(1)) if serial else (cuda.blockIdx.x, cuda.gridDim.x)
    for g in range(g0, top.size, gstep):
        t = owner(ustarts, g)
        block = blocks[t]
        upb = (block + CHUNK - 1) // CHUNK
        _, lo, hi = _unit(g - ustarts[t], block, upb, starts[t + 1] - starts[t])
        m = _unit_max(bits, starts[t] + lo, starts[t] + hi, mask, none, none, serial, tmp)
        if serial or cuda.threadIdx.x == 0:
            top[g] = m


def absmax_units_segments(bits, starts, blocks, ustarts, mask, top):
    """:func:`absmax_units` of a many-tensor run (see the CPU kernel)."""
    out = Results()
    t = out(top)
    if t.size:
        shape, serial = _unit_shape(t.size, int(np.max(blocks)) if len(blocks) else 0)
        _absmax_units_segments[shape](bits, dev(starts), dev(blocks), dev(ustarts), mask, t, serial)
    out.done()


# ---------------------------------------------------------------------------- custom floats
@jit(device=True)
def _mini_code(v, e, m, maxmag, signpos, stochastic, strm, i):
    """The code of float64 ``v`` (already scaled into range) in the window of exponent ``e``
    (``emin`` plus any rescaling), value index ``i`` drawing its random bits: the CPU's
    ``_minifloat_unit`` for one value.  Returns ``(code, off, step)`` for its value."""
    thr = _pow2(e)
    sub_scale = _pow2(m - e)
    off = U(e + 1022) << U(m)
    step = _pow2(e - m)
    if stochastic:
        r = bits32(block_key(strm, i), i)
        c = _minifloat(v, m, thr, sub_scale, off, maxmag, signpos, U(r) << U(20 - m), mul(np.float64(r), TO_UNIT))
    else:
        half = (U(1) << U(51 - m)) - U(1)
        odd0 = U(m == 0)
        ab = np.float64(abs(v)).view(np.uint64)
        c = _minifloat(v, m, thr, sub_scale, off, maxmag, signpos, half + (((ab >> U(52 - m)) & U(1)) | odd0), -1.0)
    return c, off, step


@jit
def _minifloat_encode(x, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, bad, sub, r):
    """One thread per value; ``r`` non-empty: the fused error-feedback step, the codes of
    ``x + r`` and ``sub = x + r - decoded`` (as the CPU's ``_minifloat_unit``)."""
    fused = r.size > 0
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        b = i // block
        u = b * upb + (i - b * block) // CHUNK
        xi = x[i] + r[i] if fused else x[i]
        k = max(0, -1000 - emin[b])
        v = mul(np.float64(xi), _pow2(k))
        if not (v - v == 0):
            cuda.atomic.add(bad, u, 1)
        c, off, step = _mini_code(v, emin[b] + k, m, maxmag, signpos, stochastic, strm, i)
        codes[i] = c
        if fused:
            sub[i] = xi - sub.dtype.type(saturated(_minifloat_value(c, v, m, signpos, off, step), sub))


def minifloat_encode(x, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, bad, crc=-1):
    """Codes of ``x`` in the windows ``emin`` (see the CPU kernel).  Returns the codes'
    CRC-32C continued from ``crc`` (-1 when ``crc < 0``)."""
    return _mini(x, None, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, bad, None, crc)


def feedback_minifloat_encode(x, r, acc, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, bad, crc=-1):
    """The whole error-feedback step in one pass: each ``x + r`` coded where it is read, and
    ``acc = x + r - decoded`` written once (see the CPU kernel)."""
    return _mini(x, r, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, bad, acc, crc)


def _mini(x, r, block, upb, emin, m, maxmag, signpos, stochastic, strm, codes, bad, sub, crc):
    out = Results()
    c, nb = out(codes), out(bad, zeroed=True)
    if x.size:
        none = nothing(x.dtype)
        _minifloat_encode[launch(x.size)](
            x, block, upb, dev(emin), m, maxmag, signpos, bool(stochastic), U(strm), c, nb,
            none if sub is None else sub, none if r is None else r,
        )
    got = crc_of(c, crc)
    out.done()
    return got


@jit
def _minifloat_encode_segments(x, starts, blocks, bstarts, emin, m, maxmag, signpos, stochastic, strms, codes, bad):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        t = owner(starts, i)
        j = i - starts[t]
        e = emin[bstarts[t] + j // blocks[t]]
        k = max(0, -1000 - e)
        v = mul(np.float64(x[i]), _pow2(k))
        if not (v - v == 0):
            cuda.atomic.add(bad, t, 1)
        c, _, _ = _mini_code(v, e + k, m, maxmag, signpos, stochastic, strms[t], j)
        codes[i] = c


def minifloat_encode_segments(x, starts, blocks, bstarts, emin, m, maxmag, signpos, stochastic, strms, codes, bad):
    """:func:`minifloat_encode` of a many-tensor run (see the CPU kernel)."""
    out = Results()
    c, nb = out(codes), out(bad, zeroed=True)
    if x.size:
        _minifloat_encode_segments[launch(x.size)](
            x, dev(starts), dev(blocks), dev(bstarts), dev(emin), m, maxmag, signpos, bool(stochastic), dev(np.asarray(strms, np.uint64)), c, nb
        )
    out.done()


# ---------------------------------------------------------------------------- per tensor
@jit
def _tensor_moments(x, bits, mask, shift, width, sums, top):
    tmp = cuda.shared.array(THREADS, np.uint64)
    n = x.size
    for c in range(cuda.blockIdx.x, top.size, cuda.gridDim.x):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        s, q = chunk_sums(x, lo, hi, shift, width)
        m = U(0)
        for i in range(lo + cuda.threadIdx.x, hi, cuda.blockDim.x):
            m = max(m, U(bits[i] & mask))
        m = block_max(m, tmp)
        if cuda.threadIdx.x == 0:
            sums[c, 0] = s
            sums[c, 1] = q
            top[c] = m


def tensor_moments(x, bits, mask, shift, width, sums, top):
    """Per chunk: the lane sums of ``v - shift`` and of its squares, and the largest magnitude's bits."""
    check_width(width)
    out = Results()
    s, t = out(sums), out(top)
    if t.size:
        _tensor_moments[per_unit(t.size)](x, bits, mask, np.float64(shift), width, s, t)
    out.done()


@jit
def _terngrad(x, clip, s, strm, out):
    n = x.size
    for j in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        byte = 0
        w = 1
        for t in range(5):
            i = 5 * j + t
            if i < n:
                v = np.float64(x[i])
                p = abs(min(max(v, -clip), clip)) / s if s > 0 else 0.0
                b = floor_plus(p, uniform(block_key(strm, i), i))
                byte += w * np.int64(b) * (2 if v < 0 else 1)
            w *= 3
        out[j] = np.uint8(byte)


def terngrad_encode(x, clip, s, strm, out):
    """TernGrad's trits, five per byte (see the CPU kernel)."""
    res = Results()
    o = res(out)
    if x.size:
        _terngrad[launch(o.size)](x, np.float64(clip), np.float64(s), U(strm), o)
    res.done()


@jit
def _sign_sums(x, width, sums, nneg, bad):
    """One block per chunk: the CPU's three lane sums (|v|, the negative v, the others), the
    negative count and the non-finite count."""
    ca = cuda.shared.array(MAX_WIDTH, np.float64)
    cn = cuda.shared.array(MAX_WIDTH, np.float64)
    cp = cuda.shared.array(MAX_WIDTH, np.float64)
    counts = cuda.shared.array(2, np.int64)
    n = x.size
    t = cuda.threadIdx.x
    for c in range(cuda.blockIdx.x, nneg.size, cuda.gridDim.x):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        rows = (hi - lo) // width
        if t == 0:
            counts[0] = 0
            counts[1] = 0
        cuda.syncthreads()
        neg = 0
        k = 0
        for col in range(t, width, cuda.blockDim.x):
            a = 0.0
            sn = 0.0
            sp = 0.0
            for row in range(rows):
                v = np.float64(x[lo + row * width + col])
                a += abs(v)
                sn += v if v < 0 else 0.0
                sp += 0.0 if v < 0 else v
                neg += v < 0
                k += not (v - v == 0)
            ca[col] = a
            cn[col] = sn
            cp[col] = sp
        if neg:
            cuda.atomic.add(counts, 0, neg)
        if k:
            cuda.atomic.add(counts, 1, k)
        cuda.syncthreads()
        if t == 0:
            a = 0.0
            sn = 0.0
            sp = 0.0
            for col in range(width):
                a += ca[col]
                sn += cn[col]
                sp += cp[col]
            neg = counts[0]
            k = counts[1]
            for i in range(lo + rows * width, hi):
                v = np.float64(x[i])
                a += abs(v)
                sn += v if v < 0 else 0.0
                sp += 0.0 if v < 0 else v
                neg += v < 0
                k += not (v - v == 0)
            sums[c, 0] = a
            sums[c, 1] = sn
            sums[c, 2] = sp
            nneg[c] = neg
            bad[c] = k
        cuda.syncthreads()


@jit
def _sign_bits(x, out):
    n = x.size
    for j in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        byte = 0
        for bit in range(8):
            i = 8 * j + bit
            if i < n and x[i] < 0:
                byte |= 1 << bit
        out[j] = np.uint8(byte)


def sign_encode(x, out, width, sums, nneg, bad):
    """One bit per value (1 for ``v < 0``), and per chunk the sums and counts (see the CPU kernel)."""
    check_width(width)
    res = Results()
    o, s, ng, nb = res(out), res(sums), res(nneg), res(bad)
    if x.size:
        _sign_sums[per_unit(ng.size)](x, width, s, ng, nb)
        _sign_bits[launch(o.size)](x, o)
    res.done()
