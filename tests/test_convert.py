"""16-bit float conversion (codec.ops.narrow/widen/store, the ``convert`` kernel family) against references.

References: NumPy's float32/float64 -> float16 casts (both correctly rounded), ml_dtypes for
float32 -> bfloat16, and ``round16`` (tests/conftest.py: scale, ``np.rint``, scale back) for
everything, itself checked against exact rational arithmetic.
"""

from __future__ import annotations

import contextlib
import io
from fractions import Fraction

import crc32c
import ml_dtypes
import numba
import numpy as np
import pytest

from codec import ops
from codec.dtypes import readonly as ro
from codec.kernels import module
from codec.layout import CHUNK  # elements per parallel chunk of the convert kernels
from codec.modes import ADD, SET, SUB
from support.crc import check_kernel_crc
from support.threads import same_across_threads

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf/NaN test data

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
HALVES = (F16, BF16)
SIZES = (0, 1, 7, CHUNK - 1, CHUNK, 2 * CHUNK + 3)


# ---------------------------------------------------------------- helpers
def is_nan_code(codes, dtype):
    inf = 0x7C00 if np.dtype(dtype) == F16 else 0x7F80
    return (np.asarray(codes, np.uint16) & 0x7FFF) > inf


def assert_codes(got, want, dtype, where=None):
    """Equal codes, except that any NaN matches any NaN."""
    got, want = np.asarray(got, np.uint16), np.asarray(want, np.uint16)
    assert got.shape == want.shape
    gn, wn = is_nan_code(got, dtype), is_nan_code(want, dtype)
    np.testing.assert_array_equal(gn, wn, err_msg="NaN positions differ")
    bad = np.flatnonzero((got != want) & ~wn)
    if bad.size:
        i = bad[0]
        x = "" if where is None else f" for input {where[i]!r} ({np.asarray(where)[i:i+1].view(np.uint8).tobytes().hex()})"
        raise AssertionError(f"{bad.size} codes differ; first at {i}: got {got[i]:#06x}, want {want[i]:#06x}{x}")


def assert_same_floats(got, want):
    """Bit-identical floats (signed zeros too), any NaN matching any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    gn, wn = np.isnan(got), np.isnan(want)
    np.testing.assert_array_equal(gn, wn)
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    bad = np.flatnonzero((got.view(u) != want.view(u)) & ~wn)
    assert not bad.size, f"{bad.size} values differ; first at {bad[0]}: {got[bad[0]]!r} vs {want[bad[0]]!r}"


def as64(x):
    """Exact float64 value of a float16/bfloat16/float32/float64 array."""
    return np.asarray(x).astype(np.float64)


def check_narrow(x, dtype, ref16):
    codes, bad, crc = ops.narrow(x, dtype, crc=0x9E3779B9)
    assert crc == crc32c.crc32c(codes.tobytes(), 0x9E3779B9)  # the frame's checksum, formed as they are written
    assert codes.dtype == np.uint16 and codes.shape == (x.size,)
    assert bad == int((~np.isfinite(as64(x))).sum())
    assert_codes(codes, ref16(as64(x), dtype), dtype, where=x.reshape(-1))
    return codes


def heavy(rng, n, dtype):
    """Gradient-like data with heavy tails, over many binades, both signs, a few exact zeros."""
    parts = [
        rng.standard_normal(n) * 1e-3,
        rng.standard_t(2, n),
        rng.lognormal(0, 6, n) * rng.choice([-1.0, 1.0], n),
        rng.standard_t(1.5, n) * 2.0 ** rng.integers(-30, 20, n),
    ]
    x = np.concatenate(parts)[rng.permutation(4 * n)][:n]
    x[rng.random(n) < 0.01] = 0.0
    return x.astype(dtype)


def all_codes(dtype, finite=True):
    """Every 16-bit value of ``dtype`` (both signs) as float64, optionally only the finite ones."""
    v = as64(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype))
    return v[np.isfinite(v)] if finite else v


def midpoints(dtype):
    """Every finite value, every midpoint between neighbours (and the overflow midpoint), both signs."""
    pos = np.unique(np.abs(all_codes(dtype)))  # 0 .. max finite, ascending
    top = float(pos[-1])
    over = top + (top - float(pos[-2])) / 2  # 65520 for float16: the first value that rounds to inf
    mids = np.concatenate([(pos[:-1] + pos[1:]) / 2, [over]])  # exact in float64 (and float32)
    v = np.concatenate([pos, mids])
    return np.concatenate([v, -v])


def codes_of(values, dtype) -> np.ndarray:
    """uint16 codes of float64 values that are exactly representable in ``dtype``."""
    v = np.asarray(values, np.float64)
    if np.dtype(dtype) == F16:
        return v.astype(np.float16).view(np.uint16)
    return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


# ---------------------------------------------------------------- the reference itself
def test_reference_matches_exact_rationals(ref16, exact_round):
    rng = np.random.default_rng(0)
    for dtype in HALVES:
        m = midpoints(dtype)
        x = np.concatenate(
            [
                rng.choice(m, 300),
                np.nextafter(rng.choice(m, 150), np.inf),
                np.nextafter(rng.choice(m, 150), -np.inf),
                rng.choice(m, 100) * (1 + 2.0**-40),
                heavy(rng, 300, np.float64),
                [0.0, -0.0, np.inf, -np.inf, 5e-324, -5e-324, 1.7e308],
            ]
        )
        got = ref16(x, dtype)
        fin = np.isfinite(x)
        want = codes_of([exact_round(Fraction(float(v)), dtype) if f else v for v, f in zip(x, fin)], dtype)
        want[np.signbit(x)] |= 0x8000  # -0.0 from the exact rounding of a tiny negative
        np.testing.assert_array_equal(got, want)


def test_references_agree_with_numpy_and_ml_dtypes(ref16):
    rng = np.random.default_rng(1)
    x64 = np.concatenate([heavy(rng, 20000, np.float64), midpoints(F16)])
    assert_codes(ref16(x64, F16), x64.astype(np.float16).view(np.uint16), F16)
    x32 = np.concatenate([heavy(rng, 20000, np.float32), midpoints(BF16).astype(np.float32)])
    assert_codes(ref16(x32, BF16), x32.astype(ml_dtypes.bfloat16).view(np.uint16), BF16)


# ---------------------------------------------------------------- narrow: encoders
@pytest.mark.parametrize("src", (np.float32, np.float64))
@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_narrow_random_and_heavy(n, dtype, src, ref16):
    rng = np.random.default_rng(n)
    for x in (rng.standard_normal(n).astype(src), heavy(rng, n, src)):
        codes = check_narrow(x, dtype, ref16)
        if src == np.float32 and dtype == F16:
            assert_codes(codes, x.astype(np.float16).view(np.uint16), dtype)
        if src == np.float64 and dtype == F16:  # NumPy's float64 -> float16 is correctly rounded
            assert_codes(codes, x.astype(np.float16).view(np.uint16), dtype)
        if src == np.float32 and dtype == BF16:
            assert_codes(codes, x.astype(ml_dtypes.bfloat16).view(np.uint16), dtype)


@pytest.mark.parametrize("src", (np.float32, np.float64))
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_narrow_every_value_and_every_tie(dtype, src, ref16):
    """Each representable value, each midpoint (ties to even!), and one ulp of ``src`` either side."""
    m = midpoints(dtype).astype(src)
    x = np.concatenate([m, np.nextafter(m, src(np.inf)), np.nextafter(m, src(-np.inf))])
    check_narrow(x, dtype, ref16)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_narrow_float64_has_no_double_rounding(dtype, ref16):
    """float64 values a hair off a midpoint: rounding to float32 first would land on the tie."""
    m = midpoints(dtype)
    m = m[m != 0]
    x = np.concatenate([m * (1 + 2.0**-40), m * (1 - 2.0**-40), m * (1 + 2.0**-52), m * (1 - 2.0**-53)])
    codes = check_narrow(x, dtype, ref16)
    # and this is a real trap: a float32 detour gets a share of these wrong
    detour = ref16(x.astype(np.float32).astype(np.float64), dtype)
    assert (detour != codes).sum() > x.size // 10


@pytest.mark.parametrize("src", (np.float32, np.float64))
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_narrow_overflow_and_nonfinite(dtype, src, ref16):
    top = 65504.0 if dtype == F16 else float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    over = 65520.0 if dtype == F16 else float(Fraction(2**128) - Fraction(2**119))  # max + ulp/2
    big = [top, np.nextafter(src(over), src(0)), over, np.nextafter(src(over), src(np.inf)), 1e30, 3e38, np.inf]
    if src == np.float64:
        big += [1e39, 1e300, float(np.finfo(np.float64).max)]
    x = np.array(big + [-v for v in big], src)
    if dtype == F16:  # 65519.99 -> 65504 (max), 65520 -> inf (the tie goes to the even "65536")
        x = np.concatenate([np.array([65519.99, 65520.0, -65519.99, 65519.0, 65505.0], src), x])
    # NaNs with assorted payloads and signs, including payloads invisible after truncation
    ubits = {np.float32: np.uint32, np.float64: np.uint64}[src]
    if src == np.float32:
        nans = [0x7FC00000, 0x7F800001, 0x7F800FFF, 0x7F801000, 0x7FBFFFFF, 0x7FFFFFFF, 0xFF800001, 0xFFC00000, 0x7F810000]
    else:
        nans = [0x7FF8000000000000, 0x7FF0000000000001, 0x7FF00000FFFFFFFF, 0x7FF0000100000000, 0xFFF0000000000001, 0x7FFFFFFFFFFFFFFF]
    x = np.concatenate([x, np.array(nans, ubits).view(src)])
    codes = check_narrow(x, dtype, ref16)
    nan = np.isnan(x)
    assert is_nan_code(codes[nan], dtype).all()
    inf = 0x7C00 if dtype == F16 else 0x7F80
    assert ((codes[np.isinf(x)] & 0x7FFF) == inf).all()
    if dtype == F16:
        assert codes[:3].tolist() == [0x7BFF, 0x7C00, 0xFBFF]


@pytest.mark.parametrize("src", (np.float32, np.float64))
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_narrow_subnormals(dtype, src, ref16):
    """float32 subnormals (bit patterns spread over the whole range, both signs) and float16 ones."""
    u = np.unique(np.r_[np.arange(1, 1 << 23, 997), 1, 2, 3, (1 << 22) - 1, 1 << 22, (1 << 22) + 1, (1 << 23) - 1, 1 << 23])
    u = np.r_[u, u | (1 << 31)].astype(np.uint32)
    x = np.concatenate([u.view(np.float32), np.float32([0.0, -0.0, 2.0**-126, -(2.0**-126)])]).astype(src)
    if src == np.float64:  # plus float64 values below every float32
        x = np.concatenate([x, [5e-324, -5e-324, 1e-300, 2.0**-150, 2.0**-149 * 1.5, -(2.0**-151)]])
    codes = check_narrow(x, dtype, ref16)
    if dtype == F16:
        assert ((codes & 0x7FFF) == 0).all()  # all below half the smallest float16 subnormal
        np.testing.assert_array_equal(codes >> 15, np.signbit(x))
    sub16 = all_codes(F16)
    sub16 = sub16[np.abs(sub16) < 2.0**-14]
    check_narrow(sub16.astype(src), dtype, ref16)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("src", HALVES, ids=str)
def test_narrow_from_16_bit_input(src, dtype, ref16):
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(src)
    codes = check_narrow(x, dtype, ref16)
    if src == dtype:  # same format: bits untouched, NaN payloads included
        np.testing.assert_array_equal(codes, x.view(np.uint16))
    rng = np.random.default_rng(2)
    check_narrow(heavy(rng, 2 * CHUNK + 3, np.float32).astype(src), dtype, ref16)
    check_narrow(np.zeros(0, src), dtype, ref16)


def test_narrow_keeps_shape_agnostic_flattening(ref16):
    rng = np.random.default_rng(3)
    x = heavy(rng, 3 * 5 * 7, np.float32).reshape(3, 5, 7)
    codes, _, _ = ops.narrow(x, F16)
    np.testing.assert_array_equal(codes, ref16(x.reshape(-1), F16))
    xt = x.transpose(2, 0, 1)  # non-contiguous input
    codes, _, _ = ops.narrow(xt, BF16)
    np.testing.assert_array_equal(codes, ref16(xt.reshape(-1), BF16))


def test_f64_to_f32_odd_kernel():
    """Round to odd: truncate toward zero, set the last bit when inexact (NaN/inf kept)."""
    rng = np.random.default_rng(4)
    x = np.concatenate(
        [
            heavy(rng, 2 * CHUNK + 3, np.float64),
            rng.standard_normal(1000).astype(np.float32).astype(np.float64),  # exact ones
            [0.0, -0.0, np.inf, -np.inf, np.nan, 1e39, -1e39, 1e-50, -1e-50, 5e-324, 2.0**-149, 3.4028235677973366e38],
        ]
    )
    v = x.astype(np.float32)
    over = np.abs(v.astype(np.float64)) > np.abs(x)
    v[over] = np.nextafter(v[over], np.float32(0))
    want = v.view(np.uint32) | ((v.astype(np.float64) != x) & ~np.isnan(x)).astype(np.uint32)
    from codec.kernels.cpu._half import f64_to_f32_odd_bits as odd_bits  # a CPU helper (a CUDA twin's is a device function)

    got = np.array([odd_bits(v) for v in x], np.uint32)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert np.isnan(got[nan].view(np.float32)).all()


# ---------------------------------------------------------------- widen / half decode (every code against NumPy's cast)
def lut_reference(dtype):
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    return codes.view(dtype).astype(np.float32)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_widen_every_code(dtype):
    want = lut_reference(dtype)
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    assert_same_floats(ops.widen(codes.view(dtype)), want)
    # exact: widening then narrowing back gives every non-NaN code back
    back, bad, _ = ops.narrow(ops.widen(codes.view(dtype)), dtype)
    assert bad == int((~np.isfinite(want)).sum())
    assert_codes(back, codes, dtype)
    x = codes.view(dtype).reshape(256, 256)
    assert ops.widen(x).shape == (256, 256)
    assert ops.widen(np.zeros(0, dtype)).size == 0


@pytest.mark.parametrize("src", (np.float32, np.float64))
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_narrow_codes_segments_reads_each_tensor_where_it_lies(dtype, src, ref16):
    """A many-tensor encode's one pass: every tensor's codes (read by address) end to end, as
    the correctly rounded reference gives them per tensor, with the non-finite count and the
    codes' CRC-32C, across chunk boundaries and empty tensors, in both twins."""
    K = module("convert", "cpu")
    rng = np.random.default_rng(11)
    sizes = [0, 1, 7, CHUNK - 3, 0, 2 * CHUNK + 5, 1, 3]
    xs = [heavy(rng, n, src) for n in sizes]
    xs[5][[3, 77]] = [np.nan, np.inf]
    xs[2][0] = -np.inf
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    addrs = np.array([x.ctypes.data for x in xs], np.int64)
    whole = np.concatenate(xs)
    for twin in ("serial", "parallel"):
        codes = np.zeros(whole.size, np.uint16)
        bad, crc = getattr(K.narrow_codes_segments, twin)(codes, addrs, starts, xs[0], dtype == BF16, 0xABC)
        assert bad == 3
        check_kernel_crc(crc, codes, 0xABC, K)
        assert_codes(codes, ref16(as64(whole), dtype), dtype, where=whole)


@pytest.mark.parametrize("mode", (SET, ADD, SUB))
@pytest.mark.parametrize("out_dtype", (np.float32, np.float64))
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_half_decode_segments_writes_each_tensor_where_it_lies(dtype, out_dtype, mode):
    """A many-tensor decode's one pass: tensor t's codes into its own array (by address),
    equal to NumPy's cast per tensor, across chunk boundaries and empty tensors, in both
    twins; the codes' CRC-32C formed as they are read (and the plain kernel's too)."""
    K = module("convert", "cpu")
    rng = np.random.default_rng(7 + mode)
    sizes = [0, 1, 7, CHUNK - 3, 0, 2 * CHUNK + 5, 1, 3]
    codes = rng.integers(0, 1 << 16, sum(sizes), dtype=np.uint16)
    codes[: 1 << 16 if codes.size > 1 << 16 else 0] = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every code
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    vals = lut_reference(dtype)[codes].astype(out_dtype)
    bases = [heavy(rng, n, out_dtype) for n in sizes]
    for twin in ("serial", "parallel"):
        outs = [b.copy() for b in bases]
        addrs = np.array([o.ctypes.data for o in outs], np.int64)
        with np.errstate(invalid="ignore"):
            got = getattr(K.half_decode_segments, twin)(codes, addrs, starts, outs[0], mode, dtype == BF16, 0x5EED)
        check_kernel_crc(got, codes, 0x5EED, K)
        for t, (o, b) in enumerate(zip(outs, bases)):
            v = vals[starts[t] : starts[t + 1]]
            with np.errstate(invalid="ignore"):
                assert_same_floats(o, {SET: v, ADD: b + v, SUB: b - v}[mode])
    out = np.empty(codes.size, out_dtype)
    check_kernel_crc(K.half_decode(ro(codes), out, mode, dtype == BF16, 3), codes, 3, K)  # (the codes read-only, as the stages pass them)
    assert K.half_decode(ro(codes), out, mode, dtype == BF16) == -1  # none asked


@pytest.mark.parametrize("mode", (SET, ADD, SUB))
@pytest.mark.parametrize("out_dtype", (np.float32, np.float64))
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_half_decode_modes(dtype, out_dtype, mode, backend):
    rng = np.random.default_rng(mode)
    codes = np.concatenate([np.arange(1 << 16, dtype=np.uint32).astype(np.uint16), rng.integers(0, 1 << 16, CHUNK + 5, dtype=np.uint16)])
    base = heavy(rng, codes.size, out_dtype)
    vals = lut_reference(dtype)[codes].astype(out_dtype)
    want = {SET: vals, ADD: base + vals, SUB: base - vals}[mode]
    out = base.copy()
    with np.errstate(invalid="ignore"):
        module("convert", backend).half_decode(ro(codes), out, mode, dtype == BF16)
    assert_same_floats(out, want)
    # the same through ops.store (16-bit source into a wide output)
    out = base.copy()
    with np.errstate(invalid="ignore"):
        ops.store(codes.view(dtype), out, mode)
    assert_same_floats(out, want)


@pytest.mark.parametrize("out_dtype", (np.float32, np.float64))
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_a_streamed_decode_writes_the_same_bits(dtype, out_dtype):
    """A large SET decode writes its output with streaming stores (codec/kernels/cpu/_stream.py;
    the CPU kernels only: the CUDA twin writes as before): every code, NaN payloads
    included, gives the very bits of the ordinary SET loop and NumPy's cast, from every
    alignment of the output (the items before the first aligned one, the body, the tail),
    at edge sizes; and ``half_decode`` from ``STREAM_MIN`` values (where it streams) equals
    the reference."""
    from codec.kernels.cpu._half import STREAM, decode_block
    from codec.kernels.cpu._stream import STREAM_MIN

    rng = np.random.default_rng(5)
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    u = {4: np.uint32, 8: np.uint64}[np.dtype(out_dtype).itemsize]
    for n in (0, 1, 7, 8, 9, 17, (1 << 16) + 5):
        codes = np.concatenate([every, rng.integers(0, 1 << 16, n + 7, dtype=np.uint16)])[: n + 7] if n > 8 else rng.integers(0, 1 << 16, n + 7, dtype=np.uint16)
        for at in range(8):  # the output's first item at every offset from a 32-byte boundary
            cs = codes[at : at + n]
            ordinary, streamed = (np.empty(n + 8, out_dtype)[at : at + n] for _ in range(2))
            decode_block(cs, ordinary, SET, dtype == BF16)
            decode_block(cs, streamed, STREAM, dtype == BF16)
            np.testing.assert_array_equal(streamed.view(u), ordinary.view(u))
            assert_same_floats(streamed, lut_reference(dtype)[cs].astype(out_dtype))
    if out_dtype == np.float32:
        codes = rng.integers(0, 1 << 16, STREAM_MIN + 3, dtype=np.uint16)
        out = np.empty(codes.size, np.float32)
        check_kernel_crc(module("convert", "cpu").half_decode(ro(codes), out, SET, dtype == BF16, 0), codes, 0, module("convert", "cpu"))
        assert_same_floats(out, lut_reference(dtype)[codes])


# ---------------------------------------------------------------- fused error feedback
@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_half_feedback(n, dtype, ref16, backend):
    """a = x + r (float32); codes = round(a); new residual = a - value(codes); non-finite count of a."""
    rng = np.random.default_rng(n + 1)
    x = heavy(rng, n, np.float32)
    r = (heavy(rng, n, np.float32) * np.float32(1e-3)).astype(np.float32)
    if n >= 7:
        x[:6] = [np.nan, np.inf, -np.inf, 65519.0, 65520.0, 3e38]
        r[:6] = [0.0, 0.0, 1.0, 0.99, 0.0, 3e38]  # the last overflows float32 in the sum
    a = x + r
    codes_want = ref16(a, dtype)
    acc_want = a - lut_reference(dtype)[codes_want]
    acc = np.full(n, 7.0, np.float32)
    codes = np.zeros(n, np.uint16)
    bad, crc = module("convert", backend).half_feedback(ro(x), ro(r), acc, codes, dtype == BF16, -1)  # (inputs read-only, as the stage passes them)
    assert bad == int((~np.isfinite(a)).sum()) and crc == -1
    assert_codes(codes, codes_want, dtype)
    assert_same_floats(acc, acc_want)


# ---------------------------------------------------------------- the codes' CRC-32C, formed by the kernels
@pytest.mark.parametrize("start", (0, 1, 0xFFFFFFFF, 0x12345678))
@pytest.mark.parametrize("n", SIZES)
def test_kernels_continue_the_crc_of_their_codes(n, start, backend):
    """narrow_codes and half_feedback return the CRC-32C of the codes' bytes continued from
    ``start`` (the crc32c package's value), the same codes as without it; -1 asks for none."""
    conv = module("convert", backend)
    rng = np.random.default_rng(n + start % 97)
    x = heavy(rng, n, np.float32)
    r = (heavy(rng, n, np.float32) * np.float32(1e-3)).astype(np.float32)
    for bf16 in (False, True):
        for kernel, args in ((conv.narrow_codes, (ro(x),)), (conv.half_feedback, (ro(x), ro(r), np.empty(n, np.float32)))):
            plain, codes = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
            assert kernel(*args, plain, bf16, -1)[1] == -1
            got = kernel(*args, codes, bf16, start)[1]
            np.testing.assert_array_equal(codes, plain)
            check_kernel_crc(got, codes, start, conv)


@pytest.mark.parametrize("lo", (0, 1, 5))
@pytest.mark.parametrize("n", (0, 1, 7, 8, 23, 24, 25, 255, 256, 257, 1000, 2047, 2048, 3 * 8 * 4099 + 13))
def test_crc_bytes_of_any_range(n, lo):
    """_crc.crc_bytes: the CRC-32C of any byte range (folded 256-byte blocks where the CPU can,
    three streams, words, the tail), continued from any value; the register steps alone
    (``_streams``: all a CPU without VPCLMULQDQ runs) give it too; join/combine put chunks'
    CRCs together; the byte-table step (the fallback where the CPU has no CRC-32C
    instruction) gives the same register."""
    from codec.kernels.cpu import _crc

    rng = np.random.default_rng(n + lo)
    buf = rng.integers(0, 256, n + lo + 3, dtype=np.uint8).view(np.uint8)
    data = buf[lo : lo + n].tobytes()
    for start in (0, 0xFFFFFFFF, 0xDEADBEEF):
        assert int(_crc.crc_bytes(buf, lo, lo + n, start)) == crc32c.crc32c(data, start)
        assert int(_crc._streams(buf, lo, lo + n, np.uint32(start ^ 0xFFFFFFFF)) ^ 0xFFFFFFFF) == crc32c.crc32c(data, start)
    c = np.uint32(0xFFFFFFFF)
    for b in data[:64]:
        c = _crc._sw_u8(c, b)
    assert int(c ^ np.uint32(0xFFFFFFFF)) == crc32c.crc32c(data[:64])
    cut = n // 3
    sums = np.array([crc32c.crc32c(data[:cut]), crc32c.crc32c(data[cut : 2 * cut]), crc32c.crc32c(data[2 * cut :])], np.uint32)
    if cut:
        assert int(_crc.join(sums, 77, np.array([cut, cut, n - 2 * cut]))) == crc32c.crc32c(data, 77)


# ---------------------------------------------------------------- thread count
WORKLOAD = r"""
import hashlib, numpy as np, ml_dtypes
from codec import ops
from codec.modes import SET, ADD, SUB
from codec.pack import pack_bits, unpack_bits, encode_indices, decode_indices
rng = np.random.default_rng(7)
n = 9 * 65536 + 11
x = (rng.standard_t(2, n) * 2.0 ** rng.integers(-20, 17, n)).astype(np.float64)
x[::1000] = np.nan
h = hashlib.sha256()
for src in (np.float64, np.float32, np.float16, ml_dtypes.bfloat16):
    for dst in (np.float16, ml_dtypes.bfloat16):
        c, bad, _ = ops.narrow(x.astype(src), dst)
        h.update(c.tobytes()); h.update(str(bad).encode())
codes = rng.integers(0, 1 << 16, n, dtype=np.uint16)
for out_dtype in (np.float32, np.float64):
    for mode in (SET, ADD, SUB):
        out = x.astype(out_dtype)
        ops.store(codes.view(np.float16), out, mode); h.update(out.tobytes())
        out = x[: n // 3].astype(out_dtype)
        ops.scatter(x[: n // 7].astype(out_dtype), np.sort(rng.choice(n // 3, n // 7, replace=False)), out, mode)
        h.update(out.tobytes())
    for half in (np.float16, ml_dtypes.bfloat16):
        for mode in (SET, ADD, SUB):
            out = codes.view(half).copy(); ops.store(x.astype(out_dtype), out, mode); h.update(out.tobytes())
from codec.kernels import backend
for bf in (False, True):
    xf, rf = x.astype(np.float32), x[::-1].astype(np.float32) * np.float32(1e-3)
    acc, c = np.empty_like(xf), np.empty(n, np.uint16)
    bad = backend("convert", xf).half_feedback(xf, rf, acc, c, bf, 5)
    h.update(acc.tobytes()); h.update(c.tobytes()); h.update(str(bad).encode())
    h.update(str(backend("convert", xf).narrow_codes(xf, c, bf, 9)).encode())
for bits in (1, 3, 8, 13, 16, 20, 32, 61, 64):
    p = pack_bits(rng.integers(0, 2**63, 8 * 8192 * 3 + 5, dtype=np.uint64), bits)
    h.update(p.tobytes()); h.update(unpack_bits(p, bits, 8 * 8192 * 3 + 5).tobytes())
for d in (1e-3, 0.3):
    idx = np.flatnonzero(rng.random(n * 8) < d)
    s = encode_indices(idx, n * 8); h.update(bytes(s.data))
    info = type("I", (), dict(kind=s.kind, bits=s.bits, count=s.count))
    h.update(decode_indices(info, np.frombuffer(bytes(s.data), np.uint8), n * 8).tobytes())
print(h.hexdigest())
"""


def test_results_do_not_depend_on_thread_count():
    """Every kernel family, sizes spanning many chunks: same bytes with 1, 3 and the default threads."""
    one = three = same_across_threads(WORKLOAD, counts=(1, 3))  # equal under NUMBA_NUM_THREADS=1 and 3 (asserted there)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), np.errstate(all="ignore"):
        exec(compile(WORKLOAD, "<workload>", "exec"), {})
    here = buf.getvalue().strip()
    assert len(here) == 64
    assert one == three == here, f"1 thread: {one}, 3 threads: {three}, {numba.get_num_threads()} threads: {here}"


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_narrow_of_its_own_dtype_counts_from_the_bits(dtype):
    """Input already in the target dtype: the codes are its bits, and the non-finite count is
    read from them (every exponent bit set), with no float32 copy."""
    from codec.ops import narrow

    bits = np.arange(1 << 16, dtype=np.uint16)
    x = bits.view(dtype)
    codes, bad, _ = narrow(x, dtype)
    assert np.array_equal(codes, bits)
    assert bad == int(np.count_nonzero(~np.isfinite(x.astype(np.float32))))


_EDGES = (  # float32 values where fp16's rounding is delicate (run here and in a generic-CPU process)
    "import numpy as np\n"
    "r = np.random.default_rng(0)\n"
    "ties = (r.integers(0, 1 << 31, 20000, dtype=np.uint32) & np.uint32(0xFFFFE000)) | np.uint32(0x1000)\n"
    "x = np.concatenate([r.standard_normal(70000), r.standard_normal(5000) * 2.0**-20, r.uniform(65000, 66000, 3000),\n"
    "                    ties.view(np.float32), np.float32(np.arange(-2000, 2000)) * np.float32(2.0**-24)]).astype(np.float32)\n"
    "x = x[np.isfinite(x)]\n"
    "codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)\n"
    "codes = codes[(codes & 0x7C00) != 0x7C00]\n"
)


def _frames_and_values() -> bytes:
    """fp16 and fp8 frames of the edge values, error feedback's fp16 step of them, and fp16's
    decode of every finite code (all three modes): what a CPU with or without the
    instructions must give alike."""
    import codec
    from codec.kernels.cpu import convert

    ns: dict = {}
    exec(_EDGES, ns)
    x, codes = ns["x"], ns["codes"]
    out = [bytes(codec.get_codec("fp16").encode(x)), bytes(codec.get_codec("fp8").encode(x))]
    r = (x[::-1] * np.float32(1e-3)).copy()
    acc, step = np.empty_like(x), np.empty(x.size, np.uint16)
    convert.half_feedback(x, r, acc, step, False, -1)
    out += [acc.tobytes(), step.tobytes()]
    for mode in (convert.SET, convert.ADD, convert.SUB):
        o = np.linspace(-1, 1, codes.size).astype(np.float32)
        convert.half_decode(codes, o, mode, False, -1)
        out.append(o.tobytes())
    return b"".join(out)


def test_crc_without_the_instruction(tmp_path):
    """Where Numba compiles for a CPU without SSE4.2 and F16C (NUMBA_CPU_NAME=generic, as a
    portable cache does) the module takes the byte-table step, the kernels form no checksum
    (-1) and the frames are checksummed in one pass, and fp16 takes its integer code: the
    same bytes (edge values: ties, subnormals, overflow), the same decoded values; nothing
    aborts in LLVM."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, crc32c, codec, hashlib, sys\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from test_convert import _frames_and_values\n"
        "from codec.kernels.cpu import _crc, _f16c, convert\n"
        "assert not _crc.HARDWARE and not _f16c.HARDWARE\n"
        "buf = np.arange(3000, dtype=np.uint8)\n"
        "assert int(_crc.crc_bytes(buf, 3, 2997, 5)) == crc32c.crc32c(buf[3:2997].tobytes(), 5)\n"
        "x = np.random.default_rng(0).standard_normal(70000).astype(np.float32)\n"
        "c = np.empty(x.size, np.uint16)\n"
        "assert convert.narrow_codes(x, c, False, 0)[1] == -1\n"
        "print(hashlib.sha256(_frames_and_values()).hexdigest())\n"
    )
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CPU_FEATURES="", NUMBA_CACHE_DIR=str(tmp_path))
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    import hashlib

    assert got.stdout.strip() == hashlib.sha256(_frames_and_values()).hexdigest()


@pytest.mark.skipif(__import__("platform").machine().lower() not in ("x86_64", "amd64"), reason="an x86-64 target")
def test_crc_without_the_fold(tmp_path):
    """Where Numba compiles for a CPU with the CRC-32C instruction but without VPCLMULQDQ
    (x86-64-v2: most CPUs before 2019) nothing folds (``FOLD`` False, the intrinsic never
    compiled), and the register steps give every range's CRC-32C, the kernels' too."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, crc32c\n"
        "from codec.kernels.cpu import _crc, convert\n"
        "assert _crc.HARDWARE and not _crc.FOLD\n"
        "buf = np.random.default_rng(1).integers(0, 256, 9000, dtype=np.uint8)\n"
        "for lo, hi in ((0, 9000), (3, 8191), (5, 300), (7, 7)):\n"
        "    assert int(_crc.crc_bytes(buf, lo, hi, 5)) == crc32c.crc32c(buf[lo:hi].tobytes(), 5)\n"
        "x = np.random.default_rng(0).standard_normal(70000).astype(np.float32)\n"
        "c = np.empty(x.size, np.uint16)\n"
        "assert convert.narrow_codes(x, c, False, 9)[1] == crc32c.crc32c(c.tobytes(), 9)\n"
    )
    features = "+64bit,+cx16,+sse,+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+crc32,+popcnt"
    env = dict(os.environ, NUMBA_CPU_NAME="x86-64-v2", NUMBA_CPU_FEATURES=features, NUMBA_CACHE_DIR=str(tmp_path))
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]


def test_fp16_edges_are_numpys():
    """The edge values' fp16 codes are NumPy's float16 bits, every finite code decodes to
    NumPy's value (with F16C on this CPU, its instructions' path)."""
    from codec.kernels.cpu import convert

    ns: dict = {}
    exec(_EDGES, ns)
    x, codes = ns["x"], ns["codes"]
    out = np.empty(x.size, np.uint16)
    convert.narrow_codes(x, out, False, -1)
    assert np.array_equal(out, x.astype(np.float16).view(np.uint16))
    o = np.empty(codes.size, np.float64)
    convert.half_decode(codes, o, convert.SET, False, -1)
    assert np.array_equal(o, codes.view(np.float16).astype(np.float64))


def test_crc_table_step_of_words():
    """The byte-table step of a word (what crc_bytes compiles to without the instruction)."""
    from codec.kernels.cpu import _crc

    data = np.random.default_rng(5).integers(0, 256, 800, dtype=np.uint8)
    c = np.uint32(0xFFFFFFFF)
    for w in data.view(np.uint64):
        c = _crc._sw_u64(c, w)
    assert int(c ^ np.uint32(0xFFFFFFFF)) == crc32c.crc32c(data.tobytes())


def test_narrow_refuses_an_out_it_cannot_write_whole():
    x = np.ones(10, np.float32)
    for out in (np.empty(9, np.uint16), np.empty(20, np.uint16)[::2], np.empty(10, np.int16)):
        with pytest.raises(ValueError, match="out"):
            ops.narrow(x, F16, out)


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_scale_kernel_matches_numpy(dtype, backend):
    """``convert.scale``: each segment's values times its factor in float64, rounded once to
    the output's dtype, as NumPy's ``x.astype(np.float64) * f`` then ``astype``; segments of
    sizes 0, 1, 7 and over a parallel chunk, heavy tails, signed zeros, a factor of 0."""
    rng = np.random.default_rng(8)
    sizes = [0, 1, 7, 3 * (1 << 16) + 5]
    n = sum(sizes)
    x = (rng.standard_t(2, n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    x[:2] = (-0.0, 0.0)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    factors = np.array([3.0, 1 / 3, 0.0, 1000 / 7])
    out = np.full(n, np.nan, dtype)
    module("convert", backend).scale(x, starts, factors, out)
    want = (x.astype(np.float64) * np.repeat(factors, sizes)).astype(dtype)
    assert out.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", [0, 1, 7, 3 * (1 << 16) + 5])
def test_add_kernel_matches_numpy(n, dtype, backend):
    """``out = x + r`` (error feedback's ``acc``): NumPy's ``np.add`` in the dtype, bit for bit,
    across parallel chunks (the last one short); heavy tails, signed zeros, inf, NaN, a sum
    that overflows and one that cancels to +0.0."""
    rng = np.random.default_rng(n)
    x = (rng.standard_t(2, n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    r = (rng.standard_t(2, n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    if n > 6:
        big = np.finfo(dtype).max
        x[:6], r[:6] = (-0.0, -0.0, np.inf, np.nan, big, 1.5), (-0.0, 0.0, -1.0, 2.0, big, -1.5)
    out = np.full(n, np.nan, dtype)
    with np.errstate(over="ignore"):
        module("convert", backend).add(x, r, out)
        assert out.tobytes() == np.add(x, r).tobytes()


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", [0, 1, 7, 3 * (1 << 16) + 5])
def test_momentum_kernel_matches_numpy(n, dtype, backend):
    """``out = u * m + x``: NumPy's product rounded to the dtype, then its sum (never one fused
    multiply-add), across parallel chunks; heavy tails and signed zeros."""
    rng = np.random.default_rng(n)
    u = (rng.standard_t(2, n) * 10.0 ** rng.integers(-20, 20, n)).astype(dtype)
    x = (rng.standard_t(2, n) * 10.0 ** rng.integers(-20, 20, n)).astype(dtype)
    if n > 4:
        u[:2], x[:2] = 0.0, -0.0
    m = dtype(0.9)
    out = np.full(n, np.nan, dtype)
    module("convert", backend).momentum(u, m, x, out)
    assert out.tobytes() == np.add(np.multiply(u, m, dtype=dtype), x, dtype=dtype).tobytes()


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", [0, 1, 7, 3 * (1 << 16) + 5])
def test_divide_kernel_matches_numpy(n, dtype, backend):
    """``convert.divide``: NumPy's ``np.divide`` by a rank count in the array's dtype (3: not a
    power of two, so a product by ``1/3`` would differ), across parallel chunks; heavy tails,
    signed zeros, inf and NaN."""
    rng = np.random.default_rng(n)
    x = (rng.standard_t(2, n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    if n > 4:
        x[:4] = (-0.0, np.inf, np.nan, np.finfo(dtype).tiny)
    out = np.full(n, 7, dtype)
    module("convert", backend).divide(x, dtype(3), out)
    assert out.tobytes() == np.divide(x, dtype(3)).tobytes()
