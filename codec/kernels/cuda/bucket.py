"""CUDA twin of ``codec/kernels/cpu/bucket.py``: QSGD and min-max, with the CPU file's names,
arguments and results, byte for byte.

One block per bucket (grid-stride over buckets beyond MAX_BLOCKS), or one thread per bucket
for short buckets (QSGD: no longer than the ``width`` lanes, whose sum then is the plain sum
in index order; min-max: at most ``_common.SERIAL_UNIT`` values), where a block's barriers would
cost more than the bucket's loop: under error feedback the bucket's thread or block first
forms ``acc = x + r`` over it, then takes its statistic and codes it, while it is in cache,
as the CPU's bucket loop does.

* QSGD's norm: the CPU's lane sums of squares (``width`` column lanes per ``CHUNK``-value
  piece, each lane its rows in order, then the lanes in order and the tail, pieces added in
  order), by one block (:func:`_sumsq`), squares through ``_common.mul``; the CPU's rescue
  of a sum that overflows or may have lost terms to underflow, on the values times ``2**-E``,
  the same.  Thread 0 then rounds the norm up to float32 and shares the scale.
* Min-max: a block-wide minimum and maximum of the integer keys of the bits (exact in any
  order), thread 0 forming the bounds.
* Codes: one thread per value, its random bits the ``rng`` twin's by value index; a code's
  value ``code * step + lo`` is formed with the product rounded on its own (``mul``: NVVM
  would fuse it with the sum, the CPU does not).

A non-finite count goes to its bucket group (``group_buckets``) or tensor by an atomic add.
Asked for a CRC-32C (``crc >= 0``), ``minmax_encode`` forms it over its codes on the device.
Small arrays (norms, bounds, counts, streams, offsets) may be host arrays: inputs are moved
in, outputs copied back once the kernels ran (``_common.dev``, ``_common.Results``).
"""

from __future__ import annotations

import math

import numpy as np

from codec._cuda_jit import device_functions, jit, numba_cuda
from codec.kernels.cpu import _common as _cpu_common, bucket as _cpu
from codec.kernels.cuda import _common
from codec.kernels.cuda._common import MAX_WIDTH, THREADS, Results, check_width, dev, launch, mul, nothing, owner, per_unit, rint
from codec.kernels.cuda._crc import crc_of
from codec.kernels.cuda.rng import block_key, uniform
from codec.layout import CHUNK, group_buckets

cuda = numba_cuda()

__all__ = list(_cpu.__all__)

_shared = device_functions(_cpu_common, ["floor_plus", "top_of", "saturated"], extra=_common.MATH)
floor_plus, saturated = _shared["floor_plus"], _shared["saturated"]

U = np.uint64
#: shared int64 keys of a block's minimum and maximum (min-max's bounds)
KEYS = 2 * THREADS


@jit(device=True)
def _next32(f, up):
    """The float32 next to finite ``f`` towards +inf (``up``) or -inf, as ``np.nextafter``."""
    b = np.int64(np.float32(f).view(np.int32))
    if f == 0:
        b = 1 if up else -2147483647  # the smallest subnormal, of that sign
    elif (f > 0) == up:
        b += 1
    else:
        b -= 1
    return np.int32(b).view(np.float32)


@jit(device=True)
def _up32(v):
    """``v`` (finite, >= 0) rounded up to float32, as float64 (the CPU's ``_up32``)."""
    f = np.float32(v)
    if np.float64(f) < v:
        f = _next32(f, True)
    return np.float64(f)


@jit(device=True)
def _down32(v):
    """``v`` (finite) rounded down to float32, as float64 (the CPU's ``_down32``)."""
    f = np.float32(v)
    if np.float64(f) > v:
        f = _next32(f, False)
    return np.float64(f)


#: the CPU file's rules, compiled from their source (``_bounds`` calling the float32 steps above)
_twins = device_functions(_cpu, ["_key", "_key_value", "_exponent", "_bounds"], extra={**_common.MATH, **_shared, "_up32": _up32, "_down32": _down32})
_key, _bounds, exponent = _twins["_key"], _twins["_bounds"], _twins["_exponent"]


@jit(device=True)
def _round(t, stochastic, strm, i):
    """``t >= 0`` rounded to an integer-valued float64: half to even, or ``floor(t + u_i)``."""
    if stochastic:
        return floor_plus(t, uniform(block_key(strm, i), i))
    return rint(t)


@jit(device=True)
def _me(serial):
    """``(first, step)`` of this thread's values in a bucket: all of them (``serial``: a thread
    per bucket) or every ``blockDim``-th from its index (a block per bucket)."""
    if serial:
        return 0, 1
    return cuda.threadIdx.x, cuda.blockDim.x


@jit(device=True)
def _sync(serial):
    """A block barrier, except for a thread that codes its bucket alone (``serial`` is the
    same for every thread of a launch, so a block never diverges on it)."""
    if not serial:
        cuda.syncthreads()


@jit(device=True)
def _buckets(serial):
    """``(first, step)`` of the buckets this thread (``serial``) or block codes."""
    if serial:
        return cuda.grid(1), cuda.gridsize(1)
    return cuda.blockIdx.x, cuda.gridDim.x


@jit(device=True)
def _form(x, r, acc, lo, hi, serial):
    """``acc[lo:hi] = x + r`` by the bucket's thread or block, then a barrier."""
    t, step = _me(serial)
    for i in range(lo + t, hi, step):
        acc[i] = x[i] + r[i]
    _sync(serial)


@jit(device=True)
def _sumsq(x, lo, hi, width, e, lanes, share):
    """The CPU's ``_sumsq`` by a block: the float64 sum of squares of ``x[lo:hi] * 2**e`` in
    ``width`` column lanes (lanes in order, then the tail) and the NaN/inf count, every
    thread getting them (``share``: three float64 of shared memory)."""
    t = cuda.threadIdx.x
    if t == 0:
        share[2] = 0.0
    cuda.syncthreads()
    rows = (hi - lo) // width
    k = 0
    for col in range(t, width, cuda.blockDim.x):
        q = 0.0
        for row in range(rows):
            v = np.float64(x[lo + row * width + col])
            v = math.ldexp(v, int(e)) if e != 0 else v
            q += mul(v, v)
            k += not (v - v == 0)
        lanes[col] = q
    if k:
        cuda.atomic.add(share, 2, np.float64(k))  # (a count, exact in float64)
    cuda.syncthreads()
    if t == 0:
        q = 0.0
        for col in range(width):
            q += lanes[col]
        for i in range(lo + rows * width, hi):
            v = np.float64(x[i])
            v = math.ldexp(v, int(e)) if e != 0 else v
            q += mul(v, v)
            share[2] += not (v - v == 0)
        share[0] = q
    cuda.syncthreads()
    q = share[0]
    k = np.int64(share[2])
    cuda.syncthreads()
    return q, k


@jit(device=True)
def _norm(x, lo, hi, width, lanes, share):
    """The CPU's ``_norm`` of ``x[lo:hi]`` by a block: ``(norm, NaN/inf count)``, every thread
    getting them: the lane sums of squares of each ``CHUNK``-value piece, added in order,
    and where that sum overflows or may have lost terms to underflow, the same on the values
    times ``2**-E`` (``E = floor(log2 max|v|)``, the maximum taken by thread 0), scaled back."""
    q = 0.0
    k = 0
    for c in range(lo, hi, CHUNK):
        qc, kc = _sumsq(x, c, min(hi, c + CHUNK), width, 0, lanes, share)
        q += qc
        k += kc
    if k or (q >= 2.0**-960 and q < np.inf):
        return math.sqrt(q), k
    if cuda.threadIdx.x == 0:
        m = 0.0
        for i in range(lo, hi):
            m = max(m, abs(np.float64(x[i])))
        share[1] = m
    cuda.syncthreads()
    top = share[1]
    cuda.syncthreads()
    if top == 0.0:
        return 0.0, k
    e = exponent(top)
    s = 0.0
    for c in range(lo, hi, CHUNK):
        s += _sumsq(x, c, min(hi, c + CHUNK), width, -e, lanes, share)[0]
    return math.ldexp(math.sqrt(s), int(e)), k


@jit(device=True)
def _sumsq_serial(x, lo, hi, e):
    """:func:`_sumsq` of a bucket no longer than the lanes (``hi - lo <= width``), by one
    thread: one row at most, so the lane sum is the plain sum in index order."""
    q = 0.0
    k = 0
    for i in range(lo, hi):
        v = np.float64(x[i])
        v = math.ldexp(v, int(e)) if e != 0 else v
        q += mul(v, v)
        k += not (v - v == 0)
    return q, k


@jit(device=True)
def _norm_serial(x, lo, hi):
    """:func:`_norm` of a bucket no longer than the lanes, by one thread."""
    q, k = _sumsq_serial(x, lo, hi, 0)
    if k or (q >= 2.0**-960 and q < np.inf):
        return math.sqrt(q), k
    top = 0.0
    for i in range(lo, hi):
        top = max(top, abs(np.float64(x[i])))
    if top == 0.0:
        return 0.0, k
    e = exponent(top)
    return math.ldexp(math.sqrt(_sumsq_serial(x, lo, hi, -e)[0]), int(e)), k


@jit(device=True)
def _qsgd_bucket(x, lo, hi, origin, s, stochastic, strm, width, codes, sub, lanes, share, serial):
    """One bucket of QSGD (the CPU's ``_qsgd_bucket``) by a block, or by one thread
    (``serial``, buckets no longer than the lanes): its codes (random bits by value index
    ``i - origin``), and ``(norm, NaN/inf count)``; a non-empty ``sub`` gets each code's value
    subtracted (the fused step)."""
    if serial:
        norm, k = _norm_serial(x, lo, hi)
    else:
        norm, k = _norm(x, lo, hi, width, lanes, share)
    up = _up32(norm)
    norm = up if up < np.inf else norm
    scale = s / norm if norm > 0 else 0.0
    fs = np.float64(s)
    t, step = _me(serial)
    for i in range(lo + t, hi, step):
        v = np.float64(x[i])
        level = min(_round(mul(abs(v), scale), stochastic, strm, i - origin), fs)
        lv = U(level) if level == level else U(0)
        c = (lv << U(1)) | U((v < 0) & (lv > 0))
        codes[i] = c
        if sub.size and not k:
            q = np.float64(c >> U(1)) / fs
            sub[i] -= sub.dtype.type(saturated(mul(-q if c & U(1) else q, norm), sub))
    _sync(serial)
    return norm, k


@jit
def _qsgd_encode(x, bucket, s, stochastic, strm, width, norms, codes, bad, per, r, acc, serial):
    lanes = cuda.shared.array(MAX_WIDTH, np.float64)
    share = cuda.shared.array(3, np.float64)
    fused = r.size > 0
    n = x.size
    b0, bstep = _buckets(serial)
    for b in range(b0, norms.size, bstep):
        lo = b * bucket
        hi = min(n, lo + bucket)
        if fused:  # acc = x + r, then coded, left holding acc - decoded (acc is empty otherwise)
            _form(x, r, acc, lo, hi, serial)
        norm, k = _qsgd_bucket(acc if fused else x, lo, hi, 0, s, stochastic, strm, width, codes, acc, lanes, share, serial)
        if serial or cuda.threadIdx.x == 0:
            norms[b] = norm
            if k:
                cuda.atomic.add(bad, b // per, k)


def _shape(nb: int, serial: bool):
    """The launch of ``nb`` buckets: a thread each (``serial``) or a block each."""
    return launch(nb) if serial else per_unit(nb)


def qsgd_encode(x, bucket, s, stochastic, strm, width, norms, codes, bad, r=None, acc=None):
    """QSGD: per bucket its norm and codes ``level << 1 | sign`` (see the CPU kernel); with
    ``r`` and ``acc`` the fused error-feedback step.  A bucket no longer than the ``width``
    lanes is coded by one thread, a longer one by a block."""
    check_width(width)
    out = Results()
    nm, c, nb = out(norms), out(codes), out(bad, zeroed=True)
    if x.size:
        none = nothing(x.dtype)
        serial = bucket <= width
        _qsgd_encode[_shape(nm.size, serial)](
            x, bucket, s, bool(stochastic), U(strm), width, nm, c, nb, group_buckets(bucket),
            none if r is None else r, none if acc is None else acc, serial,
        )
    out.done()


@jit
def _qsgd_encode_segments(x, starts, bstarts, bucket, s, stochastic, strms, width, norms, codes, bad, serial):
    lanes = cuda.shared.array(MAX_WIDTH, np.float64)
    share = cuda.shared.array(3, np.float64)
    none = x[:0]
    b0, bstep = _buckets(serial)
    for g in range(b0, norms.size, bstep):
        t = owner(bstarts, g)
        lo = starts[t] + (g - bstarts[t]) * bucket
        hi = min(starts[t + 1], lo + bucket)
        norm, k = _qsgd_bucket(x, lo, hi, starts[t], s, stochastic, strms[t], width, codes, none, lanes, share, serial)
        if serial or cuda.threadIdx.x == 0:
            norms[g] = norm
            if k:
                cuda.atomic.add(bad, t, k)


def qsgd_encode_segments(x, starts, bstarts, bucket, s, stochastic, strms, width, norms, codes, bad):
    """:func:`qsgd_encode` of a many-tensor run (see the CPU kernel)."""
    check_width(width)
    out = Results()
    nm, c, nb = out(norms), out(codes), out(bad, zeroed=True)
    if nm.size:
        serial = bucket <= width
        _qsgd_encode_segments[_shape(nm.size, serial)](
            x, dev(starts), dev(bstarts), bucket, s, bool(stochastic), dev(np.asarray(strms, np.uint64)), width, nm, c, nb, serial
        )
    out.done()


@jit(device=True)
def _minmax_bucket(x, ibits, lo, hi, origin, low, inf, is64, levels, stochastic, strm, codes, sub, keys, serial):
    """One bucket of min-max (the CPU's ``_minmax_bucket``) by a block, or by one thread
    (``serial``): its codes, and ``(min, max, non-finite)``; a non-empty ``sub`` gets each
    code's value subtracted."""
    t, step = _me(serial)
    kmin = _key(ibits[lo], low)
    kmax = kmin
    for i in range(lo + t, hi, step):
        kk = _key(ibits[i], low)
        kmin = min(kmin, kk)
        kmax = max(kmax, kk)
    if not serial:
        keys[t] = kmin
        keys[step + t] = kmax
        cuda.syncthreads()
        if t == 0:
            for j in range(1, step):
                kmin = min(kmin, keys[j])
                kmax = max(kmax, keys[step + j])
            keys[0] = kmin
            keys[1] = kmax
        cuda.syncthreads()
        kmin = keys[0]
        kmax = keys[1]
        cuda.syncthreads()
    mn, mx, nbad = _bounds(kmin, kmax, low, inf, is64)
    inv = levels / (mx - mn) if mx > mn else 0.0
    width = (mx - mn) / levels
    for i in range(lo + t, hi, step):
        tt = _round(mul(np.float64(x[i]) - mn, inv), stochastic, strm, i - origin)
        c = np.int32(min(max(tt, 0.0), np.float64(levels)))
        codes[i] = c
        if sub.size:
            sub[i] -= sub.dtype.type(saturated(mul(np.float64(c), width) + mn, sub))
    _sync(serial)
    return mn, mx, nbad


@jit
def _minmax_encode(x, ibits, low, inf, bucket, levels, stochastic, strm, lows, highs, codes, bad, per, r, acc, serial):
    keys = cuda.shared.array(KEYS, np.int64)
    fused = r.size > 0
    is64 = ibits.itemsize == 8
    n = x.size
    b0, bstep = _buckets(serial)
    for b in range(b0, lows.size, bstep):
        lo = b * bucket
        hi = min(n, lo + bucket)
        if fused:  # as in _qsgd_encode
            _form(x, r, acc, lo, hi, serial)
        mn, mx, k = _minmax_bucket(acc if fused else x, ibits, lo, hi, 0, low, inf, is64, levels, stochastic, strm, codes, acc, keys, serial)
        if serial or cuda.threadIdx.x == 0:
            lows[b] = mn
            highs[b] = mx
            if k:
                cuda.atomic.add(bad, b // per, k)


def minmax_encode(x, ibits, low, inf, bucket, levels, stochastic, strm, lows, highs, codes, bad, r=None, acc=None, crc=-1):
    """Min-max: per bucket its bounds and codes (see the CPU kernel); with ``r`` and ``acc`` the
    fused error-feedback step.  Returns the codes' CRC-32C continued from ``crc`` (-1 when
    ``crc < 0``).  Buckets of at most ``_common.SERIAL_UNIT`` values are coded a thread each."""
    out = Results()
    lw, hg, c, nb = out(lows), out(highs), out(codes), out(bad, zeroed=True)
    if x.size:
        none = nothing(x.dtype)
        serial = bucket <= _common.SERIAL_UNIT
        _minmax_encode[_shape(lw.size, serial)](
            x, ibits, np.int64(low), np.int64(inf), bucket, levels, bool(stochastic), U(strm), lw, hg, c, nb, group_buckets(bucket),
            none if r is None else r, none if acc is None else acc, serial,
        )
    got = crc_of(c, crc)
    out.done()
    return got


@jit
def _minmax_encode_segments(x, ibits, low, inf, starts, bstarts, bucket, levels, stochastic, strms, lows, highs, codes, bad, serial):
    keys = cuda.shared.array(KEYS, np.int64)
    is64 = ibits.itemsize == 8
    none = x[:0]
    b0, bstep = _buckets(serial)
    for g in range(b0, lows.size, bstep):
        t = owner(bstarts, g)
        lo = starts[t] + (g - bstarts[t]) * bucket
        hi = min(starts[t + 1], lo + bucket)
        mn, mx, k = _minmax_bucket(x, ibits, lo, hi, starts[t], low, inf, is64, levels, stochastic, strms[t], codes, none, keys, serial)
        if serial or cuda.threadIdx.x == 0:
            lows[g] = mn
            highs[g] = mx
            if k:
                cuda.atomic.add(bad, t, k)


def minmax_encode_segments(x, ibits, low, inf, starts, bstarts, bucket, levels, stochastic, strms, lows, highs, codes, bad):
    """:func:`minmax_encode` of a many-tensor run (see the CPU kernel)."""
    out = Results()
    lw, hg, c, nb = out(lows), out(highs), out(codes), out(bad, zeroed=True)
    if lw.size:
        serial = bucket <= _common.SERIAL_UNIT
        _minmax_encode_segments[_shape(lw.size, serial)](
            x, ibits, np.int64(low), np.int64(inf), dev(starts), dev(bstarts), bucket, levels, bool(stochastic), dev(np.asarray(strms, np.uint64)), lw, hg, c, nb, serial
        )
    out.done()
