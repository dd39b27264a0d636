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
from codec.modes import ADD, SET, SUB

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


@jit(inline="always")
def _code_of_group(w0, w1, j, bits, mask):
    """Code ``j`` (0..7) of a group of 8 codes whose 16 bytes are ``w0``, ``w1`` (inlined in
    Numba's IR: as a call, the decoder's wide codes ran 25M 11-bit values 9.5-10.0 ms against
    7.2-7.6 before its loops were copied per mode; inlined, ~15% above that)."""
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


#: the parallel tasks of a segmented call's (tensor, chunk) rows: runs of rows of about equal
#: work (:func:`_rows`)
ROW_TASKS = 64


@jit
def _rows(starts):
    """``(rows, done, tasks)`` of a segmented call (tensor ``t`` holding ``starts[t+1] -
    starts[t]`` values in ``chunks`` of CHUNK): ``rows[t]`` the first (tensor, chunk) row of
    tensor ``t``, ``rows[-1]`` their number; ``done[r]`` the values before row ``r``, and in
    all; ``tasks`` the parallel tasks the rows run in, runs of rows of about equal work
    (``_common.task_span``).  A static split of the rows by their count gave one thread
    most of a model's late, large layers: ResNet-50's 161 qsgd tensors (508 rows, 10.2M
    values in the first half, 15.4M in the second) decoded in 6.6 ms against 5.5 for one
    tensor of the same values."""
    count = starts.size - 1
    rows = np.zeros(max(count, 0) + 1, np.int64)
    for t in range(count):
        rows[t + 1] = rows[t] + chunks(starts[t + 1] - starts[t])
    done = np.zeros(rows[-1] + 1, np.int64)
    for t in range(count):
        n = starts[t + 1] - starts[t]
        for r in range(rows[t], rows[t + 1]):
            done[r + 1] = done[r] + min(CHUNK, n - (r - rows[t]) * CHUNK)
    return rows, done, min(rows[-1], ROW_TASKS)


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


@jit(inline="always")
def _put(dst, k, v, mode):
    """``dst[k] (=|+=|-=) v`` per ``mode`` (SET, ADD, SUB), ``v`` rounded once to ``dst``'s
    dtype first.  Every value goes straight to ``out``: an ADD reads and writes each element
    once, in place (25M qsgd values: 11.9 -> 5.7 ms against decoding each chunk into a
    buffer and adding that).  Its callers pass the mode as a constant (:func:`_chunk_decoder`
    holds one copy of its loops per mode), so no loop tests it per value."""
    w = dst.dtype.type(v)
    if mode == SET:
        dst[k] = w
    elif mode == SUB:
        dst[k] -= w
    else:
        dst[k] += w



@jit(inline="always")
def _dequantize_chunk(data, bits, n, lut, block, a, off, out, mode, c, fmask, fshift, largest):
    """:func:`_chunk_decoder` of chunk ``c``, every integer argument made an int64 here, so
    each caller's constants (``SET``, ``0``: Numba types a constant argument as a literal, a
    signature of its own) share one compilation per array signature: 17-18 s each, and the
    suite compiled it 4 times for 2 dtypes when the callers' literals differed."""
    i64 = np.int64
    return _chunk_decoder(data, i64(bits), i64(n), lut, i64(block), a, off, out, i64(mode), i64(c), i64(fmask), i64(fshift), i64(largest))


@jit
def _chunk_decoder(data, bits, n, lut, block, a, off, out, mode, c, fmask, fshift, largest):
    """Chunk ``c`` of :func:`dequantize` (:func:`_chunk`): one copy of its loops per mode, and
    one that checks the code fields (SET only: :func:`dequantize_checked`), the mode and the
    check constants in each, so no loop tests them per value (with the mode an argument, the
    byte table's SET ran 4.7 -> 7.3 ms for 25M values; with the check's code beside the
    decode, 11-bit codes 6.6 -> 10.0 ms)."""
    fm, t = _field_test(bits, fmask, fshift, largest)
    if t <= fm:  # (a code can fail the check)
        return _chunk(data, bits, n, lut, block, a, off, out, SET, c, fmask, fshift, largest, True)
    if mode == SET:
        return _chunk(data, bits, n, lut, block, a, off, out, SET, c, 0, 0, 0, False)
    if mode == ADD:
        return _chunk(data, bits, n, lut, block, a, off, out, ADD, c, 0, 0, 0, False)
    return _chunk(data, bits, n, lut, block, a, off, out, SUB, c, 0, 0, 0, False)



@jit(inline="always")
def _chunk(data, bits, n, lut, block, a, off, out, mode, c, fmask, fshift, largest, check):
    """Chunk ``c`` of :func:`dequantize` (codes ``8 * _GROUPS * c`` onwards); nonzero when a
    code's field is beyond ``largest`` (:func:`dequantize_checked`; ``fmask = 0``: none is
    checked).  Each code is checked once: through a block's table (or the byte table of 8-bit
    codes) on the words (bytes) the codes are read from; codes wider than a byte as each is
    decoded (:func:`_scaled_groups`); narrow codes of short blocks by ``fields_within``'s
    test of the chunk (:func:`_over_chunk`), just before it decodes.  (The few values that
    straddle a block boundary or end the chunk, :func:`_value_at`, test their own code.)"""
    mask = (U(1) << U(bits)) - U(1)
    fm, t = _field_test(bits, fmask, fshift, largest) if check else (U(0), U(1))  # (no code fails (0, 1))
    has_off = off.size > 0
    full = min(n // 8, _groups_safe(data.size, bits))
    ngroup = (n + 7) // 8
    ublock = U(block)
    g0 = c * _GROUPS
    g1 = min(ngroup, g0 + _GROUPS)
    lo = g0 * 8
    hi = min(n, g1 * 8)
    whole_bytes = bits == 8 and block >= _TABLE_BLOCK and lut.size >= 256
    tabled = bits <= 8 and min(block, n) >= _TABLE_PER_CODE << bits and lut.size >= 1 << bits and not whole_bytes
    if whole_bytes:
        top = _dequantize_bytes(data, lo, hi, lut, block, a, off, out, mode, fm if t <= fm else U(0))
        return U(t <= fm and top >= t)
    over = _over_chunk(data, bits, n, fmask, fshift, largest, c) if t <= fm and not tabled and bits <= 8 else U(0)
    even, add, carry = _swar(bits, fm, t) if t <= fm and tabled else (U(0), U(0), U(0))
    tab = np.empty((1 << bits) if tabled else 0, out.dtype)
    g = U(g0)
    gend = U(max(g0, min(g1, full)))
    while g < gend:  # block by block: the groups inside one in a tight loop
        b = g * U(8) // ublock
        inside = min(gend, (b + U(1)) * ublock // U(8))  # the groups that end within block b
        if inside <= g:  # this group straddles a block boundary: value by value
            for i in range(g * U(8), g * U(8) + U(8)):
                over |= _value_at(data, i, bits, mask, lut, a, off, has_off, ublock, out, mode, fm, t)
            g += U(1)
            continue
        ab = a[b]
        ob = off[b] if has_off else 0.0
        if tabled:
            _block_table(lut, ab, ob, has_off, tab)
            over |= _tabled_groups(data, g, inside, bits, mask, tab, out, mode, even, add) & carry
        else:
            over |= U(_scaled_groups(data, g, inside, bits, mask, lut, ab, ob, has_off, out, mode, fm if t <= fm and bits > 8 else U(0)) >= t)
        g = inside
    for i in range(U(max(lo, full * 8)), U(hi)):
        over |= _value_at(data, i, bits, mask, lut, a, off, has_off, ublock, out, mode, fm, t)
    return over



@jit(inline="always")
def _value_at(data, i, bits, mask, lut, a, off, has_off, ublock, dst, mode, fm, t):
    """Value ``i`` on its own (a group that straddles a block boundary, the last few codes);
    nonzero when its code fails :func:`_field_test`'s ``(fm, t)``."""
    bi = i // ublock
    code = _code_at(data, i, bits, mask)
    v = lut[code] * a[bi]
    _put(dst, i, v + off[bi] if has_off else v, mode)
    return U((code & fm) >= t)



@jit(inline="always")
def _tabled_groups(data, g0, g1, bits, mask, tab, dst, mode, even, add):
    """Groups ``g0..g1`` of eight codes (of one block, ``bits <= 8``) through the block's
    table ``tab``: one word, eight lookups a group, no branch (a tight loop per block ran
    16.7M 6-bit codes in 7.2 ms against 11.3 with the block tracked group by group).  Returns
    :func:`codec.kernels.cpu._codes._over_word` of every word, or-ed (0 with ``even = add = 0``)."""
    over = U(0)
    for g in range(g0, g1):
        w0 = _load8(data, g * U(bits))
        over |= _over_word(w0, bits, even, add)
        base = g * U(8)
        for j in range(U(8)):
            _put(dst, base + j, tab[(w0 >> (j * U(bits))) & mask], mode)
    return over



@jit
def _scaled_groups(data, g0, g1, bits, mask, lut, ab, ob, has_off, dst, mode, fm):
    """Groups ``g0..g1`` of eight codes of one block (factor ``ab``, offset ``ob``), each
    value ``lut[code] * ab (+ ob)`` rounded once: a function of its own, one loop per mode
    (inlined into the decoder, which holds a copy of its loops per mode, LLVM left the word
    reader a call per group: 25M 11-bit codes 7.6 -> 16.8 ms), and one for SET that checks
    the code fields as it reads them (``fm`` nonzero: :func:`_field_test`'s mask).  Returns
    the largest ``code & fm`` (0 with ``fm = 0``).  The check where the code is in a
    register: 25M 12-bit qsgd codes (``levels=1024``) decoded with their check in 9-10 ms,
    against 17-18 with ``fields_within``'s pass over the chunk before the decode."""
    if fm:
        return _scaled_loop(data, g0, g1, bits, mask, lut, ab, ob, has_off, dst, SET, fm)
    if mode == SET:
        return _scaled_loop(data, g0, g1, bits, mask, lut, ab, ob, has_off, dst, SET, U(0))
    if mode == ADD:
        return _scaled_loop(data, g0, g1, bits, mask, lut, ab, ob, has_off, dst, ADD, U(0))
    return _scaled_loop(data, g0, g1, bits, mask, lut, ab, ob, has_off, dst, SUB, U(0))


@jit(inline="always")
def _scaled_loop(data, g0, g1, bits, mask, lut, ab, ob, has_off, dst, mode, fm):
    """:func:`_scaled_groups`' loop for one ``mode`` (and field mask: 0 checks nothing)."""
    top = U(0)
    for g in range(g0, g1):
        p = g * U(bits)
        w0 = _load8(data, p)
        w1 = _load8(data, p + U(8)) if bits > 8 else U(0)
        base = g * U(8)
        for j in range(U(8)):
            code = _group_code(w0, w1, j, bits, mask)
            top = max(top, code & fm)
            v = lut[code] * ab
            _put(dst, base + j, v + ob if has_off else v, mode)
    return top



#: the shortest block whose 8-bit codes decode through a table of its 256 values
_TABLE_BLOCK = 1024
#: codes of up to 8 bits decode through a table of their block's ``2**bits`` values when the
#: block holds at least this many codes per entry.  25M t(3) values, two runs each, with the
#: table against without it: qsgd(16) 21.0-24.7 against 30.7-32.1 ms, qsgd(127) 19.6-23.0
#: against 29.2-30.2, qsgd(4) 19.9-22.0 against 30.5-31.6, minmax(bits=4) 17.5-22.2 against
#: 22.0-22.5 (qsgd's 512-value buckets hold 2 codes per entry of its 8-bit codes)
_TABLE_PER_CODE = 2



@jit(inline="always")
def _block_table(lut, ab, ob, has_off, tab):
    """``tab[c] = lut[c] * ab (+ ob)``, rounded once to ``tab``'s dtype: a block's value of
    every code, the same bits as computing each code's value."""
    for c in range(tab.size):
        v = lut[c] * ab
        tab[c] = v + ob if has_off else v



@jit(inline="always")
def _dequantize_bytes(data, lo, hi, lut, block, a, off, dst, mode, fm):
    """Values ``lo..hi`` of 8-bit codes, block by block: the block's 256 values
    ``lut[c] * a[b] (+ off[b])`` rounded once to ``dst``'s dtype into a table, then one
    gather from it per code (the same values, bit for bit, as computing each code's value; a
    plain byte-indexed loop that runs ~1.3x faster than the word-at-a-time path).  Returns
    the largest ``code & fm`` (:func:`dequantize_checked`'s field test in the same loop)."""
    has_off = off.size > 0
    tab = np.empty(256, dst.dtype)
    top = np.uint8(0)
    f = np.uint8(fm)
    i = lo
    while i < hi:
        b = i // block
        end = min(hi, (b + 1) * block)
        ab = a[b]
        ob = off[b] if has_off else 0.0
        for c in range(256):
            v = lut[c] * ab
            tab[c] = v + ob if has_off else v
        for j in range(U(i), U(end)):
            code = data[j]
            top = max(top, code & f)
            _put(dst, j, tab[code], mode)
        i = end
    return U(top)
