"""Bit packing kernels (Numba CPU); the index sets built on them are the ``index`` family.

* ``pack_codes`` / ``unpack_codes``: codes of 1..64 bits, LSB-first, exactly
  ``ceil(n*bits/8)`` bytes.  Eight codes always fill ``bits`` whole bytes, so groups of eight
  are independent and run in parallel with no shared bytes.  Fast paths: full-width codes
  (8/16/32/64 bits in that dtype) are a byte copy, 1-bit codes one byte per group, 2..7 bits
  one uint64 per group, 9..16 bits packed two words a group (``_pack_two_words``, branch-free);
  other widths use a 64-bit accumulator (pack) or one unaligned 8-byte load per code
  (unpack).
* ``sign_bits``: the top bit of each word (a float's sign, read from its bits: -0.0 and
  NaN's sign included), one bit per value LSB-first, a byte per iteration (its kernels are
  ``_signs``'s: codec/kernels/cpu/_signs.py).
* ``pack_segments``, ``put_items`` / ``take_items``: a many-tensor frame's run of small
  tensors at once: each tensor's codes packed at its own byte offset, and each tensor's
  per-block numbers (float64, float32 or int16 items) written and read at theirs; and
  ``interleave``, a sparse run's index sections and value codes, tensor by tensor.  The
  little-endian byte loads and stores they all use are codec/kernels/cpu/_bytes.py's.

Chunk boundaries depend on the sizes only, never on the thread count.  The byte order of
code words is little-endian, which is also the host order on every platform Numba targets
that we run on (x86-64, AArch64).
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._bytes import _get, _get8, _put, _put8
from codec.kernels.cpu._crc import crc_piece, crc_pieces, joined
from codec.kernels.cpu._signs import _sign_bits
from codec.errors import CodecValueError

__all__ = ["interleave", "pack_codes", "pack_segments", "put_items", "sign_bits", "take_items", "unpack_codes"]

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
    # a group's eight bytes, read as one uint64, squeezed into its bits * 8 low bits
    # (:func:`_squeeze`); all but the last few groups store 8 bytes (the extra bytes belong
    # to later groups of this slice, which rewrite them)
    m8 = m * np.uint64(0x0101010101010101)
    safe = min(ng, (dst.size - 8) // bits + 1 if dst.size >= 8 else 0)
    for g in range(np.uint64(safe)):
        _put8(dst, g * b, _squeeze(_get8(src, g * np.uint64(8)) & m8, b))
    for g in range(safe, ng):
        _put(dst, np.uint64(g) * b, _squeeze(_get8(src, np.uint64(g) * np.uint64(8)) & m8, b), bits)


@jit(inline="always")
def _squeeze(w, b):
    """Eight ``b``-bit codes, one in each byte of ``w`` (high bits clear), moved together
    into the low ``8 * b`` bits, code ``j`` at bit ``j * b``: pairs of bytes, then of 16-bit
    halves, then of 32-bit halves, each joined by one shift (a loop over the eight codes
    took 2.5 ms for 8M codes, this 1.25: it vectorises across groups)."""
    w = (w & np.uint64(0x00FF00FF00FF00FF)) | ((w >> np.uint64(8)) & np.uint64(0x00FF00FF00FF00FF)) << b
    w = (w & np.uint64(0x0000FFFF0000FFFF)) | ((w >> np.uint64(16)) & np.uint64(0x0000FFFF0000FFFF)) << (np.uint64(2) * b)
    return (w & np.uint64(0x00000000FFFFFFFF)) | (w >> np.uint64(32)) << (np.uint64(4) * b)


@jit(inline="always")
def _join8(src, i, b, m):
    """Codes ``src[i:i+8]`` (``8 < b <= 16`` bits each, masked by ``m``) joined LSB-first into
    ``8 * b`` bits: ``(w0, w1)``, the first 64 and the rest.  Which word a code lands in
    depends on its place and the width only, so every branch is taken the same way each
    group."""
    w0 = np.uint64(0)
    w1 = np.uint64(0)
    for j in range(8):
        v = np.uint64(src[i + np.uint64(j)]) & m
        off = np.uint64(j) * b
        if off < np.uint64(64):
            w0 |= v << off
            if off + b > np.uint64(64):
                w1 |= v >> (np.uint64(64) - off)
        else:
            w1 |= v << (off - np.uint64(64))
    return w0, w1


@jit
def _pack_two_words(src, bits, dst):
    """Typed codes ``src`` (a multiple of 8, ``8 < bits <= 16``) -> ``dst``, ``bits`` bytes per
    eight codes (:func:`_join8`): all but the last groups store both words whole (the bytes past
    the group belong to later groups of this slice, which rewrite them), the last ones their
    own bytes.  25M 12-bit codes: 12.0-13.1 ms through the accumulator of
    :func:`_pack_wide`, whose branch on a full word depends on the code's place."""
    m = _mask(bits)
    b = np.uint64(bits)
    ng = src.size // 8
    safe = min(ng, (dst.size - 16) // bits + 1 if dst.size >= 16 else 0)
    for g in range(np.uint64(safe)):
        w0, w1 = _join8(src, g * np.uint64(8), b, m)
        _put8(dst, g * b, w0)
        _put8(dst, g * b + np.uint64(8), w1)
    for g in range(safe, ng):
        w0, w1 = _join8(src, np.uint64(g) * np.uint64(8), b, m)
        _put8(dst, np.uint64(g) * b, w0)
        _put(dst, np.uint64(g) * b + np.uint64(8), w1, bits - 8)


@jit
def _pack_wide(src, bits, dst):
    """Typed codes ``src`` (a multiple of 8, any ``bits``) -> ``dst`` through a 64-bit
    accumulator (:func:`_pack_two_words` for ``8 < bits <= 16``)."""
    if 8 < bits <= 16:
        _pack_two_words(src, bits, dst)
        return
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
def _pack(src, size, bits, out, crc=-1):
    """``pack_codes`` on the codes' bytes ``src`` (``size`` bytes each): one signature for every
    dtype; each chunk views its slice with the real dtype for the typed inner loops, and is
    checksummed right after it is written when ``crc >= 0`` (the tail bytes are the last
    piece)."""
    ngroups = src.size // size // 8
    nchunk = (ngroups + _GROUPS - 1) // _GROUPS
    sums, lens = crc_pieces(nchunk + 1, crc)
    for c in prange(nchunk):
        _pack_chunk(src, size, bits, out, c)
        if sums.size:
            crc_piece(sums, lens, c, out, c * _GROUPS * bits, min(ngroups, (c + 1) * _GROUPS) * bits)
    _pack_tail(src, size, bits, out)
    if sums.size:
        crc_piece(sums, lens, nchunk, out, ngroups * bits, out.size)
    return joined(sums, lens, crc)


@jit(parallel=True)
def _pack_segments(src, size, starts, bits, out, ostarts):
    """``pack_segments`` on the codes' bytes (see ``_pack``)."""
    for t in prange(starts.size - 1):
        n = starts[t + 1] - starts[t]
        s = src[starts[t] * size : starts[t + 1] * size]
        d = out[ostarts[t] : ostarts[t] + (n * bits + 7) // 8]
        for c in range((n // 8 + _GROUPS - 1) // _GROUPS):
            _pack_chunk(s, size, bits, d, c)
        _pack_tail(s, size, bits, d)


@jit
def _pack_chunk(src, size, bits, out, c):
    """The full groups of eight of chunk ``c`` (``_GROUPS`` groups) of ``_pack``."""
    ngroups = src.size // size // 8
    g0 = c * _GROUPS
    g1 = min(ngroups, g0 + _GROUPS)
    s = src[g0 * 8 * size : g1 * 8 * size]
    d = out[g0 * bits : g1 * bits]
    if bits == 8 * size:  # the codes' own bytes are the packing (little-endian host)
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


@jit
def _pack_tail(src, size, bits, out):
    """The last ``n % 8`` codes of ``_pack``: OR-ed into zeroed tail bytes."""
    n = src.size // size
    ngroups = n // 8
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


def sign_bits(words, starts, out, ostarts):
    """The signs of floats, one bit each, for many tensors at once: ``words`` is the floats'
    bits (viewed as uint16, uint32 or uint64), tensor ``t`` its ``words[starts[t]:starts[t+1]]``,
    whose ``ceil(n_t/8)`` bytes go to ``out`` from byte ``ostarts[t]`` (non-decreasing; the
    tensors' bytes do not overlap), bit ``i`` the top bit of its word ``i`` (``np.signbit``:
    -0.0 and NaN's sign included), LSB-first.  Other bytes of ``out`` are left as they are.
    One tensor: ``starts = [0, n]``, ``ostarts = [0]``.  A byte per iteration, its tensor
    found by a binary search of ``ostarts``."""
    if words.dtype.kind != "u" or starts.size != ostarts.size + 1:
        raise CodecValueError(f"sign_bits: words of dtype {words.dtype}, {starts.size - 1} tensors, {ostarts.size} offsets")
    if out.size and ostarts.size:
        _sign_bits(words.reshape(-1), starts, ostarts, np.uint64(8 * words.dtype.itemsize - 1), out)


def pack_codes(codes, bits, out, crc=-1):
    """Pack ``codes`` (contiguous unsigned ints, ``bits`` <= 8 * itemsize, only the low ``bits``
    of each used) into ``out``, uint8 of exactly ``ceil(n*bits/8)`` bytes, every byte written.

    Eight codes fill ``bits`` whole bytes, so groups of eight are independent: full groups run
    in parallel chunks of ``_GROUPS`` groups (boundaries depend on the size only), the last
    ``n % 8`` codes are OR-ed into zeroed tail bytes.

    Returns, with ``crc >= 0``, the CRC-32C of ``out`` continued from ``crc``, each chunk
    checksummed as it is written (a frame's section packed straight into the frame:
    :func:`codec.pack.pack_into`); else, or where the CPU cannot (``_crc.HARDWARE``), -1.
    """
    if not 1 <= bits <= 8 * codes.dtype.itemsize or out.size != (codes.size * bits + 7) // 8:
        raise CodecValueError(f"pack_codes: {codes.size} codes of dtype {codes.dtype}, {bits} bits, {out.size} bytes out")
    return int(_pack(codes.reshape(-1).view(np.uint8), codes.dtype.itemsize, bits, out, crc))


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
        dst[i] = _code_at(src, i, bits, m)


@jit
def _code_at(src, i, bits, m):
    """Code ``i`` of the ``bits``-bit packing ``src`` (``m`` its mask), read from the at most
    nine bytes it spans, none beyond ``src``'s end (the CUDA twin's unpacking, every code)."""
    o = np.uint64(i) * np.uint64(bits)
    pos = o >> np.uint64(3)
    sh = o & np.uint64(7)
    left = np.uint64(src.size) - pos
    v = _get(src, pos, min(np.uint64(8), left)) >> sh
    if left > np.uint64(8) and sh:
        v |= np.uint64(src[pos + np.uint64(8)]) << (np.uint64(64) - sh)
    return v & m


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
        raise CodecValueError(f"unpack_codes: {out.size} codes of dtype {out.dtype}, {bits} bits, {data.size} bytes in")
    _unpack(data, bits, out.reshape(-1).view(np.uint8), out.dtype.itemsize)


def pack_segments(codes, starts, bits, out, ostarts):
    """``pack_codes`` of many tensors' codes at once (a many-tensor frame's run): the codes
    ``codes[starts[t]:starts[t+1]]`` of tensor ``t`` packed into exactly
    ``ceil(n_t*bits/8)`` bytes of ``out`` from byte ``ostarts[t]``, as ``pack_codes`` packs
    them alone; the bytes between tensors are left as they are."""
    ends = ostarts + (np.diff(starts) * bits + 7) // 8
    if not 1 <= bits <= 8 * codes.dtype.itemsize or starts.size != ostarts.size + 1 or (ends.size and (ends.max() > out.size or ostarts.min() < 0)):
        raise CodecValueError(f"pack_segments: codes of dtype {codes.dtype}, {bits} bits, {starts.size - 1} tensors, {ostarts.size} offsets, {out.size} bytes out")
    _pack_segments(codes.reshape(-1).view(np.uint8), codes.dtype.itemsize, starts, bits, out, ostarts)


@jit
def _item(w, width):
    """The float64 value of the little-endian ``width``-byte item whose bits are ``w``: 2 an
    int16, 4 a float32, 8 a float64."""
    if width == 8:
        return np.uint64(w).view(np.float64)
    if width == 4:
        return np.float64(np.uint32(w).view(np.float32))
    return np.float64(np.uint16(w).view(np.int16))


@jit
def _item_bits(v, width):
    """The bits of float64 ``v`` as a little-endian ``width``-byte item (``_item``'s inverse): 8
    a float64, 4 a float32 (rounded to nearest, as NumPy casts), 2 an int16."""
    if width == 8:
        return np.float64(v).view(np.uint64)
    if width == 4:
        return np.uint64(np.float32(v).view(np.uint32))
    return np.uint64(np.uint16(np.int16(v)))


@jit(parallel=True)
def put_items(values, vstarts, widths, out, ostarts):
    """Tensor ``t``'s float64 ``values[vstarts[t]:vstarts[t+1]]`` written from byte
    ``ostarts[t]`` of ``out`` as little-endian items of ``widths[t]`` bytes: 8 float64, 4
    float32 (rounded to nearest, as NumPy casts), 2 int16 (integers in its range)."""
    for t in prange(vstarts.size - 1):
        w = widths[t]
        p = np.uint64(ostarts[t])
        for i in range(vstarts[t], vstarts[t + 1]):
            _put(out, p, _item_bits(values[i], w), w)
            p += np.uint64(w)


@jit(parallel=True)
def take_items(data, offsets, widths, vstarts, out):
    """The inverse of ``put_items``: tensor ``t``'s ``vstarts[t+1] - vstarts[t]`` items of
    ``widths[t]`` bytes from byte ``offsets[t]`` of ``data``, as float64 into the same slice
    of ``out`` (exact)."""
    for t in prange(vstarts.size - 1):
        w = widths[t]
        p = np.uint64(offsets[t])
        for i in range(vstarts[t], vstarts[t + 1]):
            out[i] = _item(_get(data, p, w), w)
            p += np.uint64(w)


@jit(parallel=True)
def interleave(first, fstarts, second, sstarts, out):
    """``out`` = segment 0 of ``first``, segment 0 of ``second``, segment 1 of ``first``, ...:
    segment ``t`` of ``first`` is ``first[fstarts[t]:fstarts[t+1]]`` (bytes), of ``second``
    likewise; a sparse run's index sections and value codes, each tensor's two in turn."""
    for t in prange(fstarts.size - 1):
        p = fstarts[t] + sstarts[t]
        for i in range(fstarts[t], fstarts[t + 1]):
            out[p] = first[i]
            p += 1
        for i in range(sstarts[t], sstarts[t + 1]):
            out[p] = second[i]
            p += 1
