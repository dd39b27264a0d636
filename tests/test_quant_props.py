"""Quantizers (docs/codecs.md, "Quantizers (value stages)"): properties and statistics.

``tests/test_quant.py`` checks the quantizers bit for bit against the NumPy references of
``tests/reference/quant.py``; this module checks the guarantees the spec states from first
principles, with references that share nothing with either:

* ``rangefloat``: hypothesis over widths, exponent widths, blocks and dtypes: relative error
  <= 2**-(m+1) inside each block's window, decoded values representable in the format and
  never above the window's largest value, the block exponent ``T`` on the wire;
* ``fp8`` against ``ml_dtypes`` (exhaustive over the finite bfloat16 bit patterns, ties,
  random float32, saturation, the power-of-two scale), ``fp16``/``bf16`` against NumPy /
  ``ml_dtypes`` conversion;
* unbiasedness of every stochastic quantizer, bounded statistically: per element and over
  all elements, with Bernstein's inequality at a family-wise false-alarm rate below 1e-6;
* reproducibility: same (seed, key, step) -> same bytes; another -> other bytes; the
  thread count changes nothing;
* sign / efsign / onebit: zeros on the non-negative side, exact group means, efsign ==
  sign(scale=l1).

Stages not registered yet are skipped, not passed.
"""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import codec
from codec.dtypes import bfloat16
from codec.frame import SectionKind, parse_frame

from support.threads import same_across_threads

F16, BF16, F32, F64 = np.dtype(np.float16), np.dtype(bfloat16), np.dtype(np.float32), np.dtype(np.float64)

#: largest binary exponent and exponent of the smallest subnormal of each dtype
EMAX = {F16: 15, BF16: 127, F32: 127, F64: 1023}
TINY_EXP = {F16: -24, BF16: -133, F32: -149, F64: -1074}

#: format -> (ml_dtypes type, largest finite, mantissa bits, smallest normal exponent, scale offset)
FP8 = {
    "e4m3": (ml_dtypes.float8_e4m3fn, 448.0, 3, -6, 8),
    "e5m2": (ml_dtypes.float8_e5m2, 57344.0, 2, -14, 15),
}

STOCHASTIC = [
    "qsgd",
    "terngrad",
    "rangefloat(rounding=stochastic)",
    "fp8(rounding=stochastic)",
    "minmax(rounding=stochastic)",
]


# ====================================================================== helpers
def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def section(frame: bytes, kind: SectionKind) -> tuple:
    """(info, raw bytes) of the frame's only section of ``kind``."""
    fr = parse_frame(frame)
    hits = [i for i, s in enumerate(fr.sections) if s.kind == kind]
    assert len(hits) == 1, f"{len(hits)} sections of kind {kind.name} in {fr.spec!r}"
    return fr.sections[hits[0]], bytes(fr.raw(hits[0]))


def payload(frame: bytes) -> list:
    """Every section's (kind, bits, count, raw bytes): the frame without its header."""
    fr = parse_frame(frame)
    return [(s.kind, s.bits, s.count, bytes(fr.raw(i))) for i, s in enumerate(fr.sections)]


def exp2(v) -> int:
    """floor(log2 |v|) of a non-zero float, exactly (subnormals included)."""
    return math.frexp(float(v))[1] - 1


def round32_up(v: float) -> float:
    """float64 ``v`` rounded up (toward +inf) to float32."""
    f = np.float32(v)
    if float(f) < v:
        f = np.nextafter(f, np.float32(np.inf))
    return float(f)


def round32_down(v: float) -> float:
    f = np.float32(v)
    if float(f) > v:
        f = np.nextafter(f, np.float32(-np.inf))
    return float(f)


def finite_bf16_patterns_as_f32() -> np.ndarray:
    """All 2**16 bfloat16 bit patterns that are finite, as float32 (exact)."""
    x = (np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)).view(np.float32)
    return x[np.isfinite(x)]


def random_f32_patterns(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return x[np.isfinite(x)]


# ====================================================================== 1. rangefloat
def rf_T(absvals: np.ndarray, m: int, dt: np.dtype) -> int:
    """A block's top binade per the spec (exponent of max|v|, plus one when the window's
    largest value (2 - 2**-m) * 2**T is below max|v| and T + 1 <= emax)."""
    M = float(absvals.max()) if absvals.size else 0.0
    if M == 0.0:
        return TINY_EXP[dt]
    f, ex = math.frexp(M)  # M = f * 2**ex, f in [0.5, 1): M * 2**-T = 2f exactly
    T = ex - 1
    if 2 * f > 2 - 2.0**-m and T + 1 <= EMAX[dt]:
        T += 1
    return T


def rf_check_block(vals: np.ndarray, dec: np.ndarray, bits: int, e: int, T: int, where: str) -> None:
    m = bits - 1 - e
    Emin = T - 2**e + 2
    two = Fraction(2)
    top = Fraction(2 ** (m + 1) - 1, 2**m) * two**T  # (2 - 2**-m) * 2**T
    sub = two ** (Emin - m)  # smallest subnormal of the format
    for i, (v, d) in enumerate(zip(vals.astype(np.float64).tolist(), dec.astype(np.float64).tolist())):
        what = f"{where}: element {i}: v={v!r} decoded {d!r} (bits={bits}, e={e}, m={m}, T={T}, Emin={Emin})"
        assert math.isfinite(d), what
        V, D = Fraction(v), Fraction(d)
        A = abs(D)
        if v != 0:
            assert math.copysign(1, d) == math.copysign(1, v), f"{what}: sign changed"
        ok = bool(A <= top)
        assert ok, f"{what}: above the window's largest value {float(top)!r}"
        if A:
            ed = exp2(d)
            ex = max(ed, Emin)
            q = A / two ** (ex - m)
            ok = bool(ed <= T and q.denominator == 1 and q < 2 ** (m + 1))
            assert ok, f"{what}: not a value of the format"
        if v == 0:
            assert A == 0, what
            continue
        ev = exp2(v)
        if Emin <= ev <= T:  # inside the window [2**Emin, 2**(T+1))
            ok = bool(abs(D - V) * 2 ** (m + 1) <= abs(V))
            assert ok, f"{what}: relative error {float(abs(D - V) / abs(V))!r} > 2**-{m + 1}"
        elif ev < Emin:  # subnormal range of the format
            if abs(V) >= sub:
                ok = bool(abs(D - V) <= sub / 2)
                assert ok, f"{what}: error beyond half the subnormal step {float(sub)!r}"
            else:
                ok = bool(A in (0, sub))
                assert ok, f"{what}: below the smallest subnormal, must become 0 or it"
        else:
            raise AssertionError(f"{what}: above 2**(T+1): the test's T is wrong")


def _bits_for(dt: np.dtype) -> int:
    return {F16: 16, BF16: 16, F32: 32, F64: 64}[dt]


@st.composite
def rangefloat_cases(draw):
    bits = draw(st.integers(3, 16))
    e = draw(st.one_of(st.none(), st.integers(1, min(8, bits - 1))))
    dt = draw(st.sampled_from([F32, F64, F32, F64, F16, BF16]))
    n = draw(st.integers(1, 40))
    style = draw(st.sampled_from(["any", "clustered", "clustered"]))
    if style == "any":  # anything finite: subnormals, huge values, signed zeros
        if dt == BF16:
            pats = draw(st.lists(st.integers(0, 0xFFFF), min_size=n, max_size=n))
            x = np.array(pats, np.uint16).view(bfloat16)
            x = np.where(np.isfinite(x.astype(np.float32)), x, bfloat16.type(1.0)).astype(bfloat16)
        else:
            el = st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True, width=_bits_for(dt))
            x = np.array(draw(st.lists(el, min_size=n, max_size=n)), dt)
    else:  # magnitudes spanning the window and a little below it, somewhere in the dtype's range
        ee = e if e is not None else min(5, bits // 2)
        span = 2**ee + (bits - 1 - ee) + 4
        base = draw(st.integers(TINY_EXP[dt] + 1, EMAX[dt]))
        offs = draw(st.lists(st.integers(0, span), min_size=n, max_size=n))
        mant = draw(st.lists(st.floats(1.0, 2.0, exclude_max=True), min_size=n, max_size=n))
        sign = draw(st.lists(st.sampled_from([1.0, -1.0]), min_size=n, max_size=n))
        zero = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        with np.errstate(all="ignore"):
            v = np.array(sign) * np.ldexp(np.array(mant), base - np.array(offs))
            v = np.where(np.array(zero) & (np.arange(n) % 7 == 3), 0.0, v)
            x = v.astype(dt)
        big = float(ml_dtypes.finfo(dt).max)
        x = np.where(np.isfinite(x.astype(np.float64)), x.astype(np.float64), np.copysign(big, v)).astype(dt)
    block = draw(st.one_of(st.just(0), st.integers(1, max(1, n))))
    return bits, e, block, x


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rangefloat_cases())
@example((3, None, 0, np.array([np.finfo(np.float64).max])))  # the largest float64: T = 1023, saturates
@example((8, None, 0, np.array([-np.finfo(np.float64).max, 1.0, 2.0**-1074])))
@example((8, None, 0, np.array([1.875 * (1 + 2.0**-50), 0.5])))  # a hair above the window's top: T += 1
@example((8, 4, 1, np.array([1.875 * (1 + 2.0**-52), -3.75 * (1 + 2.0**-51), 2.0**-1070 * 1.9375])))
@example((16, 8, 0, np.array([2.0**-1074, 3 * 2.0**-1074, 0.0, -0.0])))
@example((16, 8, 0, np.array([1e-310, -3e-308])))  # float64 window far below 2**-1074: Emin = T - 254
@example((4, 3, 0, np.array([np.finfo(np.float32).max, 1e-45, -1e-30], np.float32)))
@example((4, None, 1, np.array([1e300, 5e-324, -3e-320, -1e308])))  # windows spanning more than float64's exponents: a second pass for the lowest
def test_rangefloat_nearest_window_error_and_grid(case):
    """Nearest rounding: |decoded - v| <= 2**-(m+1) |v| for every v in its block's window
    [2**Emin, 2**(T+1)); decoded values lie on the format's grid and below its largest value;
    the ints section holds each block's T."""
    bits, e, block, x = case
    spec = f"rangefloat(bits={bits},block={block})" if e is None else f"rangefloat(bits={bits},exp_bits={e},block={block})"
    ee = min(5, bits // 2) if e is None else e
    m = bits - 1 - ee
    c = codec.get_codec(spec)
    frame = c.encode(x)
    dec = codec.decode(frame)
    assert dec.dtype == x.dtype and dec.shape == x.shape
    flat = x.reshape(-1)
    blk = block or max(1, flat.size)
    starts = range(0, flat.size, blk)
    Ts = [rf_T(np.abs(flat[s : s + blk].astype(np.float64)), m, x.dtype) for s in starts]
    info, raw = section(frame, SectionKind.INTS)
    wire = np.frombuffer(raw, "<i2").tolist() if info.bits == 16 else None
    assert wire == Ts, f"{spec} on {x.dtype}: block exponents T on the wire {wire}, spec gives {Ts}"
    for s, T in zip(starts, Ts):
        rf_check_block(flat[s : s + blk], dec.reshape(-1)[s : s + blk], bits, ee, T, f"{spec} on {x.dtype}, block at {s}")


def test_rangefloat_signed_zero_and_carry():
    """-0.0 round-trips (the sign bit is kept for zeros); a mantissa carry steps into the next
    exponent; the window's top holds max|v| (bump rule) so nothing saturates."""
    c = codec.get_codec("rangefloat(bits=8)")  # e4m3-like: m = 3
    x = np.array([-0.0, 0.0, 1.0, 1.9375, -1.97, 3.9], np.float32)  # 1.9375 = 1 + 15/16 -> carry to 2
    d = codec.decode(c.encode(x))
    assert np.signbit(d).tolist() == [True, False, False, False, True, False], d
    assert d[3] == 2.0 and d[4] == -2.0, d
    assert d[5] == 3.75 or d[5] == 4.0, d
    # max|v| = 3.9 > (2 - 2**-3) * 2 = 3.75, so T = 2: 3.9 rounds to 4.0, not down to 3.75
    assert d[5] == 4.0, f"3.9 must round to 4.0 (T raised to 2), got {d[5]}"


# ====================================================================== 2. fp8 / fp16 / bf16 vs ml_dtypes, NumPy
def fp8_ref(v32: np.ndarray, fmt: str) -> np.ndarray:
    """ml_dtypes' nearest-even conversion of float32 values, saturated (float64 result)."""
    t, big = FP8[fmt][0], FP8[fmt][1]
    with np.errstate(all="ignore"):
        r = np.asarray(v32, np.float32).astype(t).astype(np.float64)
    bad = ~np.isfinite(r)
    r[bad] = np.copysign(big, np.asarray(v32, np.float64)[bad])
    return r


def fp8_grid(fmt: str) -> np.ndarray:
    """Every finite non-negative value of the format, ascending (float64)."""
    t = FP8[fmt][0]
    v = np.arange(256, dtype=np.uint8).view(t).astype(np.float64)
    return np.unique(v[np.isfinite(v) & (v >= 0)])


def fp8_inputs(fmt: str) -> np.ndarray:
    """Finite bfloat16 patterns, random float32, exact midpoints and their float32 neighbours."""
    g = fp8_grid(fmt)
    mids = ((g[1:] + g[:-1]) / 2).astype(np.float32)  # exact in float32
    near = np.concatenate([mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf)), g.astype(np.float32)])
    big = FP8[fmt][1]
    edge = np.array([big, big * 1.03, big * 1.0625, big * 1.07, big * 1.125, 3.4e38, 2.0**-149, 2.0**-126], np.float32)
    pos = np.concatenate([near, edge])
    return np.concatenate([finite_bf16_patterns_as_f32(), random_f32_patterns(200_000, 11), pos, -pos])


def assert_values(got, want, what: str) -> None:
    """Equal as numbers, with equal signs wherever the expected value is non-zero."""
    g, w = np.asarray(got, np.float64).reshape(-1), np.asarray(want, np.float64).reshape(-1)
    assert g.shape == w.shape, what
    bad = np.flatnonzero((g != w) | ((w != 0) & (np.signbit(g) != np.signbit(w))))
    if bad.size:
        raise AssertionError(f"{what}: {bad.size} of {g.size} differ; first inputs at {bad[:6].tolist()}: got {g[bad[:6]].tolist()}, want {w[bad[:6]].tolist()}")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_matches_ml_dtypes(fmt):
    """Nearest rounding, no scale: decode == ml_dtypes conversion in range; saturation beyond."""
    x = fp8_inputs(fmt)
    dec = codec.decode(codec.get_codec(f"fp8(format={fmt})").encode(x))
    assert dec.dtype == F32
    assert_values(dec, fp8_ref(x, fmt), f"fp8({fmt}) on float32")
    big = FP8[fmt][1]
    assert np.all(np.abs(dec) <= big)
    out = np.abs(x.astype(np.float64)) > big * 1.25
    assert np.all(np.abs(dec[out]) == big), "finite values beyond the range must saturate"


def fp8_nearest64(x, fmt: str) -> np.ndarray:
    """Nearest-even rounding of float64 ``x`` onto the format's grid, saturating (float64).

    The grid ascends with the codes, so an even index is an even mantissa; the differences
    to the two neighbours are exact (Sterbenz)."""
    g = fp8_grid(fmt)
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    k = np.clip(np.searchsorted(g, a, side="left"), 1, g.size - 1)  # g[k-1] < a <= g[k]
    low, up = g[k - 1], g[k]
    dl, du = a - low, up - a
    pick = np.where(dl < du, low, np.where(du < dl, up, np.where((k - 1) % 2 == 0, low, up)))
    pick = np.where(a >= g[-1], g[-1], pick)
    return np.copysign(pick, x)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_float64_reference_agrees_with_ml_dtypes(fmt):
    """The float64 grid reference used below equals ml_dtypes (saturated) on float32 inputs."""
    x = fp8_inputs(fmt)
    assert_values(fp8_nearest64(x.astype(np.float64), fmt), fp8_ref(x, fmt), f"test reference for {fmt}")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dt", [F16, BF16, F64], ids=["f16", "bf16", "f64"])
def test_fp8_other_dtypes(fmt, dt):
    """16-bit inputs widen exactly; float64 inputs round once (no double rounding through
    float32), also just off a tie."""
    c = codec.get_codec(f"fp8(format={fmt})")
    if dt == F64:
        g = fp8_grid(fmt)
        mids = (g[1:] + g[:-1]) / 2
        below, above = mids * (1 - 2.0**-40), mids * (1 + 2.0**-40)  # float32 would round these onto the tie
        rnd = np.random.default_rng(5).standard_normal(20_000) * np.exp(np.random.default_rng(6).uniform(-12, 7, 20_000))
        x = np.concatenate([below, above, -below, -above, rnd])
        want = fp8_nearest64(x, fmt)
        k = mids.size
        assert np.array_equal(want[:k], g[:-1]) and np.array_equal(want[k : 2 * k], g[1:])
    else:
        x = finite_bf16_patterns_as_f32()
        if dt == F16:
            with np.errstate(all="ignore"):
                x = x.astype(np.float16)
            x = x[np.isfinite(x)]
        else:
            x = x.astype(bfloat16)
        want = fp8_ref(x.astype(np.float32), fmt)
    dec = codec.decode(c.encode(x))
    assert dec.dtype == x.dtype
    assert_values(dec, want, f"fp8({fmt}) on {dt}")


def fp8_scale(M: float, fmt: str, dt: np.dtype) -> int:
    """s = floor(log2 M) - offset, plus one when M * 2**-s exceeds the largest value and
    largest * 2**(s+1) is finite in ``dt`` (the tests avoid the values where "decoded values
    stay finite" could be read differently)."""
    big, off = FP8[fmt][1], FP8[fmt][4]
    s = exp2(M) - off
    if math.ldexp(M, -s) > big and exp2(big) + s + 1 <= EMAX[dt]:
        s += 1
    return s


def scale_arrays(rng) -> list:
    out = []
    for k in (-140, -120, -60, -20, -3, 0, 5, 30, 90, 110):
        out.append((rng.standard_normal(3000) * 2.0**k).astype(np.float32))
    for fmt in ("e4m3", "e5m2"):
        big = FP8[fmt][1]
        for t in (big, big * (1 + 2**-20), big * 1.0625, big * 1.1, 2.0 ** (FP8[fmt][4] + 1) * 0.999):
            x = (rng.uniform(-1, 1, 500) * t * 2.0**-7).astype(np.float32)
            x[17] = np.float32(t * 2.0**-7)
            out.append(x)
    x = (rng.standard_normal(2000) * 1e-41).astype(np.float32)  # float32 subnormals only
    out.append(x)
    return out


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_scale_matches_ml_dtypes(fmt):
    """scale=true: decode == ml_dtypes.float8(v * 2**-s) * 2**s with s per the spec (an
    int16 in the ints section); max|v| lands in the top binade."""
    c = codec.get_codec(f"fp8(format={fmt},scale=true)")
    for j, x in enumerate(scale_arrays(np.random.default_rng(7))):
        x64 = x.astype(np.float64)
        M = float(np.abs(x64).max())
        s = fp8_scale(M, fmt, F32)
        frame = c.encode(x)
        info, raw = section(frame, SectionKind.INTS)
        assert info.bits == 16 and np.frombuffer(raw, "<i2").tolist() == [s], f"array {j}: scale {np.frombuffer(raw, '<i2')} on the wire, spec gives {s}"
        q = fp8_ref(np.ldexp(x64, -s).astype(np.float32), fmt)  # v * 2**-s is exact in float64
        with np.errstate(all="ignore"):
            want = np.ldexp(q, s).astype(np.float32)
        dec = codec.decode(frame)
        assert_values(dec, want, f"fp8({fmt},scale=true) array {j} (max|v|={M!r}, s={s})")
        top = float(np.abs(dec.astype(np.float64)).max())
        assert top > 0 and exp2(top) >= exp2(M) - 1, f"array {j}: max|v| {M} did not land in the top binade ({top})"


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_scale_float64(fmt):
    """scale=true on float64: one rounding of v * 2**-s (exact), also next to the bump
    threshold and across float64's whole range."""
    c = codec.get_codec(f"fp8(format={fmt},scale=true)")
    big = FP8[fmt][1]
    rng = np.random.default_rng(17)
    arrays = [rng.standard_normal(2000) * np.exp(rng.uniform(-30, 5, 2000)) * 2.0**k for k in (-1040, -700, -10, 0, 20, 900, 1000)]
    for t in (big, big * (1 + 2.0**-52), big * (1 + 2.0**-45), big * (1 - 2.0**-52), big * 1.0625):
        for k in (-1060, 0, 1000):
            x = rng.uniform(-1, 1, 300) * math.ldexp(t, k)
            x[3] = math.ldexp(t, k)
            arrays.append(x)
    arrays.append(np.array([np.finfo(np.float64).max, -1.0, 3e307, 0.0]))  # no raise: largest * 2**(s+1) = inf
    for M in (1e-320, 3e-322, 2.0**-1074, 2.0**-1066 * 1.5):  # 2**s below float64's range
        arrays.append(np.array([M, -M / 3, M / 200, 0.0]))
    for j, x in enumerate(arrays):
        M = float(np.abs(x).max())
        s = fp8_scale(M, fmt, F64)
        frame = c.encode(x)
        info, raw = section(frame, SectionKind.INTS)
        assert np.frombuffer(raw, "<i2").tolist() == [s], f"float64 array {j} (max|v|={M!r}): scale {np.frombuffer(raw, '<i2')} on the wire, spec gives {s}"
        with np.errstate(all="ignore"):
            want = np.ldexp(fp8_nearest64(np.ldexp(x, -s), fmt), s)
        assert_values(codec.decode(frame), want, f"fp8({fmt},scale=true) float64 array {j} (max|v|={M!r}, s={s})")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_scale_extremes(fmt):
    """scale=true at the ends of float32: decoded values stay finite; zeros stay zero."""
    c = codec.get_codec(f"fp8(format={fmt},scale=true)")
    fmax = float(np.finfo(np.float32).max)
    for x in (np.array([fmax, -fmax, 1.0, 0.0], np.float32), np.array([1.8 * 2.0**127, 3.0], np.float32),
              np.zeros(10, np.float32), np.array([2.0**-149, -2.0**-149, 0.0], np.float32)):
        d = codec.decode(c.encode(x)).astype(np.float64)
        assert np.all(np.isfinite(d)), f"fp8({fmt},scale=true) of {x}: {d}"
        assert np.all(d[x == 0] == 0)
        top = np.abs(x) == np.abs(x).max()
        assert np.all(np.abs(d - x)[top] <= np.abs(x)[top] * 0.25), f"fp8({fmt},scale=true) of {x}: {d}"


def f16_inputs() -> np.ndarray:
    rng = np.random.default_rng(3)
    base = np.concatenate([finite_bf16_patterns_as_f32(), random_f32_patterns(200_000, 4)])
    # float16 ties: a random float16 in float32 with exactly half an ulp (2**12 of float32's 2**13) added
    h = rng.integers(0, 0x7C00, 50_000, dtype=np.uint16).view(np.float16).astype(np.float32)
    tie_n = (h.view(np.uint32) + np.uint32(1 << 12)).view(np.float32)  # normal range ties
    sub = (rng.integers(0, 1024, 5000) + 0.5) * 2.0**-24  # subnormal ties
    edges = np.array([65504, 65519.99, 65520, 65536, 2.0**-25, 2.0**-25 * 1.0000001, 3 * 2.0**-26], np.float32)
    pos = np.concatenate([tie_n, sub.astype(np.float32), edges])
    return np.concatenate([base, pos, -pos])


def test_fp16_matches_numpy():
    x = f16_inputs()
    with np.errstate(all="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    dec = codec.decode(codec.get_codec("fp16").encode(x))
    assert same(dec.view(np.uint32), want.view(np.uint32)), f"fp16: {np.count_nonzero(dec.view(np.uint32) != want.view(np.uint32))} values differ from numpy"


def test_bf16_matches_ml_dtypes():
    rng = np.random.default_rng(8)
    r = random_f32_patterns(300_000, 9)
    b = rng.integers(0, 1 << 16, 50_000, dtype=np.uint32)
    ties = ((b << np.uint32(16)) | np.uint32(0x8000)).view(np.float32)  # exactly half a bfloat16 ulp
    ties = ties[np.isfinite(ties)]
    x = np.concatenate([finite_bf16_patterns_as_f32(), r, ties, np.nextafter(ties, np.float32(0))])
    with np.errstate(all="ignore"):
        want = x.astype(bfloat16).astype(np.float32)
    dec = codec.decode(codec.get_codec("bf16").encode(x))
    d, w = dec.view(np.uint32), want.view(np.uint32)
    assert np.array_equal(d, w), f"bf16: {np.count_nonzero(d != w)} values differ from ml_dtypes, e.g. input {x[d != w][:4]}"


# ====================================================================== 3. unbiasedness
N_STEPS = 400
#: per-check false-alarm probability: with <= 1e4 checks in this module, family-wise < 1e-6
DELTA = 1e-10
LOG = math.log(2 / DELTA)


def bernstein(var_sum, b):
    """t with P(|S| >= t) <= DELTA for a sum S of independent centred terms, each bounded by
    ``b`` in absolute value, of total variance ``var_sum`` (Bernstein's inequality:
    P(|S| >= t) <= 2 exp(-t**2 / (2 var_sum + 2 b t / 3)))."""
    a = np.asarray(b, np.float64) * LOG / 3
    return a + np.sqrt(a * a + 2 * np.asarray(var_sum, np.float64) * LOG)


def two_point(mag: np.ndarray, sign: np.ndarray, quantum, lo_off=0.0):
    """Stochastic rounding of ``mag / quantum`` to an integer: (lo, hi, p) with signs applied."""
    t = mag / quantum
    fl = np.floor(t)
    p = t - fl
    lo = sign * (lo_off + fl * quantum)
    hi = sign * (lo_off + (fl + 1) * quantum)
    return lo, hi, p


def grid_qsgd(x, levels=16, bucket=512):
    lo, hi, p = (np.empty_like(x) for _ in range(3))
    for s0 in range(0, x.size, bucket):
        v = x[s0 : s0 + bucket]
        norm = round32_up(math.sqrt(float(np.sum(v * v))))
        t = np.abs(v) * (levels / norm)
        fl = np.floor(t)
        sg = np.where(v < 0, -1.0, 1.0)
        lo[s0 : s0 + bucket] = sg * ((fl / levels) * norm)
        hi[s0 : s0 + bucket] = sg * ((np.minimum(fl + 1, levels) / levels) * norm)
        p[s0 : s0 + bucket] = np.where(fl >= levels, 0.0, t - fl)
    return x.copy(), lo, hi, p


def grid_terngrad(x, clip=2.5):
    sigma = float(np.std(x))
    g = np.clip(x, -clip * sigma, clip * sigma) if clip and sigma else x.copy()
    s = float(np.max(np.abs(g)))
    sg = np.where(x < 0, -1.0, 1.0)
    return g, np.zeros_like(x), sg * s, np.abs(g) / s


def grid_float(x, m, emin):
    """A float grid with ``m`` mantissa bits and smallest normal exponent ``emin``."""
    a = np.abs(x)
    e = np.maximum(np.floor(np.log2(np.where(a > 0, a, 1.0))), emin)
    e = np.where(a > 0, e, emin)
    # np.log2 may be off by one next to a power of two: fix with exact comparisons
    e = np.where(np.ldexp(1.0, e.astype(np.int64)) > a, np.maximum(e - 1, emin), e)
    e = np.where((np.ldexp(1.0, (e + 1).astype(np.int64)) <= a) & (a > 0), e + 1, e)
    q = np.ldexp(1.0, (e - m).astype(np.int64))
    lo, hi, p = two_point(a, np.where(x < 0, -1.0, 1.0), q)
    return x.copy(), lo, hi, p


def grid_rangefloat(x, bits=8):
    e = min(5, bits // 2)
    m = bits - 1 - e
    T = rf_T(np.abs(x), m, F64)
    return grid_float(x, m, T - 2**e + 2)


def grid_fp8(x, fmt="e4m3", scale=False):
    _, big, m, emin, _ = FP8[fmt]
    if not scale:
        return grid_float(x, m, emin)
    s = fp8_scale(float(np.abs(x).max()), fmt, F64)
    tgt, lo, hi, p = grid_float(np.ldexp(x, -s), m, emin)
    return x.copy(), np.ldexp(lo, s), np.ldexp(hi, s), p


def grid_minmax(x, bits=8, bucket=1024):
    L = 2**bits - 1
    lo, hi, p = (np.empty_like(x) for _ in range(3))
    for s0 in range(0, x.size, bucket):
        v = x[s0 : s0 + bucket]
        a, b = round32_down(float(v.min())), round32_up(float(v.max()))
        step = (b - a) / L
        t = (v - a) * (L / (b - a))
        fl = np.floor(t)
        lo[s0 : s0 + bucket] = a + fl * step
        hi[s0 : s0 + bucket] = a + np.minimum(fl + 1, L) * step
        p[s0 : s0 + bucket] = np.where(fl >= L, 0.0, t - fl)
    return x.copy(), lo, hi, p


def unbiased_data(rng, n=300) -> np.ndarray:
    """Gaussian values with a heavy tail, a few exact zeros and tiny values."""
    x = rng.standard_normal(n) * np.exp(rng.uniform(-4, 1, n))
    x[::37] = 0.0
    x[5::41] *= 1e-3
    return x


UNBIASED = [
    # spec, grid(x) -> (target, lo, hi, p), data scale
    ("qsgd", grid_qsgd, 1.0),
    ("qsgd(levels=3,bucket=64)", lambda x: grid_qsgd(x, 3, 64), 1.0),
    ("terngrad(clip=0)", lambda x: grid_terngrad(x, 0), 1.0),
    ("terngrad", grid_terngrad, 1.0),  # unbiased for the CLIPPED values
    ("rangefloat(rounding=stochastic)", grid_rangefloat, 1.0),
    ("rangefloat(bits=5,exp_bits=2,block=50,rounding=stochastic)", None, 1.0),
    ("fp8(rounding=stochastic)", grid_fp8, 50.0),
    ("fp8(format=e5m2,rounding=stochastic)", lambda x: grid_fp8(x, "e5m2"), 50.0),
    ("fp8(format=e5m2,scale=true,rounding=stochastic)", lambda x: grid_fp8(x, "e5m2", True), 1e-3),
    ("minmax(rounding=stochastic)", grid_minmax, 1.0),
    ("minmax(bits=3,bucket=64,rounding=stochastic)", lambda x: grid_minmax(x, 3, 64), 1.0),
]


def grid_rangefloat_blocked(x, bits=5, e=2, block=50):
    m = bits - 1 - e
    out = [np.empty_like(x) for _ in range(4)]
    for s0 in range(0, x.size, block):
        v = x[s0 : s0 + block]
        T = rf_T(np.abs(v), m, F64)
        for o, r in zip(out, grid_float(v, m, T - 2**e + 2)):
            o[s0 : s0 + block] = r
    return tuple(out)


@pytest.mark.parametrize("spec,grid,scale", UNBIASED, ids=[u[0] for u in UNBIASED])
def test_stochastic_rounding_is_unbiased(spec, grid, scale):
    """Steps 0..N-1 of the same array: every decoded value is one of its two neighbours on the
    grid, and the mean converges to the input (the clipped input for terngrad): per element
    within Bernstein's bound for the exact two-point variance, and over all elements."""
    if grid is None:
        grid = grid_rangefloat_blocked
    x = unbiased_data(np.random.default_rng(12), 300)
    x *= scale / np.abs(x).max()  # max|x| = scale (fp8 without a scale: inside its range)
    target, lo, hi, p = grid(x)
    h = np.abs(hi - lo)
    c = codec.get_codec(spec)
    total = np.zeros_like(x)
    ups = np.zeros(x.size, np.int64)
    for t in range(N_STEPS):
        d = codec.decode(c.encode(x, key="k", step=t))
        assert d.dtype == F64
        is_lo = np.isclose(d, lo, rtol=1e-12, atol=0)
        is_hi = np.isclose(d, hi, rtol=1e-12, atol=0)
        bad = np.flatnonzero(~(is_lo | is_hi))
        assert bad.size == 0, (
            f"{spec} step {t}: decoded values off their two grid neighbours at {bad[:5].tolist()}: "
            f"x={x[bad[:5]].tolist()}, decoded {d[bad[:5]].tolist()}, lo {lo[bad[:5]].tolist()}, hi {hi[bad[:5]].tolist()}"
        )
        total += d
        ups += is_hi & ~is_lo
    mean = total / N_STEPS
    # per element: S_i = N (mean_i - mu_i), terms bounded by h_i, variance N p(1-p) h^2
    var = p * (1 - p) * h * h
    tol = bernstein(N_STEPS * var, h) / N_STEPS
    slack = 1e-9 * h + 1e-13 * np.abs(target)  # u has 32 bits; float64 formula rounding
    err = np.abs(mean - target)
    bad = np.flatnonzero(err > tol + slack)
    assert bad.size == 0, (
        f"{spec}: mean of {N_STEPS} decodes is biased at {bad[:5].tolist()}: x={x[bad[:5]].tolist()}, "
        f"target {target[bad[:5]].tolist()}, mean {mean[bad[:5]].tolist()}, bound {(tol + slack)[bad[:5]].tolist()}, "
        f"p={p[bad[:5]].tolist()}, rounded up {ups[bad[:5]].tolist()} times"
    )
    # over all elements: the standardized errors sum to ~0 (catches a small systematic bias)
    live = h > 0
    z = (ups[live] - N_STEPS * p[live]).sum()  # count of ups minus its expectation
    zt = bernstein(N_STEPS * float((p[live] * (1 - p[live])).sum()), 1.0)
    assert abs(z) <= zt + 1e-6 * N_STEPS * live.sum(), f"{spec}: {ups[live].sum()} round-ups, expected {N_STEPS * p[live].sum():.1f} +- {zt:.1f}"
    # and in value units: the signed sum of the errors
    tot = N_STEPS * float((mean - target).sum())
    tt = bernstein(N_STEPS * float(var.sum()), float(h.max())) + N_STEPS * float(slack.sum())
    assert abs(tot) <= tt, f"{spec}: summed error {tot / N_STEPS} over all elements, bound {tt / N_STEPS}"


# ====================================================================== 4. reproducibility
@pytest.mark.parametrize("spec", STOCHASTIC)
def test_same_seed_key_step_same_bytes(spec):
    rng = np.random.default_rng(21)
    x = rng.standard_normal(4000).astype(np.float32)
    c = codec.get_codec(spec)
    f = c.encode(x, key="layer.0", step=3)
    assert c.encode(x.copy(), key="layer.0", step=3) == f
    assert codec.get_codec(spec).encode(x, key="layer.0", step=3) == f, "a fresh codec object gives other bytes"
    assert c.encode(x) == c.encode(x, key=None, step=0), "a bare encode must use key None, step 0"
    assert c.encode(x, key=5, step=1) == c.encode(x, key="5", step=1), "int keys hash as their decimal text"
    others = {
        "step": c.encode(x, key="layer.0", step=4),
        "key": c.encode(x, key="layer.1", step=3),
        "seed": codec.get_codec(_with_seed(spec, 1)).encode(x, key="layer.0", step=3),
        "big step": c.encode(x, key="layer.0", step=2**40 + 3),
    }
    for what, g in others.items():
        assert payload(g) != payload(f), f"{spec}: another {what} gave the same values"
    d1, d2 = codec.decode(f), codec.decode(f)
    assert same(d1, d2), "decoding is not deterministic"


def _with_seed(spec: str, seed: int) -> str:
    if "(" in spec:
        return spec[:-1] + f",seed={seed})"
    return f"{spec}(seed={seed})"


@pytest.mark.parametrize("spec", STOCHASTIC)
def test_error_feedback_passes_key_and_step(spec):
    """ErrorFeedback draws with (its key, the key's step count): its frames equal
    encode(acc, key=, step=) with acc = x + residual rounded to the dtype."""
    c = codec.get_codec(spec)
    ef = codec.ErrorFeedback(c)
    rng = np.random.default_rng(22)
    for step in range(3):
        x = rng.standard_normal(1000).astype(np.float32)
        old = ef.residual("w").copy() if step else np.zeros_like(x)
        acc = np.add(x, old, dtype=np.float32)
        f = ef.encode(x, key="w")
        assert f == c.encode(acc, key="w", step=step), f"{spec}: ErrorFeedback step {step} differs from encode(acc, key='w', step={step})"


THREAD_SCRIPT = r"""
import hashlib, sys
import numpy as np
import codec
specs = sys.argv[1:]
rng = np.random.default_rng(31)
x = (rng.standard_normal(300_000) * np.exp(rng.uniform(-3, 1, 300_000))).astype(np.float32)
h = hashlib.sha256()
for spec in specs:
    c = codec.get_codec(spec)
    for arr in (x, x.astype(np.float64)):
        for step in (0, 7):
            h.update(c.encode(arr, key="k", step=step))
print(h.hexdigest())
"""


def test_frames_do_not_depend_on_thread_count():
    specs = STOCHASTIC + ["rangefloat(block=1000)", "fp8(format=e5m2,scale=true,rounding=stochastic)", "qsgd(rounding=nearest)",
                          "minmax", "rangefloat", "sign", "efsign", "onebit", "topk(ratio=0.3)+qsgd(levels=4)"]

    one = same_across_threads(THREAD_SCRIPT, *specs)  # equal under NUMBA_NUM_THREADS=1 and 2 (asserted there)
    assert len(one) == 64
    h = hashlib.sha256()
    rng = np.random.default_rng(31)
    x = (rng.standard_normal(300_000) * np.exp(rng.uniform(-3, 1, 300_000))).astype(np.float32)
    for spec in specs:
        c = codec.get_codec(spec)
        for arr in (x, x.astype(np.float64)):
            for step in (0, 7):
                h.update(c.encode(arr, key="k", step=step))
    assert h.hexdigest() == one, "frames in this process differ from the 1-thread subprocess"


# ====================================================================== 5. sign / efsign / onebit
def sign_bits(frame: bytes, n: int) -> np.ndarray:
    info, raw = section(frame, SectionKind.VALUES)
    assert info.bits == 1 and info.count == n
    return np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")[:n]


ZERO_CASE = np.array([0.0, -0.0, 1.5, -2.0, -1e-40, 1e-40, -0.0, 3.0], np.float32)


@pytest.mark.parametrize("dt", [F32, F64, F16, BF16], ids=["f32", "f64", "f16", "bf16"])
def test_sign_zero_is_non_negative(dt):
    x = ZERO_CASE.astype(dt)
    neg = x.astype(np.float64) < 0
    f = codec.get_codec("sign").encode(x)
    assert sign_bits(f, x.size).tolist() == neg.astype(int).tolist(), "sign bits: 1 for v < 0 only (zeros and -0.0 are 0)"
    d = codec.decode(f)
    assert d.dtype == dt
    assert same(d, np.where(neg, -1.0, 1.0).astype(dt)), f"sign of {x}: {d}"
    a = np.asarray(math.fsum(np.abs(x.astype(np.float64))) / x.size).astype(dt)
    for spec in ("sign(scale=l1)", "efsign"):
        f = codec.get_codec(spec).encode(x)
        assert sign_bits(f, x.size).tolist() == neg.astype(int).tolist(), spec
        d = codec.decode(f)
        assert same(d, np.where(neg, -a, a).astype(dt)), f"{spec} of {x}: {d}, want +-{a}"


def test_sign_l1_scale_float64():
    x = np.random.default_rng(41).standard_normal(10_001) * 1e-3
    d = codec.decode(codec.get_codec("sign(scale=l1)").encode(x))
    a = math.fsum(np.abs(x)) / x.size
    assert np.all(np.abs(np.abs(d) - a) <= 4 * np.spacing(a)), (np.abs(d[0]), a)
    assert np.array_equal(np.signbit(d), x < 0)


@pytest.mark.parametrize("dt", [F32, F64, F16, BF16], ids=["f32", "f64", "f16", "bf16"])
def test_efsign_is_sign_l1_bit_for_bit(dt):
    rng = np.random.default_rng(42)
    a, b = codec.get_codec("efsign"), codec.get_codec("sign(scale=l1)")
    for x in (rng.standard_normal(1001).astype(dt), ZERO_CASE.astype(dt), np.zeros(0, dt), np.zeros(9, dt), np.array(-0.5, dt)):
        fa, fb = a.encode(x), b.encode(x)
        assert payload(fa) == payload(fb), f"efsign and sign(scale=l1) sections differ for {x.dtype}{x.shape}"
        assert same(codec.decode(fa), codec.decode(fb))
    ea, eb = codec.ErrorFeedback(a), codec.ErrorFeedback(b)
    for _ in range(4):
        x = rng.standard_normal((13, 17)).astype(dt)
        assert payload(ea.encode(x, key="g")) == payload(eb.encode(x, key="g"))
        assert same(ea.residual("g"), eb.residual("g"))


def exact_mean(vals) -> float:
    """The float64 mean of ``vals`` (correctly rounded from the exact rational mean); 0 when empty."""
    if len(vals) == 0:
        return 0.0
    return float(sum((Fraction(float(v)) for v in vals), Fraction(0)) / len(vals))


def onebit_want(x: np.ndarray) -> np.ndarray:
    v = x.astype(np.float64).reshape(-1)
    neg = v < 0
    means = [exact_mean(v[neg]), exact_mean(v[~neg])]
    with np.errstate(over="ignore"):
        m32 = [np.float32(mu) for mu in means]
    if all(np.isfinite(m32)):  # else the whole scalars section is float64
        means = [float(mu) for mu in m32]
    return np.where(neg, means[0], means[1]).astype(x.dtype).reshape(x.shape)


@pytest.mark.parametrize("dt", [F32, F64, F16, BF16], ids=["f32", "f64", "f16", "bf16"])
def test_onebit_group_means(dt):
    """Each value becomes its group's mean: float64 means of the negative and the
    non-negative values (zeros and -0.0 included there), rounded to float32."""
    rng = np.random.default_rng(43)
    c = codec.get_codec("onebit")
    cases = [
        ZERO_CASE.astype(dt),
        (rng.integers(-1000, 1000, 777) * 2.0**-10).astype(dt),  # exact sums
        rng.standard_normal(5000).astype(dt),
        (rng.standard_normal(3000) * 1e-3 + 1e-4).astype(dt),
        np.abs(rng.standard_normal(50)).astype(dt),  # no negative values: empty group
        -np.abs(rng.standard_normal(50)).astype(dt) - dt.type(0.5),  # no non-negative values
        np.array([-0.0, 0.0, -0.0], dt),
    ]
    for x in cases:
        f = c.encode(x)
        assert sign_bits(f, x.size).tolist() == (x.astype(np.float64) < 0).astype(int).tolist()
        d = codec.decode(f)
        want = onebit_want(x)
        assert d.dtype == dt
        assert_values(d, want, f"onebit on {dt}{x.shape}")


def test_onebit_means_beyond_float32():
    """float64 data whose mean does not fit float32: the means travel as float64."""
    x = np.array([1e300, 3e300, -2e300, 5e299, -1e-300, 0.0])
    d = codec.decode(codec.get_codec("onebit").encode(x))
    pos, neg = (1e300 + 3e300 + 5e299 + 0.0) / 4, (-2e300 - 1e-300) / 2
    want = np.where(x < 0, neg, pos)
    assert np.all(np.abs(d - want) <= 4 * np.spacing(np.abs(want))), (d, want)
