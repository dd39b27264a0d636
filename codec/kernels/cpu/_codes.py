"""Reading packed codes (Numba CPU), shared by the quantizers' decoder
(``codec/kernels/cpu/dequant.py``) and the many-tensor run reader (``quantrun.py``): a
little-endian word, one code or a group of eight codes of 1..16 bits packed LSB-first, and
the decoders' range check of a code field (its SWAR test, the largest field of a chunk).

Codes are read eight at a time from whole words (``bits`` bytes hold eight codes); a
parallel chunk holds ``_GROUPS`` groups (CHUNK values, ``codec.layout``).
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit
from codec.kernels.cpu._common import U, chunks
from codec.layout import CHUNK

#: groups of 8 codes per parallel chunk (CHUNK values)
_GROUPS = CHUNK // 8


@jit
def _load8(data, p):
    """uint64 from ``data[p:p+8]``, little-endian (LLVM merges this into one load)."""
    w = U(0)
    for t in range(8):
        w |= U(data[p + U(t)]) << U(8 * t)
    return w


@jit
def _code_at(data, i, bits, mask):
    """Code ``i`` of the ``bits``-bit codes packed LSB-first in ``data`` (any position)."""
    p = U(i) * U(bits)
    j = p >> U(3)
    w = U(0)
    for t in range(3):
        if j + U(t) < U(data.size):
            w |= U(data[j + U(t)]) << U(8 * t)
    return (w >> (p & U(7))) & mask


@jit
def _code_of_group(w0, w1, j, bits, mask):
    """Code ``j`` (0..7) of a group of 8 codes whose 16 bytes are ``w0``, ``w1``."""
    off = U(j) * U(bits)
    lo = (w0 >> (off & U(63))) if off < U(64) else (w1 >> ((off - U(64)) & U(63)))
    spill = off < U(64) and off + U(bits) > U(64)
    hi = (w1 << ((U(64) - off) & U(63))) if spill else U(0)
    return (lo | hi) & mask


@jit
def _groups_safe(nbytes, bits):
    """How many leading groups of 8 codes can be read with whole 8-byte words (1 word per group
    up to 8 bits, 2 above) without reading past ``nbytes``."""
    words = 8 if bits <= 8 else 16
    return max(0, (nbytes - words) // bits + 1) if nbytes >= words else 0


@jit(inline="always")
def _group_code(w0, w1, j, bits, mask):
    """Code ``j`` of a group of eight read as ``w0`` (and ``w1`` above 8 bits).  Inlined in
    Numba's IR: as an ordinary call the decode loop ran 7 -> 12 ms for 25M values."""
    return (w0 >> (U(j) * U(bits))) & mask if bits <= 8 else _code_of_group(w0, w1, j, bits, mask)


@jit
def _rows(starts):
    """``rows[t]``: the first (tensor, chunk) row of tensor ``t`` of a segmented call (tensor
    ``t`` holding ``starts[t+1] - starts[t]`` values in ``chunks`` of CHUNK), ``rows[-1]``
    their number."""
    count = starts.size - 1
    rows = np.zeros(max(count, 0) + 1, np.int64)
    for t in range(count):
        rows[t + 1] = rows[t] + chunks(starts[t + 1] - starts[t])
    return rows


@jit(inline="always")
def _over_row(data, dstarts, bits, starts, rows, r, fmask, fshift, largest):
    """:func:`_over_chunk` of row ``r`` of a segmented call's (tensor, chunk) rows (``rows``:
    :func:`_rows` of ``starts``), tensor ``t``'s codes from byte ``dstarts[t]`` of ``data``."""
    t = np.searchsorted(rows, r, side="right") - 1
    n = starts[t + 1] - starts[t]
    d = data[dstarts[t] : dstarts[t] + (n * bits + 7) // 8]
    return _over_chunk(d, bits, n, fmask, fshift, largest, r - rows[t])


@jit(inline="always")
def _field_test(bits, fmask, fshift, largest):
    """The range check of ``bits``-bit codes whose field ``(code & fmask) >> fshift`` may be at
    most ``largest``: ``(fm, t)``, a code failing it when ``code & fm >= t``; none can when
    ``t > fm`` (``fmask = 0``: nothing to check)."""
    fm = U(fmask) & ((U(1) << U(bits)) - U(1))
    return fm, (U(largest) + U(1)) << U(fshift)


@jit(inline="always")
def _swar(bits, fm, t):
    """The words of :func:`_field_test`'s test of eight codes of up to 8 bits at once (SWAR):
    ``(even, add, carry)``.  A masked code ``m`` plus ``2**bits - t`` carries out of its
    ``bits``-bit slot exactly when ``m >= t``; the even and the odd slots are added apart
    (:func:`_over_word`), so each carry lands in a slot masked to zero."""
    b = U(bits)
    even = U(0)
    add = U(0)
    carry = U(0)
    for j in range(U(4)):
        even |= fm << (U(2) * j * b)
        add |= ((U(1) << b) - t) << (U(2) * j * b)
        carry |= (U(1) << b) << (U(2) * j * b)
    return even, add, carry


@jit(inline="always")
def _over_word(w, bits, even, add):
    """:func:`_swar`'s test of the word ``w`` of eight codes: nonzero under ``carry`` when one
    fails."""
    return ((w & even) + add) | (((w >> U(bits)) & even) + add)


@jit(inline="always")
def _over_chunk(data, bits, n, fmask, fshift, largest, c):
    """Nonzero when a field of chunk ``c`` of ``fields_within``'s codes is beyond ``largest``
    (the SWAR test up to 8 bits, the largest field above)."""
    mask = (U(1) << U(bits)) - U(1)
    fm, t = _field_test(bits, fmask, fshift, largest)
    if t > fm:  # no masked code reaches it
        return U(0)
    if bits > 8:
        return U(_max_field_chunk(data, bits, n, fmask, c) >= t)
    even, add, carry = _swar(bits, fm, t)
    full = min(n // 8, _groups_safe(data.size, bits))
    g0 = c * _GROUPS
    g1 = min((n + 7) // 8, g0 + _GROUPS)
    acc = U(0)
    for g in range(U(g0), U(min(g1, full))):
        acc |= _over_word(_load8(data, g * U(bits)), bits, even, add)
    acc &= carry
    for i in range(U(max(g0 * 8, full * 8)), U(min(n, g1 * 8))):
        acc |= U((_code_at(data, i, bits, mask) & fm) >= t)
    return acc


@jit(inline="always")
def _max_field_chunk(data, bits, n, fmask, c):
    """The largest ``code & fmask`` of chunk ``c`` of :func:`max_field` (inlined in Numba's IR:
    as an ordinary call it ran ~15% slower)."""
    mask = (U(1) << U(bits)) - U(1)
    fm = U(fmask) & mask
    full = min(n // 8, _groups_safe(data.size, bits))
    ngroup = (n + 7) // 8
    m = U(0)
    g0 = c * _GROUPS
    g1 = min(ngroup, g0 + _GROUPS)
    if bits == 8:
        m = _max_bytes(data, g0 * 8, min(n, g1 * 8), fm)
    elif bits == 16:
        m = _max_halves(data, g0 * 8, min(n, g1 * 8), fm)
    else:
        for g in range(U(g0), U(min(g1, full))):
            p = g * U(bits)
            w0 = _load8(data, p)
            w1 = _load8(data, p + U(8)) if bits > 8 else U(0)
            for j in range(U(8)):
                m = max(m, _group_code(w0, w1, j, bits, mask) & fm)
        for i in range(U(max(g0 * 8, full * 8)), U(min(n, g1 * 8))):
            m = max(m, _code_at(data, i, bits, mask) & fm)
    return m


@jit
def _max_bytes(data, lo, hi, fm):
    """``max(data[lo:hi] & fm)`` over 8-bit codes: one simple loop in uint8 (it vectorises)."""
    m = np.uint8(0)
    f = np.uint8(fm)
    for i in range(U(lo), U(hi)):
        m = max(m, data[i] & f)
    return U(m)


@jit
def _max_halves(data, lo, hi, fm):
    """``max(code & fm)`` over the 16-bit codes ``lo <= i < hi`` stored little-endian in
    ``data``: one simple loop in uint16 (it vectorises)."""
    m = np.uint16(0)
    f = np.uint16(fm)
    for i in range(U(lo), U(hi)):
        code = np.uint16(np.uint16(data[U(2) * i]) | np.uint16(np.uint16(data[U(2) * i + U(1)]) << np.uint16(8)))
        m = max(m, code & f)
    return U(m)
