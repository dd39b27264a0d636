"""The convert family's CUDA twin (codec/kernels/cuda/convert.py) against the NumPy
references, on device arrays, in the simulator: small sizes (a few thousand threads a
second), several blocks, sizes that are not a multiple of the block, every mode and dtype."""

from __future__ import annotations

import crc32c
import ml_dtypes
import numpy as np
import pytest
from numba import cuda

from codec.dtypes import readonly as ro
from codec.kernels import module
from codec.modes import ADD, SET, SUB

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
HALVES = (F16, BF16)
SIZES = (0, 1, 7, 255, 256, 257, 700)  # on a GPU, blocks of 256 threads: none, part of one, several (the simulator's shapes: conftest.py)
K = module("convert", "cuda")
CPU = module("convert", "cpu")  # (its inputs passed read-only, as the stages pass them: the signatures the host suite compiles)


def data(n, dtype, seed=0):
    """Normal and Student-t(1.5) values (heavy tails: some overflow fp16), and the specials."""
    rng = np.random.default_rng(seed + n)
    x = np.where(rng.random(n) < 0.5, rng.standard_normal(n), rng.standard_t(1.5, n) * 10.0 ** rng.integers(-8, 6, n))
    x = x.astype(dtype)
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 65504.0, 65520.0, 2.0**-24, 2.0**-25, 3e38], dtype)
    m = min(n, specials.size)
    x[:m] = specials[:m]
    return x


def same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")), (got, want)


def same_values(got, want):
    """Bit for bit, except that a NaN produced by arithmetic (adding into a NaN) only has to be
    a NaN: a GPU's arithmetic returns its canonical NaN, not the operand's payload or sign
    (docs/kernels.md, "Determinism").  Codes and stored values keep every bit (``same``)."""
    got, want = np.asarray(got), np.asarray(want)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    same(got[~nan], want[~nan])


@pytest.mark.parametrize("half", HALVES, ids=str)
@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", SIZES)
def test_narrow_codes(n, dtype, half, ref16):
    x = data(n, dtype)
    out = cuda.device_array(n, np.uint16)
    bad, crc = K.narrow_codes(cuda.to_device(x), out, half == BF16, 0x5EED)
    assert crc == crc32c.crc32c(out.copy_to_host().tobytes(), 0x5EED)  # formed on the device
    assert bad == int((~np.isfinite(x)).sum())
    assert K.narrow_codes(cuda.to_device(x), out, half == BF16, -1)[1] == -1  # none asked
    got = out.copy_to_host()
    fine = ~np.isnan(x)
    same(got[fine], ref16(x, half)[fine])
    want = np.empty(n, np.uint16)
    CPU.narrow_codes(ro(x), want, half == BF16, -1)
    same(got, want)  # NaN payloads too: the CPU kernel's codes, bit for bit


@pytest.mark.parametrize("half", HALVES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_narrow_codes_of_float16_device_arrays(n, half):
    """A float16 device array's codes are the host's (codec.ops.narrow): fp16 its own bits (NaN
    payloads, signalling ones too), bf16 those of its exact float32 widening; the count and
    the CRC as for the wide dtypes."""
    from codec.ops import narrow

    x = data(n, np.float16)
    x.view(np.uint16)[: min(n, 3)] = np.array([0x7C01, 0xFE00, 0x7D55], np.uint16)[: min(n, 3)]  # NaN payloads
    out = cuda.device_array(n, np.uint16)
    bad, crc = K.narrow_codes(cuda.to_device(x), out, half == BF16, 0x5EED)
    want, want_bad, _ = narrow(x, half)
    same(out.copy_to_host(), want)
    assert bad == want_bad == int((~np.isfinite(x)).sum())
    assert crc == crc32c.crc32c(want.tobytes(), 0x5EED)


@pytest.mark.parametrize("mode", (SET, ADD, SUB))
@pytest.mark.parametrize("out_dtype", (np.float32, np.float64))
@pytest.mark.parametrize("half", HALVES, ids=str)
def test_half_decode(half, out_dtype, mode):
    rng = np.random.default_rng(mode)
    codes = np.concatenate([np.arange(0, 1 << 16, 97, dtype=np.uint32).astype(np.uint16), rng.integers(0, 1 << 16, 301, dtype=np.uint16)])
    base = data(codes.size, out_dtype, seed=3)
    vals = codes.view(half).astype(out_dtype)  # NumPy's (ml_dtypes') exact cast of every code
    with np.errstate(invalid="ignore", over="ignore"):
        want = {SET: vals, ADD: base + vals, SUB: base - vals}[mode]
    out = cuda.to_device(base)
    K.half_decode(cuda.to_device(codes), out, mode, half == BF16)
    got = out.copy_to_host()
    cpu = base.copy()
    with np.errstate(invalid="ignore"):
        CPU.half_decode(ro(codes), cpu, mode, half == BF16)
    (same if mode == SET else same_values)(got, cpu)
    same_values(got, want)


@pytest.mark.parametrize("mode", (SET, ADD, SUB))
def test_combine_into_float16_device_arrays(mode):
    """The twin's ``combine`` into float16 (error feedback's ``acc = x + residual`` of float16
    device arrays): each result rounded once to float16, as NumPy's float16 operations."""
    src, base = data(700, np.float16, 1), data(700, np.float16, 2)
    out = cuda.to_device(base)
    K.combine(cuda.to_device(src), out, mode)
    with np.errstate(invalid="ignore", over="ignore"):
        want = {SET: src, ADD: base + src, SUB: base - src}[mode]
    (same if mode == SET else same_values)(out.copy_to_host(), want)


@pytest.mark.parametrize("mode", (SET, ADD, SUB))
@pytest.mark.parametrize("pair", [(np.float32, np.float32), (np.float64, np.float64), (np.float32, np.float64), (np.float64, np.float32)])
def test_combine_and_combine_odd(pair, mode):
    src_dtype, out_dtype = pair
    src, base = data(513, src_dtype, 1), data(513, out_dtype, 2)
    for name in ("combine", "combine_odd") if mode != SET else ("combine",):
        out, cpu = cuda.to_device(base), base.copy()
        with np.errstate(invalid="ignore", over="ignore"):
            getattr(K, name)(cuda.to_device(src), out, mode)
            getattr(CPU, name)(ro(src), cpu, mode)
        (same if mode == SET else same_values)(out.copy_to_host(), cpu)
    if mode != SET:  # combine_odd's reference: the exact sum, rounded once to out's dtype
        fine = np.isfinite(src) & np.isfinite(base) & (np.abs(src.astype(np.float64)) < 1e30) & (np.abs(base.astype(np.float64)) < 1e30)
        from fractions import Fraction

        out = cuda.to_device(base)
        K.combine_odd(cuda.to_device(src), out, mode)
        got = out.copy_to_host()
        for i in np.flatnonzero(fine)[:200]:
            exact = Fraction(float(base[i])) + (Fraction(float(src[i])) if mode == ADD else -Fraction(float(src[i])))
            if out_dtype == np.float32:
                assert got[i] == np.float32(float(exact)) or abs(Fraction(float(got[i])) - exact) <= abs(Fraction(float(np.float32(float(exact)))) - exact)


@pytest.mark.parametrize("mode", (ADD, SUB))
@pytest.mark.parametrize("half", HALVES, ids=str)
def test_half_combine(half, mode, ref16):
    n = 600
    src = data(n, np.float32, 5) * np.float32(1e-2)
    codes = np.random.default_rng(9).integers(0, 1 << 16, n, dtype=np.uint16)
    codes[np.isnan(codes.view(half))] = 0  # NaN codes: their payload is the CPU's concern, tested there
    d = cuda.to_device(codes)
    with np.errstate(invalid="ignore", over="ignore"):
        K.half_combine(cuda.to_device(src), d, mode, half == BF16)
        cpu = codes.copy()
        CPU.half_combine(ro(src), cpu, mode, half == BF16)
        exact = codes.view(half).astype(np.float64) + (src.astype(np.float64) if mode == ADD else -src.astype(np.float64))
    got = d.copy_to_host()
    fine = np.isfinite(exact)
    same(got[fine], cpu[fine])
    same(got[fine], ref16(exact[fine], half))


@pytest.mark.parametrize("half", HALVES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_half_feedback(n, half, ref16):
    """a = x + r (float32); codes = round(a); acc = a - value(codes); the non-finite count of a."""
    x = data(n, np.float32, 7)
    r = (data(n, np.float32, 8) * np.float32(1e-3)).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        a = x + r
        acc_want = a - ref16(a, half).view(half).astype(np.float32)
    acc, codes = cuda.to_device(np.full(n, 7.0, np.float32)), cuda.device_array(n, np.uint16)
    bad, crc = K.half_feedback(cuda.to_device(x), cuda.to_device(r), acc, codes, half == BF16, 0)
    assert crc == crc32c.crc32c(codes.copy_to_host().tobytes(), 0) and bad == int((~np.isfinite(a)).sum())
    fine = ~np.isnan(a)
    same(codes.copy_to_host()[fine], ref16(a, half)[fine])
    assert np.array_equal(acc.copy_to_host(), acc_want, equal_nan=True)
    cpu_acc, cpu_codes = np.full(n, 7.0, np.float32), np.zeros(n, np.uint16)
    CPU.half_feedback(ro(x), ro(r), cpu_acc, cpu_codes, half == BF16, -1)
    same(codes.copy_to_host()[fine], cpu_codes[fine])
    same_values(acc.copy_to_host(), cpu_acc)


def test_twin_defines_the_cpu_contract():
    for name in CPU.__all__:
        assert callable(getattr(K, name)), name
    assert sorted(K.__all__) == sorted(CPU.__all__)


@pytest.mark.parametrize("threads,blocks", [(256, 2), (32, 3)])
def test_threads_stride_over_arrays_longer_than_the_grid(monkeypatch, ref16, threads, blocks):
    """With a grid of two or three blocks, each thread codes several values (the grid-stride
    loop that a 25M-value array takes on a GPU), and the per-block non-finite counts add up:
    the same codes, counts and decoded values."""
    from codec.kernels.cuda import _common

    monkeypatch.setattr(_common, "THREADS", threads)
    monkeypatch.setattr(_common, "MAX_BLOCKS", blocks)
    n = 1500  # about three values per thread
    x = data(n, np.float32, 11)
    x[[900, 1400]] = [np.inf, np.nan]  # non-finite values in other blocks than the first
    for bf16, half in ((False, F16), (True, BF16)):
        out = cuda.device_array(n, np.uint16)
        bad, _ = K.narrow_codes(cuda.to_device(x), out, bf16, -1)
        want = np.empty(n, np.uint16)
        assert bad == CPU.narrow_codes(ro(x), want, bf16, -1)[0] == int((~np.isfinite(x)).sum())
        same(out.copy_to_host(), want)
        dec = cuda.to_device(np.zeros(n, np.float32))
        K.half_decode(out, dec, SET, bf16)
        same(dec.copy_to_host(), want.view(half).astype(np.float32))
        acc, codes = cuda.device_array(n, np.float32), cuda.device_array(n, np.uint16)
        r = np.full(n, 1e-3, np.float32)
        bad, _ = K.half_feedback(cuda.to_device(x), cuda.to_device(r), acc, codes, bf16, -1)
        cpu_acc, cpu_codes = np.empty(n, np.float32), np.empty(n, np.uint16)
        with np.errstate(over="ignore", invalid="ignore"):
            assert bad == CPU.half_feedback(ro(x), ro(r), cpu_acc, cpu_codes, bf16, -1)[0]
        same_values(acc.copy_to_host(), cpu_acc)


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_scale_kernel_matches_numpy(dtype):
    """The convert twin's ``scale``: each segment's factor found per value, the float64 product
    rounded once to ``out``'s dtype: NumPy's and the CPU kernel's bits."""
    rng = np.random.default_rng(2)
    sizes = [0, 1, 7, 0, 301]
    n = sum(sizes)
    x = (rng.standard_t(2, n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    factors = np.array([3.0, 1 / 3, 0.0, 5.0, 1000 / 7])
    out = cuda.device_array(n, dtype)
    K.scale(cuda.to_device(x), starts, factors, out)
    cpu = np.empty(n, dtype)
    CPU.scale(x, starts, factors, cpu)
    assert out.copy_to_host().tobytes() == cpu.tobytes() == (x.astype(np.float64) * np.repeat(factors, sizes)).astype(dtype).tobytes()


@pytest.mark.parametrize("dtype", (np.float16, np.float32, np.float64))
@pytest.mark.parametrize("n", [0, 1, 7, 301])
def test_add_kernel_matches_numpy(n, dtype):
    """The convert twin's ``add`` (error feedback's ``acc = x + r``): NumPy's ``np.add`` in the
    dtype, bit for bit (heavy tails, signed zeros, inf, NaN, an overflowing sum)."""
    rng = np.random.default_rng(n)
    e = 4 if dtype == np.float16 else 20
    with np.errstate(over="ignore"):
        x = (rng.standard_t(2, n) * 10.0 ** rng.integers(-e, e, n)).astype(dtype)
        r = (rng.standard_t(2, n) * 10.0 ** rng.integers(-e, e, n)).astype(dtype)
        if n > 6:
            big = np.finfo(dtype).max
            x[:6], r[:6] = (-0.0, -0.0, np.inf, np.nan, big, 1.5), (-0.0, 0.0, -1.0, 2.0, big, -1.5)
        want = np.add(x, r)
    out = cuda.device_array(n, dtype)
    K.add(cuda.to_device(x), cuda.to_device(r), out)
    assert out.copy_to_host().tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", (np.float16, np.float32, np.float64))
def test_momentum_kernel_matches_numpy(dtype):
    """The convert twin's ``momentum``: the product rounded before the sum, never fused (float16
    too: NumPy's two float16 operations, each rounded once)."""
    rng = np.random.default_rng(1)
    n = 300
    e = 4 if dtype == np.float16 else 20
    with np.errstate(over="ignore"):
        u = (rng.standard_t(2, n) * 10.0 ** rng.integers(-e, e, n)).astype(dtype)
        x = (rng.standard_t(2, n) * 10.0 ** rng.integers(-e, e, n)).astype(dtype)
    out = cuda.device_array(n, dtype)
    K.momentum(cuda.to_device(u), dtype(0.9), cuda.to_device(x), out)
    assert out.copy_to_host().tobytes() == np.add(np.multiply(u, dtype(0.9), dtype=dtype), x, dtype=dtype).tobytes()


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", [0, 1, 7, 301])
def test_divide_kernel_matches_numpy(n, dtype):
    """The convert twin's ``divide``: NumPy's ``np.divide`` in the dtype, bit for bit (heavy
    tails, signed zeros, inf, NaN, a subnormal quotient)."""
    rng = np.random.default_rng(n)
    x = (rng.standard_t(2, n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    if n > 4:
        x[:4] = (-0.0, np.inf, np.nan, np.finfo(dtype).tiny)
    out = cuda.device_array(n, dtype)
    K.divide(cuda.to_device(x), dtype(3), out)
    assert out.copy_to_host().tobytes() == np.divide(x, dtype(3)).tobytes()
