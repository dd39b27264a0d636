"""Float format conversion kernels (Numba CPU): float32/float64 -> fp16/bf16 codes and back.

The encoder (``narrow_codes``) rounds to nearest, ties to even (float64 through float32
rounded to odd first), and counts non-finite inputs; the decoder (``half_decode``) writes
each code's exact value (NaN payloads included), stored, added or subtracted into the
output; ``half_feedback`` is the fused error-feedback step and ``half_combine`` adds into
16-bit outputs.  Each runs one chunk at a time through the per-block loops and scalar rules
of :mod:`codec.kernels.cpu._half` (eight values at a time where the CPU allows, the same
bits).  The two kernels that write a frame's codes (``narrow_codes``, ``half_feedback``) can
also return their CRC-32C, each chunk checksummed while it is in cache
(``codec/kernels/cpu/_crc.py``), so the frame needs no second pass for its checksum;
``half_decode`` likewise checksums the codes it reads, for the decode's check of the frame.
The rest (``combine``, ``add``, ``momentum``, ``combine_odd``, ``scale``, ``divide``) are the
elementwise steps around them.

Work is cut into chunks whose boundaries depend only on the array length, so results never
depend on the thread count.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._common import U, chunk_segments, chunks, view_at
from codec.kernels.cpu._crc import crc_piece, crc_pieces, joined
from codec.kernels.cpu._half import STREAM, combine_block, decode_block, feedback_block, narrow_block, sum_odd
from codec.kernels.cpu._stream import STREAM_MIN
from codec.layout import CHUNK
from codec.modes import ADD, SET, SUB

__all__ = [
    "narrow_codes",
    "narrow_codes_segments",
    "half_decode",
    "half_decode_segments",
    "combine",
    "add",
    "momentum",
    "combine_odd",
    "half_combine",
    "half_feedback",
    "scale",
    "divide",
]


@jit(parallel=True)
def narrow_codes(x, out, bf16, crc):
    """fp16 (``bf16=False``) or bf16 codes of float32/float64 ``x``, correctly rounded to nearest
    even.  Every value goes through float32 rounded to odd (exact for float32 input), so
    float64 input is not double-rounded.

    Returns ``(non-finite count, crc)``: with ``crc >= 0`` the CRC-32C of the codes' bytes
    continued from ``crc`` (each chunk checksummed as it is written), or -1 when this CPU
    cannot (the caller then checksums ``out``); ``crc < 0`` asks for none (-1)."""
    n = x.size
    nchunk = chunks(n)
    bad = np.zeros(nchunk, np.int64)
    sums, lens = crc_pieces(nchunk, crc)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        bad[c] = narrow_block(x[lo:hi], out[lo:hi], bf16)
        if sums.size:
            crc_piece(sums, lens, c, out, lo, hi)
    return bad.sum(), joined(sums, lens, crc)


@jit(parallel=True)
def narrow_codes_segments(out, addrs, starts, like, bf16, crc=-1):
    """:func:`narrow_codes` of many tensors into one run of codes: tensor ``t`` is the array of
    ``starts[t+1] - starts[t]`` values of ``like``'s dtype (float32 or float64) at address
    ``addrs[t]`` (the caller keeps them alive), and its codes are ``out[starts[t]:starts[t+1]]``.
    One parallel pass over the whole run in chunks of the run, so a many-tensor frame of a
    whole model costs what one tensor of its size costs.  Returns ``(non-finite count, crc)``
    as :func:`narrow_codes` does."""
    n = out.size
    nchunk = chunks(n)
    bad = np.zeros(nchunk, np.int64)
    sums, lens = crc_pieces(nchunk, crc)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        rows = chunk_segments(starts, lo, hi)
        for j in range(rows.shape[0]):
            t, a, b = rows[j, 0], rows[j, 1], rows[j, 2]
            x = view_at(like, addrs[t], starts[t + 1] - starts[t])
            bad[c] += narrow_block(x[a - starts[t] : b - starts[t]], out[a:b], bf16)
        if sums.size:
            crc_piece(sums, lens, c, out, lo, hi)
    return bad.sum(), joined(sums, lens, crc)


@jit(parallel=True)
def half_decode(codes, out, mode, bf16, crc=-1):
    """``out (=|+=|-=) value(codes)`` for fp16 (``bf16=False``) or bf16 codes into a
    float32/float64 ``out``; ``mode`` is SET, ADD or SUB.  Values are exact (NumPy's cast of
    every code, NaN payloads included).

    Returns, with ``crc >= 0``, the CRC-32C of the codes' bytes continued from ``crc``, each
    chunk checksummed right after it is read (a decode verifies its frame's payload in the
    same pass: :class:`codec.payloadcheck.PayloadCheck`), or -1 when this CPU cannot; ``crc < 0``
    (the default) asks for none (-1).  From ``STREAM_MIN`` values a SET writes ``out`` with
    streaming stores (:mod:`codec.kernels.cpu._stream`)."""
    n = codes.size
    nchunk = chunks(n)
    sums, lens = crc_pieces(nchunk, crc)
    how = STREAM if mode == SET and n >= STREAM_MIN else mode
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        decode_block(codes[lo:hi], out[lo:hi], how, bf16)
        if sums.size:
            crc_piece(sums, lens, c, codes, lo, hi)
    return joined(sums, lens, crc)


@jit(parallel=True)
def half_decode_segments(codes, addrs, starts, like, mode, bf16, crc=-1):
    """:func:`half_decode` of the codes of many tensors end to end, each into its own array:
    tensor ``t``'s codes are ``codes[starts[t]:starts[t+1]]`` and its output is the array of
    ``like``'s dtype at address ``addrs[t]`` (float32 or float64; the caller keeps them
    alive).  One parallel pass over the whole run, in chunks of the run (a many-tensor
    decode of a whole model costs what one tensor of its size costs), the codes checksummed
    and a large run's outputs streamed as with ``half_decode``."""
    n = codes.size
    nchunk = chunks(n)
    sums, lens = crc_pieces(nchunk, crc)
    how = STREAM if mode == SET and n >= STREAM_MIN else mode
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        rows = chunk_segments(starts, lo, hi)
        for j in range(rows.shape[0]):
            t, a, b = rows[j, 0], rows[j, 1], rows[j, 2]
            o = view_at(like, addrs[t], starts[t + 1] - starts[t])
            decode_block(codes[a:b], o[a - starts[t] : b - starts[t]], how, bf16)
        if sums.size:
            crc_piece(sums, lens, c, codes, lo, hi)
    return joined(sums, lens, crc)


@jit(parallel=True)
def combine(src, out, mode):
    """``out (=|+=|-=) src`` elementwise (same length); casting to ``out``'s dtype."""
    n = src.size
    nchunk = chunks(n)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        if mode == SET:
            for i in range(lo, hi):
                out[i] = src[i]
        elif mode == ADD:
            for i in range(lo, hi):
                out[i] += src[i]
        else:
            for i in range(lo, hi):
                out[i] -= src[i]


@jit(parallel=True)
def add(x, r, out):
    """``out = x + r`` elementwise in the arrays' dtype (error feedback's ``acc = x +
    residual``), one pass over the three arrays (NumPy's ``np.add`` runs on one thread)."""
    n = x.size
    for c in prange(chunks(n)):
        lo = c * CHUNK
        for i in range(U(lo), U(min(n, lo + CHUNK))):
            out[i] = x[i] + r[i]


@jit(parallel=True)
def momentum(u, m, x, out):
    """``out = u * m + x`` elementwise in the arrays' dtype, the product rounded before the
    sum (DGC's momentum ``u = m*u + x``, as NumPy's two operations give it); ``m`` a scalar of
    that dtype."""
    n = x.size
    for c in prange(chunks(n)):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            out[i] = u[i] * m + x[i]


@jit(parallel=True)
def combine_odd(src, out, mode):
    """``out (+|-)= src`` for ADD/SUB: the float64 sum rounded to odd (``sum_odd``), cast to ``out``.

    Into a float32 ``out`` the cast then rounds the exact sum once; a float64 ``out`` keeps the
    round-to-odd value, ready for a correct narrowing to fp16/bf16.
    """
    n = src.size
    nchunk = chunks(n)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        # one loop per mode, no ``src * sign``: LLVM may turn a multiply by a visible -1.0/1.0
        # select into a sign flip in one compilation and not the other, and a NaN's sign bit
        # then differs between the serial and the parallel twin
        if mode == SUB:
            for i in range(lo, hi):
                out[i] = sum_odd(np.float64(out[i]), -np.float64(src[i]))
        else:
            for i in range(lo, hi):
                out[i] = sum_odd(np.float64(out[i]), np.float64(src[i]))


@jit(parallel=True)
def half_combine(src, codes, mode, bf16):
    """16-bit output in place: ``codes = round(value(codes) (+|-) src)`` for ADD/SUB, rounded once.

    ``codes`` are the output's fp16 (``bf16=False``) or bf16 codes; the sum is formed in
    float64 rounded to odd, then rounded to odd again to float32 and to nearest-even to 16
    bits: the exact sum, correctly rounded.
    """
    n = src.size
    nchunk = chunks(n)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        combine_block(src[lo:hi], codes[lo:hi], mode, bf16)


@jit(parallel=True)
def half_feedback(x, r, acc, codes, bf16, crc):
    """Fused error-feedback step into fp16 (``bf16=False``) or bf16 codes, float32 only.

    a = x + r;  codes = round(a);  acc = a - value(codes)  (the new residual).  One pass per
    chunk: reads x and r, writes acc and codes (and checksums the chunk's codes while they
    are in cache).  ``acc`` must not alias ``r``: the caller keeps ``r`` intact until the
    step succeeds.  Returns ``(non-finite count of x + r, crc)``, ``crc`` as for
    :func:`narrow_codes`.
    """
    n = x.size
    nchunk = chunks(n)
    bad = np.zeros(nchunk, np.int64)
    sums, lens = crc_pieces(nchunk, crc)
    for c in prange(nchunk):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        bad[c] = feedback_block(x[lo:hi], r[lo:hi], acc[lo:hi], codes[lo:hi], bf16)
        if sums.size:
            crc_piece(sums, lens, c, codes, lo, hi)
    return bad.sum(), joined(sums, lens, crc)


@jit(parallel=True)
def scale(x, starts, factors, out):
    """``out[i] = float64(x[i]) * factors[t]`` for ``i`` in segment ``t`` (``starts``: one
    tensor ``[0, n]``, or a run's), rounded once to ``out``'s dtype (float32 or float64): the
    product NumPy's ``x.astype(np.float64) * factor`` gives, then its cast (random-k's
    unbiased values, ``scale=true``)."""
    for t in prange(starts.size - 1):
        f = factors[t]
        for i in range(starts[t], starts[t + 1]):
            out[i] = np.float64(x[i]) * f


@jit(parallel=True)
def divide(x, d, out):
    """``out = x / d`` elementwise in ``x``'s dtype (float32 or float64; ``d`` a scalar of it),
    correctly rounded: NumPy's ``np.divide(x, x.dtype.type(d))`` (an allreduce's average)."""
    n = x.size
    for c in prange(chunks(n)):
        lo = c * CHUNK
        for i in range(lo, min(n, lo + CHUNK)):
            out[i] = x[i] / d
