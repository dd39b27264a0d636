"""Frame format v1: layout, validation order, limits."""

import re
import struct
import tracemalloc
import zlib

import crc32c
import numpy as np
import pytest

import codec
from codec.errors import CodecTypeError, CodecValueError
from codec.frame import (
    FIXED_SIZE,
    MAGIC,
    MAX_ELEMENTS,
    MIN_FRAME,
    SECTION_SIZE,
    Encoding,
    Frame,
    Section,
    SectionInfo,
    SectionKind,
    SectionReader,
    SectionRun,
    build_frame,
    check_dims,
    checksum_name,
    element_limit,
    header_length,
    parse_frame,
    raw_length,
)

from support.threads import same_across_threads


def _frame(spec="fp16", arr=None):
    arr = np.arange(10, dtype=np.float32) if arr is None else arr
    return codec.get_codec(spec).encode(arr)


def _refresh_crc(buf, header_len):
    buf[header_len - 4 : header_len] = struct.pack("<I", zlib.crc32(bytes(buf[: header_len - 4])))


def test_layout_byte_by_byte():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    f = codec.get_codec("fp16").encode(arr)
    assert f[:4] == MAGIC == b"\x89GCF"
    version, flags, dtype, ndim, nsec, reserved, spec_len = struct.unpack_from("<BBBBBBH", f, 4)
    assert (version, flags, dtype, ndim, nsec, reserved, spec_len) == (1, 2, 3, 2, 1, 0, 4)  # flags: CRC-32C
    assert struct.unpack_from("<2Q", f, 12) == (2, 3)
    assert f[28:32] == b"fp16"
    kind, enc, bits, count, raw_len, stored_len = struct.unpack_from("<BBHQQQ", f, 32)
    assert (kind, enc, bits, count, raw_len, stored_len) == (SectionKind.VALUES, 0, 16, 6, 12, 12)
    hl = 32 + SECTION_SIZE + 4 + 4
    assert struct.unpack_from("<I", f, hl - 8)[0] == crc32c.crc32c(f[hl:])
    assert struct.unpack_from("<I", f, hl - 4)[0] == zlib.crc32(f[: hl - 4])
    assert len(f) == hl + 12
    assert np.frombuffer(f[hl:], np.uint16).tolist() == arr.astype(np.float16).view(np.uint16).ravel().tolist()


def test_wire_size_formula():
    # header = 12 + 8*ndim + len(spec) + 28*sections + 4 + 4 (payload CRC-32C); payload as the sections say
    for spec, arr, payload in [
        ("none", np.zeros((3, 5), np.float32), 60),
        ("fp16", np.zeros((3, 5), np.float32), 30),
        ("bf16", np.zeros(7, np.float64), 14),
        ("none", np.zeros((), np.float64), 8),
    ]:
        c = codec.get_codec(spec)
        f = c.encode(arr)
        assert len(f) == 12 + 8 * arr.ndim + len(c.spec) + 28 + 4 + 4 + payload
        assert len(codec.get_codec(spec, checksum=False).encode(arr)) == len(f) - 4
    c = codec.get_codec("fp16+crc32")
    assert len(c.encode(np.zeros(4, np.float32))) == 12 + 8 + len(c.spec) + 28 + 4 + 4 + 8


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda b: b[:MIN_FRAME - 1], "shorter than the 16-byte minimum"),
        (lambda b: b"\x89GCX" + b[4:], "not a gradcodec frame"),
        (lambda b: b[:4] + b"\x03" + b[5:], "version 3 is not supported"),
        (lambda b: b[:4] + b"\x02" + b[5:], "decode it with codec.decode_many"),
        (lambda b: b[:5] + b"\x04" + b[6:], "reserved header bits"),
        (lambda b: b[:5] + b"\x03" + b[6:], "reserved header bits"),  # both payload checksums: never written
        (lambda b: b[:9] + b"\x01" + b[10:], "reserved header bits"),
        (lambda b: b[:40], "shorter than its"),
        (lambda b: b[:30] + bytes([b[30] ^ 1]) + b[31:], "header checksum mismatch"),
        (lambda b: b + b"\0", "sections end at byte"),
    ],
)
def test_validation_reasons(mutate, reason):
    with pytest.raises(codec.CorruptFrameError, match=reason):
        codec.decode(mutate(_frame()))


def test_validation_order_reports_the_first_problem():
    f = bytearray(_frame())
    f[4] = 9  # bad version
    f[5] = 0x80  # and reserved bits
    with pytest.raises(codec.CorruptFrameError, match="version"):
        codec.decode(bytes(f))


def test_element_limit_and_out_limit():
    f = _frame(arr=np.zeros(100, np.float32))
    with pytest.raises(codec.CorruptFrameError, match="more than the limit of 50"):
        codec.decode(f, max_elements=50)
    assert codec.decode(f, max_elements=100).size == 100
    with pytest.raises(ValueError, match="out"):
        codec.decode(f, out=np.zeros(99, np.float32))


def test_inflated_shape_of_dense_frame_fails_before_allocating():
    arr = np.ones(1000, np.float32)
    f = bytearray(_frame(arr=arr))
    hl = parse_frame(f).header_len
    struct.pack_into("<Q", f, FIXED_SIZE, 10**9)  # 4 GB of float32, if anyone allocated it
    _refresh_crc(f, hl)
    tracemalloc.start()
    try:
        with pytest.raises(codec.CorruptFrameError, match="items, codec expects"):
            codec.decode(bytes(f))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_payload_checksum_catches_payload_damage():
    for spec in ("fp16+crc32", "fp16"):  # the legacy CRC32 stage, and the default CRC-32C
        f = bytearray(_frame(spec))
        f[-1] ^= 0x10
        with pytest.raises(codec.CorruptFrameError, match="payload checksum"):
            codec.decode(bytes(f))
    g = bytearray(codec.get_codec("fp16", checksum=False).encode(np.arange(1, 9, dtype=np.float32)))
    g[-1] ^= 0x10
    codec.decode(bytes(g))  # opted out: a damaged value decodes (to a wrong value)


def test_checksum_is_on_by_default_and_every_payload_flip_is_caught():
    """Issue 13 defect 7: one flipped payload byte of a topk+fp16+zstd frame used to decode to
    wrong values (NaN and inf included) with no error."""
    x = np.random.default_rng(7).standard_normal(5000).astype(np.float32)
    f = codec.get_codec("topk(ratio=0.05)+fp16+zstd").encode(x)
    info = codec.inspect(f)
    assert info["payload_checksum"] == "crc32c"
    start = info["header_bytes"]
    for i in range(start, len(f)):
        for bit in (0, 5):
            bad = bytearray(f)
            bad[i] ^= 1 << bit
            with pytest.raises(codec.CorruptFrameError):
                codec.decode(bytes(bad))


def test_payload_checksum_flags_and_opt_out():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    on, off, legacy = (codec.get_codec("fp16", checksum=True).encode(x), codec.get_codec("fp16", checksum=False).encode(x),
                       codec.get_codec("fp16+crc32").encode(x))
    assert (on[5], off[5], legacy[5]) == (0x02, 0x00, 0x01)
    assert len(on) == len(off) + 4 == len(legacy) - len("+crc32")
    hl = 12 + 16 + 4 + 28 + 8
    assert struct.unpack_from("<I", on, hl - 8)[0] == crc32c.crc32c(on[hl:])
    hl += len("+crc32")
    assert struct.unpack_from("<I", legacy, hl - 8)[0] == zlib.crc32(legacy[hl:])
    for f in (on, off, legacy):
        assert codec.decode(f).tolist() == x.tolist()
    assert codec.get_codec("fp16", checksum=False) != codec.get_codec("fp16")
    assert codec.get_codec(codec.get_codec("fp16", checksum=False).get_config()).checksum is False
    # an explicit crc32 stage writes its CRC32 with or without the default
    assert codec.get_codec("fp16+crc32", checksum=False).encode(x) == legacy
    with pytest.raises(TypeError, match="checksum"):
        codec.get_codec("fp16", checksum=1)


def test_damaged_zstd_payload_is_corrupt_not_zstd_error():
    arr = np.repeat(np.arange(50, dtype=np.float32), 20)
    f = bytearray(_frame("zstd", arr))
    info = codec.inspect(bytes(f))
    assert info["sections"][0]["encoding"] == "zstd"
    for i in range(info["header_bytes"] + 4, len(f)):
        g = bytearray(f)
        g[i] ^= 0xFF
        try:
            codec.decode(bytes(g))
        except codec.CorruptFrameError:
            pass


def test_zstd_only_used_when_smaller():
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(1000).astype(np.float32)
    assert codec.inspect(codec.get_codec("zstd").encode(noise))["sections"][0]["encoding"] in ("raw", "zstd")
    zeros = np.zeros(1000, np.float32)
    info = codec.inspect(codec.get_codec("zstd").encode(zeros))
    assert info["sections"][0]["encoding"] == "zstd" and info["payload_bytes"] < 100


def test_frames_are_deterministic_across_thread_counts(tmp_path):
    script = (
        "import numpy as np, codec, sys;"
        "x = (np.random.default_rng(5).standard_t(2, 300_001) * 1e-3).astype(np.float32);"
        "f = b''.join(codec.get_codec(s).encode(x) for s in ['fp16', 'bf16', 'threshold(value=0.002)+fp16+zstd', 'zstd']);"
        "sys.stdout.write(__import__('hashlib').sha256(f).hexdigest())"
    )
    digest = same_across_threads(script)  # equal under NUMBA_NUM_THREADS=1 and 2 (asserted there)
    assert len(digest) == 64


def test_inspect_reports_the_header():
    c = codec.get_codec("threshold(value=0.5)+fp16+zstd+crc32")
    x = np.linspace(-1, 1, 101, dtype=np.float32).reshape(1, 101)
    info = codec.inspect(c.encode(x))
    assert info["codec"] == c.spec and info["dtype"] == "float32" and info["shape"] == [1, 101]
    assert info["elements"] == 101 and info["payload_checksum"] == "crc32"
    kinds = [s["kind"] for s in info["sections"]]
    assert kinds[0] in ("index_delta", "index_bitmap") and kinds[1] == "values"
    assert info["sections"][1]["count"] == int(np.sum(np.abs(x) >= 0.5))
    assert info["frame_bytes"] == len(c.encode(x)) == info["header_bytes"] + info["payload_bytes"]


def _header(c, arr, sections, checksum=True):
    return 12 + 8 * arr.ndim + len(c.spec) + 28 * sections + 4 + (4 if checksum else 0)


@pytest.mark.parametrize("density", [0.0, 0.001, 0.05, 0.5, 1.0])
@pytest.mark.parametrize("value_spec, value_bytes", [("", 4), ("+fp16", 2), ("+bf16", 2)])
def test_threshold_wire_size_formula(density, value_spec, value_bytes):
    rng = np.random.default_rng(3)
    n = 40_001
    x = rng.uniform(-1, 1, n).astype(np.float32) * 0.5
    keep = rng.random(n) < density
    x[keep] = np.sign(x[keep]) + x[keep]  # |x| >= 0.5 exactly where kept
    c = codec.get_codec(f"threshold(value=1.0){value_spec}")
    frame = c.encode(x)
    pos = np.flatnonzero(np.abs(x) >= 1.0)
    k = pos.size
    gaps = np.diff(np.concatenate([[-1], pos])) - 1
    width = max(1, int(gaps.max()).bit_length()) if k else 1
    index_bytes = min((k * width + 7) // 8, (n + 7) // 8)
    assert len(frame) == _header(c, x, 2) + index_bytes + k * value_bytes


def test_zstd_wire_size_formula():
    import zstandard

    x = np.repeat(np.arange(100, dtype=np.float32), 30)
    c = codec.get_codec("zstd(level=5)")
    raw = x.tobytes()
    z = zstandard.ZstdCompressor(level=5, write_content_size=True).compress(raw)
    assert len(c.encode(x)) == _header(c, x, 1) + min(len(raw), len(z))


def test_verify_payload_false_skips_only_the_payload_checksum():
    """For a frame the process just built (Codec.subtract): the payload CRC is not recomputed;
    every header check still runs."""
    import codec
    from codec.errors import CorruptFrameError

    frame = bytearray(codec.get_codec("fp16").encode(np.arange(1, 65, dtype=np.float32)))
    frame[-1] ^= 0xFF  # a payload byte
    with pytest.raises(CorruptFrameError, match="payload checksum"):
        parse_frame(bytes(frame))
    assert parse_frame(bytes(frame), verify_payload=False).n == 64
    frame[0] ^= 0xFF  # the magic
    with pytest.raises(CorruptFrameError, match="not a gradcodec frame"):
        parse_frame(bytes(frame), verify_payload=False)


def test_payload_late_sections_are_filled_last_and_checksummed_in_place():
    """codec.payload.write_payload: a ``late`` section is filled after every other one (its
    bytes come from a later section's fill), wherever it sits, and the CRC-32C is the
    payload's, joined around it; ``materialized`` fills late sections last too."""
    import crc32c as ref

    from codec.frame import Section, SectionKind
    from codec.payload import materialized, write_payload

    for layout in ("LDF", "DLF", "FLD", "LLF", "FDL", "L"):
        seen, found = [], {}

        def data(i):
            return Section(SectionKind.INTS, 8, 5 + i, np.arange(5 + i, dtype=np.uint8) + i)

        def fill(i):
            def f(out, crc=None):  # a "codes" pass that finds the late sections' bytes
                seen.append(("F", i))
                out[:] = 200 + i
                found["late"] = 7 + i
                return None if crc is None else ref.crc32c(out.tobytes(), crc)

            return Section(SectionKind.VALUES, 8, 9, fill=f, fill_crc=True)

        def late(i):
            def f(out):
                seen.append(("L", i))
                out[:] = found.get("late", 99)
            return Section(SectionKind.SCALARS, 8, 3, fill=f, late=True)

        pieces = [{"L": late, "D": data, "F": fill}[k](i) for i, k in enumerate(layout)]
        size = sum(p.raw_len for p in pieces)
        for crc in (True, False):
            seen.clear()
            found.clear()
            out = np.zeros(size, np.uint8)
            got = write_payload(out, pieces, crc)
            assert [k for k, _ in seen] == sorted((k for k, _ in seen), key=lambda k: k == "L"), layout  # late ones last
            assert got == (ref.crc32c(out.tobytes()) if crc else None), layout
            if "F" in layout:  # the late bytes are what the fill found
                pos = 0
                for p, k in zip(pieces, layout):
                    if k == "L":
                        assert np.all(out[pos : pos + p.raw_len] == found["late"]), layout
                    pos += p.raw_len
        found.clear()
        seen.clear()
        raw = materialized(pieces)
        assert b"".join(bytes(r) for r in raw) == out.tobytes(), layout
    with pytest.raises(AssertionError, match="late Section"):
        Section(SectionKind.SCALARS, 8, 3, fill=lambda out, crc=None: crc, fill_crc=True, late=True)


# ---- every refusal of parse_frame, with its own message (issue 28) -------------------------
#
# The frame of _frame(): fp16 of arange(10) as float32, shape (10,), spec "fp16": the fixed
# header at 0-11 (version 4, flags 5, dtype 6, ndim 7, sections 8, reserved 9, spec length
# 10-11), the shape at 12-19, the spec at 20-23, the section entry at 24-51 (kind 24,
# encoding 25, bits 26-27, count 28-35, raw length 36-43, stored length 44-51), the payload
# CRC-32C at 52, the header CRC32 at 56, the payload (20 bytes) at 60-79.

HL = 60


def _forged(fmt, at, *values, crc=True):
    b = bytearray(_frame())
    struct.pack_into(fmt, b, at, *values)
    if crc:
        _refresh_crc(b, HL)
    return bytes(b)


def _exactly(message):
    return f"^{re.escape(message)}$"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: _frame()[:15], "frame is 15 bytes, shorter than the 16-byte minimum header"),
        (lambda: b"\x89GCX" + bytes(12), r"not a gradcodec frame (magic b'\x89GCX', expected b'\x89GCF')"),
        (lambda: _forged("<B", 4, 2, crc=False), "this is a many-tensor frame (format v2, from encode_many): decode it with codec.decode_many"),
        (lambda: _forged("<B", 4, 0, crc=False), "frame format version 0 is not supported (this gradcodec reads versions 1 and 2)"),
        (lambda: _forged("<B", 4, 3, crc=False), "frame format version 3 is not supported (this gradcodec reads versions 1 and 2)"),
        (lambda: _forged("<B", 5, 0x03, crc=False), "reserved header bits are set (flags=0x03, reserved=0x00)"),
        (lambda: _forged("<B", 9, 1, crc=False), "reserved header bits are set (flags=0x02, reserved=0x01)"),
        (lambda: _forged("<B", 7, 33, crc=False), "header declares ndim=33, spec length 4: beyond the format's limits"),
        (lambda: _forged("<H", 10, 4097, crc=False), "header declares ndim=1, spec length 4097: beyond the format's limits"),
        (lambda: _frame()[:59], "frame is 59 bytes, shorter than its 60-byte header"),
        (lambda: _forged("<B", 30, 7, crc=False), "header checksum mismatch: the header is damaged"),
        (lambda: _forged("<B", 6, 99), "unknown dtype code 99"),
        (lambda: _forged("<B", 6, 0), "unknown dtype code 0"),
        (lambda: _forged("<4s", 20, b"\xff\xfe16"), "spec text is not UTF-8"),
        (lambda: _forged("<B", 25, 2), "section 0: unknown encoding 2 or item width 16 bits"),
        (lambda: _forged("<H", 26, 0), "section 0: unknown encoding 0 or item width 0 bits"),
        (lambda: _forged("<H", 26, 65), "section 0: unknown encoding 0 or item width 65 bits"),
        (lambda: _forged("<Q", 36, 21), "section 0: raw length 21 does not hold 10 items of 16 bits"),
        (lambda: _forged("<Q", 36, 19), "section 0: raw length 19 does not hold 10 items of 16 bits"),
        (lambda: _forged("<QQ", 28, 1000, 2000), "section 0: 2000 raw bytes is more than 10 elements can need"),
        (lambda: _forged("<Q", 44, 21), "section 0: stored length 21 != raw length 20"),
        (lambda: _forged("<Q", 44, 19), "section 0: stored length 19 != raw length 20"),
        (lambda: _frame()[:79], "section 0: 20 bytes declared, only 19 left in the frame"),
        (lambda: _frame() + b"\0", "frame is 81 bytes but its sections end at byte 80"),
        (lambda: _frame()[:-1] + bytes([_frame()[-1] ^ 4]), "payload checksum mismatch: the section data is damaged"),
    ],
)
def test_every_refusal_names_its_reason(make, message):
    with pytest.raises(codec.CorruptFrameError, match=_exactly(message)):
        parse_frame(make())


@pytest.mark.parametrize("bit", [0x04, 0x08, 0x10, 0x20, 0x40, 0x80])
def test_every_reserved_flag_bit_is_refused(bit):
    with pytest.raises(codec.CorruptFrameError, match=_exactly(f"reserved header bits are set (flags={bit | 2:#04x}, reserved=0x00)")):
        parse_frame(_forged("<B", 5, bit | 2, crc=False))


def test_the_fields_parse_frame_returns():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for spec, checksum in [("fp16", "crc32c"), ("fp16+crc32", "crc32")]:
        f = parse_frame(codec.get_codec(spec).encode(x))
        assert (f.version, f.dtype, f.shape, f.spec, f.n, f.checksum) == (1, np.float32, (2, 3), spec, 6, checksum)
        assert f.header_len == 12 + 16 + len(spec) + 28 + 8 and bytes(f.buf) == codec.get_codec(spec).encode(x)
        (s,) = f.sections
        assert (s.kind, s.kind_name, s.encoding, s.bits, s.count, s.raw_len, s.stored_len, s.offset) == (1, "values", 0, 16, 6, 12, 12, f.header_len)
        assert f.raw(0).tobytes() == x.astype(np.float16).tobytes()
    f = parse_frame(codec.get_codec("fp16", checksum=False).encode(x))
    assert (f.flags, f.checksum, f.header_len) == (0, None, 12 + 16 + 4 + 28 + 4)


def test_the_limits_are_inclusive():
    """What is at a limit parses: 1- and 64-bit items, 16 bytes per element plus 1024, the
    32 dimensions and the 4096 spec bytes the format allows, 255 sections, a frame that is
    all header, the frame's exact length."""
    f = parse_frame(build_frame("x", np.float32, (64,), [Section(SectionKind.INTS, 64, 3, np.arange(3, dtype=np.uint64)),
                                                         Section(SectionKind.INDEX_BITMAP, 1, 64, np.zeros(8, np.uint8))]))
    assert [(s.bits, s.raw_len, s.offset) for s in f.sections] == [(64, 24, f.header_len), (1, 8, f.header_len + 24)]
    assert f.raw(0).view(np.uint64).tolist() == [0, 1, 2] and f.checksum is None
    for n in (1, 10):  # 16 bytes per element, plus 1024
        most = 16 * n + 1024
        assert parse_frame(build_frame("x", np.float32, (n,), [Section(SectionKind.INTS, 8, most, np.zeros(most, np.uint8))])).n == n
        with pytest.raises(codec.CorruptFrameError, match=_exactly(f"section 0: {most + 1} raw bytes is more than {n} elements can need")):
            parse_frame(build_frame("x", np.float32, (n,), [Section(SectionKind.INTS, 8, most + 1, np.zeros(most + 1, np.uint8))]))
    shape = (1,) * 31 + (2,)
    assert parse_frame(build_frame("x", np.float64, shape, [Section(SectionKind.VALUES, 64, 2, np.ones(2))], checksum="crc32c")).shape == shape
    assert parse_frame(build_frame("s" * 4096, np.float16, (1,), [])).spec == "s" * 4096
    many = parse_frame(build_frame("x", np.float32, (1,), [Section(SectionKind.INTS, 8, 1, bytes([i])) for i in range(255)]))
    assert [bytes(many.raw(i)) for i in (0, 254)] == [b"\x00", b"\xfe"]
    empty = build_frame("x", np.float32, (0,), [])
    assert len(empty) == header_length(1, 1, 0, False) == 25
    assert parse_frame(empty).sections == [] and parse_frame(empty).n == 0
    f = _frame()
    assert parse_frame(f, max_elements=10).n == 10
    with pytest.raises(codec.CorruptFrameError, match=_exactly("frame declares 10 elements, more than the limit of 9")):
        parse_frame(f, max_elements=9)


def test_build_frame_refuses_what_the_format_cannot_hold():
    with pytest.raises(CodecValueError, match=_exactly("spec is 4097 bytes; the frame format allows 4096")):
        build_frame("s" * 4097, np.float32, (1,), [])
    with pytest.raises(CodecValueError, match=_exactly("spec is 4098 bytes; the frame format allows 4096")):
        build_frame("\u00e9" * 2049, np.float32, (1,), [])  # bytes, not characters
    with pytest.raises(CodecValueError, match=_exactly("x: 33 dimensions; the frame format allows 32")):
        build_frame("x", np.float32, (1,) * 33, [])
    with pytest.raises(CodecValueError, match=_exactly("a frame holds at most 255 sections")):
        build_frame("x", np.float32, (1,), [Section(SectionKind.INTS, 8, 1, b"\x01")] * 256)


def test_empty_shapes_are_bounded_by_their_non_zero_dimensions():
    """An empty shape such as (2**41, 0) declares no element, but no NumPy array has it."""
    big = build_frame("x", np.float32, (2**41, 0), [])
    with pytest.raises(codec.CorruptFrameError,
                       match=_exactly("frame declares shape (2199023255552, 0): its non-zero dimensions exceed 1099511627776 elements")):
        parse_frame(big)
    assert parse_frame(big, max_elements=2**41).shape == (2**41, 0)
    assert parse_frame(build_frame("x", np.float32, (0, 2**40), [])).n == 0
    check_dims((3, 0, 5), 14, "x")  # the limit is never below 2**40
    check_dims((2**21, 0, 2**20), 2**41, "y")
    with pytest.raises(codec.CorruptFrameError, match=_exactly("y (2097152, 0, 2097152): its non-zero dimensions exceed 2199023255552 elements")):
        check_dims((2**21, 0, 2**21), 2**41, "y")


def test_element_limit():
    assert element_limit(None) == MAX_ELEMENTS == 2**40
    assert element_limit(0) == 0 and element_limit(2**60) == 2**60
    got = element_limit(np.int64(7))
    assert got == 7 and type(got) is int
    for bad in (-1, 2**60 + 1, True, False, 1.0, "3", np.float64(2)):
        with pytest.raises(CodecValueError, match=_exactly(f"max_elements: must be an integer in [0, 2**60], got {bad!r}")):
            element_limit(bad)


def test_small_helpers():
    assert [raw_length(c, b) for c, b in [(0, 64), (1, 1), (8, 1), (9, 1), (3, 16), (3, 12), (5, 64)]] == [0, 1, 1, 2, 6, 5, 40]
    assert header_length(2, 4, 1) == 12 + 16 + 4 + 28 + 8 and header_length(2, 4, 1, checksum=False) == 12 + 16 + 4 + 28 + 4
    assert header_length(0, 0, 3) == 12 + 84 + 8
    assert [checksum_name(f) for f in (0, 1, 2, 0x80)] == [None, "crc32", "crc32c", None]
    info = [SectionInfo(k, 0, 8, 1, 1, 1, 0).kind_name for k in (1, 2, 3, 4, 5, 6, 0, 9)]
    assert info == ["values", "index_bitmap", "index_delta", "scalars", "ints", "factors", "kind0", "kind9"]


def test_section_checks_its_bytes():
    with pytest.raises(AssertionError, match=_exactly("a Section needs exactly one of data and fill")):
        Section(SectionKind.VALUES, 16, 3)
    with pytest.raises(AssertionError, match=_exactly("a Section needs exactly one of data and fill")):
        Section(SectionKind.VALUES, 16, 3, data=bytes(6), fill=lambda out: None)
    with pytest.raises(AssertionError, match=_exactly("section VALUES: 5 bytes for 3 x 16 bits")):
        Section(SectionKind.VALUES, 16, 3, data=bytes(5))
    with pytest.raises(AssertionError, match=_exactly("section SCALARS: 7 bytes for 3 x 16 bits")):
        Section(SectionKind.SCALARS, 16, 3, data=bytes(7))
    with pytest.raises(AssertionError, match=_exactly("a late Section is filled, and checksummed by write_payload")):
        Section(SectionKind.VALUES, 8, 3, data=bytes(3), late=True)
    s = Section(SectionKind.VALUES, 32, 2, np.array([[1.0], [2.0]], np.float32))
    assert s.data.dtype == np.uint8 and s.data.shape == (8,) and bytes(s.materialize()) == np.float32([1, 2]).tobytes()
    filled = Section(SectionKind.VALUES, 12, 3, fill=lambda out: out.__setitem__(slice(None), 7))
    assert filled.raw_len == 5 and bytes(filled.materialize()) == b"\x07" * 5
    assert Section(SectionKind.INTS, 8, 2, fill=lambda out: None, late=True).late


def test_section_run_views_each_tensors_section():
    run = SectionRun(np.arange(10, dtype=np.uint8), np.array([0, 3, 10]), [2, 3], [1, 8], [24, 7])
    a, b = run.sections()
    assert (a.kind, a.bits, a.count, bytes(a.data)) == (2, 1, 24, bytes([0, 1, 2]))
    assert (b.kind, b.bits, b.count, bytes(b.data)) == (3, 8, 7, bytes(range(3, 10)))


def test_section_reader_checks_each_section_in_order():
    f = parse_frame(build_frame("x", np.float32, (8,), [Section(SectionKind.INDEX_DELTA, 8, 3, bytes([1, 2, 3])),
                                                        Section(SectionKind.VALUES, 16, 2, bytes(4))]))

    def refused(message, **take):
        r = SectionReader(f)
        with pytest.raises(codec.CorruptFrameError, match=_exactly(message)):
            r.take(**take)
        assert r.i == 0

    refused("section 0 (index_delta): codec 'x' expects a values section here", kind=SectionKind.VALUES)
    refused("section 0 (index_delta): codec 'x' expects a index_bitmap or values section here",
            kind=(SectionKind.INDEX_BITMAP, SectionKind.VALUES))
    refused("section 0 (index_delta): 8-bit items, codec expects 16", kind=SectionKind.INDEX_DELTA, bits=16)
    refused("section 0 (index_delta): 8-bit items, codec expects (4, 16)", kind=SectionKind.INDEX_DELTA, bits=(4, 16))
    refused("section 0 (index_delta): 3 items, codec expects 4", kind=SectionKind.INDEX_DELTA, count=4)
    refused("section 0 (index_delta): 3 items, codec expects 2", kind=SectionKind.INDEX_DELTA, count=2)
    refused("section 0 (index_delta): 3 items, at most 2 possible", kind=SectionKind.INDEX_DELTA, max_count=2)
    r = f.reader()
    assert r.remaining() == f.sections
    info, raw = r.take((SectionKind.INDEX_BITMAP, SectionKind.INDEX_DELTA), bits=(4, 8), count=3, max_count=3)
    assert info == f.sections[0] and raw.tolist() == [1, 2, 3] and r.remaining() == f.sections[1:]
    with pytest.raises(codec.CorruptFrameError, match=_exactly("frame has 1 section(s) that codec 'x' does not use")):
        r.done()
    with pytest.raises(codec.CorruptFrameError, match=_exactly("section 1 (values): 2 items, codec expects 3")):
        r.take(SectionKind.VALUES, count=3)
    info, raw = r.take(SectionKind.VALUES, bits=16, count=2, max_count=5)
    assert info == f.sections[1] and raw.tolist() == [0, 0, 0, 0] and r.remaining() == []
    r.done()
    with pytest.raises(codec.CorruptFrameError, match=_exactly("frame has 2 sections; codec 'x' needs another section")):
        r.take(SectionKind.VALUES)


def _zstd_frame(compress, payload=bytes(range(20)) * 5):
    import zstandard

    def compressor(raw):
        return Encoding.ZSTD, compress(zstandard, bytes(raw))

    return build_frame("x", np.float32, (25,), [Section(SectionKind.VALUES, 32, 25, payload)], compressor=compressor)


def test_zstd_sections_are_checked_before_use():
    ok = parse_frame(_zstd_frame(lambda z, raw: z.ZstdCompressor().compress(raw)))
    assert ok.sections[0].encoding == Encoding.ZSTD and ok.raw(0).tobytes() == bytes(range(20)) * 5
    with pytest.raises(codec.CorruptFrameError, match=r"^section 0: bad zstd header: "):
        parse_frame(_zstd_frame(lambda z, raw: b"not zstd at all"))
    with pytest.raises(codec.CorruptFrameError, match=_exactly("section 0: zstd declares 99 bytes, header implies 100")):
        parse_frame(_zstd_frame(lambda z, raw: z.ZstdCompressor().compress(raw[:-1])))
    with pytest.raises(codec.CorruptFrameError, match=_exactly("section 0: zstd declares 18446744073709551615 bytes, header implies 100")):
        parse_frame(_zstd_frame(lambda z, raw: z.ZstdCompressor(write_content_size=False).compress(raw)))
    cut = parse_frame(_zstd_frame(lambda z, raw: z.ZstdCompressor().compress(raw)[:-3]))  # the header is whole
    with pytest.raises(codec.CorruptFrameError, match=r"^section 0 \(values\): zstd data is damaged: "):
        cut.raw(0)
    extra = parse_frame(_zstd_frame(lambda z, raw: z.ZstdCompressor().compress(raw) + b"junk"))  # bytes after the zstd frame
    with pytest.raises(codec.CorruptFrameError, match=r"^section 0 \(values\): zstd data is damaged: .*4 bytes of unused data"):
        extra.raw(0)


def test_frame_raw_checks_what_zstd_gives():
    """parse_frame refuses a zstd section whose frame does not declare the raw length; a Frame
    built without it still gets no fewer bytes than its section says."""
    import zstandard

    stored = zstandard.ZstdCompressor(write_content_size=False).compress(b"a" * 20)
    f = Frame(memoryview(stored), 1, 0, np.dtype(np.float32), (30,), "x", [SectionInfo(1, Encoding.ZSTD, 8, 30, 30, len(stored), 0)], 0)
    with pytest.raises(codec.CorruptFrameError, match=_exactly("section 0 (values): zstd gave 20 bytes, header says 30")):
        f.raw(0)


def test_frame_buffers_of_every_kind():
    f = _frame()
    doubled = np.repeat(np.frombuffer(f, np.uint8), 2)
    for buf in (bytearray(f), memoryview(f), np.frombuffer(f, np.uint8), doubled[::2], memoryview(doubled.tobytes())[::2],
                memoryview(f).cast("I"), memoryview(np.frombuffer(f, np.uint8).reshape(2, 40))):
        assert bytes(parse_frame(buf).buf) == f and parse_frame(buf).spec == "fp16"
        assert parse_frame(buf).raw(0).tobytes() == np.arange(10, dtype=np.float16).tobytes()
    assert parse_frame(f).buf.obj is f  # a contiguous frame is read where it is, not copied
    with pytest.raises(CodecTypeError, match=_exactly("frame: expected bytes or a 1-D uint8 array, got an array of float32 with shape (20,)")):
        parse_frame(np.frombuffer(f, np.float32))
    with pytest.raises(CodecTypeError, match=_exactly("frame: expected bytes or a 1-D uint8 array, got an array of uint8 with shape (2, 40)")):
        parse_frame(np.frombuffer(f, np.uint8).reshape(2, 40))
    with pytest.raises(CodecTypeError, match=_exactly("frame: expected a bytes-like object, got int")):
        parse_frame(12345)
