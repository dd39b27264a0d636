"""The pack family's CUDA twin (codec/kernels/cuda/pack.py) against the CPU kernel and a NumPy
reference, on device arrays, in the simulator: every code dtype, widths 1..64 (the fast
paths' and the general ones), sizes 0, 1, odd and not a multiple of 8 codes or of a block."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from codec.dtypes import readonly as ro
from codec.kernels import module

K = module("pack", "cuda")
CPU = module("pack", "cpu")
DTYPES = (np.uint8, np.uint16, np.uint32, np.uint64)
WIDTHS = (1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33, 57, 58, 63, 64)
SIZES = (0, 1, 7, 8, 9, 63, 301)


def codes(n, dtype, seed=0):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed + n).integers(0, info.max, n, dtype=dtype, endpoint=True)


def reference(c, bits):
    """LSB-first packing of the low ``bits`` of each code, one bit at a time."""
    out = np.zeros((c.size * bits + 7) // 8, np.uint8)
    for i, v in enumerate(c.astype(np.uint64)):
        for k in range(bits):
            if (int(v) >> k) & 1:
                p = i * bits + k
                out[p // 8] |= np.uint8(1 << (p % 8))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_pack_and_unpack_codes(n, dtype):
    for bits in (b for b in WIDTHS if b <= 8 * np.dtype(dtype).itemsize):
        c = codes(n, dtype, bits)
        out = cuda.to_device(np.full((n * bits + 7) // 8, 0xA5, np.uint8))  # every byte written
        K.pack_codes(cuda.to_device(c), bits, out)
        got = out.copy_to_host()
        want = np.empty_like(got)
        CPU.pack_codes(ro(c), bits, want)  # (the codes read-only, as the stages pass them)
        assert np.array_equal(got, want), bits
        if n <= 63:
            assert np.array_equal(got, reference(c, bits)), bits
        back = cuda.to_device(np.zeros(n, dtype))
        K.unpack_codes(cuda.to_device(np.concatenate([got, np.full(3, 0xFF, np.uint8)])), bits, back)  # bytes beyond: ignored
        mask = np.uint64((1 << bits) - 1) if bits < 64 else np.uint64(2**64 - 1)
        assert np.array_equal(back.copy_to_host(), (c.astype(np.uint64) & mask).astype(dtype)), bits


@pytest.mark.parametrize("dtype", (np.uint8, np.uint32))
def test_pack_segments(dtype):
    sizes = [0, 1, 9, 300, 7, 64]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    c = codes(int(starts[-1]), dtype)
    for bits in (1, 3, 8, 13) if dtype == np.uint8 else (5, 17, 32):
        bits = min(bits, 8 * np.dtype(dtype).itemsize)
        ostarts = np.concatenate([[5], 5 + np.cumsum([(n * bits + 7) // 8 + 2 for n in sizes[:-1]])]).astype(np.int64)
        total = int(ostarts[-1] + (sizes[-1] * bits + 7) // 8 + 4)
        want = np.full(total, 0x5A, np.uint8)
        CPU.pack_segments(ro(c), starts, bits, want, ostarts)
        out = cuda.to_device(np.full(total, 0x5A, np.uint8))
        K.pack_segments(cuda.to_device(c), cuda.to_device(starts), bits, out, cuda.to_device(ostarts))
        assert np.array_equal(out.copy_to_host(), want), bits  # the bytes between tensors untouched too
    with pytest.raises(ValueError, match="pack_segments"):
        K.pack_segments(c, starts, 8, np.zeros(10, np.uint8), ostarts)


def test_items_and_interleave():
    rng = np.random.default_rng(4)
    vstarts = np.array([0, 3, 3, 40, 41], np.int64)
    widths = np.array([8, 4, 2, 4], np.int64)
    values = rng.standard_normal(41) * 100
    values[3:40][::5] = np.nan
    values[40] = -7  # an int16 item: an integer in its range
    sizes = np.diff(vstarts) * widths
    ostarts = np.concatenate([[1], 1 + np.cumsum(sizes[:-1])]).astype(np.int64)
    want = np.zeros(int(ostarts[-1] + sizes[-1] + 1), np.uint8)
    CPU.put_items(values, vstarts, widths, want, ostarts)
    out = cuda.to_device(np.zeros_like(want))
    K.put_items(cuda.to_device(values), cuda.to_device(vstarts), cuda.to_device(widths), out, cuda.to_device(ostarts))
    assert np.array_equal(out.copy_to_host(), want)
    back, cpu = cuda.to_device(np.zeros(41)), np.zeros(41)
    CPU.take_items(want, ostarts, widths, vstarts, cpu)
    K.take_items(out, cuda.to_device(ostarts), cuda.to_device(widths), cuda.to_device(vstarts), back)
    assert back.copy_to_host().tobytes() == cpu.tobytes()
    first, second = rng.integers(0, 256, 50, dtype=np.uint8), rng.integers(0, 256, 70, dtype=np.uint8)
    fstarts, sstarts = np.array([0, 10, 10, 50], np.int64), np.array([0, 0, 30, 70], np.int64)
    want = np.zeros(120, np.uint8)
    CPU.interleave(first, fstarts, second, sstarts, want)
    out = cuda.to_device(np.zeros(120, np.uint8))
    K.interleave(cuda.to_device(first), cuda.to_device(fstarts), cuda.to_device(second), cuda.to_device(sstarts), out)
    assert np.array_equal(out.copy_to_host(), want)


@pytest.mark.parametrize("dtype", (np.float16, np.float32, np.float64))
def test_sign_bits(dtype):
    """One tensor and a run of edge-sized tensors with gaps between their bytes: the CPU
    kernel's bytes and np.signbit's (-0.0 and a negative NaN included), guard bytes kept."""
    rng = np.random.default_rng(3)
    sizes = (0, 1, 7, 8, 9, 301)
    x = rng.standard_t(2, sum(sizes)).astype(dtype)
    x[:3] = (-0.0, np.nan, -np.nan) if x.size >= 3 else x[:3]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    nbytes = (np.array(sizes) + 7) // 8
    ostarts = np.concatenate([[0], np.cumsum(nbytes + 3)[:-1]]).astype(np.int64) + 2  # 2 guard bytes first, 3 after each
    words = x.view(f"u{np.dtype(dtype).itemsize}")
    out = cuda.to_device(np.full(int(ostarts[-1] + nbytes[-1] + 3), 0xA5, np.uint8))
    K.sign_bits(cuda.to_device(words), cuda.to_device(starts), out, cuda.to_device(ostarts))
    got = out.copy_to_host()
    want = np.full(got.size, 0xA5, np.uint8)
    CPU.sign_bits(words, starts, want, ostarts)
    assert np.array_equal(got, want)
    for t in range(len(sizes)):
        ref = np.packbits(np.signbit(x[starts[t] : starts[t + 1]]), bitorder="little")
        assert got[ostarts[t] : ostarts[t] + nbytes[t]].tobytes() == ref.tobytes(), t
    assert (got[:2] == 0xA5).all() and (got[-3:] == 0xA5).all()
    one = cuda.to_device(np.zeros((x.size + 7) // 8, np.uint8))
    K.sign_bits(cuda.to_device(words), np.array([0, x.size], np.int64), one, np.zeros(1, np.int64))
    assert one.copy_to_host().tobytes() == np.packbits(np.signbit(x), bitorder="little").tobytes()


def test_twin_defines_the_cpu_contract():
    assert K.__all__ == CPU.__all__ and all(callable(getattr(K, name)) for name in K.__all__)
