"""The multi-frame container (codec.container): format, round trip, and every corruption."""

from __future__ import annotations

import random
import struct
import zlib

import crc32c
import numpy as np
import pytest

import codec
from codec.container import MAGIC, is_container, pack_frames, pack_header, unpack_frames
from codec.errors import CorruptFrameError


def small():
    return pack_frames([("a", b"xyz"), ("bé", b"\x00\x01\x02\x03\x04"), ("", b"")])


def test_layout_byte_by_byte():
    buf = pack_frames([("ab", b"XYZ"), ("c", b"")])
    head = MAGIC + bytes([1, 1]) + struct.pack("<HI", 0, 2)  # flags bit 0: frames CRC-32C present
    table = struct.pack("<H", 2) + b"ab" + struct.pack("<Q", 3) + struct.pack("<H", 1) + b"c" + struct.pack("<Q", 0)
    frames_crc = struct.pack("<I", crc32c.crc32c(b"XYZ"))
    crc = struct.pack("<I", zlib.crc32(head + table + frames_crc))
    assert buf == head + table + frames_crc + crc + b"XYZ"


def test_layout_without_checksum_is_the_old_format():
    buf = pack_frames([("ab", b"XYZ"), ("c", b"")], checksum=False)
    head = MAGIC + bytes([1, 0]) + struct.pack("<HI", 0, 2)
    table = struct.pack("<H", 2) + b"ab" + struct.pack("<Q", 3) + struct.pack("<H", 1) + b"c" + struct.pack("<Q", 0)
    crc = struct.pack("<I", zlib.crc32(head + table))
    assert buf == head + table + crc + b"XYZ"
    assert [(n, bytes(f)) for n, f in unpack_frames(buf)] == [("ab", b"XYZ"), ("c", b"")]


def test_flagged_container_shorter_than_its_checksums_is_corrupt():
    """A 16-byte container with flags bit 0 raised struct.error (found by the fuzzer)."""
    head = MAGIC + bytes([1, 1]) + struct.pack("<HI", 0, 0)
    for tail in (struct.pack("<I", zlib.crc32(head)), b"", b"\x00" * 7):
        with pytest.raises(CorruptFrameError, match="shorter"):
            unpack_frames(head + tail)


def test_every_flip_of_a_frame_byte_is_caught():
    """Integrity by default: any damage to the frames area is a CorruptFrameError, whether or
    not the frames carry their own payload checksums."""
    frames = [("a", b"\x00" * 40), ("b", bytes(range(200)))]
    buf = pack_frames(frames)
    start = len(buf) - 240
    for i in range(start, len(buf)):
        for bit in (0, 3, 7):
            bad = bytearray(buf)
            bad[i] ^= 1 << bit
            with pytest.raises(CorruptFrameError, match="frames checksum"):
                unpack_frames(bytes(bad))


def test_empty_container():
    assert len(pack_frames({}, checksum=False)) == 16
    assert unpack_frames(pack_frames({}, checksum=False)) == []
    buf = pack_frames({})
    assert len(buf) == 20  # + the frames' CRC-32C (of nothing)
    assert unpack_frames(buf) == []
    assert is_container(buf)


def test_round_trip_dict_and_list_keep_order_and_names():
    items = {"step0000/conv1.weight": b"abc", "ünïcödé ✓": bytes(range(256)), "empty": b"", "z": b"\x89GCF"}
    for arg in (items, list(items.items())):
        out = unpack_frames(pack_frames(arg))
        assert [n for n, _ in out] == list(items)
        assert [bytes(f) for _, f in out] == list(items.values())


def test_accepts_every_buffer_type():
    frame = np.arange(10, dtype=np.uint8)
    items = [("bytes", b"ab"), ("bytearray", bytearray(b"cd")), ("mv", memoryview(b"ef")), ("np", frame),
             ("f32", np.ones(2, np.float32))]
    out = dict(unpack_frames(pack_frames(items)))
    assert bytes(out["np"]) == frame.tobytes()
    assert bytes(out["f32"]) == np.ones(2, np.float32).tobytes()
    buf = pack_frames(items)
    for wrapped in (buf, bytearray(buf), memoryview(buf), np.frombuffer(buf, np.uint8)):
        assert [bytes(f) for _, f in unpack_frames(wrapped)] == [bytes(memoryview(f).cast("B")) for _, f in items]


def test_unpack_is_zero_copy():
    buf = bytearray(pack_frames([("a", b"hello"), ("b", b"world")], checksum=False))
    views = dict(unpack_frames(buf))
    assert isinstance(views["a"], memoryview)
    buf[-1] = ord("D")  # the view sees the change: no copy was made
    assert bytes(views["b"]) == b"worlD"
    assert unpack_frames(bytes(buf))[0][1].readonly


def test_real_frames_decode_from_views():
    xs = {"w": np.linspace(-1, 1, 100, dtype=np.float32).reshape(10, 10), "b": np.arange(3, dtype=np.float64)}
    c = codec.get_codec("none+zstd")
    for name, view in unpack_frames(pack_frames({k: c.encode(v) for k, v in xs.items()})):
        np.testing.assert_array_equal(codec.decode(view), xs[name])


def test_is_container():
    assert is_container(small())
    assert not is_container(codec.get_codec("fp16").encode(np.ones(3, np.float32)))
    assert not is_container(b"")
    assert not is_container(b"\x89GC")
    assert not is_container(object())
    assert is_container(np.frombuffer(small(), np.uint8))


@pytest.mark.parametrize(
    "items, exc",
    [
        ([("a", b"1"), ("a", b"2")], ValueError),
        ([(1, b"1")], TypeError),
        ([("a", "text")], TypeError),
        ([("a",)], TypeError),
        ([("x" * 65536, b"")], ValueError),
        ([("\ud800", b"")], ValueError),
    ],
)
def test_pack_rejects_bad_items(items, exc):
    with pytest.raises(exc):
        pack_frames(items)


def test_longest_name():
    name = "n" * 65535
    assert unpack_frames(pack_frames({name: b"1"}))[0][0] == name


def _corrupt(buf) -> str:
    with pytest.raises(CorruptFrameError) as e:
        unpack_frames(buf)
    msg = str(e.value)
    assert "\n" not in msg and msg
    return msg


def test_truncation_at_every_length():
    buf = small()
    for n in range(len(buf)):
        _corrupt(buf[:n])


def test_trailing_bytes():
    assert "follow the table" in _corrupt(small() + b"\x00")


def test_every_header_bit_flip():
    buf = small()
    table_end = len(buf) - 8  # frames are 3 + 5 + 0 bytes; the header, table and CRC come before
    for i in range(table_end):
        for bit in range(8):
            bad = bytearray(buf)
            bad[i] ^= 1 << bit
            _corrupt(bytes(bad))


def test_random_bytes():
    rng = random.Random(1234)
    for _ in range(2000):
        n = rng.randrange(0, 64)
        data = bytes(rng.randrange(256) for _ in range(n))
        if rng.random() < 0.5:  # give half of them a valid-looking start so deeper checks run
            data = MAGIC + bytes([1, 0, 0, 0]) + data
        try:
            unpack_frames(data)
        except CorruptFrameError:
            pass


def test_specific_reasons():
    buf = bytearray(small())
    assert "magic" in _corrupt(b"\x89GCF" + bytes(buf[4:]))
    assert "version 2" in _corrupt(bytes(buf[:4]) + b"\x02" + bytes(buf[5:]))
    assert "reserved" in _corrupt(bytes(buf[:5]) + b"\x03" + bytes(buf[6:]))
    assert "reserved" in _corrupt(bytes(buf[:6]) + b"\x00\x01" + bytes(buf[8:]))
    huge = bytes(buf[:8]) + struct.pack("<I", 0xFFFFFFFF) + bytes(buf[12:])
    assert "entries" in _corrupt(huge)


def _forge(entries, frames=b"") -> bytes:
    """A container with a correct CRC but an arbitrary table (tests checks after the CRC)."""
    head = MAGIC + bytes([1, 0]) + struct.pack("<HI", 0, len(entries))
    for name, length in entries:
        head += struct.pack("<H", len(name)) + name + struct.pack("<Q", length)
    return head + struct.pack("<I", zlib.crc32(head)) + frames


def test_checks_after_the_crc():
    assert "add up" in _corrupt(_forge([(b"a", 2**64 - 1)], b"abc"))
    assert "add up" in _corrupt(_forge([(b"a", 1), (b"b", 1)], b"abc"))
    assert "twice" in _corrupt(_forge([(b"a", 1), (b"a", 2)], b"abc"))
    assert "UTF-8" in _corrupt(_forge([(b"\xff", 3)], b"abc"))
    assert unpack_frames(_forge([(b"a", 1), (b"b", 2)], b"abc"))[1][0] == "b"


def test_wrong_types():
    with pytest.raises(TypeError):
        unpack_frames(12)
    with pytest.raises(TypeError):
        unpack_frames(np.arange(20, dtype=np.uint8)[::2])


def test_pack_header_plus_frames_equals_pack_frames():
    items = [("a", b"xyz"), ("b", b""), ("c", bytes(100))]
    head = pack_header(((n, len(f)) for n, f in items), frames_crc=crc32c.crc32c(b"".join(f for _, f in items)))
    assert head + b"".join(f for _, f in items) == pack_frames(items)
    head = pack_header((n, len(f)) for n, f in items)
    assert head + b"".join(f for _, f in items) == pack_frames(items, checksum=False)
    with pytest.raises(ValueError):
        pack_header([("a", -1)])
