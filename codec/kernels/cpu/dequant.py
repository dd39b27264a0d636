"""The quantizers' decoder (Numba CPU): one table-driven kernel for every quantizer value
stage (docs/codecs.md, "Quantizers"), TernGrad's trit decoder and the decoders' range check.

* ``dequantize``: ``out (=|+=|-=) lut[code] * a[block] (+ off[block])`` from packed codes of
  any width 1..16, every value rounded once to ``out``'s dtype.
* ``trits_dequantize``: five trits per byte.
* ``max_field``: the largest field of any code, so a decoder can check that no code exceeds
  what an encoder writes; ``fields_within``: that check alone, eight codes a step.
* ``dequantize_segments`` / ``fields_within_segments``: the same over many tensors in one
  call (a run of small tensors, or a whole model's tensors of one dtype: per-tensor offsets,
  each tensor into its own array by address), one parallel region over (tensor, chunk) rows.

Chunks of ``CHUNK`` values (``codec.layout``) run in parallel; every value is decoded on its
own, so results never depend on the thread count.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._codes import _GROUPS, _dequantize_chunk, _max_field_chunk, _over_chunk, _over_row, _put, _rows
from codec.kernels.cpu._common import TRIT_CHUNK, U, chunks, task_span, view_at
from codec.kernels.cpu._crc import HARDWARE, combine, crc_bytes, crc_piece, crc_pieces, joined
from codec.modes import SET

__all__ = ["dequantize", "dequantize_checked", "dequantize_segments", "dequantize_segments_checked", "max_field", "fields_within", "fields_within_segments", "trits_dequantize"]


@jit(parallel=True)
def dequantize(data, bits, n, lut, block, a, off, out, mode):
    """``out[i] (=|+=|-=) lut[code_i] * a[b] (+ off[b])`` for the ``n`` codes of ``bits`` bits
    (1..16) packed LSB-first in ``data``, value ``i`` in block ``b = i // block``.  The
    float64 value is rounded once to ``out``'s dtype before it is added; ``off`` may be
    empty (no offset: a ``-0.0`` stays ``-0.0``).

    Codes are read eight at a time from whole words (``bits`` bytes hold eight codes); the
    block is tracked incrementally (a division per group cost ~4 cycles per value); groups
    that straddle a block boundary and the last few codes take a per-value path.  ADD and
    SUB add each value into ``out`` in place (:func:`_put`)."""
    for c in prange(chunks(n)):
        _dequantize_chunk(data, bits, n, lut, block, a, off, out, mode, c, 0, 0, 0)


@jit(parallel=True)
def dequantize_checked(data, bits, n, lut, block, a, off, out, fmask, fshift, largest, crc):
    """:func:`dequantize` into ``out`` (SET) of codes nobody has checked yet, checking them as
    each is read, so a decode reads its frame once (:class:`codec.payloadcheck.PayloadCheck`):
    every field ``(code & fmask) >> fshift`` must be at most ``largest`` (``fmask = 0``:
    nothing to check), and with ``crc >= 0`` each chunk's bytes of ``data`` are checksummed
    right after they are read.  ``lut`` must hold a value for every ``bits``-bit code (a code
    beyond ``largest`` is decoded before it is refused).

    Returns ``(within, crc)``: whether every field was within ``largest`` (when not, ``out``
    holds values of codes no encoder writes: the caller refuses the frame), and the CRC-32C
    of ``data``'s bytes continued from ``crc`` (-1 when ``crc < 0`` or this CPU cannot form
    it).  Through a block's table the check is a few operations on the word a group of codes
    is read from (:func:`_dequantize_chunk`): 25M qsgd values decode in 5.7-5.8 ms with the
    CRC and the check, against 7.4-8.3 ms for ``fields_within`` and the CRC before the decode."""
    nchunk = chunks(n)
    sums, lens = crc_pieces(nchunk, crc)
    over = np.zeros(nchunk, np.uint64)
    for c in prange(nchunk):
        over[c] = _dequantize_chunk(data, bits, n, lut, block, a, off, out, SET, c, fmask, fshift, largest)
        if sums.size:
            crc_piece(sums, lens, c, data, c * _GROUPS * bits, data.size if c == nchunk - 1 else (c + 1) * _GROUPS * bits)
    return not over.any(), joined(sums, lens, crc)


@jit(parallel=True)
def dequantize_segments(data, dstarts, bits, starts, lut, blocks, a, astarts, off, out, addrs, mode):
    """:func:`dequantize` of many tensors at once (a many-tensor frame's run, or a whole
    model's tensors of one dtype): tensor ``t``'s ``starts[t+1] - starts[t]`` codes are packed
    from byte ``dstarts[t]`` of ``data`` and decode with blocks of ``blocks[t]`` values and its
    per-block factors ``a[astarts[t]:astarts[t+1]]`` (and the same slice of ``off`` when ``off``
    is not empty) into ``out[starts[t]:starts[t+1]]``, or, when ``addrs`` is not empty, into
    the array of ``out``'s dtype at the address ``addrs[t]`` (each tensor's own output; the
    caller keeps them alive).  Exactly what one :func:`dequantize` per tensor gives.

    One parallel region over every (tensor, chunk) row, in tasks of about equal work
    (``_codes._rows``), so a model of a few large tensors and many small ones keeps every
    thread busy, and pays one wake-up of the pool, not one per tensor."""
    rows, done, tasks = _rows(starts)
    for task in prange(tasks):
        first, last = task_span(done, task, tasks)
        for r in range(first, last):
            _segment_row(data, dstarts, bits, starts, rows, r, lut, blocks, a, astarts, off, out, addrs, mode, 0, 0, 0)


@jit(parallel=True)
def dequantize_segments_checked(data, dstarts, bits, starts, lut, blocks, a, astarts, off, out, addrs, fmask, fshift, largest, crc):
    """:func:`dequantize_segments` (SET) of codes nobody has checked yet, checking each field
    and checksumming each chunk as :func:`dequantize_checked` does: returns ``(within,
    crc)``, ``crc`` the CRC-32C of all of ``data``'s bytes (a run's: its tensors' codes and
    the per-block numbers between them, which are checksummed after the decode) continued
    from ``crc``, -1 when ``crc < 0`` or this CPU cannot form it.  ``dstarts`` must grow."""
    rows, done, tasks = _rows(starts)
    sums, lens = crc_pieces(rows[-1], crc)
    over = np.zeros(rows[-1], np.uint64)
    for task in prange(tasks):
        first, last = task_span(done, task, tasks)
        for r in range(first, last):
            over[r] = _segment_row(data, dstarts, bits, starts, rows, r, lut, blocks, a, astarts, off, out, addrs, SET, fmask, fshift, largest)
            if sums.size:
                t = np.searchsorted(rows, r, side="right") - 1
                k = r - rows[t]
                nbytes = ((starts[t + 1] - starts[t]) * bits + 7) // 8
                end = nbytes if r == rows[t + 1] - 1 else (k + 1) * _GROUPS * bits
                crc_piece(sums, lens, r, data, dstarts[t] + k * _GROUPS * bits, dstarts[t] + end)
    if crc < 0 or not HARDWARE:
        return not over.any(), np.int64(-1)
    c = np.uint32(crc)  # the pieces in the run's order, the bytes between them checksummed here
    at = 0
    for t in range(starts.size - 1):
        c = crc_bytes(data, at, dstarts[t], c) if dstarts[t] > at else c
        for r in range(rows[t], rows[t + 1]):
            c = combine(c, sums[r], lens[r])
        at = dstarts[t] + ((starts[t + 1] - starts[t]) * bits + 7) // 8
    return not over.any(), np.int64(crc_bytes(data, at, data.size, c) if data.size > at else c)


@jit(inline="always")
def _segment_row(data, dstarts, bits, starts, rows, r, lut, blocks, a, astarts, off, out, addrs, mode, fmask, fshift, largest):
    """Row ``r`` of :func:`dequantize_segments` (chunk ``r - rows[t]`` of tensor ``t``);
    returns :func:`_dequantize_chunk`'s field flag."""
    t = np.searchsorted(rows, r, side="right") - 1
    n = starts[t + 1] - starts[t]
    d = data[dstarts[t] : dstarts[t] + (n * bits + 7) // 8]
    at = a[astarts[t] : astarts[t + 1]]
    ot = off[astarts[t] : astarts[t + 1]] if off.size else off
    dst = view_at(out, addrs[t], n) if addrs.size else out[starts[t] : starts[t + 1]]
    return _dequantize_chunk(d, bits, n, lut, blocks[t], at, ot, dst, mode, r - rows[t], fmask, fshift, largest)



@jit(parallel=True)
def max_field(data, bits, n, fmask, fshift):
    """The largest ``(code & fmask) >> fshift`` over the ``n`` codes packed in ``data`` (as for
    ``dequantize``): decoders check that no code lies beyond what an encoder writes.

    The shift is monotone, so it is applied once to the largest masked code; 8- and 16-bit
    codes (fp8, rangefloat(bits=16), the byte-wide quantizers) are whole bytes and take a
    plain loop that vectorises (3.4 -> ~1 ms for 25M fp8 codes)."""
    nchunk = chunks(n)
    top = np.zeros(nchunk, np.uint64)
    for c in prange(nchunk):
        top[c] = _max_field_chunk(data, bits, n, fmask, c)
    return (top.max() if nchunk else U(0)) >> U(fshift)


@jit(parallel=True)
def fields_within(data, bits, n, fmask, fshift, largest):
    """Whether every ``(code & fmask) >> fshift`` of the ``n`` codes packed in ``data`` is at
    most ``largest``: ``max_field(...) <= largest``, what a decoder checks, in a quarter of
    its time (25M 6-bit codes: 2.8 against 10.2 ms).

    Codes of up to 8 bits are tested eight at a time in the 64-bit word that holds them
    (SWAR): a masked code ``m`` plus ``2**bits - T`` carries out of its ``bits``-bit slot
    exactly when ``m >= T = (largest + 1) << fshift``; the even and the odd slots are added
    apart, so each carry lands in a slot that was masked to zero.  Wider codes take
    :func:`max_field`'s loop."""
    nchunk = chunks(n)
    over = np.zeros(nchunk, np.uint64)
    for c in prange(nchunk):
        over[c] = _over_chunk(data, bits, n, fmask, fshift, largest, c)
    return not over.any()


@jit(parallel=True)
def fields_within_segments(data, dstarts, bits, starts, fmask, fshift, largest):
    """:func:`fields_within` over many tensors' codes (as :func:`dequantize_segments` reads
    them), in one parallel region over their (tensor, chunk) rows."""
    rows, done, tasks = _rows(starts)
    over = np.zeros(rows[-1], np.uint64)
    for task in prange(tasks):
        first, last = task_span(done, task, tasks)
        for r in range(first, last):
            over[r] = _over_row(data, dstarts, bits, starts, rows, r, fmask, fshift, largest)
    return not over.any()


@jit
def _trit_values(vals3, like):
    """Every trit byte's five values, ``tab[b, r] = vals3[trit r of b]`` in ``like``'s dtype
    (rounded once), for the 243 bytes a frame may hold."""
    tab = np.empty((243, 5), like.dtype)
    for b in range(243):
        t = b
        for r in range(5):
            tab[b, r] = vals3[t % 3]
            t //= 3
    return tab


@jit(parallel=True)
def trits_dequantize(data, n, vals3, out, mode):
    """TernGrad decode: ``out[i] (=|+=|-=) vals3[trit_i]`` (rounded once to ``out``'s dtype),
    trits five per byte, ``t0 + 3*t1 + 9*t2 + 27*t3 + 81*t4`` (every byte below 243: the
    reader checked).  Each byte's five values are copied from a table of the 243 bytes'
    values (:func:`_trit_values`); dividing each byte by 3 five times took twice as long
    (25M values: 10.2-10.5 -> 5.3-5.5 ms, memcpy 5.3-5.6)."""
    nbytes = (n + 4) // 5
    per = TRIT_CHUNK // 5
    tab = _trit_values(vals3, out)
    for c in prange((nbytes + per - 1) // per):
        j0, j1 = c * per, min(nbytes, (c + 1) * per)
        for j in range(j0, min(j1, n // 5)):  # whole bytes: five values each
            row = tab[data[j]]
            for r in range(5):
                _put(out, j * 5 + r, row[r], mode)
        for j in range(max(j0, n // 5), j1):  # the last byte, holding fewer
            for r in range(n - j * 5):
                _put(out, j * 5 + r, tab[data[j], r], mode)
