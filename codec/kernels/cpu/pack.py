"""Bit packing and index-set kernels (Numba CPU).

* ``pack_codes`` / ``unpack_codes``: codes of 1..64 bits, LSB-first, exactly
  ``ceil(n*bits/8)`` bytes.  Eight codes always fill ``bits`` whole bytes, so groups of eight
  are independent and run in parallel with no shared bytes.
* ``delta_encode`` / ``delta_decode``: sorted unique positions <-> gaps minus one.
* ``bitmap_encode`` / ``bitmap_decode``: positions <-> one bit per element.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange

_GROUPS = 1 << 13  # groups of 8 codes per parallel chunk


@jit
def _mask(bits):
    if bits >= 64:
        return np.uint64(0xFFFFFFFFFFFFFFFF)
    return (np.uint64(1) << np.uint64(bits)) - np.uint64(1)


@jit(parallel=True)
def pack_codes(codes, bits, out):
    """Pack ``codes`` (any unsigned ints, only the low ``bits`` used) into zeroed ``out``."""
    n = codes.size
    b = np.uint64(bits)
    mask = _mask(bits)
    ngroups = (n + 7) // 8
    nchunk = (ngroups + _GROUPS - 1) // _GROUPS
    for c in prange(nchunk):
        lo = c * _GROUPS * 8
        hi = min(n, lo + _GROUPS * 8)
        for i in range(lo, hi):
            v = np.uint64(codes[i]) & mask
            p = np.uint64(i) * b
            byte = np.int64(p >> np.uint64(3))
            sh = p & np.uint64(7)
            out[byte] |= np.uint8((v << sh) & np.uint64(0xFF))
            w = v >> (np.uint64(8) - sh)
            put = np.uint64(8) - sh
            j = 1
            while put < b:
                out[byte + j] |= np.uint8(w & np.uint64(0xFF))
                w >>= np.uint64(8)
                put += np.uint64(8)
                j += 1


@jit(parallel=True)
def unpack_codes(data, bits, out):
    """Inverse of ``pack_codes``: fill ``out`` (unsigned ints) with ``out.size`` codes."""
    n = out.size
    b = np.uint64(bits)
    mask = _mask(bits)
    ngroups = (n + 7) // 8
    nchunk = (ngroups + _GROUPS - 1) // _GROUPS
    for c in prange(nchunk):
        lo = c * _GROUPS * 8
        hi = min(n, lo + _GROUPS * 8)
        for i in range(lo, hi):
            p = np.uint64(i) * b
            byte = np.int64(p >> np.uint64(3))
            sh = p & np.uint64(7)
            v = np.uint64(data[byte]) >> sh
            got = np.uint64(8) - sh
            j = 1
            while got < b:
                v |= np.uint64(data[byte + j]) << got
                got += np.uint64(8)
                j += 1
            out[i] = v & mask


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


@jit
def bitmap_encode(idx, out):
    """Set bit ``idx[i]`` (LSB-first) of zeroed ``out`` for every position."""
    for i in range(idx.size):
        x = idx[i]
        out[x >> 3] |= np.uint8(1 << (x & 7))


_BYTES = 1 << 16  # bitmap bytes per parallel chunk


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
    """Positions of set bits, given each chunk's first output slot ``starts`` (from bitmap_count)."""
    nchunk = starts.size
    for c in prange(nchunk):
        lo = c * _BYTES
        hi = min(bitmap.size, lo + _BYTES)
        k = starts[c]
        for i in range(lo, hi):
            v = bitmap[i]
            while v:
                low = v & -v
                bit = 0
                t = low
                while t > 1:
                    t >>= 1
                    bit += 1
                out[k] = i * 8 + bit
                k += 1
                v ^= low
