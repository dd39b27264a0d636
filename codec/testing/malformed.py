"""Malformed frames: every damage raises CorruptFrameError before any large allocation."""

from __future__ import annotations

import struct
import tracemalloc
import zlib

import numpy as np

import codec as _codec
from codec.errors import CorruptFrameError
from codec.frame import CHECKSUMS, FIXED_SIZE, SECTION_SIZE, checksum_name, parse_frame
from codec.testing.checks import _get

__all__ = ["check_malformed"]

def _fix_crc(buf: bytearray, header_len: int) -> None:
    buf[header_len - 4 : header_len] = struct.pack("<I", zlib.crc32(bytes(buf[: header_len - 4])))


def _expect_corrupt(c, buf, what: str, limit: int) -> None:
    tracemalloc.start()
    try:
        try:
            _codec.decode(bytes(buf))
        except CorruptFrameError:
            pass
        except Exception as e:  # noqa: BLE001 - the point is to catch anything else
            raise AssertionError(f"{c}: {what}: raised {type(e).__name__}: {e}, not CorruptFrameError") from None
        else:
            raise AssertionError(f"{c}: {what}: decoded without error")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= limit, f"{c}: {what}: allocated {peak} bytes before failing (limit {limit})"


def check_malformed(codec, arr: np.ndarray, n_random: int = 10_000, seed: int = 3) -> None:
    """Truncations, header bit flips, random bytes, lying length fields and a forged zstd
    content size all raise CorruptFrameError, allocating no more than 4x the input size."""
    import zstandard  # noqa: F401  (imported before measuring: a first import is not the decoder's allocation)

    c = _get(codec)
    frame = c.encode(arr)
    limit = 4 * max(arr.nbytes, len(frame)) + (64 << 10)
    fr = parse_frame(frame)
    hl = fr.header_len
    for cut in range(len(frame)):
        _expect_corrupt(c, frame[:cut], f"frame truncated to {cut} bytes", limit)
    for bit in range(hl * 8):
        buf = bytearray(frame)
        buf[bit // 8] ^= 1 << (bit % 8)
        _expect_corrupt(c, buf, f"header bit {bit} flipped", limit)
    rng = np.random.default_rng(seed)
    for i in range(n_random):
        size = int(rng.integers(0, 2 * len(frame) + 64))
        junk = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        if i % 2:  # half of them past the magic check
            junk = frame[: min(len(frame), int(rng.integers(4, hl + 1)))] + junk
        try:
            _codec.decode(junk)
        except CorruptFrameError:
            continue
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"{c}: random bytes #{i}: raised {type(e).__name__}: {e}") from None
        raise AssertionError(f"{c}: random bytes #{i} decoded")
    # lying length fields, header CRC recomputed so the lie reaches the length checks
    table = FIXED_SIZE + 8 * len(fr.shape) + len(fr.spec.encode())
    for i in range(len(fr.sections)):
        base = table + SECTION_SIZE * i
        for field_off, name in ((4, "count"), (12, "raw length"), (20, "stored length")):
            for delta in (1, -1, 1 << 40):
                buf = bytearray(frame)
                (v,) = struct.unpack_from("<Q", buf, base + field_off)
                struct.pack_into("<Q", buf, base + field_off, (v + delta) % (1 << 64))
                _fix_crc(buf, hl)
                _expect_corrupt(c, buf, f"section {i} {name} off by {delta}", limit)
    # a zstd section that claims 2**40 bytes of content
    if fr.sections:
        # magic, descriptor (8-byte content size, not single-segment), window byte, size, empty last block
        forged = bytes([0x28, 0xB5, 0x2F, 0xFD, 0xC0, 0x58]) + struct.pack("<Q", 1 << 40) + b"\x01\x00\x00"
        s0 = fr.sections[0]
        buf = bytearray(frame[:hl]) + forged + bytearray(frame[s0.offset + s0.stored_len :])
        base = table
        struct.pack_into("<B", buf, base + 1, 1)
        struct.pack_into("<Q", buf, base + 20, len(forged))
        _fix_crc(buf, hl)
        name = checksum_name(buf[5])
        if name is not None:  # payload checksum present (CRC-32C by default): make it match so the zstd check is reached
            pos = hl - 8
            buf[pos : pos + 4] = struct.pack("<I", CHECKSUMS[name][1](bytes(buf[hl:])))
            _fix_crc(buf, hl)
        _expect_corrupt(c, buf, "zstd section forging a 2**40-byte content size", limit)
