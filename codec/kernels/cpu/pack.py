"""Bit packing and index-set kernels (Numba CPU).

* ``pack_codes`` / ``unpack_codes``: codes of 1..64 bits, LSB-first, exactly
  ``ceil(n*bits/8)`` bytes.  Eight codes always fill ``bits`` whole bytes, so groups of eight
  are independent and run in parallel with no shared bytes.  Fast paths: full-width codes
  (8/16/32/64 bits in that dtype) are a byte copy, 1-bit codes one byte per group, 2..7 bits
  one uint64 per group; other widths use a 64-bit accumulator (pack) or one unaligned 8-byte
  load per code (unpack).
* ``delta_encode`` / ``delta_decode``: sorted unique positions <-> gaps minus one.
* ``bitmap_encode`` / ``bitmap_decode``: positions <-> one bit per element.
* ``index_widths`` / ``index_write``: the index sections of many position sets at once
  (segments of one array, a many-tensor frame's run of small tensors), each the bytes
  ``pack_bits(gaps, width)`` or ``bitmap_encode`` gives it alone; ``index_counts`` /
  ``index_read`` read many index sections back at once.

Chunk boundaries depend on the sizes only, never on the thread count.  The byte order of
code words is little-endian, which is also the host order on every platform Numba targets
that we run on (x86-64, AArch64).
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange

__all__ = [
    "pack_codes",
    "unpack_codes",
    "delta_encode",
    "delta_decode",
    "bitmap_encode",
    "bitmap_count",
    "bitmap_decode",
    "index_widths",
    "index_write",
    "index_counts",
    "index_read",
]

_GROUPS = 1 << 13  # groups of 8 codes per parallel chunk

# Codes travel as their little-endian bytes plus an item size (1, 2, 4 or 8): one compiled
# signature serves every unsigned dtype, so the parallel kernels compile once each (a parallel
# Numba function costs ~2 s to compile per signature).  Hot loops index with unsigned integers
# or 0-based ranges: with signed indices LLVM cannot prove non-negative, Numba's
# negative-index wraparound blocks load/store merging and vectorisation (5x slower).


@jit
def _mask(bits):
    if bits >= 64:
        return np.uint64(0xFFFFFFFFFFFFFFFF)
    return (np.uint64(1) << np.uint64(bits)) - np.uint64(1)


@jit
def _put(out, pos, w, nb):
    """Store the low ``nb`` bytes of uint64 ``w`` little-endian at ``out[pos:]``."""
    p = np.uint64(pos)
    for t in range(nb):
        out[p + np.uint64(t)] = np.uint8((w >> np.uint64(8 * t)) & np.uint64(0xFF))


@jit
def _put8(out, pos, w):
    """Store uint64 ``w`` little-endian at ``out[pos:pos+8]`` (LLVM merges this into one store)."""
    p = np.uint64(pos)
    for t in range(8):
        out[p + np.uint64(t)] = np.uint8((w >> np.uint64(8 * t)) & np.uint64(0xFF))


@jit
def _get8(data, pos):
    """uint64 from ``data[pos:pos+8]`` little-endian (LLVM merges this into one load)."""
    p = np.uint64(pos)
    w = np.uint64(0)
    for t in range(8):
        w |= np.uint64(data[p + np.uint64(t)]) << np.uint64(8 * t)
    return w


@jit
def _get(data, pos, nb):
    """uint64 from the ``nb`` (0..8) bytes at ``data[pos:]``, little-endian."""
    if nb == 8:
        return _get8(data, pos)
    p = np.uint64(pos)
    w = np.uint64(0)
    for t in range(nb):
        w |= np.uint64(data[p + np.uint64(t)]) << np.uint64(8 * t)
    return w


@jit
def _code(src, i, size):
    """Code ``i`` of the ``size``-byte codes whose bytes are ``src``, as uint64 (tails only)."""
    return _get(src, np.uint64(i) * np.uint64(size), size)


@jit
def _pack_small(src, bits, dst):
    """uint8 codes ``src`` (a multiple of 8, 1 <= bits < 8) -> ``dst``, ``bits`` bytes per 8 codes."""
    m = _mask(bits)
    b = np.uint64(bits)
    ng = src.size // 8
    if bits == 1:
        for g in range(ng):
            i = g * 8
            acc = src[i] & 1
            for j in range(1, 8):
                acc |= (src[i + j] & 1) << j
            dst[g] = np.uint8(acc)
        return
    # one uint64 holds a group; all but the last few groups store 8 bytes (the extra bytes
    # belong to later groups of this slice, which rewrite them)
    safe = (dst.size - 8) // bits + 1 if dst.size >= 8 else 0
    for g in range(ng):
        i = np.uint64(g) * np.uint64(8)
        acc = np.uint64(0)
        for j in range(8):
            acc |= (np.uint64(src[i + np.uint64(j)]) & m) << (np.uint64(j) * b)
        p = np.uint64(g) * b
        if g < safe:
            _put8(dst, p, acc)
        else:
            _put(dst, p, acc, bits)


@jit
def _pack_wide(src, bits, dst):
    """Typed codes ``src`` (a multiple of 8, any ``bits``) -> ``dst`` through a 64-bit accumulator."""
    m = _mask(bits)
    b = np.uint64(bits)
    for g in range(src.size // 8):
        i = np.uint64(g) * np.uint64(8)
        p = np.uint64(g) * b
        acc = np.uint64(0)
        fill = np.uint64(0)
        for j in range(8):
            v = np.uint64(src[i + np.uint64(j)]) & m
            acc |= v << fill
            fill += b
            if fill >= np.uint64(64):
                _put8(dst, p, acc)
                p += np.uint64(8)
                fill -= np.uint64(64)
                acc = v >> (b - fill) if fill > np.uint64(0) else np.uint64(0)
        _put(dst, p, acc, np.int64(fill >> np.uint64(3)))


@jit(parallel=True)
def _pack(src, size, bits, out):
    """``pack_codes`` on the codes' bytes ``src`` (``size`` bytes each): one signature for every
    dtype; each chunk views its slice with the real dtype for the typed inner loops."""
    n = src.size // size
    ngroups = n // 8
    nchunk = (ngroups + _GROUPS - 1) // _GROUPS
    full = bits == 8 * size
    for c in prange(nchunk):
        g0 = c * _GROUPS
        g1 = min(ngroups, g0 + _GROUPS)
        s = src[g0 * 8 * size : g1 * 8 * size]
        d = out[g0 * bits : g1 * bits]
        if full:  # the codes' own bytes are the packing (little-endian host)
            for i in range(d.size):
                d[i] = s[i]
        elif size == 1:
            _pack_small(s, bits, d)
        elif size == 2:
            _pack_wide(s.view(np.uint16), bits, d)
        elif size == 4:
            _pack_wide(s.view(np.uint32), bits, d)
        else:
            _pack_wide(s.view(np.uint64), bits, d)
    # the last n % 8 codes: OR-ed into zeroed tail bytes
    b = np.uint64(bits)
    mask = _mask(bits)
    for t in range(ngroups * bits, out.size):
        out[t] = 0
    for i in range(ngroups * 8, n):
        v = _code(src, i, size) & mask
        p = np.uint64(i) * b
        byte = p >> np.uint64(3)
        sh = p & np.uint64(7)
        out[byte] |= np.uint8((v << sh) & np.uint64(0xFF))
        w = v >> (np.uint64(8) - sh)
        put = np.uint64(8) - sh
        j = np.uint64(1)
        while put < b:
            out[byte + j] |= np.uint8(w & np.uint64(0xFF))
            w >>= np.uint64(8)
            put += np.uint64(8)
            j += np.uint64(1)


def pack_codes(codes, bits, out):
    """Pack ``codes`` (contiguous unsigned ints, ``bits`` <= 8 * itemsize, only the low ``bits``
    of each used) into ``out``, uint8 of exactly ``ceil(n*bits/8)`` bytes, every byte written.

    Eight codes fill ``bits`` whole bytes, so groups of eight are independent: full groups run
    in parallel chunks of ``_GROUPS`` groups (boundaries depend on the size only), the last
    ``n % 8`` codes are OR-ed into zeroed tail bytes.
    """
    if not 1 <= bits <= 8 * codes.dtype.itemsize or out.size != (codes.size * bits + 7) // 8:
        raise ValueError(f"pack_codes: {codes.size} codes of dtype {codes.dtype}, {bits} bits, {out.size} bytes out")
    _pack(codes.reshape(-1).view(np.uint8), codes.dtype.itemsize, bits, out)


@jit
def _unpack_bits1(src, dst):
    """One-bit codes: byte ``g`` of ``src`` -> uint8 codes ``dst[8g:8g+8]``."""
    for g in range(src.size):
        x = src[g]
        i = g * 8
        for j in range(8):
            dst[i + j] = (x >> j) & 1


@jit
def _unpack_groups(src, bits, dst):
    """Typed codes ``dst`` (a multiple of 8) from ``src``, ``bits`` bytes per 8 codes.

    Each code lies in the 8 bytes at its first byte (bits <= 57) or 9 (bits 58..63):
    independent loads, no carried state; the last codes read a shorter, in-range tail.
    """
    m = _mask(bits)
    b = np.uint64(bits)
    n = dst.size
    span = 8 if bits <= 57 else 9
    fast = 0
    if src.size >= span:
        fast = min(n, ((src.size - span) * 8) // bits + 1)
    for i in range(fast):
        o = np.uint64(i) * b
        pos = o >> np.uint64(3)
        sh = o & np.uint64(7)
        v = _get8(src, pos) >> sh
        if span == 9 and sh:
            v |= np.uint64(src[pos + np.uint64(8)]) << (np.uint64(64) - sh)
        dst[i] = v & m
    for i in range(fast, n):
        o = np.uint64(i) * b
        pos = o >> np.uint64(3)
        sh = o & np.uint64(7)
        left = np.uint64(src.size) - pos
        v = _get(src, pos, min(np.uint64(8), left)) >> sh
        if left > np.uint64(8) and sh:
            v |= np.uint64(src[pos + np.uint64(8)]) << (np.uint64(64) - sh)
        dst[i] = v & m


@jit(parallel=True)
def _unpack(data, bits, out, size):
    """``unpack_codes`` into the bytes ``out`` of ``size``-byte codes (one signature for all dtypes)."""
    n = out.size // size
    ngroups = n // 8
    nchunk = (ngroups + _GROUPS - 1) // _GROUPS
    full = bits == 8 * size
    for c in prange(nchunk):
        g0 = c * _GROUPS
        g1 = min(ngroups, g0 + _GROUPS)
        s = data[g0 * bits : g1 * bits]
        d = out[g0 * 8 * size : g1 * 8 * size]
        if full:
            for i in range(d.size):
                d[i] = s[i]
        elif size == 1 and bits == 1:
            _unpack_bits1(s, d)
        elif size == 1:
            _unpack_groups(s, bits, d)
        elif size == 2:
            _unpack_groups(s, bits, d.view(np.uint16))
        elif size == 4:
            _unpack_groups(s, bits, d.view(np.uint32))
        else:
            _unpack_groups(s, bits, d.view(np.uint64))
    b = np.uint64(bits)
    mask = _mask(bits)
    for i in range(ngroups * 8, n):
        p = np.uint64(i) * b
        byte = p >> np.uint64(3)
        sh = p & np.uint64(7)
        v = np.uint64(data[byte]) >> sh
        got = np.uint64(8) - sh
        j = np.uint64(1)
        while got < b:
            v |= np.uint64(data[byte + j]) << got
            got += np.uint64(8)
            j += np.uint64(1)
        _put(out, np.uint64(i) * np.uint64(size), v & mask, size)


def unpack_codes(data, bits, out):
    """Inverse of ``pack_codes``: fill ``out`` (contiguous unsigned ints, ``bits`` <= 8 * itemsize)
    with ``out.size`` codes from the uint8 array ``data``."""
    if not 1 <= bits <= 8 * out.dtype.itemsize or data.size < (out.size * bits + 7) // 8:
        raise ValueError(f"unpack_codes: {out.size} codes of dtype {out.dtype}, {bits} bits, {data.size} bytes in")
    _unpack(data, bits, out.reshape(-1).view(np.uint8), out.dtype.itemsize)


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


@jit
def delta_decode(gaps, n, out):
    """Positions from gaps; returns False (leaving ``out`` partly filled) if one reaches ``n``."""
    pos = np.int64(-1)
    lim = np.uint64(n)
    for i in range(gaps.size):
        g = np.uint64(gaps[i])
        if g >= lim:
            return False
        pos += np.int64(g) + 1
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
        k = np.int64(0)
        for i in range(lo, hi):
            v = bitmap[i]
            v = v - ((v >> 1) & 0x55)
            v = (v & 0x33) + ((v >> 2) & 0x33)
            k += (v + (v >> 4)) & 0x0F
        counts[c] = k
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


@jit(parallel=True)
def index_widths(pos, starts, widths):
    """Per segment ``s`` (positions ``pos[starts[s]:starts[s+1]]``, each set sorted and
    relative to its own tensor): ``widths[s]`` = the bit length of its largest gap minus one
    (at least 1), as :func:`delta_encode` and ``codec.pack.encode_indices`` find it; -1 when
    the set is not strictly increasing from 0."""
    for s in prange(widths.size):
        prev = np.int64(-1)
        big = np.uint64(0)
        ok = True
        for i in range(starts[s], starts[s + 1]):
            x = np.int64(pos[i])
            if x <= prev:
                ok = False
                break
            big = max(big, np.uint64(x - prev - 1))
            prev = x
        w = 1
        while w < 64 and (big >> np.uint64(w)) != np.uint64(0):
            w += 1
        widths[s] = w if ok else -1


@jit(parallel=True)
def index_write(pos, starts, widths, bitmap, offsets, out):
    """Write segment ``s``'s index section at ``out[offsets[s]:offsets[s+1]]``: its set as a
    bitmap of ``(offsets[s+1] - offsets[s]) * 8`` bits when ``bitmap[s]``, else its gaps minus
    one packed LSB-first in ``widths[s]`` bits each (at most 56), padding bits zero: the bytes
    ``bitmap_encode`` or ``pack_codes`` writes for that segment alone."""
    for s in prange(widths.size):
        o0 = offsets[s]
        o1 = offsets[s + 1]
        for t in range(o0, o1):
            out[t] = 0
        if bitmap[s]:
            for i in range(starts[s], starts[s + 1]):
                x = pos[i]
                out[o0 + (x >> 3)] |= np.uint8(1) << np.uint8(x & 7)
            continue
        w = np.uint64(widths[s])
        acc = np.uint64(0)
        fill = np.uint64(0)
        t = o0
        prev = np.int64(-1)
        for i in range(starts[s], starts[s + 1]):
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


@jit(parallel=True)
def index_counts(data, begin, end, bitmap, counts, out_counts):
    """Per index section ``s`` at ``data[begin[s]:end[s]]``: how many positions it holds,
    ``counts[s]`` for packed gaps, the set bits of a bitmap (``bitmap[s]``)."""
    for s in prange(counts.size):
        if bitmap[s]:
            m = 0
            for t in range(begin[s], end[s]):
                b = np.uint32(data[t])
                b = b - ((b >> np.uint32(1)) & np.uint32(0x55))
                b = (b & np.uint32(0x33)) + ((b >> np.uint32(2)) & np.uint32(0x33))
                m += np.int64((b + (b >> np.uint32(4))) & np.uint32(0x0F))
            out_counts[s] = m
        else:
            out_counts[s] = counts[s]


@jit(parallel=True)
def index_read(data, begin, end, bitmap, widths, sizes, out_starts, out, bad):
    """Read index section ``s`` (see :func:`index_counts`) into
    ``out[out_starts[s]:out_starts[s+1]]``: the positions of a bitmap's set bits, or the
    running sum of packed gaps plus one (``widths[s]`` bits each, LSB-first, at most 56);
    ``bad[s] = 1`` when a position reaches ``sizes[s]`` (the rest of that set unread)."""
    for s in prange(widths.size):
        o = out_starts[s]
        if bitmap[s]:
            for t in range(begin[s], end[s]):
                b = data[t]
                base = (t - begin[s]) * 8
                for j in range(8):
                    if (b >> j) & 1:
                        out[o] = base + j
                        o += 1
            continue
        w = np.uint64(widths[s])
        mask = (np.uint64(1) << w) - np.uint64(1)
        n = sizes[s]
        acc = np.uint64(0)
        fill = np.uint64(0)
        t = begin[s]
        pos = np.int64(-1)
        for i in range(out_starts[s], out_starts[s + 1]):
            while fill < w:
                acc |= np.uint64(data[t]) << fill
                t += 1
                fill += np.uint64(8)
            g = acc & mask
            acc >>= w
            fill -= w
            if g >= np.uint64(n):
                bad[s] = 1
                break
            pos += np.int64(g) + 1
            if pos >= n:
                bad[s] = 1
                break
            out[i] = pos
