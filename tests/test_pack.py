"""Bit packing and index-set coding against pure-NumPy references: codec.pack, and the ``pack``
kernel family itself on every kernel backend (the ``backend`` fixture of tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec.errors import CodecTypeError, CodecValueError, CorruptFrameError
from codec.frame import SectionKind, SectionInfo, raw_length
from codec.kernels import module
from codec.ops import readonly
from codec.pack import decode_indices, encode_indices, pack_bits, unpack_bits

UNSIGNED = (np.uint8, np.uint16, np.uint32, np.uint64)
CHUNK = 8 * 8192  # codes per parallel chunk of the pack kernels
SMALL = (0, 1, 7, 8, 9, 1000)
BIG = 2 * CHUNK + 5


# ---------------------------------------------------------------- references
def ref_pack(codes, bits: int) -> np.ndarray:
    """LSB-first packing through the bit matrix: row i holds the low ``bits`` bits of code i."""
    c = np.asarray(codes).astype(np.uint64).reshape(-1)
    planes = (c[:, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)
    return np.packbits(planes.astype(np.uint8).reshape(-1), bitorder="little")


def ref_unpack(data, bits: int, count: int) -> np.ndarray:
    planes = np.unpackbits(np.asarray(data, np.uint8), bitorder="little", count=count * bits)
    planes = planes.reshape(count, bits).astype(np.uint64)
    return (planes << np.arange(bits, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)


def mask(bits: int) -> np.uint64:
    return np.uint64((1 << bits) - 1)


def random_codes(rng, n, dtype):
    """Full-width random values of ``dtype`` (high bits set, so packing must mask them)."""
    return rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)


def ref_gaps(idx):
    idx = np.asarray(idx, np.int64)
    return np.diff(np.concatenate([[-1], idx])) - 1


def ref_width(idx) -> int:
    g = ref_gaps(idx)
    return max(1, int(g.max()).bit_length()) if g.size else 1


def info_of(kind, bits, count) -> SectionInfo:
    n = raw_length(count, bits)
    return SectionInfo(int(kind), 0, bits, count, n, n, 0)


def roundtrip_indices(idx, n):
    """Encode, check the choice and the bytes against the references, decode; returns the section."""
    idx = np.asarray(idx, np.int64)
    sec = encode_indices(idx, n)
    width = ref_width(idx)
    delta_bytes, bitmap_bytes = raw_length(idx.size, width), raw_length(n, 1)
    if delta_bytes <= bitmap_bytes:  # ties go to delta
        assert (sec.kind, sec.bits, sec.count) == (SectionKind.INDEX_DELTA, width, idx.size)
        assert bytes(sec.data) == ref_pack(ref_gaps(idx).astype(np.uint64), width).tobytes()
    else:
        assert (sec.kind, sec.bits, sec.count) == (SectionKind.INDEX_BITMAP, 1, n)
        m = np.zeros(n, np.uint8)
        m[idx] = 1
        assert bytes(sec.data) == np.packbits(m, bitorder="little").tobytes()
    raw = np.frombuffer(bytes(sec.data), np.uint8)
    back = decode_indices(info_of(sec.kind, sec.bits, sec.count), raw, n)
    assert back.dtype == np.int64
    np.testing.assert_array_equal(back, idx)
    return sec


# ---------------------------------------------------------------- pack_bits / unpack_bits
def test_reference_packer_is_lsb_first():
    assert ref_pack(np.array([1, 0, 3], np.uint8), 2).tolist() == [0b110001]
    assert ref_pack(np.array([0x1FF], np.uint16), 9).tolist() == [0xFF, 0x01]
    assert ref_unpack(ref_pack(np.array([5, 2, 7], np.uint8), 3), 3, 3).tolist() == [5, 2, 7]


@pytest.mark.parametrize("dtype", UNSIGNED)
def test_pack_small_sizes_every_width(dtype):
    rng = np.random.default_rng(np.dtype(dtype).itemsize)
    for n in SMALL:
        codes = random_codes(rng, n, dtype)
        for bits in range(1, 65):
            got = pack_bits(codes, bits)
            assert got.dtype == np.uint8 and got.size == raw_length(n, bits), (n, bits)
            want = ref_pack(codes.astype(np.uint64) & mask(bits), bits)
            assert got.tobytes() == want.tobytes(), (n, bits)
            back = unpack_bits(got, bits, n)
            assert back.dtype.itemsize * 8 >= bits
            np.testing.assert_array_equal(back.astype(np.uint64), codes.astype(np.uint64) & mask(bits))


@pytest.mark.parametrize("bits", range(1, 65))
def test_pack_across_parallel_chunks(bits):
    """A size crossing two chunk boundaries plus a ragged tail, high bits set; unpack against ref."""
    rng = np.random.default_rng(bits)
    codes = random_codes(rng, BIG, np.uint64)
    got = pack_bits(codes, bits)
    want = ref_pack(codes & mask(bits), bits)
    assert got.tobytes() == want.tobytes()
    np.testing.assert_array_equal(unpack_bits(got, bits, BIG, np.uint64), ref_unpack(want, bits, BIG))


@pytest.mark.parametrize("bits", (1, 6, 12, 33))
def test_pack_into_continues_the_checksum(bits):
    """Packing straight into a frame's section continues the payload's CRC-32C over exactly
    the packed bytes (each chunk, then the tail: one value whatever the chunking), the bytes
    those of pack_bits; without a CRC asked, none is formed."""
    import crc32c

    from codec.kernels.cpu._crc import HARDWARE
    from codec.pack import pack_into

    rng = np.random.default_rng(bits)
    for n in (*SMALL, BIG):
        codes = random_codes(rng, n, np.uint64)
        out = np.full(raw_length(n, bits), 0xCD, np.uint8)
        assert pack_into(codes, bits, out, 12345) == crc32c.crc32c(out, 12345), n
        assert out.tobytes() == ref_pack(codes & mask(bits), bits).tobytes(), n
        assert pack_into(codes, bits, out) is None
        kernel = module("pack", "cpu").pack_codes(readonly(codes.astype(np.uint64)), bits, out, 7)
        assert kernel == (crc32c.crc32c(out, 7) if HARDWARE else -1), n


@pytest.mark.parametrize("bits", (1, 2, 4, 8, 16, 32))
@pytest.mark.parametrize("dtype", UNSIGNED)
def test_pack_narrow_dtypes_across_chunks(bits, dtype):
    rng = np.random.default_rng(bits)
    codes = random_codes(rng, BIG, dtype)
    got = pack_bits(codes, bits)
    assert got.tobytes() == ref_pack(codes.astype(np.uint64) & mask(bits), bits).tobytes()
    np.testing.assert_array_equal(unpack_bits(got, bits, BIG).astype(np.uint64), codes.astype(np.uint64) & mask(bits))


def test_pack_extremes_and_layout():
    for bits in range(1, 65):
        top = np.full(17, np.iinfo(np.uint64).max, np.uint64)
        got = pack_bits(top, bits)
        want = np.full(raw_length(17, bits), 0xFF, np.uint8)
        if (17 * bits) % 8:
            want[-1] = (1 << ((17 * bits) % 8)) - 1  # padding bits stay zero
        assert got.tobytes() == want.tobytes(), bits
        assert not pack_bits(np.zeros(17, np.uint64), bits).any()
    # a multi-dimensional or non-contiguous input packs in C order of its elements
    a = np.arange(24, dtype=np.uint16).reshape(4, 6)
    assert pack_bits(a, 5).tobytes() == ref_pack(a.reshape(-1), 5).tobytes()
    assert pack_bits(a[:, ::2], 5).tobytes() == ref_pack(a[:, ::2].reshape(-1), 5).tobytes()


def test_unpack_accepts_bytes_and_views():
    codes = np.arange(100, dtype=np.uint8) % 8
    packed = pack_bits(codes, 3)
    for data in (packed, packed.tobytes(), bytearray(packed.tobytes()), memoryview(packed.tobytes())):
        np.testing.assert_array_equal(unpack_bits(data, 3, 100), codes)
    # extra trailing bytes are ignored, a subset count reads the prefix
    np.testing.assert_array_equal(unpack_bits(np.concatenate([packed, [0xFF] * 3]).astype(np.uint8), 3, 100), codes)
    np.testing.assert_array_equal(unpack_bits(packed, 3, 10), codes[:10])
    # a packed buffer held in a wider array is read as its bytes
    wide = np.zeros(64, np.uint32)
    wide.view(np.uint8)[: packed.size] = packed
    np.testing.assert_array_equal(unpack_bits(wide, 3, 100), codes)
    # an explicit wider dtype, as a type or as a dtype object (falsy on NumPy 1.x)
    for dt in (np.uint64, np.dtype(np.uint64), "uint32"):
        got = unpack_bits(packed, 3, 100, dt)
        assert got.dtype == np.dtype(dt)
        np.testing.assert_array_equal(got, codes)
    for bits in (1, 8, 9, 16, 17, 32, 33, 64):
        got = unpack_bits(b"", bits, 0)
        assert got.size == 0 and got.dtype == code_dtype(bits)  # the narrowest that holds the codes


def test_pack_refusals_name_their_argument():
    """Each refusal of pack_bits / unpack_bits by its class and its own message, and the
    accepted neighbour of each bound (bits 1 and 64: test_pack_small_sizes_every_width)."""
    u8 = np.ones(4, np.uint8)
    for codes in (np.arange(4, dtype=np.int32), np.ones(4, np.float32), np.ones(4, bool)):
        with pytest.raises(CodecTypeError, match=f"^codes: expected an unsigned integer array, got {codes.dtype}$"):
            pack_bits(codes, 4)
    with pytest.raises(CodecTypeError, match="^bits: expected an integer, got float$"):
        pack_bits(u8, 3.5)
    with pytest.raises(CodecTypeError, match="^bits: expected an integer, got str$"):
        unpack_bits(b"\0", "3", 1)
    for bits in (0, -1, 65):
        with pytest.raises(CodecValueError, match=rf"^bits: must be within 1\.\.64, got {bits}$"):
            pack_bits(u8, bits)
        with pytest.raises(CodecValueError, match=rf"^bits: must be within 1\.\.64, got {bits}$"):
            unpack_bits(b"\0" * 64, bits, 4)
    with pytest.raises(CodecValueError, match="^count: must be >= 0, got -1$"):
        unpack_bits(b"\0" * 8, 4, -1)
    with pytest.raises(CodecTypeError, match="^count: expected an integer, got float$"):
        unpack_bits(b"\0" * 8, 4, 2.0)
    with pytest.raises(CodecTypeError, match="^dtype: expected an unsigned integer dtype, got int32$"):
        unpack_bits(b"\0" * 8, 4, 4, np.int32)
    for dt in (np.uint8, np.uint16, np.uint32):
        bits = np.dtype(dt).itemsize * 8
        with pytest.raises(CodecValueError, match=f"^dtype: {np.dtype(dt)} cannot hold {bits + 1}-bit codes$"):
            unpack_bits(b"\0" * 40, bits + 1, 4, dt)
        assert unpack_bits(b"\xff" * 40, bits, 4, dt).tolist() == [2**bits - 1] * 4  # the widest codes it holds
    with pytest.raises(CodecValueError, match="^data: 2 bytes cannot hold 2 codes of 9 bits$"):
        unpack_bits(b"\0\0", 9, 2)
    assert unpack_bits(b"\xff\xff\x03", 9, 2).tolist() == [511, 511]  # exactly ceil(18 / 8) bytes


# ---------------------------------------------------------------- index sets
DENSITIES = (0.0, 1e-4, 0.01, 0.5, 1.0)


@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("n", (0, 1, 7, 8, 9, 1000, 2 * 65536 * 8 + 13))
def test_indices_random_masks(n, density):
    rng = np.random.default_rng(int(density * 1e4) + n)
    idx = np.flatnonzero(rng.random(n) < density)
    roundtrip_indices(idx, n)


@pytest.mark.parametrize("n", (1000, 1_000_003, 4 * 65536 * 8 + 1))
def test_indices_heavy_tailed_topk(n):
    """Top-k positions of a heavy-tailed gradient: clustered, uneven gaps."""
    rng = np.random.default_rng(n)
    g = rng.standard_t(2, n) * np.repeat(rng.lognormal(0, 2, n // 100 + 1), 100)[:n]
    for ratio in (1e-3, 0.01, 0.1, 0.3):
        k = max(1, int(n * ratio))
        idx = np.sort(np.argpartition(np.abs(g), n - k)[n - k :])
        roundtrip_indices(idx, n)


def test_indices_choice_at_the_tie():
    # n = 32: bitmap 4 bytes.  8 positions with a largest gap of 13 -> width 4 -> 4 bytes: tie -> delta
    tie = np.r_[np.arange(7), 20]
    assert (raw_length(8, ref_width(tie)), raw_length(32, 1)) == (4, 4)
    assert roundtrip_indices(tie, 32).kind == SectionKind.INDEX_DELTA
    # one more position -> 36 bits -> 5 bytes: bitmap
    assert roundtrip_indices(np.r_[np.arange(8), 20], 32).kind == SectionKind.INDEX_BITMAP
    # a bitmap of n=1 is one byte, as is one delta code: tie -> delta
    assert roundtrip_indices([0], 1).kind == SectionKind.INDEX_DELTA
    assert roundtrip_indices([], 0).kind == SectionKind.INDEX_DELTA
    # all of range(n): gaps of 0, width 1 -> n bits either way: tie -> delta
    assert roundtrip_indices(np.arange(64), 64).kind == SectionKind.INDEX_DELTA
    half = np.flatnonzero(np.random.default_rng(1).random(1000) < 0.5)
    assert roundtrip_indices(half, 1000).kind == SectionKind.INDEX_BITMAP


def test_indices_beyond_32_bits():
    """Delta path for n > 2**32 (a bitmap would be 2 GiB and must not be chosen or allocated)."""
    n = (1 << 34) + 12345
    for idx in (
        [0],
        [n - 1],
        [0, n - 1],
        [5, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, (1 << 33) + 17, n - 1],
        list(range(3, 1000, 7)) + [1 << 33, (1 << 34) - 3],
    ):
        sec = roundtrip_indices(idx, n)
        assert sec.kind == SectionKind.INDEX_DELTA
    assert encode_indices([(1 << 34) + 1], n).bits == 35


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 3000).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, max(n - 1, 0)), max_size=n))))
def test_indices_property(case):
    n, s = case
    roundtrip_indices(np.array(sorted(s), np.int64), n)


def test_encode_indices_refusals():
    """Each refusal of encode_indices by its class and its own message, and the accepted edge
    beside each: no positions of any dtype, the largest uint64 position that is an int64."""
    with pytest.raises(CodecValueError, match="^n: must be >= 0, got -1$"):
        encode_indices([], -1)
    with pytest.raises(CodecTypeError, match="^n: expected an integer, got float$"):
        encode_indices([1], 5.0)
    for idx in ([1.0, 2.0], np.array([1, 2], np.float32), [True], [1, 2**70]):
        with pytest.raises(CodecTypeError, match=f"^idx: expected integer positions, got {np.asarray(idx).dtype}$"):
            encode_indices(idx, 10)
    for idx in ([], np.empty(0, np.float32)):  # no positions has no position of the wrong type
        sec = encode_indices(idx, 5)
        assert (sec.kind, sec.bits, sec.count, sec.data.size) == (SectionKind.INDEX_DELTA, 1, 0, 0)
    outside = ([-1, 2], [0, 10], [12], np.array([1, 2**63 + 5], np.uint64), np.array([2**64 - 1], np.uint64))
    for idx in outside:
        with pytest.raises(CodecValueError, match=r"^idx: positions must lie in \[0, 10\)$"):
            encode_indices(idx, 10)
    for idx in ([3, 3], [4, 2], [5, 100, 3]):
        with pytest.raises(CodecValueError, match="^idx: positions must be strictly increasing$"):
            encode_indices(idx, 10)
    top = encode_indices(np.array([2**63 - 1], np.uint64), 2**63)
    assert (top.kind, top.bits, top.count, bytes(top.data)) == (SectionKind.INDEX_DELTA, 63, 1, (2**63 - 1).to_bytes(8, "little"))


def delta_section(gaps, width):
    return np.frombuffer(pack_bits(np.asarray(gaps, np.uint64), width).tobytes(), np.uint8)


DELTA, BITMAP = SectionKind.INDEX_DELTA, SectionKind.INDEX_BITMAP


def test_decode_indices_refusals():
    """Every section no encoder writes is a CorruptFrameError with its own message; the
    accepted edge beside each bound decodes."""
    n = 100
    ok = delta_section([1, 2, 3], 2)
    beyond = "index section: a position lies beyond the 100 elements"
    bad = [
        # a position past the end, from the last gap or from the sum of gaps reaching n exactly
        (info_of(DELTA, 7, 1), delta_section([100], 7), n, beyond),
        (info_of(DELTA, 7, 2), delta_section([60, 39], 7), n, beyond),
        # a width of none or wider than any gap in range(n) can need; more positions than elements
        (info_of(DELTA, 0, 1), np.empty(0, np.uint8), n, "index section: 1 gaps of 0 bits cannot address 100 elements"),
        (info_of(DELTA, 8, 1), delta_section([3], 8), n, "index section: 1 gaps of 8 bits cannot address 100 elements"),
        (info_of(DELTA, 64, 1), delta_section([3], 64), n, "index section: 1 gaps of 64 bits cannot address 100 elements"),
        (info_of(DELTA, 2, 1), delta_section([1], 2), 2, "index section: 1 gaps of 2 bits cannot address 2 elements"),
        (info_of(DELTA, 1, 11), delta_section([0] * 11, 1), 10, "index section: 11 gaps of 1 bits cannot address 10 elements"),
        # padding bits after the last gap; truncated and overlong payloads
        (info_of(DELTA, 2, 3), np.array([ok[0] | 0xC0], np.uint8), n, "index section: padding bits past the last item are set"),
        (info_of(DELTA, 7, 3), delta_section([1, 2], 7), n, r"index section: 2 bytes for 3 items of 7 bits \(want 3\)"),
        (info_of(DELTA, 2, 3), np.r_[ok, [0]].astype(np.uint8), n, r"index section: 2 bytes for 3 items of 2 bits \(want 1\)"),
        # bitmap: a count other than n, items of more than one bit, padding bits set, wrong lengths
        (info_of(BITMAP, 1, 99), np.zeros(13, np.uint8), n, "index bitmap: 99 items of 1 bits for 100 elements"),
        (info_of(BITMAP, 2, n), np.zeros(25, np.uint8), n, "index bitmap: 100 items of 2 bits for 100 elements"),
        (info_of(BITMAP, 1, n), np.r_[np.zeros(12), [0x10]].astype(np.uint8), n, "index bitmap: padding bits past the last item are set"),
        (info_of(BITMAP, 1, n), np.zeros(12, np.uint8), n, r"index bitmap: 12 bytes for 100 items of 1 bits \(want 13\)"),
        (info_of(BITMAP, 1, n), np.r_[np.zeros(13), [1]].astype(np.uint8), n, r"index bitmap: 14 bytes for 100 items of 1 bits \(want 13\)"),
        # not an index section at all
        (info_of(SectionKind.VALUES, 8, 3), np.zeros(3, np.uint8), n, "section kind 1 is not an index set"),
        (info_of(SectionKind.SCALARS, 1, n), np.zeros(13, np.uint8), n, "section kind 4 is not an index set"),
    ]
    for info, raw, nn, message in bad:
        with pytest.raises(CorruptFrameError, match=f"^{message}$"):
            decode_indices(info, raw, nn)
    with pytest.raises(CodecTypeError, match="^n: expected an integer, got float$"):
        decode_indices(info_of(DELTA, 2, 3), ok, 100.0)
    accepted = [
        (info_of(DELTA, 2, 3), ok, n, [1, 4, 8]),
        (info_of(DELTA, 1, 0), np.empty(0, np.uint8), 0, []),  # no positions, no bytes
        (info_of(DELTA, 1, 1), delta_section([0], 1), 1, [0]),  # the one width of n = 1
        (info_of(DELTA, 4, 1), delta_section([8], 4), 9, [8]),  # the widest gap of n = 9
        (info_of(DELTA, 7, 2), delta_section([60, 38], 7), n, [60, 99]),  # the sum reaching n - 1
        (info_of(DELTA, 1, 10), delta_section([0] * 10, 1), 10, list(range(10))),  # as many positions as elements
        # the last bitmap bit in range; n % 8 == 0 has no padding
        (info_of(BITMAP, 1, n), np.r_[np.zeros(12), [0x08]].astype(np.uint8), n, [99]),
        (info_of(BITMAP, 1, 16), np.array([0, 0x80], np.uint8), 16, [15]),
    ]
    for info, raw, nn, want in accepted:
        got = decode_indices(info, raw, nn)
        assert got.dtype == np.int64 and got.tolist() == want, (info, nn)


def test_decode_indices_reads_large_sections_where_asked(monkeypatch):
    """With ``device=True`` a section of 128 KB (docs/api.md) or more is read where the
    decode writes, a smaller one on the host; without it, always on the host."""
    import codec.pack as pack

    assert pack.DEVICE_SECTION == 128 * 1024
    where = []

    class Host(pack.Memory):  # records the choice, reads on the host (no GPU needed)
        def __init__(self, device):
            where.append(device)
            super().__init__(False)

    monkeypatch.setattr(pack, "Memory", Host)
    for size, device in ((128 * 1024 - 1, True), (128 * 1024, True), (128 * 1024, False)):
        raw = np.zeros(size, np.uint8)
        raw[-1] = 0x80
        assert decode_indices(info_of(BITMAP, 1, 8 * size), raw, 8 * size, device=device).tolist() == [8 * size - 1]
    monkeypatch.setattr(pack, "DEVICE_SECTION", 0)  # as tests/cuda/conftest.py sets it: every section but an empty one
    assert decode_indices(info_of(DELTA, 1, 0), b"", 0, device=True).tolist() == []
    assert decode_indices(info_of(BITMAP, 1, 8), b"\x01", 8, device=True).tolist() == [0]
    assert where == [False, True, False, False, True]


# ---------------------------------------------------------------- the pack family, per backend
def code_dtype(bits):
    """The codes' dtype codec.pack hands the kernels: the narrowest unsigned one that holds them."""
    return next(np.dtype(d) for d in UNSIGNED if np.dtype(d).itemsize * 8 >= bits)


@pytest.mark.parametrize("bits", (1, 2, 3, 7, 8, 9, 11, 16, 17, 29, 32, 33, 63, 64))
def test_pack_family_codes_across_chunks(backend, bits):
    kern = module("pack", backend)
    rng = np.random.default_rng(bits)
    n = BIG + 3  # whole parallel chunks, then a tail of fewer than 8 codes
    codes = (random_codes(rng, n, np.uint64) & mask(bits)).astype(code_dtype(bits))
    out = np.full(raw_length(n, bits), 0xA5, np.uint8)  # every byte must be written
    kern.pack_codes(readonly(codes), bits, out)
    assert out.tobytes() == ref_pack(codes, bits).tobytes()
    back = np.empty(n, code_dtype(bits))
    kern.unpack_codes(readonly(out), bits, back)
    np.testing.assert_array_equal(back, codes)


def test_index_family_index_sets(backend):
    kern = module("index", backend)
    rng = np.random.default_rng(7)
    n = 2 * 8 * (1 << 16) + 13  # a bitmap of more than two parallel chunks of bytes
    idx = np.flatnonzero(rng.random(n) < 0.01).astype(np.int64)
    gaps = np.empty(idx.size, np.uint64)
    assert kern.delta_encode(readonly(idx), gaps) == ref_gaps(idx).max()
    np.testing.assert_array_equal(gaps, ref_gaps(idx).astype(np.uint64))
    back = np.empty(idx.size, np.int64)
    assert kern.delta_decode(readonly(gaps), n, back) is True
    np.testing.assert_array_equal(back, idx)
    assert kern.delta_decode(readonly(gaps), int(idx[-1]), np.empty(idx.size, np.int64)) is False  # one reaches n
    assert kern.delta_encode(readonly(idx[::-1].copy()), np.empty(idx.size, np.uint64)) == -1
    assert kern.delta_encode(readonly(np.arange(5, dtype=np.int64)), np.empty(5, np.uint64)) == 0  # gaps of 0 only
    bitmap = np.full(raw_length(n, 1), 0xA5, np.uint8)
    kern.bitmap_encode(readonly(idx), bitmap)
    m = np.zeros(n, np.uint8)
    m[idx] = 1
    assert bitmap.tobytes() == np.packbits(m, bitorder="little").tobytes()
    counts = kern.bitmap_count(readonly(bitmap))
    assert counts.dtype == np.int64 and counts.size > 2 and counts.sum() == idx.size
    starts = np.zeros(counts.size, np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    pos = np.empty(idx.size, np.int64)
    kern.bitmap_decode(readonly(bitmap), starts, pos)
    np.testing.assert_array_equal(pos, idx)


def test_index_family_absolute_positions(backend):
    """Each set's positions (relative to its tensor) moved to the run: empty sets and tensors
    included, in place too."""
    kern = module("index", backend)
    rng = np.random.default_rng(11)
    sizes = np.array([0, 1, 7, 0, 1000, 3], np.int64)
    sets = [np.flatnonzero(rng.random(n) < 0.3).astype(np.int64) for n in sizes.tolist()]
    pos = np.concatenate(sets)
    kstarts = np.concatenate([[0], np.cumsum([p.size for p in sets])]).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    want = np.concatenate([p + s for p, s in zip(sets, starts[:-1].tolist())])
    out = np.full(pos.size, -1, np.int64)
    kern.absolute_positions(readonly(pos), kstarts, starts, out)
    np.testing.assert_array_equal(out, want)
    kern.absolute_positions(pos, kstarts, starts, pos)
    np.testing.assert_array_equal(pos, want)


@pytest.mark.parametrize("dtype", (np.float16, np.float32, np.float64))
def test_pack_family_sign_bits(backend, dtype):
    """np.signbit of each tensor, packed LSB-first at its own byte offset (several parallel
    iterations' worth, -0.0 and negative NaN included); bytes between tensors untouched;
    refusals name the function."""
    kern = module("pack", backend)
    rng = np.random.default_rng(5)
    sizes = (0, 1, 9, 0, BIG)
    x = rng.standard_t(2, sum(sizes)).astype(dtype)
    x[:3] = (-0.0, np.nan, -np.nan)
    words = x.view(f"u{np.dtype(dtype).itemsize}")
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    nbytes = (np.array(sizes) + 7) // 8
    ostarts = np.concatenate([[0], np.cumsum(nbytes + 8)[:-1]]).astype(np.int64)  # 8 bytes between, as AdaComp's scales
    out = np.full(int(ostarts[-1] + nbytes[-1]), 0xA5, np.uint8)
    kern.sign_bits(readonly(words), starts, out, ostarts)
    for t in range(len(sizes)):
        ref = np.packbits(np.signbit(x[starts[t] : starts[t + 1]]), bitorder="little")
        assert out[ostarts[t] : ostarts[t] + nbytes[t]].tobytes() == ref.tobytes(), t
        if t + 1 < len(sizes):
            assert (out[ostarts[t] + nbytes[t] : ostarts[t + 1]] == 0xA5).all(), t  # the gap untouched
    with pytest.raises(CodecValueError, match="sign_bits"):
        kern.sign_bits(x, starts, out, ostarts)  # floats, not their bits


def test_index_family_bitmap_edges(backend):
    """Every byte value's set bits (counted per one-byte section, decoded); a chunk count
    that follows the size exactly; a dense bitmap over chunk ends decoded into an ``out``
    with guard values after it (nothing written past its end)."""
    kern = module("index", backend)
    every = np.arange(256, dtype=np.uint8)
    begin = np.arange(256, dtype=np.int64)
    counts = np.empty(256, np.int64)
    table = lambda kind, bits, count, length=1: readonly(np.stack(np.broadcast_arrays(int(kind), bits, count, begin, length), 1).astype(np.int64))  # noqa: E731
    kern.index_counts(readonly(every), table(BITMAP, 1, 8), np.full(256, 8, np.int64), counts)
    assert counts.tolist() == [bin(v).count("1") for v in range(256)]  # each byte an 8-element bitmap
    kern.index_counts(readonly(every), table(DELTA, 8, 1), np.full(256, 256, np.int64), counts)
    assert counts.tolist() == [1] * 256  # packed gaps: the count their section states
    # what no encoder writes is -1, set by set, as codec.pack.decode_indices refuses one
    rows = readonly(np.array([
        [3, 2, 3, 0, 1],  # good: 3 gaps of 2 bits (byte 0 has no bits past them)
        [3, 2, 3, 0, 2],  # a length not its count's
        [3, 0, 3, 0, 1],  # gaps of 0 bits
        [3, 9, 1, 0, 2],  # wider than 255 elements need
        [3, 2, 3, 255, 2],  # past the data
        [3, 2, 3, -1, 1],  # before it
        [2, 1, 7, 0, 1],  # a bitmap of 7 items for 8 elements
        [2, 2, 8, 0, 2],  # a bitmap of 2-bit items
        [1, 1, 8, 0, 1],  # values, not an index set
        [3, 1, 3, 8, 1],  # 3 gaps of 1 bit: byte 8's bit past them set
    ], np.int64))
    sizes = np.array([12, 12, 12, 256, 12, 12, 8, 8, 8, 12], np.int64)
    got = np.empty(len(sizes), np.int64)
    kern.index_counts(readonly(every), rows, sizes, got)
    assert got.tolist() == [3] + [-1] * 9
    chunk = module("index", "cpu")._BYTES  # the CPU's chunks, which the CUDA twin keeps
    for size in (chunk, 2 * chunk, 2 * chunk + 1):
        assert kern.bitmap_count(readonly(np.zeros(size, np.uint8))).size == -(-size // chunk)
    encoded = np.full(2 * chunk + 1, 0xA5, np.uint8)  # a last chunk of one byte, written too
    kern.bitmap_encode(readonly(np.array([3, 8 * chunk + 5, 16 * chunk + 7], np.int64)), encoded)
    assert np.flatnonzero(encoded).tolist() == [0, chunk, 2 * chunk] and encoded[[0, chunk, 2 * chunk]].tolist() == [8, 32, 128]
    # random bytes, then one bit in each of the last 7: the last chunk's share ends 7 slots
    # after a byte with a bit, where 8 candidate positions would overrun it
    rng = np.random.default_rng(3)
    bitmap = np.r_[rng.integers(0, 256, 2 * chunk, dtype=np.uint8), every, [0x10] * 7].astype(np.uint8)
    bitmap[chunk - 1] = 0xFF  # the first chunk ends with a byte that fills its last 8 slots
    want = np.flatnonzero(np.unpackbits(bitmap, bitorder="little"))
    counts = kern.bitmap_count(readonly(bitmap))
    assert counts.tolist() == [np.unpackbits(bitmap[c : c + chunk]).sum() for c in range(0, bitmap.size, chunk)]
    for named in (3, 1):  # every chunk, or the first only: bitmap_decode reads the chunks ``starts`` names
        starts = np.zeros(named + 1, np.int64)  # a 0 past the starts given: the share ends come from them
        np.cumsum(counts[: named - 1], out=starts[1:named])
        m = want.size if named == 3 else int(counts[0])
        buf = np.full(m + 16, -7, np.int64)  # guard values past ``out``
        kern.bitmap_decode(readonly(bitmap), starts[:named], buf[:m])
        np.testing.assert_array_equal(buf[:m], want[:m])
        assert (buf[m:] == -7).all()


def test_index_family_widths(backend):
    """index_widths: per set the bit length of its largest gap (at least 1), -1 for a set that
    is not strictly increasing, starts below 0 or reaches its size."""
    kern = module("index", backend)
    sets = [([], 5), ([0], 1), ([4], 5), ([3, 8], 9), ([2**40], 2**41), ([2, 2], 5), ([3, 1], 5), ([-1], 5), ([5], 5)]
    pos = np.array([p for s, _ in sets for p in s], np.int64)
    starts = np.cumsum([0] + [len(s) for s, _ in sets]).astype(np.int64)
    widths = np.zeros(len(sets), np.int64)
    kern.index_widths(readonly(pos), starts, readonly(np.array([n for _, n in sets], np.int64)), widths)
    assert widths.tolist() == [1, 1, 3, 3, 41, -1, -1, -1, -1]


def test_index_family_writes_every_byte(backend):
    """index_write puts each set's section (as encode_indices codes it alone) at its offset,
    every byte written: bitmaps after gaps and gaps after bitmaps, into an ``out`` of junk."""
    kern = module("index", backend)
    dense = np.flatnonzero(np.random.default_rng(4).random(50) < 0.6)
    sets = [([1, 5, 9], 12), (list(range(30)) + [39], 40), ([0], 1), (dense, 50), ([], 3), ([7, 60], 64), (dense + 1, 51)]
    secs = [encode_indices(idx, n) for idx, n in sets]
    assert [s.kind for s in secs] == [DELTA, BITMAP, DELTA, BITMAP, DELTA, DELTA, BITMAP]
    pos = np.array([p for s, _ in sets for p in s], np.int64)
    starts = np.cumsum([0] + [len(s) for s, _ in sets]).astype(np.int64)
    at = np.cumsum([0] + [s.data.size for s in secs]).astype(np.int64)
    out = np.full(int(at[-1]), 0xA5, np.uint8)
    bitmap = np.array([s.kind == BITMAP for s in secs])
    widths = np.array([s.bits if s.kind == DELTA else 1 for s in secs], np.int64)
    offsets = np.r_[at, [0]]  # an entry more than the sets need: set s is addressed by offsets[s] and offsets[s + 1] only
    kern.index_write(readonly(pos), starts, readonly(widths), readonly(bitmap), offsets, out)
    assert bytes(out) == b"".join(bytes(s.data) for s in secs)


# ---------------------------------------------------------------- index sections of many sets
def _sets(seed):
    """Position sets over edge sizes and densities: empty, one, sparse, dense (bitmap), all,
    random and heavy-tailed-top-k-like, and the exact delta/bitmap tie."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (0, 1, 7, 8, 9, 100, 1000, 4097, 65536):
        for density in (0.0, 0.01, 0.1, 0.5, 1.0):
            idx = np.flatnonzero(rng.random(n) < density) if density < 1 else np.arange(n)
            out.append((idx.astype(np.int64), n))
        if n:
            out.append((np.array([n - 1], np.int64), n))  # the widest single gap
            x = np.abs(rng.standard_t(2, n))
            out.append((np.sort(np.argsort(-x, kind="stable")[: max(1, n // 20)]).astype(np.int64), n))
    out.append((np.arange(0, 64, 8, dtype=np.int64), 64))  # 8 gaps of 3 bits = 3 bytes against 8: delta
    out.append((np.r_[np.arange(7), 20].astype(np.int64), 32))  # 4 bytes either way: delta
    out.append((np.r_[np.arange(8), 20].astype(np.int64), 32))  # 5 bytes against 4: bitmap
    return out


def _payload(sections, rng):
    """The sections back to back with a few junk bytes between them (a many-tensor frame puts
    each tensor's values section there), and their infos."""
    parts, infos, off = [], [], 0
    for sec in sections:
        junk = rng.integers(0, 256, int(rng.integers(0, 5)), dtype=np.uint8)
        parts += [junk, np.frombuffer(bytes(sec.data), np.uint8)]
        off += junk.size
        infos.append(SectionInfo(int(sec.kind), 0, sec.bits, sec.count, sec.raw_len, sec.raw_len, off))
        off += sec.raw_len
    return np.concatenate(parts) if parts else np.empty(0, np.uint8), infos


@pytest.mark.parametrize("seed", [0, 1])
def test_index_segments_match_one_set_at_a_time(seed):
    """encode_index_segments gives, set by set, encode_indices' section (kind, width, count and
    bytes, checked against the NumPy references); decode_index_segments reads them back."""
    from codec.pack import decode_index_segments, encode_index_segments

    sets = _sets(seed)
    pos = np.concatenate([s for s, _ in sets])
    starts = np.zeros(len(sets) + 1, np.int64)
    np.cumsum([s.size for s, _ in sets], out=starts[1:])
    sizes = [n for _, n in sets]
    got = encode_index_segments(pos, starts, sizes)
    assert len(got) == len(sets)
    for sec, (idx, n) in zip(got, sets):
        want = roundtrip_indices(idx, n)
        assert (sec.kind, sec.bits, sec.count) == (want.kind, want.bits, want.count), n
        assert bytes(sec.data) == bytes(want.data), n
    data, infos = _payload(got, np.random.default_rng(seed))
    back = decode_index_segments(data, infos, sizes)
    assert back is not None and len(back) == len(sets)
    for b, (idx, _) in zip(back, sets):
        assert b.dtype == np.int64 and np.array_equal(b, idx)
    assert encode_index_segments(np.empty(0, np.int64), np.zeros(1, np.int64), []) == []
    assert decode_index_segments(np.empty(0, np.uint8), [], []) == []
    empty = SectionInfo(int(SectionKind.INDEX_DELTA), 0, 1, 0, 0, 0, 0)  # no positions, no payload at all
    (none,) = decode_index_segments(np.empty(0, np.uint8), [empty], [5])
    assert none.size == 0


def test_index_segments_refuse_what_one_set_refuses():
    """A set that is not increasing or runs past its tensor is a CodecValueError; a section
    no encoder writes, even one among good ones, makes decode_index_segments hand the frame
    back (None) to decode_indices, which names the damage (its message) or reads it (a gap
    beyond the 56 bits of the many-section reader)."""
    from codec.pack import decode_index_segments, encode_index_segments

    message = r"^idx: each set's positions must be strictly increasing and lie in \[0, n\)$"
    for pos, n in (([3, 3], 10), ([10], 10), ([-1], 10)):
        with pytest.raises(CodecValueError, match=message):
            encode_index_segments(np.array(pos, np.int64), np.array([0, len(pos)], np.int64), [n])
    sets = [(np.array([1, 5, 9], np.int64), 12), (np.append(np.arange(30), 39).astype(np.int64), 40)]
    pos = np.concatenate([s for s, _ in sets])
    secs = encode_index_segments(pos, np.array([0, 3, 34], np.int64), [12, 40])
    assert [(s.kind, s.bits, bytes(s.data)) for s in secs] == [(DELTA, 2, b"\x3d"), (BITMAP, 1, bytes(secs[1].data))]
    good = SectionInfo(int(BITMAP), 0, 1, 40, 5, 5, 1)
    head = np.r_[[0], secs[1].data, [0xFF]].astype(np.uint8)  # the bitmap at 1, a set byte after it
    (back,) = decode_index_segments(head, [good], [40])
    assert back.tolist() == sets[1][0].tolist()

    def refused(message, raw, n, kind=DELTA, bits=2, count=3, raw_len=1, offset=None, trail=b"\xff"):
        """The section (``raw`` at ``offset``, set bits after it) after a good one is handed
        back, and decode_indices refuses it by ``message``."""
        raw = np.frombuffer(bytes(raw), np.uint8)
        data = np.r_[head, raw, np.frombuffer(trail, np.uint8)].astype(np.uint8)
        info = SectionInfo(int(kind), 0, bits, count, raw_len, raw_len, head.size if offset is None else offset)
        assert decode_index_segments(data, [good, info], [40, n]) is None, message
        with pytest.raises(CorruptFrameError, match=f"^{message}$"):
            decode_indices(info, data[max(0, info.offset) : info.offset + raw_len], n)

    refused("index section: padding bits past the last item are set", b"\xbd", 12)
    refused("index section: a position lies beyond the 11 elements", b"\x3f", 11)  # 3, 7, 11
    refused("index section: a position lies beyond the 5 elements", b"\x3d", 5)  # 1, 5
    refused("index section: 1 gaps of 2 bits cannot address 2 elements", b"\x01", 2, count=1)  # a width n = 2 cannot need
    refused("index section: 3 gaps of 0 bits cannot address 12 elements", b"", 12, bits=0, raw_len=0)
    refused("index section: 13 gaps of 1 bits cannot address 12 elements", b"\0\0", 12, bits=1, count=13, raw_len=2)
    refused(r"index section: 2 bytes for 3 items of 2 bits \(want 1\)", b"\x3d\0", 12, raw_len=2)  # a length not its count's
    refused(r"index section: 0 bytes for 3 items of 2 bits \(want 1\)", b"\x3d", 12, offset=-1)
    refused(r"index section: 0 bytes for 3 items of 2 bits \(want 1\)", b"\x3d", 12, offset=head.size + 1, trail=b"")  # past the data
    refused("index bitmap: 39 items of 1 bits for 40 elements", bytes(5), 40, kind=BITMAP, bits=1, count=39, raw_len=5)
    refused("index bitmap: 40 items of 2 bits for 40 elements", bytes(10), 40, kind=BITMAP, bits=2, count=40, raw_len=10)
    refused("section kind 1 is not an index set", b"\0", 12, kind=SectionKind.VALUES, bits=1, count=5)
    # gaps of 57 bits are an encoder's (encode_indices of a tensor that large) but past the reader's 56
    big = SectionInfo(int(DELTA), 0, 57, 1, 8, 8, 0)
    raw = np.frombuffer((1 << 56).to_bytes(8, "little"), np.uint8)
    assert decode_index_segments(raw, [big], [1 << 58]) is None
    assert decode_indices(big, raw, 1 << 58).tolist() == [1 << 56]
    # a section at offset 0 ending at the data's end is in bounds
    (only,) = decode_index_segments(head[1:6], [good._replace(offset=0)], [40])
    assert only.tolist() == sets[1][0].tolist()


def test_index_segments_fall_back_past_56_bit_gaps():
    """index_segments writes the sets whose gaps fit its kernels' 56 bits and returns None
    when one needs more; encode_index_segments then gives encode_indices' section of every
    set, both kinds mixed."""
    from codec.pack import decode_index_segments, encode_index_segments, index_segments

    one = np.array([0, 1], np.int64)
    run = index_segments(np.array([2**56 - 1], np.int64), one, [2**57])
    (sec,) = run.sections()
    assert (sec.kind, sec.bits, sec.count, bytes(sec.data)) == (DELTA, 56, 1, (2**56 - 1).to_bytes(7, "little"))
    (back,) = decode_index_segments(run.data, [SectionInfo(int(DELTA), 0, 56, 1, 7, 7, 0)], [2**57])  # and reads them
    assert back.tolist() == [2**56 - 1]
    assert index_segments(np.array([2**56], np.int64), one, [2**57]) is None
    sets = [([1, 5, 9], 12), ([3, 2**60], 2**61), (list(range(30)) + [39], 40), ([], 0), ([0], 1), ([2**56], 2**57)]
    pos = np.array([p for s, _ in sets for p in s], np.int64)
    starts = np.cumsum([0] + [len(s) for s, _ in sets]).astype(np.int64)
    assert index_segments(pos, starts, [n for _, n in sets]) is None
    got = encode_index_segments(pos, starts, [n for _, n in sets])
    assert [(s.kind, s.bits) for s in got] == [(DELTA, 2), (DELTA, 60), (BITMAP, 1), (DELTA, 1), (DELTA, 1), (DELTA, 57)]
    for sec, (idx, n) in zip(got, sets):
        want = encode_indices(idx, n)
        assert (sec.kind, sec.bits, sec.count, bytes(sec.data)) == (want.kind, want.bits, want.count, bytes(want.data))


def test_padding_bytes_name_each_sections_last_byte():
    """Per section with padding bits past its last item: its own last byte, never a
    neighbour's (set bits around it), the first and the last byte of the data included, and
    the shift that leaves the padding bits."""
    from codec.pack import padding_bytes

    def clear(data, starts, counts, bits):
        last, shift = padding_bytes(starts, counts, bits, data.size)
        return not (data[last].astype(np.int64) >> shift).any()

    starts, counts = np.array([0, 1, 2, 4]), np.array([3, 4, 5, 3])  # 2-bit items: 6, 8, 10 and 6 bits
    last, shift = padding_bytes(starts, counts, 2, 5)
    assert last.tolist() == [0, 3, 4] and shift.tolist() == [6, 2, 6]  # (the 8-bit section has none)
    ok = np.array([0x3F, 0xFF, 0xFF, 0x03, 0x3F], np.uint8)
    assert clear(ok, starts, counts, 2)
    for byte, bit in ((0, 0x40), (3, 0x04), (4, 0x80)):  # each padded section's own padding
        dirty = ok.copy()
        dirty[byte] |= bit
        assert not clear(dirty, starts, counts, 2)
    assert padding_bytes(starts, counts, np.array([2, 2, 2, 1]), 5)[1].tolist() == [6, 2, 3]  # 3 bits of 1-bit items
    assert not clear(ok, starts, counts, np.array([2, 2, 2, 1]))  # (0x3F past 3 bits)
    assert padding_bytes(np.array([0, 0]), np.array([0, 1]), 3, 0)[0].tolist() == [0]  # (no bytes: the caller refuses)
    # a last byte outside the data reads the nearest one: the first before it, the last past it
    assert padding_bytes(np.array([-1, 2]), np.array([1, 11]), 2, 3)[0].tolist() == [0, 2]
    # sections of every width end to end, against the rule written out (1 to 7 bits used)
    rng = np.random.default_rng(6)
    counts, widths = rng.integers(0, 3000, 300), rng.integers(1, 17, 300)
    ends = np.cumsum(-(-counts * widths // 8))
    starts = np.concatenate([[0], ends[:-1]])
    last, shift = padding_bytes(starts, counts, widths, int(ends[-1]))
    want = [(s + -(-c * b // 8) - 1, c * b % 8) for s, c, b in zip(starts.tolist(), counts.tolist(), widths.tolist()) if c * b % 8]
    assert list(zip(last.tolist(), shift.tolist())) == want and {u for _, u in want} == set(range(1, 8))


# ---------------------------------------------------------------- a many-tensor run's bytes
@pytest.mark.parametrize("bits", [1, 3, 6, 8, 11, 16, 33])
def test_pack_segments_match_numpy(bits, backend):
    """Each tensor's codes packed at its own byte offset exactly as ref_pack packs them alone;
    the bytes between tensors are left as they were."""
    rng = np.random.default_rng(bits)
    sizes = [0, 1, 7, 8, 9, 1001, (1 << 16) + 5, 3]
    dtype = np.uint8 if bits <= 8 else np.uint16 if bits <= 16 else np.uint64
    codes = random_codes(rng, sum(sizes), dtype)
    starts = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    lens = [raw_length(n, bits) for n in sizes]
    ostarts = np.cumsum([0] + [ln + 3 for ln in lens])[:-1].astype(np.int64)  # 3 bytes between
    out = np.full(int(ostarts[-1]) + lens[-1] + 3, 0xCD, np.uint8)
    module("pack", backend).pack_segments(readonly(codes), starts, bits, out, ostarts)
    for t, n in enumerate(sizes):
        assert bytes(out[ostarts[t] : ostarts[t] + lens[t]]) == bytes(ref_pack(codes[starts[t] : starts[t + 1]], bits)), t
        assert np.all(out[ostarts[t] + lens[t] : ostarts[t] + lens[t] + 3] == 0xCD)


def test_put_and_take_items_match_numpy(backend):
    """Per tensor float64 items written as float64, float32 (rounded as NumPy casts) or int16,
    little-endian at their offsets, and read back as float64."""
    rng = np.random.default_rng(5)
    counts = [0, 1, 5, 300, 2]
    widths = np.array([8, 4, 2, 4, 8], np.int64)
    values = []
    for c, w in zip(counts, widths):
        v = rng.standard_t(2, c) * 1e3
        values.append(np.round(v).clip(-32768, 32767) if w == 2 else v)
    vstarts = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=vstarts[1:])
    ostarts = np.cumsum([0] + [c * w + 1 for c, w in zip(counts, widths)])[:-1].astype(np.int64)
    out = np.zeros(int(ostarts[-1]) + counts[-1] * int(widths[-1]), np.uint8)
    flat = np.concatenate(values)
    module("pack", backend).put_items(readonly(flat), vstarts, widths, out, ostarts)
    back = np.full(flat.size, np.nan)
    module("pack", backend).take_items(readonly(out), ostarts, widths, vstarts, back)
    for t, (v, w) in enumerate(zip(values, widths)):
        want = v.astype({8: "<f8", 4: "<f4", 2: "<i2"}[int(w)])
        assert bytes(out[ostarts[t] : ostarts[t] + v.size * w]) == want.tobytes(), t
        assert np.array_equal(back[vstarts[t] : vstarts[t + 1]], want.astype(np.float64)), t


def test_interleave_matches_numpy(backend):
    """A sparse run's bytes: each tensor's index bytes, then its value codes, in turn."""
    rng = np.random.default_rng(9)
    a_sizes, b_sizes = [0, 3, 1, 0, 40], [2, 0, 8, 0, 5]
    first = rng.integers(0, 256, sum(a_sizes), dtype=np.uint8)
    second = rng.integers(0, 256, sum(b_sizes), dtype=np.uint8)
    fs, ss = (np.concatenate([[0], np.cumsum(x)]).astype(np.int64) for x in (a_sizes, b_sizes))
    out = np.full(first.size + second.size, 7, np.uint8)
    module("pack", backend).interleave(readonly(first), fs, readonly(second), ss, out)
    want = np.concatenate([p for t in range(len(a_sizes)) for p in (first[fs[t] : fs[t + 1]], second[ss[t] : ss[t + 1]])])
    assert bytes(out) == bytes(want)


def test_pack_segments_refuses_an_out_too_small(backend):
    """A tensor's bytes past ``out`` are refused before the kernel runs (it checks nothing)."""
    codes = np.arange(24, dtype=np.uint8)
    starts = np.array([0, 8, 24], np.int64)
    with pytest.raises(ValueError, match="pack_segments"):
        module("pack", backend).pack_segments(readonly(codes), starts, 8, np.zeros(23, np.uint8), np.array([0, 8], np.int64))
    with pytest.raises(ValueError, match="pack_segments"):
        module("pack", backend).pack_segments(readonly(codes), starts, 8, np.zeros(24, np.uint8), np.array([-1, 8], np.int64))
