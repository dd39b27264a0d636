"""The quantizers' CUDA twins (``quantize``, ``bucket``, ``dequant``) against their CPU kernels,
bit for bit, in the simulator: every name of each family's ``__all__``, float32 and float64,
normal, heavy-tailed and sparse data (with -0.0) and NaN/inf, sizes 0, 1, odd and not a
multiple of the block, bucket or launch; nearest and stochastic rounding; the fused
error-feedback forms; the CRC-32C they form.  The CPU kernels are checked against NumPy
references of the documented rules in tests/test_quant_kernels.py, so equal results here
carry those references to the device."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from codec.dtypes import readonly as ro
from codec.kernels import module
from codec.layout import LANES
from codec.modes import ADD, SET, SUB
from test_quant_kernels import KINDS, data  # the CPU kernels' test data (normal, heavy-tailed, sparse with -0.0)

G = {f: module(f, "cuda") for f in ("quantize", "bucket", "dequant", "elias")}
C = {f: module(f, "cpu") for f in ("quantize", "bucket", "dequant", "elias")}
SIZES = (0, 1, 7, 257)
STRM = np.uint64(0x9E3779B97F4A7C15)


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a.view(f"u{a.itemsize}") if a.dtype.kind == "f" else a, b.view(f"u{b.itemsize}") if b.dtype.kind == "f" else b), (a, b)


def both(fn, family, *args, device=(0,)):
    """``fn`` of the CPU module and of the twin (the arguments at ``device`` moved there; every
    NumPy argument copied first, so each side writes its own), returning each side's args.
    The CPU side's copies are read-only where the argument is, as the stages pass a kernel its
    inputs (``codec.dtypes.readonly``): the CPU kernel then runs the signature the host suite
    compiles and caches beside this process (with writeable inputs, test_dequantize compiled
    the chunk decoder again: 74-82 s a dtype in a simulator run beside the host suite)."""
    out = []
    for side in (C, G):
        a = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
        if side is C:
            a = [ro(c) if isinstance(x, np.ndarray) and not x.flags.writeable else c for x, c in zip(args, a)]
        a = [cuda.to_device(x) if side is G and i in device else x for i, x in enumerate(a)]
        got = getattr(side[family], fn)(*a)
        out.append(([x.copy_to_host() if i in device and side is G else x for i, x in enumerate(a)], got))
    return out


def bits_of(x):
    if x.dtype == np.float32:
        return x.view(np.uint32), np.uint32(0x7FFFFFFF)
    return x.view(np.uint64), np.uint64(0x7FFFFFFFFFFFFFFF)


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", SIZES)
def test_minifloat(n, dtype):
    for kind in KINDS:
        x = data(kind, n, dtype)
        if kind == "heavy" and n > 3:
            x[3] = np.nan
        x = ro(x)  # (an input, read-only as the stages pass it: see both)
        block, upb = (100, 1) if n > 100 else (3, 1)  # a block per window, or a thread per window (<= 64 values)
        units = -(-n // block)
        bits, mask = bits_of(x)
        (ca, _), (ga, _) = both("absmax_units", "quantize", bits, block, upb, mask, np.zeros(units, bits.dtype))
        same(ga[4], ca[4])
        emin = np.arange(units, dtype=np.int64) % 3 - 12 - (1020 if dtype == np.float64 and kind == "sparse" else 0)  # (windows below 2**-1000: rescaled)
        for stochastic in (False, True):
            for m, maxmag, signpos, codes in ((3, 0x7E, 7, np.uint8), (10, 0x7FFF, 15, np.uint16)):
                (ca, cc), (ga, gc) = both("minifloat_encode", "quantize", x, block, upb, emin, m, maxmag, signpos, stochastic, STRM, np.zeros(n, codes), np.zeros(units, np.int64), 11)
                same(ga[9], ca[9]), same(ga[10], ca[10])
                assert gc == cc or cc == -1


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_minifloat_feedback(dtype):
    n, upb = 257, 1
    block = 257 if dtype == np.float32 else 50  # a block per window, or a thread per window
    x, r = data("normal", n, dtype), data("heavy", n, dtype, 1)
    acc = np.zeros(n, dtype)
    bits, mask = bits_of(acc)
    out = []
    for side in (C, G):
        units = -(-n // block)
        top = np.zeros(units, bits.dtype)
        args = (cuda.to_device(x), cuda.to_device(r)) if side is G else (ro(x), ro(r))  # (read-only, as the stage passes them)
        side["quantize"].feedback_absmax_units(*args, block, upb, mask, top)
        host = (lambda d: d.copy_to_host()) if side is G else (lambda d: d)
        got = [top]
        for emin, m, maxmag, stochastic, crc in ((-8, 3, 0x7E, True, 5), (-6, 2, 0x7B, False, -1)):
            a = cuda.to_device(acc) if side is G else acc.copy()
            codes, bad = np.zeros(n, np.uint8), np.zeros(units, np.int64)
            crc = side["quantize"].feedback_minifloat_encode(*args, a, block, upb, np.full(units, emin), m, maxmag, 7, stochastic, STRM, codes, bad, crc)
            got += [host(a), codes, crc]
        out.append(got)
    for c, g in zip(*out):
        assert (c == g) if isinstance(c, int) else same(g, c) is None


def test_minifloat_segments():
    x = ro(data("heavy", 300, np.float32))
    starts = np.array([0, 7, 7, 150, 300])
    blocks = np.array([7, 1, 40, 150])
    nblocks = -(-np.diff(starts) // blocks)
    bstarts = np.concatenate([[0], np.cumsum(nblocks)])
    bits, mask = bits_of(x)
    (ca, _), (ga, _) = both("absmax_units_segments", "quantize", bits, starts, blocks, bstarts, mask, np.zeros(bstarts[-1], np.uint32))
    same(ga[5], ca[5])
    emin = np.arange(bstarts[-1]) % 4 - 10
    strms = np.array([1, 2, 3, 4], np.uint64)
    for stochastic in (False, True):
        (ca, _), (ga, _) = both("minifloat_encode_segments", "quantize", x, starts, blocks, bstarts, emin, 3, 0x7E, 7, stochastic, strms, np.zeros(300, np.uint8), np.zeros(4, np.int64))
        same(ga[10], ca[10]), same(ga[11], ca[11])


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", SIZES)
def test_per_tensor(n, dtype):
    for kind in KINDS:
        x = data(kind, n, dtype)
        if kind == "sparse" and n > 5:
            x[5] = -np.inf
        x = ro(x)
        bits, mask = bits_of(x)
        (ca, _), (ga, _) = both("tensor_moments", "quantize", x, bits, mask, float(x[0]) if n else 0.0, LANES, np.zeros((1, 2)), np.zeros(1, bits.dtype), device=(0, 1))
        same(ga[5], ca[5]), same(ga[6], ca[6])
        s = 0.7 if kind == "normal" else 1e-3
        (ca, _), (ga, _) = both("terngrad_encode", "quantize", x, 1.5 * s, s, STRM, np.zeros(-(-n // 5), np.uint8))
        same(ga[4], ca[4])
        nc = -(-n // 65536)
        (ca, _), (ga, _) = both("sign_encode", "quantize", x, np.zeros(-(-n // 8), np.uint8), 4, np.zeros((nc, 3)), np.zeros(nc, np.int64), np.zeros(nc, np.int64))
        for j in (1, 3, 4, 5):
            same(ga[j], ca[j])


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", SIZES)
def test_buckets(n, dtype):
    """Each kind of data once, nearest or stochastic; buckets of 5 values (a thread each: QSGD
    with 8 lanes) for the small sizes, of 65 for 257 (a block each: the simulator pays 20-30
    ms per barrier)."""
    from codec.layout import bucket_groups

    bucket, width = (5, 8) if n < 100 else (65, 4)
    for kind, stochastic in (("normal", False), ("heavy", True), ("sparse", True)):
        x = data(kind, n, dtype)
        if kind == "heavy" and n > 9:
            x[9] = np.nan
        nb, _, ng = bucket_groups(n, bucket)
        (ca, _), (ga, _) = both("qsgd_encode", "bucket", ro(x), bucket, 7, stochastic, STRM, width, np.zeros(nb), np.zeros(n, np.uint8), np.zeros(ng, np.int64))
        for j in (6, 7, 8):
            same(ga[j], ca[j])
        wide = dtype == np.float64
        ibits = x.view(np.int64 if wide else np.int32)
        low, inf = ((1 << 63) - 1, 0x7FF0000000000000) if wide else (0x7FFFFFFF, 0x7F800000)
        (ca, cc), (ga, gc) = both(
            "minmax_encode", "bucket", ro(x), ibits, low, inf, bucket, 15, stochastic, STRM, np.zeros(nb), np.zeros(nb), np.zeros(n, np.uint8), np.zeros(ng, np.int64), None, None, 3, device=(0, 1)
        )
        for j in (10, 11, 12, 13):
            same(ga[j], ca[j])
        assert gc == cc or cc == -1


def test_tiny_norms_are_rescued():
    """A bucket whose sum of squares underflows takes the CPU's rescue (values times 2**-E)."""
    x = np.array([3e-170, -1e-165, 0.0, 2e-168, 5e-300], np.float64)
    (ca, _), (ga, _) = both("qsgd_encode", "bucket", ro(x), 5, 7, False, STRM, 4, np.zeros(1), np.zeros(5, np.uint8), np.zeros(1, np.int64))
    same(ga[6], ca[6]), same(ga[7], ca[7])


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_bucket_feedback(dtype):
    n, bucket = 200, 70  # (a block per bucket; test_buckets has the thread per bucket)
    x, r = data("normal", n, dtype), data("heavy", n, dtype, 1)
    wide = dtype == np.float64
    low, inf = ((1 << 63) - 1, 0x7FF0000000000000) if wide else (0x7FFFFFFF, 0x7F800000)
    out = []
    for side in (C, G):
        dv = (lambda a: cuda.to_device(a)) if side is G else (lambda a: a.copy())
        inp = (lambda a: cuda.to_device(a)) if side is G else (lambda a: ro(a.copy()))  # (the data: read-only, as the stages pass it)
        host = (lambda d: d.copy_to_host()) if side is G else (lambda d: d)
        acc, acc2 = dv(np.zeros(n, dtype)), dv(np.zeros(n, dtype))
        norms, codes, bad = np.zeros(3), np.zeros(n, np.uint8), np.zeros(1, np.int64)
        side["bucket"].qsgd_encode(inp(x), bucket, 5, True, STRM, 4, norms, codes, bad, inp(r), acc)
        lows, highs, codes2 = np.zeros(3), np.zeros(3), np.zeros(n, np.uint8)
        crc = side["bucket"].minmax_encode(inp(x), acc2.view(np.int64 if wide else np.int32), low, inf, bucket, 255, False, STRM, lows, highs, codes2, bad, inp(r), acc2, 9)
        out.append((norms, codes, host(acc), lows, highs, codes2, host(acc2), crc))
    for c, g in zip(*out):
        assert (c == g) if isinstance(c, int) else same(g, c) is None


def test_bucket_segments():
    x = data("heavy", 300, np.float64)
    starts = np.array([0, 7, 7, 150, 300])
    bucket = 40
    bstarts = np.concatenate([[0], np.cumsum(-(-np.diff(starts) // bucket))])
    strms = np.array([1, 2, 3, 4], np.uint64)
    nb = int(bstarts[-1])
    (ca, _), (ga, _) = both("qsgd_encode_segments", "bucket", x, starts, bstarts, bucket, 7, True, strms, 4, np.zeros(nb), np.zeros(300, np.uint8), np.zeros(4, np.int64))
    for j in (8, 9, 10):
        same(ga[j], ca[j])
    ibits = x.view(np.int64)
    (ca, _), (ga, _) = both(
        "minmax_encode_segments", "bucket", x, ibits, (1 << 63) - 1, 0x7FF0000000000000, starts, bstarts, bucket, 3, True, strms, np.zeros(nb), np.zeros(nb), np.zeros(300, np.uint8), np.zeros(4, np.int64), device=(0, 1)
    )
    for j in (10, 11, 12, 13):
        same(ga[j], ca[j])


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", SIZES)
def test_dequantize(n, dtype):
    rng = np.random.default_rng(n)
    for bits in (1, 4, 8, 11):
        data_ = ro(rng.integers(0, 256, (n * bits + 7) // 8, dtype=np.uint8))
        lut = ro(rng.standard_normal(1 << bits))
        block = 3
        a = ro(rng.standard_normal(-(-n // block)) * 1e3)
        for off in (ro(np.empty(0)), ro(rng.standard_normal(a.size))):
            for mode in (SET, ADD, SUB):
                base = rng.standard_normal(n).astype(dtype)
                (ca, _), (ga, _) = both("dequantize", "dequant", data_, bits, n, lut, block, a, off, base, mode, device=(7,))
                same(ga[7], ca[7])
        (_, cm), (_, gm) = both("max_field", "dequant", data_, bits, n, (1 << bits) - 1 - 1, 1)
        assert int(cm) == int(gm)
        for largest in {max(int(cm) - 1, 0), int(cm)}:
            (_, cw), (_, gw) = both("fields_within", "dequant", data_, bits, n, (1 << bits) - 1 - 1, 1, largest)
            assert bool(cw) == bool(gw) == (int(cm) <= largest)
            (ca, (cok, ccrc)), (ga, (gok, gcrc)) = both("dequantize_checked", "dequant", data_, bits, n, lut, block, a, off, np.zeros(n, dtype), (1 << bits) - 1 - 1, 1, largest, 5, device=(7,))
            same(ga[7], ca[7])  # (decode and check; the CRC formed on the device)
            assert bool(cok) == bool(gok) == (int(cm) <= largest) and ccrc in (-1, gcrc)
    trits = rng.integers(0, 243, -(-n // 5), dtype=np.uint8)
    for mode in (SET, SUB):
        (ca, _), (ga, _) = both("trits_dequantize", "dequant", ro(trits), n, ro(np.array([0.0, 0.3, -0.3])), np.ones(n, dtype), mode, device=(3,))
        same(ga[3], ca[3])


def test_dequantize_segments():
    rng = np.random.default_rng(3)
    starts = np.array([0, 5, 5, 40, 41])
    bits = 5
    nbytes = (np.diff(starts) * bits + 7) // 8
    dstarts = np.concatenate([[0], np.cumsum(nbytes + 2)])[:-1]  # gaps between tensors
    data_ = rng.integers(0, 256, int(dstarts[-1] + nbytes[-1]), dtype=np.uint8)
    blocks = np.array([2, 1, 16, 1])
    nb = -(-np.diff(starts) // blocks)
    astarts = np.concatenate([[0], np.cumsum(nb)])
    a, lut = rng.standard_normal(astarts[-1]), rng.standard_normal(32)
    data_, dstarts, starts, blocks, astarts, a, lut = map(ro, (data_, dstarts, starts, blocks, astarts, a, lut))
    for off in (ro(np.empty(0)), ro(rng.standard_normal(a.size))):
        (ca, _), (ga, _) = both("dequantize_segments", "dequant", data_, dstarts, bits, starts, lut, blocks, a, astarts, off, np.ones(41), ro(np.empty(0, np.int64)), ADD, device=(9,))
        same(ga[9], ca[9])
        for largest in (14, 15):
            (ca, (cok, ccrc)), (ga, (gok, gcrc)) = both("dequantize_segments_checked", "dequant", data_, dstarts, bits, starts, lut, blocks, a, astarts, off, np.ones(41), ro(np.empty(0, np.int64)), 0x1E, 1, largest, 3, device=(9,))
            same(ga[9], ca[9])
            assert bool(cok) == bool(gok) and ccrc in (-1, gcrc)
    seen = set()
    for largest in range(16):  # (0x1E >> 1 of 5-bit codes: fields 0..15)
        (_, cw), (_, gw) = both("fields_within_segments", "dequant", data_, dstarts, bits, starts, 0x1E, 1, largest)
        assert bool(cw) == bool(gw), largest
        seen.add(bool(cw))
    assert seen == {False, True}


def test_elias():
    """QSGD's Elias-gamma twin: the chunk lengths, the streams and their decode (a damaged
    stream flagged) equal the CPU's."""
    rng = np.random.default_rng(4)
    bucket, per, levels = 8, 3, 7
    codes = (rng.integers(0, 8, 100) * (rng.random(100) < 0.3) * 2 + rng.integers(0, 2, 100)).astype(np.uint8)
    codes[(codes >> 1) == 0] = 0  # a zero level has no sign
    codes = ro(codes)
    nch = -(-100 // (bucket * per))
    sizes = []
    for side in (C, G):
        s = np.zeros(nch, np.uint64)
        side["elias"].elias_sizes(cuda.to_device(codes) if side is G else codes, bucket, per, s)
        sizes.append(s)
    same(sizes[1], sizes[0])
    starts = np.concatenate([[0], np.cumsum(sizes[0].astype(np.int64))])
    streams = []
    for side in (C, G):
        out = np.zeros(int(starts[-1]), np.uint8)
        side["elias"].elias_encode(cuda.to_device(codes) if side is G else codes, bucket, per, starts[:-1], out)
        streams.append(out)
    same(streams[1], streams[0])
    damaged = streams[0].copy()
    damaged[-1] ^= 0x80
    for data_ in (streams[0], damaged):
        got = []
        for side in (C, G):
            dec, bad = np.zeros(100, np.uint8), np.zeros(nch, np.int64)
            side["elias"].elias_decode(ro(data_), starts, 100, bucket, per, levels, dec, bad)
            got.append((dec, bad))
        same(got[1][0], got[0][0]), same(got[1][1], got[0][1])
        assert got[0][1].any() == (data_ is damaged)
        if data_ is not damaged:
            same(got[0][0], codes)
