"""The quantization kernels (the ``quantize``, ``bucket`` and ``dequant`` families) and the
random stream (``rng``) against plain NumPy references of their documented contracts, on every
kernel backend (the ``backend`` fixture of tests/conftest.py).

The quantizer stages are checked end to end in test_quant.py; here each kernel is called the
way its stage calls it (read-only inputs, the same argument types) and compared bit for bit
with a vectorised NumPy reference written from docs/codecs.md ("Quantizers (value stages)",
"The random stream") and the kernels' docstrings: random, heavy-tailed and sparse data (with
-0.0), sizes 0, 1, odd, across the 65,536-value chunk and the random stream's 2**16 period,
float32 and float64 input, NaN/inf reporting, serial and parallel twins.
"""

from __future__ import annotations

import types

import ml_dtypes
import numpy as np
import pytest

from codec import layout
from codec._jit import PARALLEL_MIN
from codec.kernels import module
from codec.modes import ADD, SET, SUB
from support.crc import check_kernel_crc
from codec.ops import readonly

CHUNK = 1 << 16  # values per chunk of the sums, the work units and the decoder's chunks
LANES = 64  # column lanes of every float64 sum
TRIT_CHUNK = 65535  # values per chunk of the trit kernels (a multiple of 5)
SIZES = [0, 1, 7, CHUNK - 1, CHUNK + 1, 3 * CHUNK + 17]
DTYPES = [np.float32, np.float64]
KINDS = ["normal", "heavy", "sparse"]
U64 = np.uint64
M32 = U64(0xFFFFFFFF)
BIG = 300_007  # one input per parallel kernel for the twins check (>= PARALLEL_MIN)
#: the kernel families under test
FAMILIES = ("quantize", "bucket", "dequant", "rng")
#: ``K.<family>``: that family's module on the running test's backend (set by :func:`kernels`),
#: so the run_* and check_* helpers below call the same backend as the test
K = types.SimpleNamespace()


@pytest.fixture(autouse=True)
def kernels(backend):
    """Every test here runs once per kernel backend, with ``K`` pointing at its modules."""
    for family in FAMILIES:
        setattr(K, family, module(family, backend))
    yield K
    K.__dict__.clear()


# ====================================================================== helpers
def data(kind, n, dtype, seed=0):
    """``n`` values: standard normal, heavy-tailed (Student t, 2 dof, times 1e-3) or sparse
    (95% zeros, half of them -0.0 since they are 0 times a negative value)."""
    rng = np.random.default_rng([seed, KINDS.index(kind), n])
    if kind == "normal":
        x = rng.standard_normal(n)
    elif kind == "heavy":
        x = rng.standard_t(2, n) * 1e-3
    else:
        x = rng.standard_normal(n) * (rng.random(n) < 0.05)
    return x.astype(dtype)


def ro(a):
    return readonly(np.ascontiguousarray(a))


def assert_same(got, want, what="array"):
    """Bit-for-bit equality (so -0.0 != 0.0 and NaN == NaN of the same pattern)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    if got.tobytes() != want.tobytes():
        g = got.reshape(-1).view(f"u{got.itemsize}")
        w = want.reshape(-1).view(f"u{want.itemsize}")
        bad = np.flatnonzero(g != w)
        i = int(bad[0])
        pytest.fail(f"{what}: {bad.size} of {g.size} differ; first at {i}: got {got.reshape(-1)[i]!r}, want {want.reshape(-1)[i]!r}")


def fbits(x):
    """Bit patterns of float32/float64 ``x`` and their sign-clearing mask (as magnitude_bits)."""
    if x.dtype == np.float32:
        return ro(x.view(np.uint32)), np.uint32(0x7FFFFFFF)
    return ro(x.view(np.uint64)), np.uint64(0x7FFFFFFFFFFFFFFF)


def inf_bits(dtype):
    return 0x7F800000 if np.dtype(dtype) == np.float32 else 0x7FF0000000000000


def nbad_per(x, ids, size):
    """How many NaN/inf values of ``x`` fall in each group ``ids`` (of ``size`` groups)."""
    return np.bincount(ids[~np.isfinite(x)], minlength=size).astype(np.int64)


# ====================================================================== NumPy references
# ---------------------------------------------------------------- the random stream
def ref_mix(z):
    """SplitMix64's finaliser on uint64 (NumPy wraps uint64 products and sums mod 2**64)."""
    z = np.array(z, np.uint64, ndmin=1)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def mix_int(z):
    """The same finaliser on Python ints: the literal formula, to check ``ref_mix`` itself."""
    m = (1 << 64) - 1
    z &= m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def ref_stream(seed, khash, step):
    return ref_mix(ref_mix(ref_mix(U64(seed)) ^ U64(khash)) ^ U64(step))[0]


def ref_h32(x):
    x = np.array(x, np.uint64, ndmin=1) & M32
    x = x ^ (x >> U64(16))
    x = (x * U64(0x21F0AAAD)) & M32
    x = x ^ (x >> U64(15))
    x = (x * U64(0x735A2D97)) & M32
    return x ^ (x >> U64(15))


def ref_block_key(strm, i):
    """``mix(stream + (i >> 16)) mod 2**32`` per value index ``i`` (uint64)."""
    i = np.array(i, np.uint64, ndmin=1)
    with np.errstate(over="ignore"):
        return ref_mix(U64(strm) + (i >> U64(16))) & M32


def ref_bits(strm, i):
    """``r_i = h32((mix(stream + (i >> 16)) mod 2**32) + (i mod 2**16))`` (uint32)."""
    i = np.array(i, np.uint64, ndmin=1)
    return ref_h32(ref_block_key(strm, i) + (i & U64(0xFFFF))).astype(np.uint32)


def ref_uniform(strm, n):
    """``u_i = r_i / 2**32`` for values ``0..n-1`` (float64, exact)."""
    return np.ldexp(ref_bits(strm, np.arange(n, dtype=np.uint64)).astype(np.float64), -32)


STRM = ref_stream(2024, 0x0123456789ABCDEF, 7)


# ---------------------------------------------------------------- lane sums
def lanesum_rows(m):
    """Per row of ``m`` (rows of at most CHUNK values): 64 column lanes over the first
    ``64 * floor(len/64)`` values (each lane in order from 0), the lanes added in order
    0..63 starting from 0, then the remaining values in order."""
    m = np.asarray(m, np.float64)
    r, length = m.shape
    assert length <= CHUNK
    rows = length // LANES
    lanes = np.zeros((r, LANES))
    body = m[:, : rows * LANES].reshape(r, rows, LANES)
    for k in range(rows):
        lanes += body[:, k, :]
    total = np.zeros(r)
    for j in range(LANES):
        total += lanes[:, j]
    for j in range(rows * LANES, length):
        total += m[:, j]
    return total


def lanesum_segments(w, seg):
    """``lanesum(w, segment)`` of every segment of ``seg`` consecutive values (the last may be
    shorter): each segment cut into chunks of CHUNK values, chunk results added in order from 0."""
    w = np.asarray(w, np.float64)
    n = w.size
    nseg = -(-n // seg)
    out = np.zeros(nseg)
    if seg <= CHUNK:
        nfull = n // seg
        if nfull:
            out[:nfull] = 0.0 + lanesum_rows(w[: nfull * seg].reshape(nfull, seg))
        if n > nfull * seg:
            out[nfull] = 0.0 + lanesum_rows(w[nfull * seg :][None, :])[0]
        return out
    for s in range(nseg):
        part = w[s * seg : (s + 1) * seg]
        total = 0.0
        for lo in range(0, part.size, CHUNK):
            total += lanesum_rows(part[lo : lo + CHUNK][None, :])[0]
        out[s] = total
    return out


# ---------------------------------------------------------------- rounding to float32
def round32(v, up):
    """float64 ``v`` rounded up (down) to float32, as float64: the nearest float32, stepped one
    ulp when it lies on the wrong side; +-inf when no finite float32 lies on the right side."""
    v = np.array(v, np.float64, ndmin=1)
    with np.errstate(over="ignore"):
        f = v.astype(np.float32)
    wrong = (f.astype(np.float64) < v) if up else (f.astype(np.float64) > v)
    f[wrong] = np.nextafter(f[wrong], np.float32(np.inf if up else -np.inf))
    return f.astype(np.float64)


# ---------------------------------------------------------------- packing
def ref_pack(codes, bits):
    """LSB-first packing: ``k`` codes of ``bits`` bits in ``ceil(k*bits/8)`` bytes."""
    c = np.asarray(codes).astype(np.uint64).reshape(-1)
    planes = (c[:, None] >> np.arange(bits, dtype=np.uint64)) & U64(1)
    return np.packbits(planes.astype(np.uint8).reshape(-1), bitorder="little")


def ref_unpack(raw, bits, count):
    planes = np.unpackbits(np.asarray(raw, np.uint8), bitorder="little", count=count * bits)
    planes = planes.reshape(count, bits).astype(np.uint64)
    return (planes << np.arange(bits, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)


# ---------------------------------------------------------------- custom floats
def ref_units(n, block):
    """Work unit of every value: piece ``(i mod block) // CHUNK`` of block ``i // block``."""
    upb = -(-block // CHUNK)
    i = np.arange(n)
    return (i // block) * upb + (i % block) // CHUNK, (-(-n // block)) * upb, upb


def ref_absmax_units(x, block):
    bits, mask = fbits(x)
    unit, units, _ = ref_units(x.size, block)
    top = np.zeros(units, bits.dtype)
    np.maximum.at(top, unit, bits & mask)
    return top


def ref_minifloat(x, block, emin, m, maxmag, signpos, stochastic=False, strm=U64(0)):
    """docs/codecs.md (rangefloat, step 3): ``e' = max(floor(log2|v|), Emin)``,
    ``q = |v| * 2**(m - e')`` (exact: ldexp), ``r`` = q rounded half to even or
    ``floor(q + u_i)``, ``code = min((e' - Emin) * 2**m + r, maxmag)``, sign bit at
    ``signpos`` (set for -0.0).  Finite ``x`` only."""
    v = np.asarray(x, np.float64)
    n = v.size
    em = np.asarray(emin, np.int64)[np.arange(n) // block]
    a = np.abs(v)
    e = np.frexp(a)[1].astype(np.int64) - 1  # floor(log2 |v|), exact (subnormals too)
    e = np.where(a > 0, np.maximum(e, em), em)
    q = np.ldexp(a, (m - e).astype(np.int32))
    r = np.floor(q + ref_uniform(strm, n)) if stochastic else np.rint(q)
    code = np.minimum((e - em).astype(np.float64) * 2.0**m + r, float(maxmag)).astype(np.int64)
    return code | (np.signbit(v).astype(np.int64) << signpos)


def ref_minifloat_value(code, bits, m, emin):
    """docs/codecs.md (rangefloat, decoding): exponent code ``ec`` and mantissa ``f`` of the
    magnitude; ``f * 2**(emin - m)`` for ``ec = 0``, ``(2**m + f) * 2**(emin + ec - 1 - m)``
    otherwise; negative with the sign bit (``-0.0`` for a zero magnitude)."""
    code = np.asarray(code, np.int64)
    mag = code & ((1 << (bits - 1)) - 1)
    ec, f = mag >> m, (mag & ((1 << m) - 1)).astype(np.float64)
    a = np.where(ec == 0, np.ldexp(f, (emin - m).astype(np.int32)), np.ldexp(f + 2.0**m, (emin + ec - 1 - m).astype(np.int32)))
    return np.where(code >> (bits - 1), -a, a)


def window_emins(x, block, m, e, dtype):
    """rangefloat's windows (docs step 1-2): ``Emin = T - 2**e + 2`` per block."""
    sub, emax = (-149, 127) if np.dtype(dtype) == np.float32 else (-1074, 1023)
    n = x.size
    nb = -(-n // block)
    a = np.abs(np.asarray(x, np.float64))
    amax = np.zeros(nb)
    np.maximum.at(amax, np.arange(n) // block, a)
    t = np.frexp(amax)[1].astype(np.int64) - 1
    t = t + ((amax > np.ldexp(2.0 - 2.0**-m, t.astype(np.int32))) & (t + 1 <= emax))
    t = np.where(amax > 0, t, sub)
    return t - (1 << e) + 2


# ---------------------------------------------------------------- bucketed
def ref_qsgd(x, bucket, s, stochastic, strm):
    """docs/codecs.md, qsgd steps 1-4 (finite ``x``): norms (float32 rounded up where finite,
    else float64) and codes ``level << 1 | sign``."""
    v = np.asarray(x, np.float64)
    n = v.size
    nb = -(-n // bucket)
    b = np.arange(n) // bucket
    with np.errstate(over="ignore", under="ignore"):
        q = lanesum_segments(v * v, bucket)
    amax = np.zeros(nb)
    np.maximum.at(amax, b, np.abs(v))
    redo = ~((q >= 2.0**-960) & (q < np.inf)) & (amax > 0)
    norm = np.sqrt(q)
    if redo.any():
        big_e = np.where(redo, np.frexp(amax)[1] - 1, 0).astype(np.int32)
        w = np.ldexp(v, -big_e[b])
        q2 = lanesum_segments(w * w, bucket)
        norm = np.where(redo, np.ldexp(np.sqrt(q2), big_e), norm)
    up = round32(norm, up=True)
    norms = np.where(np.isfinite(up), up, norm)
    with np.errstate(divide="ignore"):
        scale = np.where(norms > 0, s / np.where(norms > 0, norms, 1.0), 0.0)
    t = np.abs(v) * scale[b]
    level = np.floor(t + ref_uniform(strm, n)) if stochastic else np.rint(t)
    level = np.minimum(level, float(s)).astype(np.int64)
    codes = (level << 1) | ((v < 0) & (level > 0))
    return norms, codes


def ordered_minmax(v, bucket):
    """Per bucket min and max in IEEE total order on zeros (-0.0 < +0.0)."""
    n = v.size
    nb = -(-n // bucket)
    pad = nb * bucket - n
    w = np.concatenate([v, np.full(pad, v[(nb - 1) * bucket] if n else 0.0)]).reshape(nb, bucket)
    mn, mx = w.min(axis=1), w.max(axis=1)
    negz = ((w == 0) & np.signbit(w)).any(axis=1)
    posz = ((w == 0) & ~np.signbit(w)).any(axis=1)
    mn = np.where(mn == 0, np.where(negz, -0.0, 0.0), mn)
    mx = np.where(mx == 0, np.where(posz, 0.0, -0.0), mx)
    return mn, mx


def ref_minmax(x, bucket, levels, stochastic, strm):
    """docs/codecs.md, minmax (finite ``x``): per bucket ``lo = min`` rounded down and ``hi = max``
    rounded up to float32 (both float64 when either does not fit), codes
    ``round((v - lo) * (L / (hi - lo)))`` clamped to ``[0, L]``."""
    v = np.asarray(x, np.float64)
    n = v.size
    b = np.arange(n) // bucket
    mn, mx = ordered_minmax(v, bucket)
    dn, up = round32(mn, up=False), round32(mx, up=True)
    fits = np.isfinite(dn) & np.isfinite(up)
    lows, highs = np.where(fits, dn, mn), np.where(fits, up, mx)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(highs > lows, levels / np.where(highs > lows, highs - lows, 1.0), 0.0)
    t = (v - lows[b]) * inv[b]
    c = np.floor(t + ref_uniform(strm, n)) if stochastic else np.rint(t)
    return lows, highs, np.clip(c, 0.0, float(levels)).astype(np.int64)


# ---------------------------------------------------------------- per tensor
def ref_trits(x, clip, s, strm):
    v = np.asarray(x, np.float64)
    n = v.size
    p = np.abs(np.clip(v, -clip, clip)) / s if s > 0 else np.zeros(n)
    b = np.floor(p + ref_uniform(strm, n)).astype(np.int64)
    trits = b * np.where(v < 0, 2, 1)
    nbytes = -(-n // 5)
    t = np.zeros(nbytes * 5, np.int64)
    t[:n] = trits
    t = t.reshape(nbytes, 5)
    return (t @ np.array([1, 3, 9, 27, 81])).astype(np.uint8), trits


def ref_untrit(raw, n):
    t = np.asarray(raw, np.int64)[:, None] // np.array([1, 3, 9, 27, 81]) % 3
    return t.reshape(-1)[:n]


# ====================================================================== kernel calls (as the stages make them)
def run_absmax(x, block, fn=None):
    fn = fn or K.quantize.absmax_units
    bits, mask = fbits(x)
    _, units, upb = ref_units(x.size, block)
    top = np.zeros(units, bits.dtype)
    if x.size:
        fn(bits, block, upb, mask, top)
    return top


def run_minifloat(x, block, emin, m, maxmag, signpos, stochastic=False, strm=U64(0), fn=None):
    fn = fn or K.quantize.minifloat_encode
    _, units, upb = ref_units(x.size, block)
    codes = np.zeros(x.size, np.uint8 if signpos < 8 else np.uint16)
    bad = np.zeros(units, np.int64)
    if x.size:
        crc = fn(ro(x), block, upb, np.asarray(emin, np.int64), m, maxmag, signpos, stochastic, U64(strm), codes, bad, 0x5EED)
        check_kernel_crc(crc, codes, 0x5EED, K.quantize)  # the codes' CRC-32C, formed unit by unit
    return codes, bad


def run_qsgd(x, bucket, s, stochastic, strm=U64(0), fn=None):
    fn = fn or K.bucket.qsgd_encode
    n = x.size
    nb = -(-n // bucket)
    per = max(1, CHUNK // bucket)
    norms = np.empty(nb)
    codes = np.empty(n, np.uint8 if 1 + s.bit_length() <= 8 else np.uint16)
    bad = np.zeros(-(-nb // per), np.int64)
    if n:
        fn(ro(x), bucket, s, stochastic, U64(strm), LANES, norms, codes, bad)
    return norms, codes, bad


def saturated(v, dtype):
    """float64 decoded values as a decoder stores them in ``dtype``: clipped to its finite
    range, then rounded (``Quantizer.write``)."""
    top = np.finfo(dtype).max
    return np.clip(v, -top, top).astype(dtype)


def run_minmax(x, bucket, levels, stochastic, strm=U64(0), fn=None):
    fn = fn or K.bucket.minmax_encode
    n = x.size
    nb = -(-n // bucket)
    per = max(1, CHUNK // bucket)
    lows, highs = np.empty(nb), np.empty(nb)
    codes = np.empty(n, np.uint8)
    bad = np.zeros(-(-nb // per), np.int64)
    if n:
        wide = x.dtype == np.float64
        ibits = ro(x.view(np.int64 if wide else np.int32))
        low, inf = ((1 << 63) - 1, 0x7FF0000000000000) if wide else (0x7FFFFFFF, 0x7F800000)
        fn(ro(x), ibits, low, inf, bucket, levels, stochastic, U64(strm), lows, highs, codes, bad)
    return lows, highs, codes, bad


def run_moments(x, shift, fn=None):
    fn = fn or K.quantize.tensor_moments
    nchunk = -(-x.size // CHUNK)
    bits, mask = fbits(x)
    sums, top = np.zeros((nchunk, 2)), np.zeros(nchunk, bits.dtype)
    if x.size:
        fn(ro(x), bits, mask, float(shift), LANES, sums, top)
    return sums, top


def run_terngrad(x, clip, s, strm, fn=None):
    fn = fn or K.quantize.terngrad_encode
    out = np.empty(-(-x.size // 5), np.uint8)
    if x.size:
        fn(ro(x), float(clip), float(s), U64(strm), out)
    return out


def run_sign(x, fn=None):
    fn = fn or K.quantize.sign_encode
    n = x.size
    nchunk = -(-n // CHUNK)
    out = np.empty(-(-n // 8), np.uint8)
    sums, nneg, bad = np.zeros((nchunk, 3)), np.zeros(nchunk, np.int64), np.zeros(nchunk, np.int64)
    if n:
        fn(ro(x), out, LANES, sums, nneg, bad)
    return out, sums, nneg, bad


def run_dequantize(raw, bits, n, lut, block, a, off, out, mode, fn=None):
    fn = fn or K.dequant.dequantize
    fn(ro(raw), bits, n, ro(lut), block, ro(a), ro(off), out, mode)
    return out


def ref_dequantize(raw, bits, n, lut, block, a, off, out0, mode):
    codes = ref_unpack(raw, bits, n).astype(np.int64)
    b = np.arange(n) // block
    val = lut[codes] * a[b]
    if off.size:
        val = val + off[b]
    val = val.astype(out0.dtype)  # rounded once to out's dtype
    return val if mode == SET else (out0 + val if mode == ADD else out0 - val)


# ====================================================================== the random stream
def test_constants():
    from codec.kernels.cpu import _common  # the trit kernels' chunk: a CPU work split, not a layout constant

    assert layout.CHUNK == CHUNK and layout.LANES == LANES and layout.SPAN == 1 << 16 and _common.TRIT_CHUNK == TRIT_CHUNK
    assert PARALLEL_MIN <= BIG


def test_reference_mix_is_splitmix64():
    # SplitMix64 seeded with 0: outputs are mix(k * golden gamma); its published first values
    gamma = 0x9E3779B97F4A7C15
    want = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    got = ref_mix(np.array([(k * gamma) % 2**64 for k in (1, 2, 3)], np.uint64))
    assert got.tolist() == want
    assert [mix_int(k * gamma) for k in (1, 2, 3)] == want


def test_mix_and_stream_match_reference():
    rng = np.random.default_rng(1)
    zs = np.concatenate([np.array([0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1], np.uint64),
                         rng.integers(0, 2**64 - 1, 200, dtype=np.uint64, endpoint=True)])
    want = ref_mix(zs)
    assert [int(K.rng.mix(z)) for z in zs] == want.tolist()
    assert [mix_int(int(z)) for z in zs] == want.tolist()
    assert int(K.rng.mix(U64(0))) == 0
    for seed, khash, step in [(0, 0, 0), (1, 2, 3), (2**63 - 1, 2**64 - 1, 2**64 - 1), (12345, 0xDEADBEEF, 10**12)]:
        got = K.rng.stream(U64(seed), U64(khash), U64(step))
        assert isinstance(got, (np.uint64, int)) and int(got) == int(ref_stream(seed, khash, step))
        lit = mix_int(mix_int(mix_int(seed) ^ khash) ^ step)
        assert int(got) == lit


@pytest.mark.parametrize("strm", [U64(0), STRM, U64(2**64 - 1), U64(2**64 - 3)])
def test_block_key_bits32_uniform_match_reference(strm):
    rng = np.random.default_rng(2)
    idx = np.concatenate([
        np.arange(0, 5), np.arange(65530, 65542), np.arange(131068, 131076),
        np.array([2**32 - 1, 2**32, 2**32 + 65535, 2**40 + 7, 2**48 - 1]),
        rng.integers(0, 2**40, 100),
    ]).astype(np.uint64)
    keys = ref_block_key(strm, idx)
    bits = ref_bits(strm, idx)
    for i, k, r in zip(idx.tolist(), keys.tolist(), bits.tolist()):
        key = np.uint32(K.rng.block_key(strm, U64(i)))  # a uint32 inside the kernels (Numba returns an int)
        assert int(key) == k
        assert int(K.rng.block_key(strm, i)) == k  # a Python int index (int64) too
        assert int(K.rng.bits32(key, U64(i))) == r
        u = K.rng.uniform(key, U64(i))
        assert u == r / 2**32 and 0.0 <= u < 1.0
    # one key per 2**16-aligned span of values
    k = [int(K.rng.block_key(strm, U64(i))) for i in (65535, 65536, 131071, 131072)]
    assert k[1] == k[2] and len({k[0], k[1], k[3]}) == 3


def test_bits32_wraps_key_plus_index_mod_2_32():
    for key in (0xFFFFFFFF, 0xFFFFFFF0, 0x80000000):
        for i in (0, 15, 16, 65535, 65536 + 17):
            x = (key + (i & 0xFFFF)) & 0xFFFFFFFF
            assert int(K.rng.bits32(np.uint32(key), U64(i))) == int(ref_h32(x)[0])


def test_random_bits_are_uniform_enough():
    u = ref_uniform(STRM, 3 * CHUNK)
    assert abs(u.mean() - 0.5) < 0.005 and u.min() >= 0 and u.max() < 1
    assert np.unique(ref_bits(STRM, np.arange(3 * CHUNK))).size > 3 * CHUNK - 10


# ====================================================================== absmax_units
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_absmax_units_match_numpy(kind, n, dtype):
    x = data(kind, n, dtype)
    for block in sorted({1, 7, CHUNK - 1, CHUNK + 3, 2 * CHUNK, max(1, n)}):
        if block == 1 and n > CHUNK + 1:
            continue  # one unit per value: covered at the small sizes
        assert_same(run_absmax(x, block), ref_absmax_units(x, block), f"top block={block}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_absmax_units_report_nonfinite(dtype):
    n, block = 2 * CHUNK + 100, CHUNK + 50  # 2 blocks x 2 units, one short unit per block
    x = data("normal", n, dtype)
    x[[5, CHUNK + 60, 2 * CHUNK + 90]] = [np.inf, -np.nan, -np.inf]  # units 0, 2, 3
    top = run_absmax(x, block)
    inf = inf_bits(dtype)
    assert int(top[0]) == inf and int(top[1]) < inf
    assert int(top[2]) > inf and int(top[3]) == inf  # NaN's magnitude is above inf's
    assert_same(top, ref_absmax_units(x, block))


# ====================================================================== minifloat_encode
#: (bits, exponent bits): m = bits - 1 - e mantissa bits, sign at bit bits - 1
MINIFLOATS = [(8, 4), (8, 5), (3, 1), (3, 2), (12, 8), (16, 5), (16, 1)]
FP8 = {"e4m3": (3, -6, 0x7E, np.dtype(ml_dtypes.float8_e4m3fn)), "e5m2": (2, -14, 0x7B, np.dtype(ml_dtypes.float8_e5m2))}


def check_minifloat(x, block, emin, m, maxmag, signpos, stochastic, strm=STRM, what=""):
    codes, bad = run_minifloat(x, block, emin, m, maxmag, signpos, stochastic, strm)
    want = ref_minifloat(x, block, emin, m, maxmag, signpos, stochastic, strm)
    assert_same(codes.astype(np.int64), want, f"codes {what} block={block} m={m} stochastic={stochastic}")
    assert not bad.any()
    return codes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_minifloat_encode_matches_spec(kind, n, dtype):
    x = data(kind, n, dtype)
    rng = np.random.default_rng([n, 3])
    for bits, e in MINIFLOATS:
        m = bits - 1 - e
        for block in (7, max(1, n), CHUNK + 3) if n > 7 else (1, 7, max(1, n)):
            emin = window_emins(x, block, m, e, dtype)
            # shift some windows up (the top values saturate) or down (more subnormal headroom)
            emin = emin + rng.integers(-2, 3, emin.size) * (rng.random(emin.size) < 0.5)
            for stochastic in (False, True):
                check_minifloat(x, block, emin, m, (1 << (bits - 1)) - 1, bits - 1, stochastic, what=f"bits={bits} e={e}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits,e", MINIFLOATS)
def test_minifloat_encode_ties_subnormals_saturation(bits, e, dtype):
    """Values on the half-grid of the window (every tie, normal and subnormal), zeros of both
    signs, values beyond the top (saturate at maxmag) and below the smallest subnormal."""
    m = bits - 1 - e
    emin = -10 if e < 8 else -130  # the window's top binade emin + 2**e - 2 below float32's
    rng = np.random.default_rng([bits, e])
    n = 4001
    d = rng.integers(0, min(1 << e, 100) + 1, n)  # binade d - 1 above emin (0: subnormal region; 2**e: above the top)
    j = np.where(d == 0, rng.integers(0, 1 << (m + 2), n), rng.integers(1 << (m + 1), 1 << (m + 2), n))
    x = np.ldexp(j.astype(np.float64), (emin + np.maximum(d, 1) - 1 - m - 1).astype(np.int32))
    x = (x * np.where(rng.random(n) < 0.5, -1.0, 1.0)).astype(dtype)
    sub = 2.0 ** (emin - m)  # the smallest subnormal step
    x[:8] = [0.0, -0.0, 3e38, -3e38, sub / 4, -sub * 2.0**-40, sub / 2, -sub * 1.5]
    maxmag = (1 << (bits - 1)) - 1
    for block in (1, 7, n):
        em = np.full(-(-n // block), emin, np.int64)
        for stochastic in (True, False):
            codes = check_minifloat(x, block, em, m, maxmag, bits - 1, stochastic, what=f"grid bits={bits}")
    sign = 1 << (bits - 1)
    assert int(codes[0]) == 0 and int(codes[1]) == sign  # -0.0 keeps its sign bit
    assert int(codes[2]) == maxmag and int(codes[3]) == sign | maxmag  # saturation
    # nearest: a tie at half the smallest subnormal goes to 0 (even), 1.5 of it to 2
    near, _ = run_minifloat(x, n, np.array([emin]), m, maxmag, bits - 1, False)
    assert int(near[6]) & maxmag == 0 and int(near[7]) & maxmag == 2


def test_minifloat_encode_no_mantissa_ties():
    """m = 0 (rangefloat bits=3, exp_bits=2; bits=9, exp_bits=8): the representable magnitudes
    are powers of two and the documented rounding is ``r = rint(q)``, ``q = |v| * 2**-e'`` in
    [1, 2): a tie (q = 1.5) gives r = 2, the next power of two, whatever the exponent."""
    x = np.array([0.75, -0.75, 1.5, 3.0])
    emin = np.array([-1, -1, -1, 0])  # one block per value
    want = ref_minifloat(x, 1, emin, 0, 3, 2)
    assert want.tolist() == [2, 4 | 2, 3, 3]  # 0.75 -> 1.0, 1.5 -> 2.0, 3.0 -> 4.0 (window 1, 2, 4)
    codes, _ = run_minifloat(x, 1, emin, 0, 3, 2, False)
    assert_same(codes.astype(np.int64), want, "m=0 ties")


@pytest.mark.parametrize("fmt", sorted(FP8))
def test_minifloat_encode_fp8_matches_ml_dtypes(fmt):
    """The OCP formats (fixed window, maxmag below the NaN/inf codes): nearest-even equals
    ml_dtypes' conversion for every value in range; beyond, codes saturate."""
    m, emin, maxmag, f8 = FP8[fmt]
    top = float(ml_dtypes.finfo(f8).max)
    rng = np.random.default_rng(5)
    x = np.concatenate([
        np.arange(256, dtype=np.uint8).view(f8).astype(np.float32),  # every code's value (NaNs dropped below)
        (rng.standard_t(2, 50_000) * top / 50).astype(np.float32),
        np.ldexp(rng.random(20_000), rng.integers(-30, 2, 20_000)).astype(np.float32) * float(2.0**emin),
    ])
    x = x[np.isfinite(x)]
    x = np.concatenate([x, np.float32([top * 1.03, -top * 1.03, 1e38, -1e38, 0.0, -0.0])])
    for stochastic in (True, False):
        codes = check_minifloat(x, x.size, np.array([emin]), m, maxmag, 7, stochastic, what=fmt)
    inside = np.abs(x) <= top
    assert_same(codes[inside], x[inside].astype(f8).view(np.uint8), f"{fmt} vs ml_dtypes")
    assert (codes[~inside] & 0x7F == maxmag).all()


def test_minifloat_encode_stochastic_tiny_values():
    """Below the smallest subnormal step, stochastic rounding is ``floor(q + u_i)`` as
    documented: a value of 2**-20 of the step becomes 1 (the step) where ``u_i >= 1 - 2**-20``
    and 0 elsewhere."""
    u = ref_uniform(STRM, 1 << 22)
    hit = int(np.flatnonzero(u >= 1 - 2.0**-20)[0])
    x = np.zeros(hit + 2)
    x[hit - 1 : hit + 2] = 2.0**-20  # emin = 3, m = 3: the subnormal step is 1
    codes, _ = run_minifloat(x, x.size, np.array([3]), 3, 0x7F, 7, True, STRM)
    assert codes[hit - 1 : hit + 2].tolist() == [0, 1, 0]
    assert_same(codes.astype(np.int64), ref_minifloat(x, x.size, [3], 3, 0x7F, 7, True, STRM))


def test_minifloat_encode_float64_tiny_windows():
    """float64 windows below 2**-1000 (the kernel rescales them): deep subnormal data, windows
    at emin -1020 .. -1330, all-zero blocks at the smallest subnormal's exponent."""
    rng = np.random.default_rng(6)
    n = 3 * 4096 + 5
    x = rng.standard_normal(n) * np.ldexp(1.0, rng.integers(-1074, -990, n).astype(np.int32))
    x[4096 : 2 * 4096] = 0.0
    x[4096 + 7] = -0.0
    x[-5:] = [5e-324, -5e-324, 1e-320, 2.0**-1022, -(2.0**-1000)]
    block = 4096
    for bits, e in MINIFLOATS:
        m = bits - 1 - e
        emin = window_emins(x, block, m, e, np.float64)
        assert emin.min() < -1000
        for delta in (0, -3, 40):
            for stochastic in (False, True):
                check_minifloat(x, block, emin + delta, m, (1 << (bits - 1)) - 1, bits - 1, stochastic, what=f"tiny delta={delta}")
    assert int(window_emins(np.zeros(1), 1, 3, 4, np.float64)[0]) == -1074 - 14


@pytest.mark.parametrize("dtype", DTYPES)
def test_minifloat_encode_reports_nonfinite(dtype):
    n, block = 2 * CHUNK + 100, CHUNK + 50
    x = data("normal", n, dtype)
    pos = [3, 4, CHUNK + 60, 2 * CHUNK + 99]
    x[pos] = [np.nan, np.inf, -np.inf, np.nan]
    unit, units, _ = ref_units(n, block)
    for stochastic in (False, True):
        codes, bad = run_minifloat(x, block, np.array([-20, -20]), 3, 0x7F, 7, stochastic, STRM)
        assert_same(bad, nbad_per(x, unit, units))
        if not stochastic:  # finite values are coded as usual
            fine = np.isfinite(x)
            want = ref_minifloat(np.where(fine, x, 0), block, [-20, -20], 3, 0x7F, 7, False)
            assert_same(codes[fine].astype(np.int64), want[fine])
        assert int(codes[4]) == 0x7F and int(codes[CHUNK + 60]) == 0xFF  # inf saturates with its sign


# ====================================================================== the fused error-feedback pair
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_feedback_absmax_units_and_feedback_minifloat_encode_match_numpy(kind, n, dtype):
    """feedback_absmax_units: the maxima of the magnitudes of acc = x + r (in the dtype) per
    work unit, writing nothing; feedback_minifloat_encode in those windows (rangefloat's
    step) and in others (fp8's fixed ones; a window too small or too large): the codes of acc
    (the spec's reference) and acc minus each code's value lut[code] * scale[block], rounded
    to the dtype first (the dequantizer's SUB), written into a buffer of its own."""
    x = data(kind, n, dtype)
    r = data("heavy", n, dtype, seed=9) * dtype(0.25)
    for bits, e in MINIFLOATS[:3]:
        m = bits - 1 - e
        maxmag = (1 << (bits - 1)) - 1
        for block in (7, max(1, n), CHUNK + 3) if n > 7 else (1, 7, max(1, n)):
            _, units, upb = ref_units(n, block)
            top = np.zeros(units, fbits(x)[0].dtype)
            if n:
                K.quantize.feedback_absmax_units(ro(x), ro(r), block, upb, fbits(x)[1], top)
            want_acc = (x + r).astype(dtype)
            assert_same(top, ref_absmax_units(want_acc, block), "top")
            emin = window_emins(want_acc, block, m, e, dtype)
            codes = np.zeros(n, np.uint8 if bits <= 8 else np.uint16)
            bad = np.zeros(units, np.int64)
            for stochastic in (False, True):
                for used in (emin, emin + 1, emin - 2):
                    once, codes1 = np.empty(n, dtype), np.zeros_like(codes)
                    if n:
                        crc = K.quantize.feedback_minifloat_encode(
                            ro(x), ro(r), once, block, upb, used, m, maxmag, bits - 1, stochastic, STRM, codes1, bad, 7
                        )
                        check_kernel_crc(crc, codes1, 7, K.quantize)
                    want1 = ref_minifloat(want_acc, block, used, m, maxmag, bits - 1, stochastic, STRM)
                    what = f"one pass bits={bits} block={block} stochastic={stochastic} shift={int(used[0] - emin[0]) if n else 0}"
                    assert not bad.any()
                    assert_same(codes1.astype(np.int64), want1, f"codes {what}")
                    value1 = saturated(ref_minifloat_value(want1, bits, m, used[np.arange(n) // block]), dtype)
                    assert_same(once, (want_acc - value1).astype(dtype), f"acc - decoded {what}")


# ====================================================================== qsgd_encode
QSGD_LEVELS = [1, 3, 16, 127, 32767]


def check_qsgd(x, bucket, s, stochastic, strm=STRM, what=""):
    norms, codes, bad = run_qsgd(x, bucket, s, stochastic, strm)
    want_norms, want_codes = ref_qsgd(x, bucket, s, stochastic, strm)
    assert_same(norms, want_norms, f"norms {what} bucket={bucket} s={s}")
    assert_same(codes.astype(np.int64), want_codes, f"codes {what} bucket={bucket} s={s} stochastic={stochastic}")
    assert not bad.any()
    return norms


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_qsgd_encode_matches_spec(kind, n, dtype):
    x = data(kind, n, dtype)
    buckets = (1, 7, 512, max(1, n)) if n <= CHUNK + 1 else (7, 512, 1000, CHUNK)
    for bucket in buckets:
        for s in QSGD_LEVELS:
            for stochastic in (False, True):
                norms = check_qsgd(x, bucket, s, stochastic, what=kind)
                assert np.all(norms == round32(norms, up=True))  # float32 data: float32 norms


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_qsgd_encode_fused_feedback_matches_numpy(kind, n, dtype):
    """qsgd_encode(..., r, acc): acc = x + r (in the dtype), QSGD's norms and codes of acc (the spec's
    reference), and acc minus each code's value ``+-(level / s) * norm`` rounded to the dtype
    first (the dequantizer's SUB)."""
    x = data(kind, n, dtype)
    r = data("heavy", n, dtype, seed=6) * dtype(0.5)
    want_acc = (x + r).astype(dtype)
    for bucket in ((1, 7, max(1, n)) if n <= CHUNK + 1 else (7, 512, CHUNK)):
        for s in QSGD_LEVELS:
            for stochastic in (False, True):
                nb = -(-n // bucket)
                norms = np.empty(nb)
                codes = np.empty(n, np.uint8 if 1 + s.bit_length() <= 8 else np.uint16)
                bad = np.zeros(-(-nb // max(1, CHUNK // bucket)), np.int64)
                acc = np.empty(n, dtype)
                if n:
                    K.bucket.qsgd_encode(ro(x), bucket, s, stochastic, STRM, LANES, norms, codes, bad, ro(r), acc)
                wn, wc = ref_qsgd(want_acc, bucket, s, stochastic, STRM)
                what = f"bucket={bucket} s={s} stochastic={stochastic}"
                assert_same(norms, wn, f"norms {what}")
                assert_same(codes.astype(np.int64), wc, f"codes {what}")
                q = (wc >> 1) / s
                value = saturated(np.where(wc & 1, -q, q) * wn[np.arange(n) // bucket], dtype)
                assert_same(acc, (want_acc - value).astype(dtype), f"acc - decoded {what}")
                assert not bad.any()


def test_qsgd_encode_float64_scaling_and_fallback():
    """float64 data whose squares overflow (norms beyond float32: kept float64) or underflow
    (sum below 2**-960: recomputed on scaled values; norms rounded up to float32, down to its
    smallest subnormal), mixed per bucket, and all-zero buckets."""
    rng = np.random.default_rng(7)
    n = 20 * 512 + 3
    x = rng.standard_normal(n)
    scale = np.array([1.0, 1e160, 1e300, 1e-170, 1e-300, 1e-305, 0.0, 1e20, 1e-30, 3e38])
    x *= np.repeat(scale[np.arange(21) % scale.size], 512)[:n]
    x[512 * 6 + 3] = -0.0
    for bucket in (7, 512, 1000):
        for s in (1, 16, 32767):
            for stochastic in (False, True):
                norms = check_qsgd(x, bucket, s, stochastic, what="scaled")
    norms = check_qsgd(x, 512, 16, False)
    assert norms[1] > 3.4e38 and norms[1] != round32(norms[1], True)[0]  # a float64 norm
    assert norms[6] == 0.0 and norms[5] == 2.0**-149  # zero bucket; a norm below float32's range


def test_qsgd_encode_subnormal_bucket():
    """A bucket whose largest magnitude is a float64 subnormal (below 2**-1022): the sum of
    squares underflows, so it is recomputed on the values times ``2**-E`` (E < -1022, exact)
    and the root scaled back: a finite norm (here float32's smallest subnormal, rounded up)."""
    x = np.array([1e-320, -1e-320, 5e-324, 0.0, 1e-310, 3e-312, -2e-309])
    for bucket in (1, 3, 7):
        check_qsgd(x, bucket, 1, False, what="subnormal")
    norms, _, _ = run_qsgd(x, 7, 1, False)
    assert norms.tolist() == [2.0**-149]


def test_bucket_level_is_floor_plus_at_every_boundary():
    """The bucket quantizers' integer rounding (``bucket._level``: ``(floor(t * 2**32) + bits)
    >> 32``) against ``floor_plus(t, bits / 2**32)`` capped at ``s``, where they could part: a
    fraction exactly ``1 - u`` and one ulp either side, tiny fractions, integers, ``t`` at,
    just below and above the cap, inf and NaN (0), nearest's ties; for bits 0, 1 and
    ``2**32 - 1``.  Random data never lands on these (one value in 2**32)."""
    from codec.kernels.cpu import bucket
    from codec.kernels.cpu._common import floor_plus
    from codec.kernels.cpu.rng import bits32

    def key_of(b):  # the key whose bits32(key, 0) is b: Wellons' hash inverted step by step
        m = 2**32 - 1
        b ^= (b >> 15) ^ (b >> 30)
        b = b * pow(0x735A2D97, -1, 2**32) & m
        b ^= (b >> 15) ^ (b >> 30)
        b = b * pow(0x21F0AAAD, -1, 2**32) & m
        return np.uint32(b ^ (b >> 16))

    fs, i = 16.0, 0
    for b in (0, 1, 12345, 2**31, 2**32 - 1):
        key = key_of(b)
        assert int(bits32(key, i)) == b
        u = b * 2.0**-32
        edge = [k + (1.0 - u) for k in (0, 1, 7, 15)]
        ts = [0.0, 2.0**-1074, 2.0**-40, 0.5, 1.0, 2.5, 15.0, np.nextafter(fs, 0), fs, fs + 0.5, 1e300, np.inf, np.nan]
        ts += edge + [np.nextafter(t, 0) for t in edge] + [np.nextafter(t, np.inf) for t in edge]
        for t in ts:
            for stochastic in (True, False):
                want = min(floor_plus(t, u) if stochastic else np.rint(t), fs)
                want = 0 if want != want else int(want)
                got = int(bucket._level(np.float64(t), fs, stochastic, key, i))
                assert got == want, (t, b, stochastic, got, want)


def test_qsgd_encode_bucket_longer_than_chunk():
    """A bucket longer than 65,536 values is one segment cut into 65,536-value chunks (docs:
    "lanesum"): the chunk results are added in order.  float64 norms (beyond float32's range)
    show every bit of the sum."""
    x = data("heavy", 3 * CHUNK + 17, np.float64) * 1e40
    for bucket in (CHUNK + 100, 2 * CHUNK + 1, x.size):
        check_qsgd(x, bucket, 16, False, what="long bucket")


@pytest.mark.parametrize("dtype", DTYPES)
def test_qsgd_encode_reports_nonfinite(dtype):
    n, bucket = 2 * CHUNK + 700, 1000  # 65 buckets per group of 65 (per = 65)
    x = data("normal", n, dtype)
    pos = [3, 4, 70_000, n - 1]
    x[pos] = [np.nan, np.inf, -np.inf, np.nan]
    nb = -(-n // bucket)
    per = CHUNK // bucket
    group = (np.arange(n) // bucket) // per
    for stochastic in (False, True):
        _, codes, bad = run_qsgd(x, bucket, 16, stochastic, STRM)
        assert_same(bad, nbad_per(x, group, -(-nb // per)))
        # buckets without a NaN/inf are coded as usual
        clean = np.ones(n, bool)
        for p in pos:
            clean[p // bucket * bucket : (p // bucket + 1) * bucket] = False
        _, want = ref_qsgd(np.where(clean, x, 0), bucket, 16, stochastic, STRM)
        assert_same(codes[clean].astype(np.int64), want[clean])


# ====================================================================== minmax_encode
def check_minmax(x, bucket, levels, stochastic, strm=STRM, what=""):
    lows, highs, codes, bad = run_minmax(x, bucket, levels, stochastic, strm)
    wl, wh, wc = ref_minmax(x, bucket, levels, stochastic, strm)
    assert_same(lows, wl, f"lows {what} bucket={bucket}")
    assert_same(highs, wh, f"highs {what} bucket={bucket}")
    assert_same(codes.astype(np.int64), wc, f"codes {what} bucket={bucket} L={levels} stochastic={stochastic}")
    assert not bad.any()
    return lows, highs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_minmax_encode_matches_spec(kind, n, dtype):
    x = data(kind, n, dtype)
    buckets = (1, 7, 1024, max(1, n)) if n <= CHUNK + 1 else (7, 1024, CHUNK + 5)
    for bucket in buckets:
        for bits in (1, 2, 5, 8):
            for stochastic in (False, True):
                lows, highs = check_minmax(x, bucket, (1 << bits) - 1, stochastic, what=kind)
                assert np.all(lows <= highs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_minmax_encode_fused_feedback_matches_numpy(kind, n, dtype):
    """minmax_encode(..., r, acc): acc = x + r (in the dtype), min-max's bounds and codes of acc (the
    spec's reference), and acc minus each code's value ``code * ((hi - lo) / L) + lo`` rounded
    to the dtype first (the dequantizer's SUB)."""
    x = data(kind, n, dtype)
    r = data("heavy", n, dtype, seed=4) * dtype(0.5)
    want_acc = (x + r).astype(dtype)
    for bucket in ((1, 7, max(1, n)) if n <= CHUNK + 1 else (7, 1024, CHUNK + 5)):
        for bits in (1, 5, 8):
            levels = (1 << bits) - 1
            for stochastic in (False, True):
                nb = -(-n // bucket)
                lows, highs = np.empty(nb), np.empty(nb)
                codes = np.empty(n, np.uint8)
                bad = np.zeros(-(-nb // max(1, CHUNK // bucket)), np.int64)
                acc = np.empty(n, dtype)
                if n:
                    wide = dtype == np.float64
                    low, inf = ((1 << 63) - 1, 0x7FF0000000000000) if wide else (0x7FFFFFFF, 0x7F800000)
                    crc = K.bucket.minmax_encode(ro(x), acc.view(np.int64 if wide else np.int32), low, inf, bucket, levels, stochastic, STRM,
                                                 lows, highs, codes, bad, ro(r), acc, 0x5EED)
                    check_kernel_crc(crc, codes, 0x5EED, K.bucket)  # the codes' CRC-32C, formed group by group
                wl, wh, wc = ref_minmax(want_acc, bucket, levels, stochastic, STRM)
                what = f"bucket={bucket} bits={bits} stochastic={stochastic}"
                assert_same(lows, wl, f"lows {what}")
                assert_same(highs, wh, f"highs {what}")
                assert_same(codes.astype(np.int64), wc, f"codes {what}")
                b = np.arange(n) // bucket
                value = saturated(wc * ((wh - wl) / levels)[b] + wl[b], dtype)
                assert_same(acc, (want_acc - value).astype(dtype), f"acc - decoded {what}")
                assert not bad.any()


def test_minmax_encode_float64_bounds_and_zeros():
    """float64 data: bounds rounded outward to float32, kept float64 per bucket when either does
    not fit (beyond 3.4e38); constant buckets; zeros of both signs (-0.0 < 0.0)."""
    rng = np.random.default_rng(8)
    n = 12 * 64 + 5
    x = rng.standard_normal(n) * np.repeat([1.0, 1e39, 1e-40, 1e300, 3.4e38, 1e-310, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 64)[:n]
    x[6 * 64 : 7 * 64] = 2.5  # constant bucket: codes 0
    x[7 * 64 : 8 * 64] = 0.0
    x[7 * 64 + 3] = -0.0
    x[8 * 64 : 9 * 64] = -0.0
    x[9 * 64 : 10 * 64] = np.abs(x[9 * 64 : 10 * 64])
    x[9 * 64 + 1] = -0.0
    x[10 * 64] = 3.5e38  # its bucket's max does not fit float32; its min does
    x[11 * 64] = -3.5e38
    for levels in (1, 255):
        for stochastic in (False, True):
            lows, highs = check_minmax(x, 64, levels, stochastic, what="bounds")
    assert lows[7] == 0 and np.signbit(lows[7]) and not np.signbit(highs[7])
    assert np.signbit(lows[8]) and np.signbit(highs[8])
    assert lows[1] != round32(lows[1], False)[0] and lows[0] == round32(lows[0], False)[0]


def test_minmax_encode_float32_bounds_round_outward():
    """float64 values between float32 neighbours: lo rounds down, hi up, every code in range."""
    x = np.array([1.0 + 2.0**-30, 1.0 + 2.0**-25, 1.0 + 3 * 2.0**-25, -(1.0 + 2.0**-30), 0.1, -0.1, 1e-50, -1e-50])
    lows, highs = check_minmax(x, 4, 255, False)
    assert lows[0] < x[:4].min() and highs[0] > x[:4].max()
    assert lows[1] < -0.1 and highs[1] > 0.1 and lows[1] == round32(-0.1, False)[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_minmax_encode_reports_nonfinite(dtype):
    n, bucket = 3 * CHUNK + 5, 4096  # groups of 16 buckets
    x = data("normal", n, dtype)
    pos = [5, 6, 16 * 4096 + 3, 3 * CHUNK + 4]
    x[pos] = [np.nan, -np.inf, np.inf, -np.nan]
    nb = -(-n // bucket)
    group = (np.arange(n) // bucket) // 16
    want = nbad_per(x, group, -(-nb // 16)) > 0
    for stochastic in (False, True):
        lows, highs, codes, bad = run_minmax(x, bucket, 255, stochastic, STRM)
        assert_same(bad > 0, want)  # every group with a NaN/inf reports it
        clean = np.ones(nb, bool)
        clean[np.array(pos) // bucket] = False
        wl, wh, _ = ref_minmax(np.where(np.isfinite(x), x, 0), bucket, 255, stochastic, STRM)
        assert_same(lows[clean], wl[clean]) and assert_same(highs[clean], wh[clean])


# ====================================================================== tensor_moments
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_tensor_moments_match_lane_order(kind, n, dtype):
    for offset in (0.0, 1000.0):
        x = (data(kind, n, dtype) + dtype(offset)).astype(dtype)
        shift = float(x[0]) if n else 0.0
        sums, top = run_moments(x, shift)
        d = x.astype(np.float64) - shift
        want = np.stack([lanesum_segments(d, CHUNK), lanesum_segments(d * d, CHUNK)], axis=1).reshape(-1, 2)
        assert_same(sums, want, f"sums offset={offset}")
        assert_same(top, ref_absmax_units(x, CHUNK), "top")
        for extra in (0.0, -3.25):  # any shift, not only x[0]
            sums, _ = run_moments(x, extra)
            d = x.astype(np.float64) - extra
            assert_same(sums[:, 1], lanesum_segments(d * d, CHUNK))


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_moments_report_nonfinite(dtype):
    n = 2 * CHUNK + 9
    x = data("normal", n, dtype)
    x[[CHUNK + 1, 2 * CHUNK + 8]] = [np.inf, np.nan]
    _, top = run_moments(x, float(x[0]))
    inf = inf_bits(dtype)
    assert int(top[0]) < inf and int(top[1]) == inf and int(top[2]) > inf


# ====================================================================== terngrad_encode
def terngrad_scale(x, clip):
    a = float(np.abs(x).max(initial=0.0)) if x.size else 0.0
    top = min(a, clip)
    if top == 0:
        return 0.0
    return float(round32(top, up=True)[0]) if x.dtype == np.float32 else top


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 4, 5, 6, 7, TRIT_CHUNK - 1, TRIT_CHUNK, TRIT_CHUNK + 1, CHUNK + 1, 3 * CHUNK + 17])
@pytest.mark.parametrize("kind", KINDS)
def test_terngrad_encode_trits(kind, n, dtype):
    x = data(kind, n, dtype)
    sigma = float(np.std(x.astype(np.float64))) if n else 0.0
    for clip in (np.inf, 2.5 * sigma if sigma > 0 else np.inf, 0.5 * sigma if sigma > 0 else np.inf):
        s = terngrad_scale(x, clip)
        out = run_terngrad(x, clip, s, STRM)
        want, trits = ref_trits(x, clip, s, STRM)
        assert trits.max(initial=0) <= 2 and want.max(initial=0) < 243
        assert_same(out, want, f"trit bytes clip={clip}")
        assert_same(ref_untrit(out, n), trits)


def test_terngrad_encode_zero_scale_and_signs():
    x = np.array([0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0], np.float32)
    assert_same(run_terngrad(x, np.inf, 0.0, STRM), np.zeros(2, np.uint8))
    # s = |v| for every value: every trit non-zero (u < 1), -s -> 2, +s -> 1, -0.0 -> 0
    x = np.array([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 0.0, -0.0, 0.5], np.float64)
    out = run_terngrad(x, np.inf, 1.0, STRM)
    want, trits = ref_trits(x, np.inf, 1.0, STRM)
    assert trits[:6].tolist() == [1, 2, 2, 1, 1, 2] and trits[6:8].tolist() == [0, 0]
    assert_same(out, want)
    # clipping: |v| beyond clip draws with probability clip/s (here 1: clip == s)
    x = np.array([5.0, -5.0, 0.25], np.float32)
    assert ref_trits(x, 2.0, 2.0, STRM)[1][:2].tolist() == [1, 2]
    assert_same(run_terngrad(x, 2.0, 2.0, STRM), ref_trits(x, 2.0, 2.0, STRM)[0])


# ====================================================================== sign_encode
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES + [8, 9, 16, 63, 64, 65])
@pytest.mark.parametrize("kind", KINDS)
def test_sign_encode_bits_and_sums(kind, n, dtype):
    x = data(kind, n, dtype)
    out, sums, nneg, bad = run_sign(x)
    v = x.astype(np.float64)
    assert_same(out, np.packbits(v < 0, bitorder="little"), "sign bits")
    want = np.stack([
        lanesum_segments(np.abs(v), CHUNK),
        lanesum_segments(np.where(v < 0, v, 0.0), CHUNK),
        lanesum_segments(np.where(v < 0, 0.0, v), CHUNK),
    ], axis=1).reshape(-1, 3)
    assert_same(sums, want, "sums")
    assert_same(nneg, np.bincount(np.arange(n)[v < 0] // CHUNK, minlength=sums.shape[0]).astype(np.int64))
    assert not bad.any()


def test_sign_encode_zeros_are_positive():
    x = np.array([-0.0, 0.0, -1e-45, -0.0, 5.0, -0.0, 0.0, -0.0, -0.0, -2.0], np.float32)
    out, sums, nneg, _ = run_sign(x)
    assert out.tolist() == [0b00000100, 0b10]
    assert nneg.tolist() == [2] and not np.signbit(sums[0, 2]) and sums[0, 2] == 5.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_sign_encode_reports_nonfinite(dtype):
    n = 2 * CHUNK + 11
    x = data("normal", n, dtype)
    pos = [0, 1, CHUNK + 5, 2 * CHUNK + 10]
    x[pos] = [np.nan, -np.inf, np.inf, -np.nan]
    out, _, nneg, bad = run_sign(x)
    assert_same(bad, nbad_per(x, np.arange(n) // CHUNK, 3))
    assert_same(out, np.packbits(x < 0, bitorder="little"))  # -inf is negative, NaN is not
    assert_same(nneg, np.bincount(np.arange(n)[x < 0] // CHUNK, minlength=3).astype(np.int64))


# ====================================================================== dequantize
def dequant_case(bits, n, block, offsets, seed=0, slack=0):
    rng = np.random.default_rng([bits, n, block, seed])
    codes = rng.integers(0, 1 << bits, n, dtype=np.uint64)
    raw = np.concatenate([ref_pack(codes, bits), rng.integers(0, 256, slack, dtype=np.uint8)])
    assert raw.size == -(-n * bits // 8) + slack
    lut = rng.standard_normal(1 << bits) * np.ldexp(1.0, rng.integers(-40, 40, 1 << bits).astype(np.int32))
    lut[:: max(1, lut.size // 5)] = -0.0  # -0.0 * a > 0 stays -0.0 without an offset
    lut[1::7] = 0.0
    nb = -(-n // block)
    a = np.abs(rng.standard_normal(nb)) + 0.5
    a[::3] = 1.0
    off = rng.standard_normal(nb) if offsets else np.empty(0)
    return raw, lut, a, off


@pytest.mark.parametrize("bits", range(1, 17))
def test_dequantize_every_width(bits):
    """Small sizes (the per-value tail and the straddling groups), every block size, with and
    without offsets, SET into float32/float64, exact section length and with spare bytes."""
    for n in (0, 1, 7, 8, 9, 17, 100, 1001):
        for block in sorted({1, 7, 8, 512, max(1, n)}):
            for offsets in (False, True):
                for slack in (0, 16):
                    raw, lut, a, off = dequant_case(bits, n, block, offsets, slack=slack)
                    for dtype in DTYPES:
                        out = np.full(n, np.nan, dtype)
                        run_dequantize(raw, bits, n, lut, block, a, off, out, SET)
                        want = ref_dequantize(raw, bits, n, lut, block, a, off, out, SET)
                        assert_same(out, want, f"n={n} block={block} off={offsets} slack={slack} {np.dtype(dtype)}")


@pytest.mark.parametrize("bits", [1, 3, 8, 11, 16])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [SET, ADD, SUB])
def test_dequantize_chunks_and_modes(bits, dtype, mode):
    n = 2 * CHUNK + 13
    rng = np.random.default_rng(bits)
    for block in (7, 512, CHUNK + 5, n):
        for offsets in (False, True):
            raw, lut, a, off = dequant_case(bits, n, block, offsets)
            out0 = (rng.standard_normal(n) * 10).astype(dtype)
            out = out0.copy()
            run_dequantize(raw, bits, n, lut, block, a, off, out, mode)
            want = ref_dequantize(raw, bits, n, lut, block, a, off, out0, mode)
            assert_same(out, want, f"block={block} off={offsets}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [SET, ADD, SUB])
def test_dequantize_bytes_through_a_table(dtype, mode):
    """8-bit codes in blocks of at least 1,024 values decode through a per-block table of the
    256 values (dequant._dequantize_bytes): the same bits as each code's value, at block and
    chunk edges, with and without offsets (-0.0 kept without one)."""
    rng = np.random.default_rng(8)
    for n in (0, 1, 1023, 1024, 1025, 5000, CHUNK + 1031):
        for block in sorted({1024, 1500, max(1, n), CHUNK + 5}):
            for offsets in (False, True):
                raw, lut, a, off = dequant_case(8, n, block, offsets)
                out0 = (rng.standard_normal(n) * 10).astype(dtype)
                out = out0.copy()
                run_dequantize(raw, 8, n, lut, block, a, off, out, mode)
                assert_same(out, ref_dequantize(raw, 8, n, lut, block, a, off, out0, mode), f"n={n} block={block} off={offsets}")


def test_dequantize_negative_zero():
    lut = np.array([-0.0, 1.0, -2.0, 0.0])
    raw = ref_pack(np.array([0, 1, 2, 3, 0, 0, 0, 0, 0, 0]), 2)
    for dtype in DTYPES:
        out = np.full(10, 7.0, dtype)
        run_dequantize(raw, 2, 10, lut, 10, np.array([3.0]), np.empty(0), out, SET)
        assert np.signbit(out[0]) and not np.signbit(out[3]) and out[2] == -6.0
        run_dequantize(raw, 2, 10, lut, 10, np.array([3.0]), np.zeros(1), out, SET)
        assert not np.signbit(out[0])  # -0.0 + 0.0 = 0.0 with an offset


def test_dequantize_rounds_once_to_out_dtype():
    """The float64 value is rounded to out's dtype first, then added in out's dtype: here a
    float32 tie (to even) that adding in float64 and rounding the sum would break."""
    one = np.array([1.0], np.float64)
    for mode, v, want in ((ADD, 2.0**-24 + 2.0**-50, 1.0), (SUB, 2.0**-25 + 2.0**-50, 1.0), (SET, 1 + 2.0**-24 + 2.0**-50, 1 + 2.0**-23)):
        out = np.ones(1, np.float32)
        run_dequantize(ref_pack(np.zeros(1, np.uint64), 1), 1, 1, np.array([v, 0.0]), 1, one, np.empty(0), out, mode)
        assert out[0] == np.float32(want), (mode, out[0])
        assert_same(out, ref_dequantize(ref_pack(np.zeros(1, np.uint64), 1), 1, 1, np.array([v, 0.0]), 1, one, np.empty(0), np.ones(1, np.float32), mode))


# ====================================================================== max_field
@pytest.mark.parametrize("bits", range(1, 17))
def test_max_field_every_width(bits):
    rng = np.random.default_rng(bits)
    full = (1 << bits) - 1
    fields = [(full, 0), (full, 1), (full >> 1, 0), (0xFF, 0), (0x7F, 0), (full & 0x5A5A, 2)]
    for n in (0, 1, 7, 8, 9, 17, 1001, CHUNK * 8 // bits + 3):
        for slack in (0, 16):
            codes = rng.integers(0, 1 << bits, n, dtype=np.uint64) >> U64(rng.integers(0, bits + 1))
            raw = np.concatenate([ref_pack(codes, bits), np.full(slack, 255, np.uint8)])
            for fmask, fshift in fields:
                got = K.dequant.max_field(ro(raw), bits, n, fmask, fshift)
                want = int(((codes & U64(fmask)) >> U64(fshift)).max(initial=0))
                assert int(got) == want, (n, slack, fmask, fshift)
                for largest in {max(want - 1, 0), want, want + 1}:  # fields_within: the check alone
                    assert bool(K.dequant.fields_within(ro(raw), bits, n, fmask, fshift, largest)) == (want <= largest), (n, fmask, fshift, largest)


def test_max_field_finds_the_last_code_and_chunk_edges():
    for bits in (1, 5, 8, 9, 16):
        n = 2 * CHUNK + 13
        for where in (0, 7, 8, CHUNK - 1, CHUNK, 2 * CHUNK, n - 1):
            codes = np.zeros(n, np.uint64)
            codes[where] = (1 << bits) - 1
            raw = ro(ref_pack(codes, bits))
            assert int(K.dequant.max_field(raw, bits, n, (1 << bits) - 1, 0)) == (1 << bits) - 1, (bits, where)
            assert int(K.dequant.max_field(raw, bits, n, (1 << bits) - 1, bits - 1)) == 1
            assert not K.dequant.fields_within(raw, bits, n, (1 << bits) - 1, 0, (1 << bits) - 2), (bits, where)
            assert bits == 1 or not K.dequant.fields_within(raw, bits, n, (1 << bits) - 1, 1, ((1 << bits) - 1 >> 1) - 1), (bits, where)
            assert K.dequant.fields_within(raw, bits, n, (1 << bits) - 2, 0, (1 << bits) - 2)  # the one large code masked


# ====================================================================== dequantize_checked
@pytest.mark.parametrize("bits", [1, 3, 6, 8, 11, 16])
def test_dequantize_checked_matches_numpy(bits):
    """``dequantize_checked`` (a decode that checks its codes as it reads them): the values
    ``ref_dequantize`` gives, whether every field ``(code & fmask) >> fshift`` is within the
    largest allowed (a code one beyond it anywhere: first, last, at chunk edges), and the
    CRC-32C of the codes' bytes, on every path of a chunk: a block's table with groups that
    straddle blocks (1 bit, blocks of 7), the table of 6-bit codes, 8-bit codes through the
    byte table (blocks of 1,024), per-value codes (3 bits, blocks of 7) and wide codes."""
    rng = np.random.default_rng(bits)
    full = (1 << bits) - 1
    fshift = 1 if bits > 1 else 0
    largest = (full >> fshift) - 1  # the largest field allowed: a code of all ones is beyond it
    for n in (0, 1, 9, 1001, 2 * CHUNK + 13):
        wheres = [None, 0, n - 1] + ([7, CHUNK - 1, CHUNK, 2 * CHUNK + 5] if n > CHUNK else [])
        for block in sorted({7, 512, 1024, max(1, n)}):
            _, lut, a, off = dequant_case(bits, n, block, block == 7)
            fields = rng.integers(0, largest + 1, n, dtype=np.uint64)
            for where in sorted(set(wheres) & set(range(n)), key=str) + [None] if n else [None]:
                codes = (fields << U64(fshift)) | rng.integers(0, 1 << fshift, n, dtype=np.uint64)
                if where is not None:
                    codes[where] = full
                raw = ref_pack(codes, bits)
                for dtype, start in ((np.float32, 0), (np.float64, 0x5EED)):
                    out = np.full(n, 7.0, dtype)
                    within, crc = K.dequant.dequantize_checked(ro(raw), bits, n, ro(lut), block, ro(a), ro(off), out, full, fshift, largest, start)
                    what = f"n={n} block={block} where={where}"
                    assert bool(within) == (where is None), what
                    assert_same(out, ref_dequantize(raw, bits, n, lut, block, a, off, out, SET), what)
                    check_kernel_crc(int(crc), raw, start, K.dequant)
            within, crc = K.dequant.dequantize_checked(ro(raw), bits, n, ro(lut), block, ro(a), ro(off), out, 0, 0, 0, -1)
            assert bool(within) and int(crc) == -1  # nothing asked: nothing refused, no CRC


# ====================================================================== trits_dequantize
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [SET, ADD, SUB])
def test_trits_dequantize(dtype, mode):
    rng = np.random.default_rng(mode)
    vals3 = np.array([0.0, 0.1 + 2.0**-40, -(0.1 + 2.0**-40)])
    for n in (0, 1, 4, 5, 6, TRIT_CHUNK - 1, TRIT_CHUNK, TRIT_CHUNK + 1, 2 * TRIT_CHUNK + 7):
        trits = rng.integers(0, 3, n)
        t = np.zeros(-(-n // 5) * 5, np.int64)
        t[:n] = trits
        raw = (t.reshape(-1, 5) @ np.array([1, 3, 9, 27, 81])).astype(np.uint8)
        out0 = rng.standard_normal(n).astype(dtype)
        out = out0.copy()
        K.dequant.trits_dequantize(ro(raw), n, ro(vals3), out, mode)
        val = vals3[trits].astype(dtype)
        want = val if mode == SET else (out0 + val if mode == ADD else out0 - val)
        assert_same(out, want, f"n={n}")


# ====================================================================== serial and parallel twins
def test_serial_and_parallel_twins_agree(backend):
    if backend != "cpu":
        pytest.skip("the serial and parallel twins are the CPU jit wrapper's")
    n = BIG
    runs = []
    for twin in ("serial", "parallel"):
        res = []
        for dtype in DTYPES:
            x = data("heavy", n, dtype)
            x[:: 997] = -0.0
            block = CHUNK + 77
            res.append(run_absmax(x, block, getattr(K.quantize.absmax_units, twin)))
            emin = window_emins(x, block, 3, 4, dtype)
            _, units, upb = ref_units(n, block)
            for stochastic in (False, True):
                codes, bad = np.zeros(n, np.uint8), np.zeros(units, np.int64)
                getattr(K.quantize.minifloat_encode, twin)(ro(x), block, upb, emin, 3, 0x7F, 7, stochastic, STRM, codes, bad)
                res += [codes, bad]
                acc, r = np.empty(n, dtype), x[::-1].copy()
                crc = getattr(K.quantize.feedback_minifloat_encode, twin)(
                    ro(x), ro(r), acc, block, upb, emin + 1, 3, 0x7F, 7, stochastic, STRM, codes, bad, 0
                )
                res += [acc, codes, bad, np.int64(crc)]
                res += list(run_qsgd(x, 512, 16, stochastic, STRM, getattr(K.bucket.qsgd_encode, twin)))
                res += list(run_minmax(x, 1024, 255, stochastic, STRM, getattr(K.bucket.minmax_encode, twin)))
            res += list(run_moments(x, float(x[0]), getattr(K.quantize.tensor_moments, twin)))
            s = terngrad_scale(x, 0.01)
            res.append(run_terngrad(x, 0.01, s, STRM, getattr(K.quantize.terngrad_encode, twin)))
            res += list(run_sign(x, getattr(K.quantize.sign_encode, twin)))
            for bits in (3, 11):
                raw, lut, a, off = dequant_case(bits, n, 700, True)
                for mode in (SET, ADD, SUB):
                    out = np.ones(n, dtype)
                    run_dequantize(raw, bits, n, lut, 700, a, off, out, mode, getattr(K.dequant.dequantize, twin))
                    res.append(out)
                res.append(np.uint64(getattr(K.dequant.max_field, twin)(ro(raw), bits, n, (1 << bits) - 1, 1)))
                res.append(np.array([getattr(K.dequant.fields_within, twin)(ro(raw), bits, n, (1 << bits) - 1, 1, lim) for lim in (1, 3, 300)]))
            raw = np.random.default_rng(9).integers(0, 243, -(-n // 5), dtype=np.uint8)
            for mode in (SET, SUB):
                out = np.ones(n, dtype)
                getattr(K.dequant.trits_dequantize, twin)(ro(raw), n, ro(np.array([0.0, 0.3, -0.3])), out, mode)
                res.append(out)
        runs.append([np.asarray(r).tobytes() for r in res])
    assert len(runs[0]) == len(runs[1])
    for i, (a, b) in enumerate(zip(*runs)):
        assert a == b, f"result {i} differs between the serial and parallel twins"


# ====================================================================== segmented kernels
# A many-tensor frame's run of small tensors is coded and decoded in one call with per-tensor
# offsets: each tensor exactly as the NumPy reference codes it alone, with its own stream.
SEGMENTS = [[], [0], [5], [1, 0, 7, 1000, 513, CHUNK, 3, 4097], [CHUNK - 1, 2, CHUNK + 1]]


def segmented(kind, sizes, dtype):
    """The tensors of ``sizes``, their concatenation and starts, and a stream per tensor."""
    xs = [data(kind, n, dtype, seed=i) for i, n in enumerate(sizes)]
    starts = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    strms = np.array([ref_stream(2024, i, 3) for i in range(len(sizes))], np.uint64)
    flat = np.concatenate(xs) if xs else np.empty(0, dtype)
    return xs, flat, starts, strms


def bucket_starts(sizes, bucket):
    out = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum([-(-n // bucket) for n in sizes], out=out[1:])
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sizes", SEGMENTS)
def test_qsgd_encode_segments_match_numpy(sizes, kind, dtype):
    xs, flat, starts, strms = segmented(kind, sizes, dtype)
    for bucket, s in ((7, 3), (512, 16), (CHUNK, 127)):
        for stochastic in (False, True):
            bstarts = bucket_starts(sizes, bucket)
            norms = np.full(int(bstarts[-1]), np.nan)
            codes = np.zeros(flat.size, np.uint8)
            bad = np.full(len(sizes), -1, np.int64)
            K.bucket.qsgd_encode_segments(ro(flat), starts, bstarts, bucket, s, stochastic, strms, LANES, norms, codes, bad)
            assert not bad.any()
            for t, x in enumerate(xs):
                want_norms, want_codes = ref_qsgd(x, bucket, s, stochastic, strms[t])
                assert_same(norms[bstarts[t] : bstarts[t + 1]], want_norms, f"norms of tensor {t}")
                assert_same(codes[starts[t] : starts[t + 1]].astype(np.int64), want_codes, f"codes of tensor {t}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sizes", SEGMENTS)
def test_minmax_encode_segments_match_numpy(sizes, kind, dtype):
    xs, flat, starts, strms = segmented(kind, sizes, dtype)
    wide = np.dtype(dtype) == np.float64
    ibits = ro(flat.view(np.int64 if wide else np.int32))
    low, inf = ((1 << 63) - 1, 0x7FF0000000000000) if wide else (0x7FFFFFFF, 0x7F800000)
    for bucket, bits in ((7, 1), (1024, 8), (33, 5)):
        for stochastic in (False, True):
            bstarts = bucket_starts(sizes, bucket)
            lows, highs = np.full(int(bstarts[-1]), np.nan), np.full(int(bstarts[-1]), np.nan)
            codes = np.zeros(flat.size, np.uint8)
            bad = np.full(len(sizes), -1, np.int64)
            K.bucket.minmax_encode_segments(
                ro(flat), ibits, low, inf, starts, bstarts, bucket, (1 << bits) - 1, stochastic, strms, lows, highs, codes, bad
            )
            assert not bad.any()
            for t, x in enumerate(xs):
                wl, wh, wc = ref_minmax(x, bucket, (1 << bits) - 1, stochastic, strms[t])
                sl = slice(bstarts[t], bstarts[t + 1])
                assert_same(lows[sl], wl, f"lows of tensor {t}")
                assert_same(highs[sl], wh, f"highs of tensor {t}")
                assert_same(codes[starts[t] : starts[t + 1]].astype(np.int64), wc, f"codes of tensor {t}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_encode_segments_report_nonfinite_per_tensor(dtype):
    sizes = [5, 700, 3]
    _, flat, starts, strms = segmented("normal", sizes, dtype)
    flat[600] = np.nan  # tensor 1
    flat[706] = np.inf  # tensor 2
    bstarts = bucket_starts(sizes, 512)
    bad = np.zeros(3, np.int64)
    K.bucket.qsgd_encode_segments(ro(flat), starts, bstarts, 512, 16, True, strms, LANES, np.empty(int(bstarts[-1])), np.empty(flat.size, np.uint8), bad)
    assert bad.tolist() == [0, 1, 1]
    wide = np.dtype(dtype) == np.float64
    low, inf = ((1 << 63) - 1, 0x7FF0000000000000) if wide else (0x7FFFFFFF, 0x7F800000)
    bad[:] = 0
    nb = int(bstarts[-1])
    K.bucket.minmax_encode_segments(
        ro(flat), ro(flat.view(np.int64 if wide else np.int32)), low, inf, starts, bstarts, 512, 255, False, strms,
        np.empty(nb), np.empty(nb), np.empty(flat.size, np.uint8), bad,
    )
    assert bad.tolist() == [0, 1, 1]


#: the tensors of a run the segmented decoders are tested on: sizes, and their blocks
SEGMENT_SIZES = [0, 1, 9, 1001, CHUNK + 3, 17, 8]
SEGMENT_BLOCKS = [1, 7, 8, 512, CHUNK, 17, 1]


def segments_case(bits, offsets):
    """A run's payload for the segmented decoders: every tensor of :data:`SEGMENT_SIZES`
    with its codes at its own byte offset (gaps of other bytes between them, one after the
    last), its own block length and factors.  Returns ``(data, args, lut, dstarts, starts,
    a_parts, off_parts)``, ``args`` the decoders' arguments after ``data`` up to ``out``."""
    parts, dstarts, lut = [], [], None
    a_parts, off_parts = [], []
    pos = 0
    for t, (n, block) in enumerate(zip(SEGMENT_SIZES, SEGMENT_BLOCKS)):
        raw, lut_t, a, off = dequant_case(bits, n, block, offsets, seed=t)
        lut = lut_t if lut is None else lut
        gap = np.full(t % 3, 0xAB, np.uint8)  # bytes of other sections between the codes
        parts += [gap, raw]
        dstarts.append(pos + gap.size)
        pos += gap.size + raw.size
        a_parts.append(a)
        off_parts.append(off)
    data_ = np.concatenate(parts + [np.full(3, 0xCD, np.uint8)])
    starts = np.zeros(len(SEGMENT_SIZES) + 1, np.int64)
    np.cumsum(SEGMENT_SIZES, out=starts[1:])
    astarts = np.zeros(len(SEGMENT_SIZES) + 1, np.int64)
    np.cumsum([a.size for a in a_parts], out=astarts[1:])
    off_all = np.concatenate(off_parts) if offsets else np.empty(0)
    dstarts = np.array(dstarts, np.int64)
    args = (ro(dstarts), bits, ro(starts), ro(lut), ro(np.array(SEGMENT_BLOCKS, np.int64)), ro(np.concatenate(a_parts)), ro(astarts), ro(off_all))  # (read-only, as the stage passes them)
    return data_, args, lut, dstarts, starts, a_parts, off_parts


@pytest.mark.parametrize("bits", [1, 3, 6, 8, 11, 16])
@pytest.mark.parametrize("offsets", [False, True])
def test_dequantize_segments_match_numpy(bits, offsets):
    """Every tensor's codes at its own byte offset (gaps between them), its own block length
    and factors; SET, ADD and SUB into float32/float64, into one array and into each tensor's
    own array by address, each tensor as ref_dequantize gives it."""
    sizes, blocks = SEGMENT_SIZES, SEGMENT_BLOCKS
    data_, args, lut, dstarts, starts, a_parts, off_parts = segments_case(bits, offsets)
    rng = np.random.default_rng(bits)
    for dtype in DTYPES:
        for mode in (SET, ADD, SUB):
            out0 = (rng.standard_normal(int(starts[-1])) * 10).astype(dtype)
            out = out0.copy()
            outs = [out0[starts[t] : starts[t + 1]].copy() for t in range(len(sizes))]  # each its own array
            twin = ("serial", "parallel")[mode % 2]  # both twins' (tensor, chunk) rows
            getattr(K.dequant.dequantize_segments, twin)(ro(data_), *args, out, ro(np.empty(0, np.int64)), mode)
            addrs = np.array([o.ctypes.data for o in outs], np.int64)
            getattr(K.dequant.dequantize_segments, twin)(ro(data_), *args, outs[0], ro(addrs), mode)
            for t, n in enumerate(sizes):
                raw = data_[dstarts[t] : dstarts[t] + -(-n * bits // 8)]
                sl = slice(starts[t], starts[t + 1])
                want = ref_dequantize(raw, bits, n, lut, blocks[t], a_parts[t], off_parts[t], out0[sl], mode)
                assert_same(out[sl], want, f"tensor {t} {np.dtype(dtype)} mode {mode}")
                assert_same(outs[t], want, f"tensor {t} {np.dtype(dtype)} mode {mode}, by address")


@pytest.mark.parametrize("bits", [1, 6, 8, 11])
def test_dequantize_segments_checked_match_numpy(bits):
    """``dequantize_segments_checked``: each tensor's values as ``ref_dequantize`` gives them
    (into one array and into each tensor's own), whether every field of every tensor is
    within the largest allowed (the NumPy maximum over the run, and one beyond it), and the
    CRC-32C of the whole run's bytes, the gaps between the tensors' codes included, on both
    twins' (tensor, chunk) rows."""
    data_, args, lut, dstarts, starts, a_parts, off_parts = segments_case(bits, bits % 2 == 0)
    fmask, fshift = (1 << bits) - 1, min(1, bits - 1)
    top = max(int(((ref_unpack(data_[d:], bits, n) & U64(fmask)) >> U64(fshift)).max(initial=0)) for d, n in zip(dstarts, SEGMENT_SIZES))
    for dtype, twin, largest, start in ((np.float32, "serial", top, 0), (np.float64, "parallel", top - 1, 0x5EED), (np.float32, "parallel", top, -1)):
        out = np.full(int(starts[-1]), 7.0, dtype)
        outs = [np.full(n, 7.0, dtype) for n in SEGMENT_SIZES]
        for dst, addrs in ((out, ro(np.empty(0, np.int64))), (outs[0], ro(np.array([o.ctypes.data for o in outs], np.int64)))):
            within, crc = getattr(K.dequant.dequantize_segments_checked, twin)(ro(data_), *args, dst, addrs, fmask, fshift, largest, start)
            assert bool(within) == (top <= largest), (largest, top)
            if start < 0:
                assert int(crc) == -1
            else:
                check_kernel_crc(int(crc), data_, start, K.dequant)
        for t, n in enumerate(SEGMENT_SIZES):
            raw = data_[dstarts[t] : dstarts[t] + -(-n * bits // 8)]
            want = ref_dequantize(raw, bits, n, lut, SEGMENT_BLOCKS[t], a_parts[t], off_parts[t], np.empty(n, dtype), SET)
            assert_same(out[starts[t] : starts[t + 1]], want, f"tensor {t} {np.dtype(dtype)}")
            assert_same(outs[t], want, f"tensor {t} {np.dtype(dtype)}, by address")


@pytest.mark.parametrize("bits", [1, 5, 8, 9, 16])
def test_fields_within_segments_match_numpy(bits):
    """The largest field over every tensor's codes (its own offset, set bits between), the
    largest code in each tensor in turn: within ``largest`` exactly when NumPy's maximum is."""
    rng = np.random.default_rng(bits)
    sizes = [0, 3, 8, 1001, CHUNK * 8 // bits + 3]
    full = (1 << bits) - 1
    for fmask, fshift in ((full, 0), (full, 1), (full >> 1, 0)):
        for hot in range(len(sizes)):  # the largest code in each tensor in turn
            codes = [rng.integers(0, 2, n, dtype=np.uint64) for n in sizes]
            if sizes[hot]:
                codes[hot][-1] = full  # the last code of that tensor
            raws = [ref_pack(c, bits) for c in codes]
            gaps = [np.full(2, 0xFF, np.uint8) for _ in sizes]  # set bits between tensors are not codes
            data_ = np.concatenate([p for g, r in zip(gaps, raws) for p in (g, r)])
            dstarts = np.cumsum([0] + [g.size + r.size for g, r in zip(gaps, raws)])[:-1] + 2
            starts = np.zeros(len(sizes) + 1, np.int64)
            np.cumsum(sizes, out=starts[1:])
            want = max(int(((c & U64(fmask)) >> U64(fshift)).max(initial=0)) for c in codes)
            for largest, twin in ((max(want - 1, 0), "serial"), (want, "parallel"), (max(want - 1, 0), "parallel")):
                got = getattr(K.dequant.fields_within_segments, twin)(ro(data_), dstarts.astype(np.int64), bits, starts, fmask, fshift, largest)
                assert got == (want <= largest), (fmask, fshift, hot, largest)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sizes", SEGMENTS)
def test_minifloat_segments_match_numpy(sizes, kind, dtype):
    """absmax_units_segments and minifloat_encode_segments: every tensor with its own window
    length (one window, or blocks of 100), windows and stream, as the references code it alone."""
    xs, flat, starts, strms = segmented(kind, sizes, dtype)
    for per_block in (None, 100):
        blocks = np.array([max(1, n if per_block is None else min(per_block, n)) for n in sizes], np.int64)
        bstarts = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum([-(-n // b) for n, b in zip(sizes, blocks)], out=bstarts[1:])
        ustarts = np.zeros(len(sizes) + 1, np.int64)  # a window longer than CHUNK is several work units
        np.cumsum([-(-n // b) * -(-b // CHUNK) for n, b in zip(sizes, blocks)], out=ustarts[1:])
        bits_, mask = fbits(flat)
        top = np.zeros(int(ustarts[-1]), bits_.dtype)
        K.quantize.absmax_units_segments(bits_, starts, blocks, ustarts, mask, top)
        for t, x in enumerate(xs):
            assert_same(top[ustarts[t] : ustarts[t + 1]], ref_absmax_units(x, int(blocks[t])), f"maxima of tensor {t}")
        for bits, e in ((8, 4), (3, 1), (16, 5)):
            m = bits - 1 - e
            emin = np.concatenate([window_emins(x, int(b), m, e, dtype) for x, b in zip(xs, blocks)] + [np.zeros(0, np.int64)])
            for stochastic in (False, True):
                codes = np.zeros(flat.size, np.uint8 if bits <= 8 else np.uint16)
                bad = np.full(len(sizes), -1, np.int64)
                maxmag = (1 << (bits - 1)) - 1
                K.quantize.minifloat_encode_segments(ro(flat), starts, blocks, bstarts, emin, m, maxmag, bits - 1, stochastic, strms, codes, bad)
                assert not bad.any()
                for t, x in enumerate(xs):
                    want = ref_minifloat(x, int(blocks[t]), emin[bstarts[t] : bstarts[t + 1]], m, maxmag, bits - 1, stochastic, strms[t])
                    assert_same(codes[starts[t] : starts[t + 1]].astype(np.int64), want, f"codes of tensor {t} bits={bits}")
