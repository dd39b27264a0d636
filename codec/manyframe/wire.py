"""Format v2's header primitives: its version, flags and fixed fields, the unsigned LEB128
varints every count is written in, and the bounded :class:`Cursor` the reader walks with."""

from __future__ import annotations

import struct

from codec.errors import CorruptFrameError
from codec.frame import FLAG_PAYLOAD_CRC, FLAG_PAYLOAD_CRC32C

VERSION = 2
#: flags bit 2: the layout is given by its 8-byte hash instead of the table
FLAG_LAYOUT_HASH = 0x04
#: flags bit 3: the layout names its tensors (a frame encoded from a dict)
FLAG_NAMES = 0x08
#: flags bit 4: the payload is stored as one zstd frame
FLAG_ZSTD = 0x10
#: flags bit 5: the tensors are coded as one, their concatenation (one entry of sections)
FLAG_JOINT = 0x20
#: flags bit 6: counts may be derived: a pattern entry's kind byte holds the section's kind in
#: its low 4 bits and its count rule (below) in its high 4, and a tensor writes only the counts
#: of its ``COUNT_WRITTEN`` sections (every frame encoded since 2026-11-28 whose section kinds
#: are below 16; frames without the flag keep decoding)
FLAG_DERIVED = 0x40
#: flags bits 0 and 1 (the payload checksum) are format v1's (codec.frame)
CHECKSUM_FLAGS = FLAG_PAYLOAD_CRC | FLAG_PAYLOAD_CRC32C
KNOWN_FLAGS = 0x7F
#: count rules of a pattern's section (with FLAG_DERIVED): its count is written per tensor; it
#: is 1; a rule ``r >= COUNT_OF`` (at most ``MAX_RULE``) is the count of the tensor's section
#: ``r - COUNT_OF``, an earlier one (AdaComp's signs repeat its index count after the scale)
COUNT_WRITTEN, COUNT_ONE, COUNT_OF, MAX_RULE = 0, 1, 2, 15
#: the section kinds a FLAG_DERIVED pattern entry can hold (its kind byte's low 4 bits)
DERIVED_KINDS = 16


def count_rules(counts) -> tuple:
    """The count rule of each of a tensor's sections, from their counts: 1, else the count of
    the first earlier section with the same count (among the first ``MAX_RULE - COUNT_OF + 1``),
    else written."""
    rules, first = [], {}
    for j, c in enumerate(counts):
        rules.append(COUNT_ONE if c == 1 else COUNT_OF + first[c] if c in first else COUNT_WRITTEN)
        if j <= MAX_RULE - COUNT_OF:
            first.setdefault(c, j)
    return tuple(rules)


def common_rules(a: tuple, b: tuple) -> tuple:
    """The rules two tensors of one (kind, bits) pattern share: each section's rule where
    both have it, else written.  The encoder gives every tensor of a pattern the rules all of
    them share, so deriving counts never splits a pattern (a frame is never larger for it)."""
    return tuple(x if x == y else COUNT_WRITTEN for x, y in zip(a, b))


#: the most sections one tensor may have (a pattern's count is one byte)
MAX_SECTIONS = 255
HASH_SIZE = 8

FIXED = struct.Struct("<4sBBH")  # magic, version, flags, reserved
FIXED_SIZE = FIXED.size  # 8


def put_varint(out: bytearray, v: int) -> None:
    """Append ``v`` (0 <= v < 2**64) as an unsigned LEB128 varint: 7 bits per byte, low
    groups first, the high bit set on every byte but the last."""
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


class Cursor:
    """Reads a header field by field, never past ``end`` (CorruptFrameError instead)."""

    __slots__ = ("mv", "pos", "end")

    def __init__(self, mv, pos: int, end: int):
        self.mv, self.pos, self.end = mv, pos, end

    def byte(self, what: str) -> int:
        if self.pos >= self.end:
            raise CorruptFrameError(f"many-tensor frame: header ends inside {what}")
        b = self.mv[self.pos]
        self.pos += 1
        return b

    def varint(self, what: str) -> int:
        mv, pos, end = self.mv, self.pos, self.end
        if pos < end and mv[pos] < 0x80:  # one byte: most counts and every small field
            self.pos = pos + 1
            return mv[pos]
        v = shift = 0
        while True:
            if pos >= end:
                raise CorruptFrameError(f"many-tensor frame: header ends inside {what}")
            b = mv[pos]
            pos += 1
            v |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 63:
                raise CorruptFrameError(f"many-tensor frame: {what} is a varint longer than 10 bytes")
        if (b == 0 and shift) or v >> 64:
            raise CorruptFrameError(f"many-tensor frame: {what} is not a minimal varint below 2**64")
        self.pos = pos
        return v

    def take(self, size: int, what: str):
        if size > self.end - self.pos:
            raise CorruptFrameError(f"many-tensor frame: {what} ({size} bytes) runs past the header")
        start = self.pos
        self.pos += size
        return self.mv[start : self.pos]
