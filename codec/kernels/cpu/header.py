"""Frame-header kernels (Numba CPU only: a device frame's header is copied to the host and
read there, :mod:`codec.devframe`, so this family has no CUDA twin).

* ``pair_sections``: the part of a v2 header that changes from step to step in a sparse
  frame (the section patterns and each tensor's counts: docs/format.md) read for a frame
  whose every tensor has two sections, its index section and its kept values stored raw,
  into the tables ``scatter.index_scatter_segments`` takes.  What
  :func:`codec.manyframe.parse.read_header` and ``_sections`` read for such a frame,
  without a Python step per field (the sample's top-k header: ~55 -> a few µs).  It
  refuses (returns -1) whatever it does not read as they would, and the caller then parses
  the frame with them, which raises the error they raise.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit
from codec.section import SectionKind

__all__ = ["pair_sections"]

_BITMAP = int(SectionKind.INDEX_BITMAP)
_DELTA = int(SectionKind.INDEX_DELTA)
_VALUES = int(SectionKind.VALUES)
#: codec.frame.SECTION_BYTES_PER_ELEMENT: a section's bytes are bounded by its tensor's size
_PER_ELEMENT = 16
#: the count rules of codec.manyframe.wire (COUNT_WRITTEN, COUNT_ONE, COUNT_OF)
_WRITTEN, _ONE, _OF = 0, 1, 2


@jit(inline="always")
def _varint(data, pos, end):
    """The minimal unsigned LEB128 varint at ``data[pos:]`` (at most 8 bytes, below 2**56)
    and the position after it, or ``(-1, pos)`` where :class:`codec.manyframe.wire.Cursor`
    would raise or the value needs more than 8 bytes (a count that large is refused anyway:
    no section of a tensor's bytes holds it)."""
    v = np.int64(0)
    shift = 0
    while True:
        if pos >= end or shift > 49:
            return np.int64(-1), pos
        b = np.int64(data[pos])
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            if b == 0 and shift:
                return np.int64(-1), pos
            return v, pos
        shift += 7


@jit
def pair_sections(data, pos, sizes, derived, checksum, value_bits, table, values_at, counts):
    """Read the header of the v2 frame ``data`` (uint8) from ``pos``, the pattern count that
    follows its layout, for tensors of ``sizes`` elements (the layout's), each with two
    sections: an index section (bitmap or gaps) and its kept values, raw items of
    ``value_bits`` bits.  ``derived``: the header's FLAG_DERIVED (count rules in the
    patterns' kind bytes); ``checksum``: it carries a payload checksum (4 bytes before the
    header's CRC).  Writes row ``t`` of ``table`` (kind, bits, count, first byte and byte
    length in the payload of tensor ``t``'s index section: ``index.index_counts``'
    columns), ``values_at[t]`` (the first byte of its values in the payload) and
    ``counts[t]`` (how many); returns the header's length (the payload's first byte), or
    -1: the header is not read here (a field past the frame's end, not minimal, a width
    outside 1..64, a count rule an encoder does not write, a pattern id past the patterns,
    a section of another kind or width, a section longer than its tensor can need, or
    sections that do not end where the frame does)."""
    end = data.size
    npat, pos = _varint(data, pos, end)
    if npat < 0 or npat > end - pos:
        return -1
    pats = np.empty((max(npat, 1), 6), np.int64)  # (kind, bits, rule) of each of the two sections
    for p in range(npat):
        if pos >= end or data[pos] != 2 or pos + 5 > end:
            return -1
        for j in range(2):
            kind = np.int64(data[pos + 1 + 2 * j])
            bits = np.int64(data[pos + 2 + 2 * j])
            rule = _WRITTEN
            if derived:
                rule = kind >> 4
                kind = kind & 0x0F
            if bits < 1 or bits > 64 or rule >= _OF + j:
                return -1
            pats[p, 3 * j] = kind
            pats[p, 3 * j + 1] = bits
            pats[p, 3 * j + 2] = rule
        pos += 5
    off = np.int64(0)
    for t in range(sizes.size):
        pid, pos = _varint(data, pos, end)
        if pid < 0 or pid >= npat:
            return -1
        most = _PER_ELEMENT * sizes[t] + 1024
        first = np.int64(0)
        for j in range(2):
            rule = pats[pid, 3 * j + 2]
            if rule == _WRITTEN:
                c, pos = _varint(data, pos, end)
                if c < 0:
                    return -1
            elif rule == _ONE:
                c = np.int64(1)
            else:
                c = first
            kind, bits = pats[pid, 3 * j], pats[pid, 3 * j + 1]
            if c > 8 * most:  # (then its bytes are more than most; and c * bits stays in range)
                return -1
            length = (c * bits + 7) // 8
            if length > most:
                return -1
            if j == 0:
                if kind != _BITMAP and kind != _DELTA:
                    return -1
                first = c
                table[t, 0] = kind
                table[t, 1] = bits
                table[t, 2] = c
                table[t, 3] = off
                table[t, 4] = length
            else:
                if kind != _VALUES or bits != value_bits:
                    return -1
                values_at[t] = off
                counts[t] = c
            off += length
    header_len = pos + (4 if checksum else 0) + 4
    if header_len > end or off != end - header_len:
        return -1
    return header_len
