"""Frame format v1: layout, validation order, limits."""

import struct
import tracemalloc
import zlib

import crc32c
import numpy as np
import pytest

import codec
from codec.frame import FIXED_SIZE, MAGIC, MIN_FRAME, SECTION_SIZE, SectionKind, parse_frame

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
