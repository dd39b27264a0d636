"""Plain NumPy references for the quantizers of docs/codecs.md ("Quantizers (value stages)").

Each function follows the numbered semantics of the document literally, favouring the
obviously correct over the fast: no Numba, only NumPy (uint64 arithmetic wraps mod 2**64),
``ml_dtypes`` for the fp8 codes and ``codec.stages.select.randomk.key_hash`` for the key hash.

Every quantizer takes the coded values ``values`` (a flat array in the array's dtype:
float16 / bfloat16 / float32 / float64; after a select stage: the kept values in position
order) and returns a :class:`Coded`:

* ``wide``: the decoded values in float64, before the final rounding;
* ``decoded``: ``wide`` rounded once to the dtype (what ``codec.decode`` must return);
* ``values``: the raw bytes of the frame's ``values`` section (codes, LSB-first);
* ``values_bits`` / ``values_count``: that section's item width and item count
  (``None``: not pinned down by the spec, see the codec);
* ``scalars`` (float64 array or None) and ``scalars_bits`` (32 or 64): the ``scalars`` section;
* ``ints`` (int64 array or None): the ``ints`` section (rangefloat's T, fp8's scale);
* ``payload``: the documented payload size in bytes (``len(frame) - H``).

Readings of points the document leaves open are marked ``READING:`` below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from codec.dtypes import bfloat16
from codec.stages.select.randomk import key_hash
from .sparse import _C1, _C2, mix_int, round_to as _sparse_round_to  # SplitMix64 and the rounding, shared

F16 = np.dtype(np.float16)
BF16 = np.dtype(bfloat16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
MASK64 = (1 << 64) - 1
U64 = np.uint64

#: largest binary exponent of a finite value ("emax" of the dtype)
EMAX = {F16: 15, BF16: 127, F32: 127, F64: 1023}
#: exponent of the dtype's smallest subnormal
SUBEXP = {F16: -24, BF16: -133, F32: -149, F64: -1074}
#: significand bits (implicit one included), exponent of the subnormal quantum, first overflowing magnitude


# ====================================================================== helpers
def wide(x) -> np.ndarray:
    """Flat float64 copy (exact for every supported dtype)."""
    return np.asarray(x).reshape(-1).astype(np.float64)


def check_finite(x) -> None:
    """ValueError naming the first non-finite position (the common rule of every quantizer)."""
    a = np.asarray(x)
    bad = np.flatnonzero(~np.isfinite(wide(a)))
    if bad.size:
        where = tuple(int(v) for v in np.unravel_index(int(bad[0]), a.shape)) if a.ndim else ()
        raise ValueError(f"x: non-finite value at position {where}")


def round_to(x, dtype) -> np.ndarray:
    """float64 ``x`` rounded once (nearest, ties to even) to ``dtype`` (reference.sparse's rounding;
    float32/float64 overflow to inf quietly)."""
    with np.errstate(over="ignore"):
        return _sparse_round_to(x, dtype)


def _next(f: np.ndarray, up: bool) -> np.ndarray:
    """The neighbour of each (finite) ``f`` in its own dtype, towards +inf (``up``) or -inf."""
    f = np.array(f)
    if f.dtype == BF16:  # np.nextafter has no bfloat16 loop: step the bit pattern
        bits = f.view(np.uint16).astype(np.int64)
        neg = (bits & 0x8000) != 0
        mag = bits & 0x7FFF
        away = neg != up  # moving away from zero increments the magnitude
        zero = mag == 0
        mag2 = np.where(away, mag + 1, mag - 1)
        out = np.where(neg, 0x8000, 0) | mag2
        out = np.where(zero, 0x0001 if up else 0x8001, out)
        return out.astype(np.uint16).view(BF16)
    return np.nextafter(f, np.array(np.inf if up else -np.inf, f.dtype))


def round_dir(x, dtype, up: bool) -> np.ndarray:
    """float64 ``x`` rounded up (toward +inf) or down (toward -inf) to ``dtype`` (as a ``dtype``
    array); values beyond the format's range give +-inf."""
    x = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        f = round_to(x, dtype)
        fw = f.astype(np.float64)
        wrong = (fw < x) if up else (fw > x)
        if np.any(wrong & np.isfinite(fw)):
            f = np.where(wrong & np.isfinite(fw), _next(f, up), f).astype(dtype)
        # nearest may give +-inf for values just inside the range: the directed rounding toward
        # zero is the largest finite value
        fw = f.astype(np.float64)
        big = np.isinf(fw) & np.isfinite(x) & ((fw > 0) != up)
        if np.any(big):
            fmax = float(ml_dtypes.finfo(np.dtype(dtype)).max)
            f = np.where(big, np.copysign(fmax, x), f).astype(dtype)
    return f


def fexp(a: np.ndarray) -> np.ndarray:
    """``floor(log2 a)`` exactly, from the float's exponent (``a > 0``; 0 gives a sentinel -10**6)."""
    a = np.asarray(a, np.float64)
    m, e = np.frexp(a)
    return np.where(a > 0, e.astype(np.int64) - 1, -(10**6))


def pack_bits(codes, bits: int) -> bytes:
    """``k`` codes of ``bits`` bits packed LSB-first: ``ceil(k*bits/8)`` bytes (numpy only)."""
    codes = np.asarray(codes, np.uint64).reshape(-1)
    if codes.size == 0:
        return b""
    stream = np.unpackbits(codes.astype("<u8").view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")[:, :bits]
    return np.packbits(stream.reshape(-1), bitorder="little").tobytes()


def unpack_bits(raw: bytes, bits: int, count: int) -> np.ndarray:
    """Inverse of :func:`pack_bits` (int64 codes)."""
    if count == 0:
        return np.zeros(0, np.int64)
    stream = np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")[: count * bits].reshape(count, bits)
    return (stream.astype(np.int64) << np.arange(bits, dtype=np.int64)).sum(axis=1)


def nblocks(k: int, block: int) -> int:
    """``ceil(k/block)``; 1 for ``block=0`` (one block), 0 when ``k=0``."""
    if k == 0:
        return 0
    return 1 if block == 0 else -(-k // block)


def block_ids(k: int, block: int) -> np.ndarray:
    """The block of each coded value (consecutive runs of ``block``; ``block=0``: all in block 0)."""
    return np.zeros(k, np.int64) if block == 0 else np.arange(k, dtype=np.int64) // block


def _block_reduce(ufunc, a: np.ndarray, block: int) -> np.ndarray:
    if a.size == 0:
        return a[:0]
    starts = np.arange(0, a.size, block if block else a.size)
    return ufunc.reduceat(a, starts)


def _scalars32(vals, up: bool) -> tuple[np.ndarray, int]:
    """Per-bucket scalars: each rounded to float32 up (``up``) or down when that is finite,
    else kept as its float64 value; the section is float64 when any was kept (docs/codecs.md,
    QSGD step 1: "stored as float32 rounded up (when that is finite; else the float64 value)").
    Returns (the float64 values of the stored scalars, the section's item width)."""
    vals = np.asarray(vals, np.float64)
    f = round_dir(vals, F32, up).astype(np.float64)
    fits = np.isfinite(f)
    return np.where(fits, f, vals), 32 if fits.all() else 64


# ====================================================================== summation order
#: docs/codecs.md, "Sums": ``lanesum(f, segment)``: per chunk of CHUNK values, LANES
#: column lanes (lane j adds the chunk's values j, j+64, ... in order) over the first
#: 64*floor(len/64) values, the lanes added in order from 0, then the chunk's remaining
#: values in order; the chunk results added in chunk order from 0.
from codec.layout import CHUNK, LANES  # noqa: E402  (the one definition: codec/layout.py)


def lanes_sum(v: np.ndarray, width: int = LANES) -> float:
    """float64 sum of ``v`` in ``width`` column lanes, then the lanes in order, then the tail."""
    v = np.asarray(v, np.float64).reshape(-1)
    rows = v.size // width
    total = 0.0
    if rows:
        cols = np.cumsum(v[: rows * width].reshape(rows, width), axis=0)[-1]  # sequential per lane
        for c in cols.tolist():
            total += c
    for t in v[rows * width :].tolist():
        total += t
    return total


def chunked_sum(v: np.ndarray) -> float:
    """:func:`lanes_sum` per CHUNK values, the chunk sums added in order (from 0.0)."""
    v = np.asarray(v, np.float64).reshape(-1)
    total = 0.0
    for lo in range(0, v.size, CHUNK):
        total += lanes_sum(v[lo : lo + CHUNK])
    return total


def bucket_lanes_sums(w: np.ndarray, bucket: int) -> np.ndarray:
    """:func:`lanes_sum` of every bucket of ``bucket`` consecutive values (vectorised over the
    full buckets; the last, shorter one on its own)."""
    w = np.asarray(w, np.float64).reshape(-1)
    k = w.size
    nfull = k // bucket
    out = np.zeros(-(-k // bucket) if k else 0)
    if nfull:
        full = w[: nfull * bucket].reshape(nfull, bucket)
        rows = bucket // LANES
        tot = np.zeros(nfull)
        if rows:
            cols = np.cumsum(full[:, : rows * LANES].reshape(nfull, rows, LANES), axis=1)[:, -1, :]
            for c in range(LANES):
                tot = tot + cols[:, c]
        for t in range(rows * LANES, bucket):
            tot = tot + full[:, t]
        out[:nfull] = tot
    if k > nfull * bucket:
        out[nfull] = lanes_sum(w[nfull * bucket :])
    return out


# ====================================================================== the random stream


def mix_np(z) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (NumPy wraps uint64 products mod 2**64)."""
    z = np.array(z, np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z ^= z >> U64(30)
        z *= U64(_C1)
        z ^= z >> U64(27)
        z *= U64(_C2)
        z ^= z >> U64(31)
    return z


def stream(seed: int, key, step: int) -> int:
    """``mix(mix(mix(seed) ^ key_hash) ^ step)`` (uint64, as a Python int)."""
    return mix_int(mix_int(mix_int(int(seed)) ^ key_hash(key)) ^ (int(step) & MASK64))


def h32_int(x: int) -> int:
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    x ^= x >> 15
    return x


def random_bits_scalar(k: int, strm: int) -> list[int]:
    """``r_i`` for ``i < k`` with Python ints: the literal text of the document."""
    out = []
    for i in range(k):
        c = mix_int((strm + (i >> 16)) & MASK64)
        out.append(h32_int((c % 2**32 + i % 2**16) % 2**32))
    return out


def random_bits(k: int, strm: int) -> np.ndarray:
    """``r_i`` (uint32) for ``i < k``, vectorised."""
    i = np.arange(k, dtype=np.uint64)
    with np.errstate(over="ignore"):
        c = mix_np(U64(strm) + (i >> U64(16)))
        x = ((c & U64(0xFFFFFFFF)) + (i & U64(0xFFFF))) & U64(0xFFFFFFFF)
        x = x.astype(np.uint32)
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x21F0AAAD)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x735A2D97)
        x ^= x >> np.uint32(15)
    return x


def uniforms(k: int, seed: int, key=None, step: int = 0) -> np.ndarray:
    """``u_i = r_i / 2**32`` (float64, exact) for the ``k`` coded values of one frame."""
    return random_bits(k, stream(seed, key, step)).astype(np.float64) * 2.0**-32


def sround(t: np.ndarray, rounding: str, u: np.ndarray | None) -> np.ndarray:
    """``t >= 0`` to an integer: ``np.rint`` (half to even) or ``floor(t + u_i)`` computed exactly."""
    if rounding == "nearest":
        return np.rint(t)
    return minifloat_round(t, "stochastic", u)


# ====================================================================== result
@dataclass
class Coded:
    wide: np.ndarray
    decoded: np.ndarray
    values: bytes
    values_bits: int | None
    values_count: int | None
    scalars: np.ndarray | None = None
    scalars_bits: int | None = None
    ints: np.ndarray | None = None
    payload: int = 0


def _finish(x, w, values, vbits, vcount, payload, **kw) -> Coded:
    return Coded(w, round_to(w, np.asarray(x).dtype), values, vbits, vcount, payload=payload, **kw)


# ====================================================================== rangefloat
def rangefloat_e(bits: int, exp_bits=None) -> tuple[int, int]:
    """``(e, m)``: exponent and mantissa bits (auto ``e = min(5, bits // 2)``)."""
    e = min(5, bits // 2) if exp_bits in (None, "auto") else int(exp_bits)
    return e, bits - 1 - e


def rangefloat_lut(codes: np.ndarray, m: int, Emin) -> np.ndarray:
    """``lut(code) * 2**Emin``: ``(2**m + f) * 2**(Emin + E - 1 - m)`` for ``E >= 1``,
    ``f * 2**(Emin - m)`` for ``E = 0``, as ONE ldexp (so a float64 result that underflows
    is rounded once, correctly)."""
    codes = np.asarray(codes, np.int64)
    E = codes >> m
    f = codes & ((1 << m) - 1)
    sig = np.where(E > 0, (1 << m) + f, f).astype(np.float64)
    exp = np.where(E > 0, E - 1, 0) - m + np.asarray(Emin, np.int64)
    return np.ldexp(sig, exp.astype(np.int64))


def rangefloat_T(mags: np.ndarray, m: int, dtype) -> int:
    """Step 1: the window's top binade ``T`` of one block (``mags`` = |v| in float64)."""
    dtype = np.dtype(dtype)
    M = float(mags.max()) if mags.size else 0.0
    if M == 0:
        return SUBEXP[dtype]
    frac, e = math.frexp(M)
    T = e - 1
    # M > (2 - 2**-m) * 2**T, compared on the exact significand M / 2**T in [1, 2)
    if 2 * frac > 2 - 2.0**-m and T + 1 <= EMAX[dtype]:
        T += 1
    return T


def rangefloat(values, bits=8, exp_bits=None, block=0, rounding="nearest", seed=0, key=None, step=0) -> Coded:
    """``rangefloat`` on the coded values (docs/codecs.md steps 1-4).

    READING: ``u_i`` is indexed by the value's position among ALL coded values of the frame
    (not within its block).  Step 3's "down to 2**-11 of it; below that they are 0" is
    applied as a cut-off (see :data:`SR_CUTOFF`).
    Decoding computes ``lut(code) * 2**Emin`` as ONE correctly rounded float64 ldexp (the
    common rule: computed by the formula, rounded once).  For a float64 window below
    2**-1000 the document forms it as ``(lut * 2**-K) * 2**(Emin + K)`` (the same value)
    "unless another block of the same frame sits above 2**(1023 - K)"; that exception (a
    frame mixing windows near both ends of float64's range) is not modelled here and not
    tested."""
    x = np.asarray(values).reshape(-1)
    check_finite(x)
    dtype = x.dtype
    v = wide(x)
    k = v.size
    e, m = rangefloat_e(bits, exp_bits)
    nb = nblocks(k, block)
    a = np.abs(v)
    Ts = np.array(
        [rangefloat_T(a[b * block : (b + 1) * block] if block else a, m, dtype) for b in range(nb)], np.int64
    )
    Emin_b = Ts - (1 << e) + 2
    Emin = Emin_b[block_ids(k, block)] if k else np.zeros(0, np.int64)
    ep = np.maximum(fexp(a), Emin)  # e' = max(floor(log2|v|), Emin); 0 takes Emin
    q = np.ldexp(a, (m - ep).astype(np.int64))  # exact (or an underflow far below the window)
    u = uniforms(k, seed, key, step) if rounding == "stochastic" else None
    r = minifloat_round(q, rounding, u)
    top = (1 << (bits - 1)) - 1
    code = np.minimum((ep - Emin) * (1 << m) + r.astype(np.int64), top)
    neg = np.signbit(v)  # the sign is kept for zeros: -0.0 round-trips
    w = rangefloat_lut(code, m, Emin)
    w = np.where(neg, -w, w)
    codes = code | (neg.astype(np.int64) << (bits - 1))
    payload = 2 * nb + (k * bits + 7) // 8
    return _finish(x, w, pack_bits(codes, bits), bits, k, payload, ints=Ts)


#: READING of rangefloat's step 3, "stochastic: to it with the right probability, down to
#: 2**-11 of it; below that they are 0": a scaled significand ``q < 2**-11`` (a value below
#: 2**-11 of the smallest subnormal) becomes 0 whatever ``u_i``.  The document says this of
#: rangefloat only; fp8 ("subnormals as in the spec") is read the same way, both being the
#: same kind of small float.
SR_CUTOFF = None  # the cut-off was dropped: below the smallest subnormal too, floor(q + u) exactly


def minifloat_round(q: np.ndarray, rounding: str, u) -> np.ndarray:
    """The scaled significand ``q >= 0`` of a small float rounded to an integer: nearest even,
    or ``floor(q + u_i)`` computed exactly (``floor(q) + (frac(q) >= 1 - u_i)``: every step
    exact in float64, where ``q + u_i`` itself may round) and 0 below :data:`SR_CUTOFF`."""
    if rounding == "nearest":
        return np.rint(q)
    fl = np.floor(q)
    r = fl + ((q - fl) >= (1.0 - u))
    return r if SR_CUTOFF is None else np.where(q < SR_CUTOFF, 0.0, r)


# ====================================================================== fp8
#: format -> (mantissa bits, smallest normal exponent, largest finite, ml_dtypes type, scale offset)
FP8 = {
    "e4m3": (3, -6, 448.0, ml_dtypes.float8_e4m3fn, 8),
    "e5m2": (2, -14, 57344.0, ml_dtypes.float8_e5m2, 15),
}


def fp8_round(a: np.ndarray, fmt: str, rounding: str, u=None, shift: int = 0) -> np.ndarray:
    """``|v| * 2**-shift`` (``a`` = |v| >= 0, float64) rounded to the fp8 format, saturating at
    the largest finite value; returns the fp8 magnitudes as float64.

    Subnormals as in the OCP spec: ``e' = max(floor(log2 y), emin)``, ``q = y * 2**(m - e')``
    rounded to an integer (nearest even or ``floor(q + u_i)``), value ``r * 2**(e' - m)``;
    ``q`` is formed with one ldexp straight from ``a`` (exact: no intermediate underflow)."""
    m, emin, fmax, _, _ = FP8[fmt]
    ep = np.maximum(fexp(a) - shift, emin)
    q = np.ldexp(a, (m - ep - shift).astype(np.int64))
    r = minifloat_round(q, rounding, u)
    return np.minimum(np.ldexp(r, (ep - m).astype(np.int64)), fmax)


def fp8_scale(a: np.ndarray, fmt: str, dtype, rounding: str) -> int:
    """``s``: ``floor(log2 max|v|) - 8`` (e4m3) or ``- 15`` (e5m2), plus one when
    ``max|v| * 2**-s`` exceeds the largest value and the raised scale keeps decoded values
    finite in the dtype.

    READING: "keeps decoded values finite" = ``2**(floor(log2 max|v|) + 1)`` (the largest
    value the raised scale can decode to: the top of max|v|'s binade) is finite in the
    dtype, i.e. ``floor(log2 max|v|) + 1 <= emax``, as rangefloat's step 1.
    READING: all-zero (or empty) input: ``s = 0`` (the document does not say)."""
    m, emin, fmax, _, off = FP8[fmt]
    M = float(a.max()) if a.size else 0.0
    if M == 0:
        return 0
    T = math.frexp(M)[1] - 1
    s = T - off
    if math.ldexp(M, -s) > fmax and T + 1 <= EMAX[np.dtype(dtype)]:
        s += 1
    return s


def fp8(values, format="e4m3", scale=False, rounding="nearest", seed=0, key=None, step=0) -> Coded:
    """OCP fp8 (saturating), optionally with a per-tensor power-of-two scale.

    READING: the fp8 sign bit is the IEEE one (``signbit``): -0.0 and negative values that
    round to 0 decode as -0.0, as ``ml_dtypes`` gives (rangefloat says so explicitly; fp8
    "matches ml_dtypes for every value in range").
    READING: stochastic rounding is ``floor(q + u_i)`` on the significand scaled to the
    value's binade (subnormal quantum below the normal range), as rangefloat's step 3."""
    x = np.asarray(values).reshape(-1)
    check_finite(x)
    v = wide(x)
    k = v.size
    a = np.abs(v)
    _, _, _, mlt, _ = FP8[format]
    s = fp8_scale(a, format, x.dtype, rounding) if scale else 0
    u = uniforms(k, seed, key, step) if rounding == "stochastic" else None
    mag = fp8_round(a, format, rounding, u, shift=s)
    neg = np.signbit(v)
    f8 = np.where(neg, -mag, mag)
    codes = f8.astype(mlt).view(np.uint8)  # exact: every f8 is representable
    w = np.ldexp(f8, s)  # exact scaling (one rounding in float64 only for float64 subnormals)
    payload = k + (2 if scale and k else 0)  # one int16 per block: none when nothing is coded
    ints = (np.array([s], np.int64) if k else np.zeros(0, np.int64)) if scale else None
    return _finish(x, w, codes.tobytes(), 8, k, payload, ints=ints)


# ====================================================================== qsgd
def qsgd_width(levels: int) -> int:
    return 1 + int(levels).bit_length()


def bucket_sums(w: np.ndarray, bucket: int) -> np.ndarray:
    """``lanesum`` of every bucket (one segment each: chunked within a bucket > CHUNK)."""
    if bucket <= CHUNK:
        return bucket_lanes_sums(w, bucket)
    return np.array([chunked_sum(w[lo : lo + bucket]) for lo in range(0, w.size, bucket)])


def bucket_norms(v: np.ndarray, bucket: int) -> np.ndarray:
    """QSGD step 1: ``sqrt(lanesum(v**2, bucket))``; when that sum is not in
    ``[2**-960, inf)`` and the bucket is not all zero, recomputed on ``v * 2**-E``,
    ``E = floor(log2 max|v|)``, and the root scaled back by ``2**E``."""
    k = v.size
    if k == 0:
        return np.zeros(0)
    a = np.abs(v)
    with np.errstate(over="ignore"):
        ssq = bucket_sums(a * a, bucket)
    norms = np.sqrt(ssq)
    M = _block_reduce(np.maximum, a, bucket)
    redo = ~((ssq >= 2.0**-960) & (ssq < np.inf)) & (M > 0)
    if np.any(redo):
        E = fexp(np.where(M > 0, M, 1.0))
        scaled = np.ldexp(a, -np.repeat(E, bucket)[:k])
        ssq2 = bucket_sums(scaled * scaled, bucket)
        norms = np.where(redo, np.ldexp(np.sqrt(ssq2), E), norms)
    return norms


def qsgd(values, levels=16, bucket=512, rounding="stochastic", seed=0, key=None, step=0) -> Coded:
    """QSGD (steps 1-5).

    READING: ``t_i`` uses the STORED norm (float32 rounded up, or the float64 one), the
    value the decoder multiplies by: rounding up keeps ``t <= s``."""
    x = np.asarray(values).reshape(-1)
    check_finite(x)
    v = wide(x)
    k = v.size
    s = int(levels)
    norms64 = bucket_norms(v, bucket)
    norms, nbits = _scalars32(norms64, True)
    nrm = norms[np.arange(k) // bucket] if k else np.zeros(0)
    a = np.abs(v)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(nrm > 0, a * (s / np.where(nrm > 0, nrm, 1.0)), 0.0)
    u = uniforms(k, seed, key, step) if rounding == "stochastic" else None
    level = np.clip(sround(t, rounding, u), 0, s).astype(np.int64)
    sign = (v < 0) & (level != 0)
    w = (level / s) * nrm
    w = np.where(sign, -w, w)
    width = qsgd_width(s)
    codes = (level << 1) | sign.astype(np.int64)
    payload = (4 if nbits == 32 else 8) * norms.size + (k * width + 7) // 8
    return _finish(x, w, pack_bits(codes, width), width, k, payload, scalars=norms, scalars_bits=nbits)


# ====================================================================== terngrad
def terngrad_sigma(v: np.ndarray) -> float:
    """Step 1: ``d = v - v_0``, ``S = lanesum(d)``, ``Q = lanesum(d**2)``, ``mean = S/k``,
    ``sigma = sqrt(max(0, Q/k - mean**2))``."""
    n = v.size
    if n == 0:
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # 1e300 data: Q is inf, so is sigma
        d = v - v[0]
        mean = chunked_sum(d) / n
        return math.sqrt(max(0.0, chunked_sum(d * d) / n - mean * mean))


def terngrad(values, clip=2.5, seed=0, key=None, step=0, sigma=None) -> Coded:
    """TernGrad (steps 1-5); ``sigma`` overrides step 1 (for tests that take it from elsewhere)."""
    x = np.asarray(values).reshape(-1)
    check_finite(x)
    dtype = x.dtype
    v = wide(x)
    k = v.size
    sig = terngrad_sigma(v) if sigma is None else float(sigma)
    if clip == 0 or sig == 0:
        g = v
    else:
        c = float(clip) * sig
        g = np.minimum(np.maximum(v, -c), c)
    smax = float(np.abs(g).max()) if k else 0.0
    s = float(round_dir(np.float64(smax), dtype, True).astype(np.float64))
    u = uniforms(k, seed, key, step)
    if s > 0:
        b = np.floor(np.abs(g) / s + u)
    else:
        b = np.zeros(k)
    b = np.minimum(b, 1).astype(np.int64)  # |g|/s <= 1, so floor(...) is 0 or 1
    neg = v < 0
    trit = np.where(b == 0, 0, np.where(neg, 2, 1))
    w = np.where(trit == 1, s, np.where(trit == 2, -s, 0.0))
    nbytes = (k + 4) // 5
    pad = np.zeros(nbytes * 5, np.int64)
    pad[:k] = trit
    packed = (pad.reshape(-1, 5) * np.array([1, 3, 9, 27, 81])).sum(axis=1).astype(np.uint8) if nbytes else np.zeros(0, np.uint8)
    return _finish(x, w, packed.tobytes(), None, None, 8 + nbytes, scalars=np.array([s]), scalars_bits=64)


# ====================================================================== sign / efsign
def abs_sum(v: np.ndarray) -> float:
    """``lanesum(|v|)``."""
    return chunked_sum(np.abs(v))


def sign(values, scale="none") -> Coded:
    """signSGD (``scale=none``: +-1) and EF-signSGD (``scale=l1``: +-sum|v|/k rounded to the dtype)."""
    x = np.asarray(values).reshape(-1)
    check_finite(x)
    dtype = x.dtype
    v = wide(x)
    k = v.size
    neg = v < 0  # zero and -0.0 are positive
    if scale == "l1":
        a = float(round_to(np.float64(abs_sum(v) / k if k else 0.0), dtype).astype(np.float64))
    else:
        a = 1.0
    w = np.where(neg, -a, a)
    bits = pack_bits(neg.astype(np.uint64), 1)
    payload = (k + 7) // 8 + (8 if scale == "l1" else 0)
    sc = np.array([a]) if scale == "l1" else None
    return _finish(x, w, bits, 1, k, payload, scalars=sc, scalars_bits=64 if scale == "l1" else None)


def efsign(values) -> Coded:
    return sign(values, scale="l1")


# ====================================================================== onebit
def onebit(values) -> Coded:
    """1-bit SGD: a sign bit each and the two group means.

    The group sums are ``lanesum`` over all values of ``v if v < 0 else 0`` and
    ``0 if v < 0 else v``, divided by the group sizes.
    The scalars section holds ``[mean of the non-negative values, mean of the negative
    values]`` (code order)."""
    x = np.asarray(values).reshape(-1)
    check_finite(x)
    v = wide(x)
    k = v.size
    neg = v < 0
    nneg = int(neg.sum())
    npos = k - nneg
    sn = chunked_sum(np.where(neg, v, 0.0))
    sp = chunked_sum(np.where(neg, 0.0, v))
    means64 = np.array([sp / npos if npos else 0.0, sn / nneg if nneg else 0.0])
    # READING: "does not fit float32" = |mean| > float32's largest value
    if np.all(np.abs(means64) <= float(np.finfo(np.float32).max)):
        means, mbits = means64.astype(np.float32).astype(np.float64), 32
    else:
        means, mbits = means64, 64
    w = np.where(neg, means[1], means[0])
    payload = (8 if mbits == 32 else 16) + (k + 7) // 8
    return _finish(x, w, pack_bits(neg.astype(np.uint64), 1), 1, k, payload, scalars=means, scalars_bits=mbits)


# ====================================================================== minmax
def minmax(values, bits=8, bucket=1024, rounding="nearest", seed=0, key=None, step=0) -> Coded:
    """Min-max uniform quantization per bucket.

    READING: ``step``, ``t`` and the decoded value use the STORED bounds (float32 rounded
    down / up, or float64 when the section is float64), as the decoder must."""
    x = np.asarray(values).reshape(-1)
    check_finite(x)
    v = wide(x)
    k = v.size
    L = (1 << bits) - 1
    lo64 = _block_reduce(np.minimum, v, bucket) if k else np.zeros(0)
    hi64 = _block_reduce(np.maximum, v, bucket) if k else np.zeros(0)
    nb = lo64.size
    # READING: a bucket's bounds are float32 (lo rounded down, hi up) when both roundings are
    # finite, else both keep their float64 values; the section is float64 when any bucket
    # kept them (QSGD's rule, said explicitly there, applied per bucket here)
    lo32 = round_dir(lo64, F32, False).astype(np.float64)
    hi32 = round_dir(hi64, F32, True).astype(np.float64)
    fits = np.isfinite(lo32) & np.isfinite(hi32)
    lo, hi = np.where(fits, lo32, lo64), np.where(fits, hi32, hi64)
    sbits = 32 if fits.all() else 64
    idx = np.arange(k) // bucket
    lo_i, hi_i = lo[idx], hi[idx]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        span = hi_i - lo_i
        stp = span / L
        t = np.where(hi_i == lo_i, 0.0, (v - lo_i) * (L / np.where(span != 0, span, 1.0)))
    u = uniforms(k, seed, key, step) if rounding == "stochastic" else None
    code = np.clip(sround(t, rounding, u), 0, L).astype(np.int64)
    w = lo_i + code * stp
    payload = (8 if sbits == 32 else 16) * nb + (k * bits + 7) // 8
    # READING: the scalars section is all lows, then all highs (the document does not say;
    # tests accept that or (lo, hi) pairs)
    return _finish(x, w, pack_bits(code, bits), bits, k, payload, scalars=np.concatenate([lo, hi]), scalars_bits=sbits)


# ====================================================================== by spec
def parse_spec(spec: str) -> tuple[str, dict]:
    """``name(a=1,b=x)`` -> ("name", {"a": 1, "b": "x"}) (ints, floats, true/false, strings)."""
    name, _, rest = spec.partition("(")
    params = {}
    rest = rest.rstrip(")")
    for item in filter(None, rest.split(",")):
        k_, _, val = item.partition("=")
        val = val.strip()
        if val in ("true", "false"):
            params[k_.strip()] = val == "true"
            continue
        try:
            params[k_.strip()] = int(val)
        except ValueError:
            try:
                params[k_.strip()] = float(val)
            except ValueError:
                params[k_.strip()] = val
    return name.strip(), params


def code(spec: str, values, key=None, step=0) -> Coded:
    """The reference of a value-stage spec (one stage, e.g. ``qsgd(levels=2,bucket=7)``)."""
    name, p = parse_spec(spec)
    ks = dict(key=key, step=step)
    if name == "rangefloat":
        eb = p.get("exp_bits")
        return rangefloat(values, p.get("bits", 8), eb, p.get("block", 0), p.get("rounding", "nearest"), p.get("seed", 0), **ks)
    if name == "fp8":
        return fp8(values, p.get("format", "e4m3"), p.get("scale", False), p.get("rounding", "nearest"), p.get("seed", 0), **ks)
    if name == "qsgd":
        return qsgd(values, p.get("levels", 16), p.get("bucket", 512), p.get("rounding", "stochastic"), p.get("seed", 0), **ks)
    if name == "terngrad":
        return terngrad(values, p.get("clip", 2.5), p.get("seed", 0), **ks)
    if name == "sign":
        return sign(values, p.get("scale", "none"))
    if name == "efsign":
        return efsign(values)
    if name == "onebit":
        return onebit(values)
    if name == "minmax":
        return minmax(values, p.get("bits", 8), p.get("bucket", 1024), p.get("rounding", "nearest"), p.get("seed", 0), **ks)
    raise ValueError(f"no reference for {spec!r}")
