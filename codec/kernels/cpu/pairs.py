"""Kernels of a sparse frame of pairs (Numba CPU only: a device frame's header is copied to
the host and read there, :mod:`codec.devframe`, and the replayed steps that call these take
host arrays, so this family has no CUDA twin): a v2 frame whose every tensor has two
sections, its index section (a bitmap or packed gaps) and its kept values stored raw.

* ``pair_sections``: the part of such a frame's header that changes from step to step (the
  section patterns and each tensor's counts: docs/format.md) read into the tables
  ``scatter.index_scatter_segments`` takes.  What :func:`codec.manyframe.parse.read_header`
  and ``_sections`` read for such a frame, without a Python step per field (the sample's
  top-k header: ~55 -> a few µs).  It refuses (returns -1) whatever it does not read as they
  would, and the caller then parses the frame with them, which raises the error they raise.
* ``pair_payload``: a selection's finds (``Select.find_segments``) written as such a frame's
  payload, each tensor's index section (as ``index.index_write`` writes it, the kind
  ``codec.pack.index_segments`` chooses) then its kept values, with the table of every
  tensor's sections; ``pair_head``: that table written as the header's patterns and counts,
  byte for byte what :func:`codec.manyframe.build.head_of` writes after the layout.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.frame import SECTION_BYTES_PER_ELEMENT as _PER_ELEMENT
from codec.kernels.cpu.index import BITMAP as _BITMAP, DELTA as _DELTA, _width_of, _write_section
from codec.manyframe.wire import COUNT_OF as _OF, COUNT_ONE as _ONE, COUNT_WRITTEN as _WRITTEN
from codec.section import SectionKind

__all__ = ["pair_sections", "pair_payload", "pair_head"]

_VALUES = int(SectionKind.VALUES)


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


@jit(parallel=True)
def pair_payload(flat, starts, pos, room, counts, out, table):
    """Tensor ``t``'s ``counts[t]`` kept positions ``pos[room[t]:]`` (sorted, counted from
    its start ``starts[t]`` in ``flat``, its values) written from byte 0 of ``out``, tensor
    after tensor: its index section, a bitmap of its ``starts[t+1] - starts[t]`` elements
    where that takes fewer bytes than its gaps, else the gaps minus one packed in the bit
    length of the largest (ties to the gaps: ``codec.pack.index_segments``' choice, the bytes
    ``index.index_write`` writes), then its kept values' bytes as ``flat`` holds them.  Row
    ``t`` of ``table``: the index section's kind, bits and count, then the values' kind,
    bits and count (``pair_head``'s input).  Returns the payload's length, or -1 (nothing
    written) when a set's gaps need more than 56 bits, a set is not increasing inside its
    tensor, or ``out`` is too small."""
    count = counts.size
    item = flat.itemsize
    at = np.empty(count + 1, np.int64)
    at[0] = 0
    for t in range(count):
        n = starts[t + 1] - starts[t]
        k = counts[t]
        w = _width_of(pos, room[t], room[t] + k, n)
        if w < 0 or w > 56:
            return -1
        delta = (k * w + 7) // 8
        full = (n + 7) // 8
        if delta > full:
            table[t, 0], table[t, 1], table[t, 2] = _BITMAP, 1, n
        else:
            table[t, 0], table[t, 1], table[t, 2] = _DELTA, w, k
        table[t, 3], table[t, 4], table[t, 5] = _VALUES, 8 * item, k
        at[t + 1] = at[t] + min(delta, full) + k * item
    if at[count] > out.size:
        return -1
    raw = flat.view(np.uint8)
    for t in prange(count):
        k = counts[t]
        a = room[t]
        o = at[t + 1] - k * item
        _write_section(pos, a, a + k, table[t, 1], table[t, 0] == _BITMAP, out, at[t], o)
        first = starts[t]
        for i in range(k):
            src = (first + pos[a + i]) * item
            for j in range(item):
                out[o + j] = raw[src + j]
            o += item
    return at[count]


@jit(inline="always")
def _put_varint(out, o, v):
    """``v`` (>= 0) as an unsigned LEB128 varint at ``out[o:]``; the position after it."""
    while v >= 0x80:
        out[o] = np.uint8((v & 0x7F) | 0x80)
        o += 1
        v >>= 7
    out[o] = np.uint8(v)
    return o + 1


@jit
def pair_head(table, out):
    """The header bytes after the layout of a frame whose tensor ``t`` has the two sections
    of row ``t`` of ``table`` (kind, bits, count of its index section, then of its values:
    ``pair_payload``'s), with count rules (FLAG_DERIVED), written from byte 0 of ``out``:
    the pattern count, each pattern (its first use's order) with the count rules its
    tensors share, then per tensor its pattern id and its written counts, byte for byte what
    :func:`codec.manyframe.build.head_of` writes there.  Returns how many bytes, or -1 when
    a kind does not fit beside a count rule (16 or more) or ``out`` may be too small
    (``12 + 25 * rows`` bytes always suffice)."""
    count = table.shape[0]
    if out.size < 12 + 25 * count:
        return -1
    keys = np.empty((max(count, 1), 4), np.int64)
    rules = np.empty((max(count, 1), 2), np.int64)
    pid = np.empty(max(count, 1), np.int64)
    npat = 0
    for t in range(count):
        if table[t, 0] >= 16 or table[t, 3] >= 16 or table[t, 0] < 0 or table[t, 3] < 0:
            return -1
        c0, c1 = table[t, 2], table[t, 5]
        r0 = _ONE if c0 == 1 else _WRITTEN
        r1 = _ONE if c1 == 1 else _OF if c1 == c0 else _WRITTEN
        p = 0
        while p < npat and not (keys[p, 0] == table[t, 0] and keys[p, 1] == table[t, 1] and keys[p, 2] == table[t, 3] and keys[p, 3] == table[t, 4]):
            p += 1
        if p == npat:
            keys[p, 0], keys[p, 1], keys[p, 2], keys[p, 3] = table[t, 0], table[t, 1], table[t, 3], table[t, 4]
            rules[p, 0], rules[p, 1] = r0, r1
            npat += 1
        else:  # the rules a pattern's tensors share (codec.manyframe.wire.common_rules)
            if rules[p, 0] != r0:
                rules[p, 0] = _WRITTEN
            if rules[p, 1] != r1:
                rules[p, 1] = _WRITTEN
        pid[t] = p
    o = _put_varint(out, 0, npat)
    for p in range(npat):
        out[o] = 2
        out[o + 1] = np.uint8(keys[p, 0] | rules[p, 0] << 4)
        out[o + 2] = np.uint8(keys[p, 1])
        out[o + 3] = np.uint8(keys[p, 2] | rules[p, 1] << 4)
        out[o + 4] = np.uint8(keys[p, 3])
        o += 5
    for t in range(count):
        p = pid[t]
        o = _put_varint(out, o, p)
        if rules[p, 0] == _WRITTEN:
            o = _put_varint(out, o, table[t, 2])
        if rules[p, 1] == _WRITTEN:
            o = _put_varint(out, o, table[t, 5])
    return o
