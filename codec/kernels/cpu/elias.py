"""QSGD's Elias coder (Numba CPU): run-length Elias-gamma streams of QSGD codes
(docs/codecs.md, "qsgd").

* ``elias_sizes`` / ``elias_encode``: one stream per bucket group (``codec.layout``), each
  padded to whole bytes, so groups code in parallel; the frame stores each one's length.
* ``elias_decode``: the codes back, with every count, run and level checked against what an
  encoder writes (a damaged stream is reported per chunk, never read past its end).
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._common import U

__all__ = ["elias_sizes", "elias_encode", "elias_decode"]


@jit
def _bitlen(v):
    n = U(0)
    while v:
        n += U(1)
        v >>= U(1)
    return n


@jit
def _put_gamma(out, pos, v):
    """Write Elias-gamma(v >= 1) at bit ``pos`` of ``out`` (zeroed, LSB-first stream): bitlen-1
    zeros, then v's bits from the most significant; returns the next position."""
    nb = _bitlen(v)
    pos += nb - U(1)
    for t in range(nb):
        if (v >> (nb - U(1) - U(t))) & U(1):
            out[pos >> U(3)] |= np.uint8(1) << np.uint8(pos & U(7))
        pos += U(1)
    return pos


@jit
def _elias_chunk(codes, lo, hi, bucket, out, pos, write):
    """The run-length Elias-gamma stream of QSGD codes ``codes[lo:hi]`` (whole buckets) from bit
    ``pos``: per bucket gamma(nnz + 1), then per non-zero level gamma(zeros before it + 1), its
    sign bit and gamma(level).  With ``write`` false only the length is counted."""
    for b in range(lo, hi, bucket):
        e = min(hi, b + bucket)
        nnz = U(0)
        for i in range(b, e):
            nnz += U(codes[i] >> 1 != 0)
        pos = _put_gamma(out, pos, nnz + U(1)) if write else pos + U(2) * _bitlen(nnz + U(1)) - U(1)
        run = U(0)
        for i in range(b, e):
            level = U(codes[i] >> 1)
            if level == 0:
                run += U(1)
                continue
            if write:
                pos = _put_gamma(out, pos, run + U(1))
                if codes[i] & 1:
                    out[pos >> U(3)] |= np.uint8(1) << np.uint8(pos & U(7))
                pos += U(1)
                pos = _put_gamma(out, pos, level)
            else:
                pos += U(2) * _bitlen(run + U(1)) + U(2) * _bitlen(level) - U(1)
            run = U(0)
    return pos


@jit(parallel=True)
def elias_sizes(codes, bucket, per, nbytes):
    """Bytes of each chunk's Elias stream (``per`` buckets per chunk, padded to whole bytes)."""
    n = codes.size
    span = per * bucket
    nothing = np.zeros(1, np.uint8)
    for c in prange(nbytes.size):
        bits = _elias_chunk(codes, c * span, min(n, (c + 1) * span), bucket, nothing, U(0), False)
        nbytes[c] = (bits + U(7)) >> U(3)


@jit(parallel=True)
def elias_encode(codes, bucket, per, starts, out):
    """Write each chunk's Elias stream at byte ``starts[c]`` of ``out`` (zeroed)."""
    n = codes.size
    span = per * bucket
    for c in prange(starts.size):
        _elias_chunk(codes, c * span, min(n, (c + 1) * span), bucket, out, U(starts[c]) * U(8), True)


@jit
def _get_gamma(data, pos, end):
    """Read an Elias-gamma value at bit ``pos`` (stream ends at bit ``end``): (value, next
    position); value 0 when the stream is damaged (runs out, or more than 63 leading zeros)."""
    z = U(0)
    while True:
        if pos >= end or z > U(63):
            return U(0), pos
        bit = (data[pos >> U(3)] >> np.uint8(pos & U(7))) & np.uint8(1)
        pos += U(1)
        if bit:
            break
        z += U(1)
    if pos + z > end:
        return U(0), pos
    v = U(1)
    for _ in range(z):
        v = (v << U(1)) | U((data[pos >> U(3)] >> np.uint8(pos & U(7))) & np.uint8(1))
        pos += U(1)
    return v, pos


@jit(parallel=True)
def elias_decode(data, starts, n, bucket, per, levels, codes, bad):
    """QSGD codes from the chunked Elias streams (``starts``: each chunk's first byte, plus the
    end); ``bad[c]`` = 1 where a chunk's stream is damaged (a count, run or level out of range,
    or bits left over beyond its padding)."""
    for c in prange(bad.size):
        bad[c] = 0 if _decode_chunk(data, starts, n, bucket, per, levels, codes, c) else 1


@jit
def _decode_chunk(data, starts, n, bucket, per, levels, codes, c):
    """Chunk ``c`` of :func:`elias_decode`; returns whether its stream is whole."""
    span = per * bucket
    lo = c * span
    hi = min(n, lo + span)
    pos = U(starts[c]) * U(8)
    end = U(starts[c + 1]) * U(8)
    for b in range(lo, hi, bucket):
        e = min(hi, b + bucket)
        nnz, pos = _get_gamma(data, pos, end)
        if nnz == 0 or nnz - U(1) > U(e - b):
            return False
        i = U(b)
        for _ in range(nnz - U(1)):
            run, pos = _get_gamma(data, pos, end)
            if run == 0 or pos >= end:
                return False
            i += run - U(1)
            sign = (data[pos >> U(3)] >> np.uint8(pos & U(7))) & np.uint8(1)
            pos += U(1)
            level, pos = _get_gamma(data, pos, end)
            if level == 0 or level > U(levels) or i >= U(e):
                return False
            codes[i] = (level << U(1)) | U(sign)
            i += U(1)
    if end - pos >= U(8):
        return False
    while pos < end:  # the padding bits must be zero
        if (data[pos >> U(3)] >> np.uint8(pos & U(7))) & np.uint8(1):
            return False
        pos += U(1)
    return True
