"""The ``quantrun`` kernel family (codec/kernels/cpu/quantrun.py) against a NumPy reference:
``run_read`` reads a quantizer run's per-block numbers (int16, float32, float64 items) and
flags a non-finite number, padding bits set past a codes section's last item and a code
field beyond what an encoder writes, each whatever the others find; both compilations
(serial and parallel), sizes 0, 1, odd and past a chunk, code widths 1..16."""

from __future__ import annotations

import numpy as np
import pytest

from codec.dtypes import readonly as ro
from codec.kernels import module
from codec.kernels.cpu.quantrun import FIELD, NONFINITE, PADDING
from codec.layout import CHUNK
from codec.pack import padding_bytes

Q = module("quantrun")
ITEM = {2: "<i2", 4: "<f4", 8: "<f8"}


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """``codes`` packed LSB-first, ``bits`` bits each, padded with zero bits to whole bytes."""
    b = ((codes[:, None].astype(np.uint64) >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8).reshape(-1)
    return np.packbits(b, bitorder="little")


def unpack(data: np.ndarray, n: int, bits: int) -> np.ndarray:
    b = np.unpackbits(data, bitorder="little")[: n * bits].reshape(n, bits).astype(np.uint64)
    return (b << np.arange(bits, dtype=np.uint64)).sum(1)


def run(sizes, nheads, widths, bits, seed, largest=None):
    """A run laid out as a frame's: per tensor its numbers, then its packed codes (fields of
    ``(c & mask) >> 1`` up to ``largest`` when given); returns the arrays ``run_read`` takes."""
    rng = np.random.default_rng(seed)
    parts, hoffs, dstarts, at = [], [], [], 0
    for n, h, w in zip(sizes, nheads, widths):
        nums = rng.standard_normal(h) * 100 if w != 2 else rng.integers(-300, 300, h)
        parts.append(np.asarray(nums).astype(ITEM[w]).view(np.uint8))
        hoffs.append(at)
        at += h * w
        top = (1 << bits) - 1 if largest is None else min((1 << bits) - 1, (largest << 1) | 1)
        parts.append(pack(rng.integers(0, top + 1, n).astype(np.uint64), bits))
        dstarts.append(at)
        at += (n * bits + 7) // 8
    data = np.concatenate(parts) if parts else np.empty(0, np.uint8)
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    hstarts = np.concatenate(([0], np.cumsum(nheads))).astype(np.int64)
    last, used = padding_bytes(np.array(dstarts, np.int64), np.array(sizes, np.int64), bits, data.size)
    return data, np.array(hoffs, np.int64), np.array(widths, np.int64), hstarts, last, used, np.array(dstarts, np.int64), starts


def reference(data, hoffs, widths, hstarts, last, used, dstarts, bits, starts, fmask, fshift, largest):
    heads = [data[o : o + w * (b - a)].view(ITEM[w]).astype(np.float64) for o, w, a, b in zip(hoffs, widths, hstarts[:-1], hstarts[1:])]
    head = np.concatenate(heads) if heads else np.empty(0)
    flags = 0 if np.isfinite(head).all() else NONFINITE
    if last.size and (not data.size or (data[last] >> used.astype(np.uint8)).any()):
        flags |= PADDING
    if largest >= 0:
        for d, a, b in zip(dstarts, starts[:-1], starts[1:]):
            codes = unpack(data[d : d + ((b - a) * bits + 7) // 8], b - a, bits)
            if ((codes & np.uint64(fmask)) >> np.uint64(fshift) > largest).any():
                flags |= FIELD
    return head, flags


def read(kern, data, hoffs, hw, hstarts, head, last, used, dstarts, bits, starts, *limit):
    """``kern`` (a ``run_read`` twin) with its inputs read-only, as the quantizer passes them:
    one compiled signature, the one the codecs use."""
    return kern(data, ro(hoffs), ro(hw), ro(hstarts), head, ro(last), ro(used), ro(dstarts), bits, ro(starts), *limit)


@pytest.mark.parametrize("twin", ["serial", "parallel"])
@pytest.mark.parametrize("bits", [1, 3, 6, 8, 11, 16])
def test_run_read_matches_numpy(twin, bits):
    kern = getattr(Q.run_read, twin)
    sizes = [0, 1, 7, 333, CHUNK + 5, 64]
    nheads = [0, 1, 1, 2, 3, 1]
    cases = 0
    for widths in ([4, 8, 4, 4, 8, 4], [2] * 6):
        largest = max(0, ((1 << bits) - 1) >> 2)  # fields (c & mask) >> 1 up to it: half the range
        fmask, fshift = (1 << bits) - 1, 1
        data, hoffs, hw, hstarts, last, used, dstarts, starts = run(sizes, nheads, widths, bits, bits, largest)
        for mutate in ("none", "nan", "pad", "field", "all", "unchecked"):
            d = data.copy()
            lim = -1 if mutate == "unchecked" else largest
            if mutate in ("nan", "all") and widths[3] != 2:
                d[hoffs[3] : hoffs[3] + 4] = np.array([np.nan], "<f4").view(np.uint8)
            if mutate in ("pad", "all") and last.size:
                d[last[-1]] |= np.uint8(0x80)
            if mutate in ("field", "all", "unchecked") and bits > 1:
                codes = unpack(d[dstarts[3] : dstarts[3] + (333 * bits + 7) // 8], 333, bits)
                codes[200] = (1 << bits) - 1  # its field (c >> 1) is beyond the largest
                d[dstarts[3] : dstarts[3] + (333 * bits + 7) // 8] = pack(codes, bits)
            d.flags.writeable = False
            want_head, want = reference(d, hoffs, hw, hstarts, last, used, dstarts, bits, starts, fmask, fshift, lim)
            head = np.full(int(hstarts[-1]), 7.0)
            got = read(kern, d, hoffs, hw, hstarts, head, last, used, dstarts, bits, starts, fmask, fshift, lim)
            assert got == want, (widths, mutate, got, want)
            assert np.array_equal(head, want_head, equal_nan=True)
            cases += bool(want)
    assert cases >= 4  # (the mutations were seen)


def test_run_read_edges():
    kern = Q.run_read
    empty = np.empty(0, np.int64)
    no = np.empty(0, np.uint8)
    no.flags.writeable = False
    assert read(kern, no, empty, empty, np.zeros(1, np.int64), np.empty(0), empty, empty, empty, 5, np.zeros(1, np.int64), 31, 1, 3) == 0  # no tensors
    # a codes section whose last byte lies past an empty payload: its padding cannot be clear
    assert read(kern, no, empty, empty, np.zeros(2, np.int64), np.empty(0), np.zeros(1, np.int64), np.array([3], np.int64), np.zeros(1, np.int64), 5, np.array([0, 1], np.int64), 31, 1, 3) == PADDING
    data = np.array([0b00011111], np.uint8)  # one 5-bit code 31: field 15
    data.flags.writeable = False
    one = np.array([0, 1], np.int64)
    assert read(kern, data, empty, empty, np.zeros(2, np.int64), np.empty(0), empty, empty, np.zeros(1, np.int64), 5, one, 31, 1, 15) == 0
    assert read(kern, data, empty, empty, np.zeros(2, np.int64), np.empty(0), empty, empty, np.zeros(1, np.int64), 5, one, 31, 1, 14) == FIELD
