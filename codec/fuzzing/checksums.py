"""Recomputing the checksums of an edited frame, container or many-tensor frame, so the edit
reaches the checks behind the CRCs.  The magic numbers, flags and checksums are the codec's
own (codec.frame, codec.container, codec.checksum), under the names the fuzzer uses.
"""

from __future__ import annotations

import struct
import zlib

from codec import checksum
from codec.container import FLAG_FRAMES_CRC32C as CFLAG_CRC32C, MAGIC as CONTAINER_MAGIC
from codec.frame import CHECKSUMS, FLAG_PAYLOAD_CRC as FLAG_CRC32, FLAG_PAYLOAD_CRC32C as FLAG_CRC32C, MAGIC as FRAME_MAGIC
from codec.frame import checksum_name, header_length

__all__ = ["CFLAG_CRC32C", "CONTAINER_MAGIC", "FLAG_CRC32", "FLAG_CRC32C", "FRAME_MAGIC", "crc32c", "fix_container_checksums",
           "fix_frame_checksums", "fix_many_checksums", "frame_header_len"]


def crc32c(data) -> int:
    """CRC-32C (Castagnoli) of ``data`` (any bytes-like), as the codec computes it."""
    return checksum.crc32c(data)


def _payload_crc(flags: int, data) -> int:
    """The payload checksum ``flags`` name (CRC32 when both bits are set, as no encoder does)."""
    return CHECKSUMS[checksum_name(flags) or "crc32"][1](data)


def frame_header_len(buf) -> int | None:
    """The header length ``parse_frame`` computes from ``buf``'s own fields (None if too short)."""
    if len(buf) < 12:
        return None
    flags, ndim, nsec = buf[5], buf[7], buf[8]
    return header_length(ndim, buf[10] | buf[11] << 8, nsec, bool(flags & (FLAG_CRC32 | FLAG_CRC32C)))


def fix_frame_checksums(buf) -> bytes:
    """``buf`` with its payload checksum (flags bit 0: zlib CRC32, bit 1: CRC-32C) and header
    CRC32 recomputed where ``parse_frame`` will look for them, whatever the other fields say:
    an edit anywhere then reaches the checks behind the CRCs."""
    b = bytearray(buf)
    hl = frame_header_len(b)
    if hl is None or len(b) < hl:
        return bytes(b)
    pos = hl - 4
    flags = b[5]
    if flags & (FLAG_CRC32 | FLAG_CRC32C):
        struct.pack_into("<I", b, pos - 4, _payload_crc(flags, memoryview(b)[hl:]))
    struct.pack_into("<I", b, pos, zlib.crc32(memoryview(b)[:pos]))
    return bytes(b)


def fix_many_checksums(buf) -> bytes:
    """``buf`` (a many-tensor frame, format v2) with its payload checksum and header CRC32
    recomputed where ``parse_many`` will look for them (the header walked as it walks it);
    unchanged when the header cannot be walked."""
    from codec.errors import CorruptFrameError
    from codec.manyframe import read_header

    b = bytearray(buf)
    if len(b) < 12 or b[:4] != FRAME_MAGIC:
        return bytes(b)
    try:
        h = read_header(memoryview(b))
    except CorruptFrameError:
        return bytes(b)
    if h.flags & (FLAG_CRC32 | FLAG_CRC32C):
        struct.pack_into("<I", b, h.crc_at - 4, _payload_crc(h.flags, memoryview(b)[h.header_len :]))
    struct.pack_into("<I", b, h.crc_at, zlib.crc32(memoryview(b)[: h.crc_at]))
    return bytes(b)


def _container_table_end(b) -> int | None:
    """Where a container's table ends (walking ``count`` entries as unpack_frames does)."""
    if len(b) < 12:
        return None
    (count,) = struct.unpack_from("<I", b, 8)
    off = 12
    for _ in range(count):
        if off + 10 > len(b):
            return None
        (nl,) = struct.unpack_from("<H", b, off)
        off += 2 + nl + 8
    return off if off <= len(b) else None


def fix_container_checksums(buf) -> bytes:
    """``buf`` with the container's table CRC32 (and, with flags bit 0, the CRC-32C of the
    frames area, stored just before the table CRC, which covers it) recomputed."""
    b = bytearray(buf)
    t = _container_table_end(b)
    if t is None:
        return bytes(b)
    if b[5] & CFLAG_CRC32C:
        if t + 8 > len(b):
            return bytes(b)
        struct.pack_into("<I", b, t, crc32c(memoryview(b)[t + 8 :]))
        t += 4
    if t + 4 > len(b):
        return bytes(b)
    struct.pack_into("<I", b, t, zlib.crc32(memoryview(b)[:t]))
    return bytes(b)
