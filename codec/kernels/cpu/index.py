"""Index-set kernels (Numba CPU): a sorted set of positions as gaps or as a bitmap.

* ``delta_encode`` / ``delta_decode``: sorted unique positions <-> gaps minus one (packed
  by the ``pack`` family's ``pack_codes``).
* ``bitmap_encode`` / ``bitmap_count`` / ``bitmap_decode``: positions <-> one bit per element.
* ``index_widths`` / ``index_write``: the index sections of many position sets at once
  (segments of one array, a many-tensor frame's run of small tensors), each the bytes
  ``pack_bits(gaps, width)`` or ``bitmap_encode`` gives it alone; ``index_counts`` /
  ``index_read`` read many index sections back at once; ``absolute_positions`` turns the
  sets' positions (each relative to its own tensor) into positions in the run.

Chunk boundaries depend on the sizes only, never on the thread count.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.section import SectionKind

__all__ = [
    "delta_encode",
    "delta_decode",
    "bitmap_encode",
    "bitmap_count",
    "bitmap_decode",
    "index_widths",
    "index_write",
    "index_counts",
    "index_read",
    "absolute_positions",
]


@jit
def _popcount8(v):
    """The set bits of byte ``v`` (as int64), branch-free."""
    b = np.int64(v)
    b = b - ((b >> 1) & 0x55)
    b = (b & 0x33) + ((b >> 2) & 0x33)
    return (b + (b >> 4)) & 0x0F


@jit
def delta_encode(idx, out):
    """Gaps of sorted unique ``idx``: out[0] = idx[0], out[i] = idx[i] - idx[i-1] - 1.

    Returns the largest gap (0 when empty); -1 if ``idx`` is not strictly increasing and >= 0.
    """
    prev = np.int64(-1)
    big = np.uint64(0)
    for i in range(idx.size):
        x = np.int64(idx[i])
        if x <= prev:
            return np.int64(-1)
        d = np.uint64(x - prev - 1)
        out[i] = d
        if d > big:
            big = d
        prev = x
    return np.int64(big)


@jit(inline="always")  # (inlined by Numba: as a call, delta_decode took 30-45% longer)
def _step(pos, g, n):
    """The position a gap ``g`` after ``pos`` (``pos + g + 1``; ``pos`` at most ``n``, or -1
    before the first), ``n`` itself for a gap beyond any position: a gap's one rule for
    every reader, which refuses the set when the answer reaches ``n`` (no sum wraps below
    ``n = 2**62``; frames hold at most 2**60 elements)."""
    if g >= np.uint64(n):
        return np.int64(n)
    return pos + np.int64(g) + 1


@jit
def delta_decode(gaps, n, out):
    """Positions from gaps; returns False (leaving ``out`` partly filled) if one reaches ``n``."""
    pos = np.int64(-1)
    for i in range(gaps.size):
        pos = _step(pos, np.uint64(gaps[i]), n)
        if pos >= n:
            return False
        out[i] = pos
    return True


_BYTES = 1 << 16  # bitmap bytes per parallel chunk


@jit(parallel=True)
def bitmap_encode(idx, out):
    """Bitmap of sorted unique positions ``idx`` (LSB-first) into ``out``, every byte written.

    Chunk ``c`` owns bytes ``[c*_BYTES, (c+1)*_BYTES)`` and the positions that fall there
    (found by binary search), so chunks share no byte.
    """
    nchunk = (out.size + _BYTES - 1) // _BYTES
    for c in prange(nchunk):
        lo = c * _BYTES
        hi = min(out.size, lo + _BYTES)
        for i in range(lo, hi):
            out[i] = 0
        a = np.searchsorted(idx, lo * 8)
        b = np.searchsorted(idx, hi * 8)
        for i in range(a, b):
            x = idx[i]
            out[x >> 3] |= np.uint8(1) << np.uint8(x & 7)


@jit(parallel=True)
def bitmap_count(bitmap):
    """Set bits per chunk of ``_BYTES`` bytes (int64 array)."""
    nchunk = (bitmap.size + _BYTES - 1) // _BYTES
    counts = np.zeros(nchunk, np.int64)
    for c in prange(nchunk):
        lo = c * _BYTES
        hi = min(bitmap.size, lo + _BYTES)
        counts[c] = _count_bits(bitmap, lo, hi)
    return counts


@jit(parallel=True)
def bitmap_decode(bitmap, starts, out):
    """Positions of set bits, given each chunk's first output slot ``starts`` (from bitmap_count).

    Branch-free compaction: each byte writes all 8 candidate positions and advances by its
    bits, while 8 slots remain in this chunk's share of ``out``; the last bytes go bit by bit.
    """
    nchunk = starts.size
    for c in prange(nchunk):
        lo = c * _BYTES
        hi = min(bitmap.size, lo + _BYTES)
        end = starts[c + 1] if c + 1 < nchunk else out.size
        dst = out[starts[c] : end]
        k = 0
        for i in range(hi - lo):
            v = np.int64(bitmap[lo + i])
            if v == 0:
                continue
            base = np.int64(lo + i) * 8
            if k + 8 <= dst.size:
                for j in range(8):
                    dst[k] = base + j
                    k += (v >> j) & 1
            else:
                for j in range(8):
                    if (v >> j) & 1:
                        dst[k] = base + j
                        k += 1


@jit
def _width_of(pos, lo, hi, size):
    """The gap width of the set ``pos[lo:hi]`` (sorted, relative to a tensor of ``size``
    elements): the bit length of its largest gap minus one, at least 1; -1 when the set is
    not strictly increasing from 0 or its last position is not below ``size``."""
    prev = np.int64(-1)
    big = np.uint64(0)
    for i in range(lo, hi):
        x = np.int64(pos[i])
        if x <= prev:
            return -1
        big = max(big, np.uint64(x - prev - 1))
        prev = x
    if prev >= size:
        return -1
    w = 1
    while w < 64 and (big >> np.uint64(w)) != np.uint64(0):
        w += 1
    return w


@jit
def _write_section(pos, lo, hi, width, bitmap, out, o0, o1):
    """The index section of the set ``pos[lo:hi]`` at ``out[o0:o1]``: a bitmap of ``(o1 - o0)
    * 8`` bits when ``bitmap``, else its gaps minus one packed LSB-first in ``width`` bits
    each (at most 56), padding bits zero."""
    for t in range(o0, o1):
        out[t] = 0
    if bitmap:
        for i in range(lo, hi):
            x = pos[i]
            out[o0 + (x >> 3)] |= np.uint8(1) << np.uint8(x & 7)
        return
    w = np.uint64(width)
    acc = np.uint64(0)
    fill = np.uint64(0)
    t = o0
    prev = np.int64(-1)
    for i in range(lo, hi):
        x = np.int64(pos[i])
        acc |= np.uint64(x - prev - 1) << fill
        prev = x
        fill += w
        while fill >= np.uint64(8):
            out[t] = np.uint8(acc & np.uint64(0xFF))
            t += 1
            acc >>= np.uint64(8)
            fill -= np.uint64(8)
    if fill:
        out[t] = np.uint8(acc & np.uint64(0xFF))


@jit
def _count_bits(data, lo, hi):
    """The set bits of ``data[lo:hi]``."""
    m = np.int64(0)
    for t in range(lo, hi):
        m += _popcount8(data[t])
    return m


@jit
def _read_section(data, lo, hi, bitmap, width, n, out, o0, o1):
    """The positions of the index section ``data[lo:hi]`` into ``out[o0:o1]``: a bitmap's set
    bits, or the running sum of packed gaps plus one (``width`` bits each, LSB-first, at most
    56); False when a position reaches ``n`` (the rest unread)."""
    if bitmap:
        o = o0
        for t in range(lo, hi):
            b = data[t]
            base = (t - lo) * 8
            for j in range(8):
                if (b >> j) & 1:
                    out[o] = base + j
                    o += 1
        return True
    w = np.uint64(width)
    mask = (np.uint64(1) << w) - np.uint64(1)
    acc = np.uint64(0)
    fill = np.uint64(0)
    t = lo
    pos = np.int64(-1)
    for i in range(o0, o1):
        while fill < w:
            acc |= np.uint64(data[t]) << fill
            t += 1
            fill += np.uint64(8)
        g = acc & mask
        acc >>= w
        fill -= w
        pos = _step(pos, g, n)
        if pos >= n:
            return False
        out[i] = pos
    return True


@jit(parallel=True)
def index_widths(pos, starts, sizes, widths):
    """Per segment ``s`` (positions ``pos[starts[s]:starts[s+1]]``, each set sorted and
    relative to its own tensor of ``sizes[s]`` elements): ``widths[s]`` = the bit length of
    its largest gap minus one (at least 1), as :func:`delta_encode` and
    ``codec.pack.encode_indices`` find it; -1 when the set is not strictly increasing from 0
    or its last position is not below ``sizes[s]`` (:func:`_width_of`)."""
    for s in prange(widths.size):
        widths[s] = _width_of(pos, starts[s], starts[s + 1], sizes[s])


@jit(parallel=True)
def index_write(pos, starts, widths, bitmap, offsets, out):
    """Write segment ``s``'s index section at ``out[offsets[s]:offsets[s+1]]``: its set as a
    bitmap of ``(offsets[s+1] - offsets[s]) * 8`` bits when ``bitmap[s]``, else its gaps minus
    one packed LSB-first in ``widths[s]`` bits each (at most 56), padding bits zero: the bytes
    ``bitmap_encode`` or ``pack_codes`` writes for that segment alone (:func:`_write_section`)."""
    for s in prange(widths.size):
        _write_section(pos, starts[s], starts[s + 1], widths[s], bitmap[s], out, offsets[s], offsets[s + 1])


#: a frame's index section kinds, as the section table holds them
BITMAP, DELTA = int(SectionKind.INDEX_BITMAP), int(SectionKind.INDEX_DELTA)
#: the columns of a section table (:func:`index_counts`, :func:`index_read`): a frame header's
#: :class:`codec.section.SectionInfo` fields, one row per section
KIND, BITS, COUNT, BEGIN, LENGTH = range(5)


@jit
def _bit_length(v):
    """The bits of ``v`` >= 0 (0 for 0), as Python's ``int.bit_length``."""
    w = 0
    while v > 0:
        w += 1
        v >>= 1
    return w


@jit
def _section_count(data, kind, bits, count, lo, length, n):
    """How many positions the index section of ``length`` bytes at ``data[lo:]`` holds (the
    set bits of a bitmap, a packed section's ``count``), or -1 when it is not one an encoder
    writes for ``n`` elements and the many-section reader reads: inside ``data``, a bitmap of
    one bit per element, ``count <= n`` gaps of 1 to ``n - 1``'s bit length (at most 56)
    bits, exactly ``(count * bits + 7) // 8`` bytes, the padding bits past the last item clear
    (what ``codec.pack.decode_indices`` checks of one section, which names the damage)."""
    if lo < 0 or length < 0 or lo > data.size - length or count < 0 or count > 8 * data.size:
        return -1
    if kind == BITMAP:
        if bits != 1 or count != n:
            return -1
    elif kind == DELTA:
        if count > n or bits < 1 or bits > min(max(1, _bit_length(n - 1)), 56):
            return -1
    else:
        return -1
    if length != (count * bits + 7) // 8:
        return -1
    used = (count * bits) % 8
    if used and (np.int64(data[lo + length - 1]) >> used) != 0:
        return -1
    return _count_bits(data, lo, lo + length) if kind == BITMAP else count


@jit(parallel=True)
def index_counts(data, sections, sizes, out_counts):
    """Per index section ``s`` (row ``s`` of the section table ``sections``: kind, bits,
    count, first byte in ``data`` and byte length, as a frame's header gives them) of a
    tensor of ``sizes[s]`` elements: ``out_counts[s]`` = how many positions it holds, or -1
    when it is not a section an encoder writes (:func:`_section_count`); nothing beyond
    the section's bytes is read."""
    for s in prange(sizes.size):
        out_counts[s] = _section_count(data, sections[s, KIND], sections[s, BITS], sections[s, COUNT], sections[s, BEGIN], sections[s, LENGTH], sizes[s])


@jit(parallel=True)
def index_read(data, sections, sizes, out_starts, out, bad):
    """Read index section ``s`` (row ``s`` of ``sections``, which :func:`index_counts` found
    to be one an encoder writes) into ``out[out_starts[s]:out_starts[s+1]]``: the positions
    of a bitmap's set bits, or the running sum of packed gaps plus one (at most 56 bits
    each); ``bad[s] = 1`` when a position reaches ``sizes[s]`` (the rest of that set unread;
    :func:`_read_section`)."""
    for s in prange(sizes.size):
        lo = sections[s, BEGIN]
        if not _read_section(data, lo, lo + sections[s, LENGTH], sections[s, KIND] == BITMAP, sections[s, BITS], sizes[s], out, out_starts[s], out_starts[s + 1]):
            bad[s] = 1


@jit(parallel=True)
def absolute_positions(pos, kstarts, starts, out):
    """``out[j] = pos[j] + starts[t]`` for ``j`` in set ``t``'s ``[kstarts[t], kstarts[t+1])``:
    each set's positions, relative to its own tensor, as positions in the run of tensors
    (tensor ``t`` from ``starts[t]``).  ``out`` may be ``pos``."""
    for t in prange(kstarts.size - 1):
        for j in range(kstarts[t], kstarts[t + 1]):
            out[j] = pos[j] + starts[t]
