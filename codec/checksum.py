"""The payload checksum, CRC-32C, on every thread of the budget.

A frame's payload CRC-32C (docs/format.md) is one pass over the payload: the ``crc32c``
package's SSE4.2 instruction runs at about 16 GB/s on one core, 3 ms for the 50 MB of an fp16
frame of 25M values, as much as the conversion itself.  :func:`crc32c` splits a large buffer
into one part per thread of the budget (``codec.threads.budget()``), checksums the parts at
once on the budget's threads (``codec.threads.each``; the package releases the GIL with
``gil_release_mode=1``, the kernels always), and
joins them with :func:`combine`, the CRC algebra of zlib's ``crc32_combine`` for the
Castagnoli polynomial.  The value is the CRC-32C of the whole buffer, bit for bit, whatever
the thread count.  Where the CPU folds 256-byte blocks with VPCLMULQDQ
(codec/kernels/cpu/_crc.py, ``FOLD``) and the kernels are loaded, parts of 16 KB or more are
checksummed by the kernels' CRC instead of the package (about 60 GB/s on one core).
"""

from __future__ import annotations

import sys

import crc32c as _crc32c

from codec import threads

__all__ = ["FOLD_MIN", "PARALLEL_MIN", "POLY", "combine", "crc32c", "zero_operators"]

#: buffers shorter than this are checksummed in one call (a thread hand-off costs ~20 us)
PARALLEL_MIN = 8 << 20
#: the reflected Castagnoli polynomial
POLY = 0x82F63B78

_ZEROS = None  # uint32[64, 32]: row k, the 32x32 GF(2) operator of appending 2**k zero bytes


def zero_operators():
    """``ops[k]`` (k = 0..63): the 32x32 GF(2) operator (32 columns of 32 bits, a uint32 array)
    that carries a reflected CRC-32C register through ``2**k`` zero bytes, by squaring from
    one zero bit, as zlib's ``crc32_combine`` builds them; computed once.  What :func:`combine`
    applies, and what the kernels that checksum chunks join them with (codec/kernels/cpu/_crc.py)."""
    global _ZEROS
    if _ZEROS is None:
        import numpy as np

        bits = np.arange(32, dtype=np.uint32)

        def times(mat, vecs):  # mat applied to each of vecs
            sel = ((vecs[:, None] >> bits[None, :]) & np.uint32(1)).astype(bool)
            return np.bitwise_xor.reduce(np.where(sel, mat[None, :], np.uint32(0)), axis=1).astype(np.uint32)

        op = np.concatenate(([POLY], np.uint32(1) << np.arange(31, dtype=np.uint32))).astype(np.uint32)  # one zero bit
        for _ in range(3):  # 2, 4, 8 bits: one byte
            op = times(op, op)
        ops = np.empty((64, 32), np.uint32)
        for k in range(64):
            ops[k] = op
            op = times(op, op)
        ops.flags.writeable = False
        _ZEROS = ops  # (two threads computing it at once set the same value)
    return _ZEROS


def _times(mat, vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= int(mat[i])
        vec >>= 1
        i += 1
    return out


def combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32C of ``A + B`` from ``crc1 = crc32c(A)``, ``crc2 = crc32c(B)`` and ``len2 =
    len(B)``: ``crc1`` carried through ``len2`` zero bytes, then xored with ``crc2``."""
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _times(zero_operators()[k], crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2


def crc32c(buf, value: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``buf`` (a contiguous bytes-like object), continuing from the
    CRC ``value`` of the bytes before it: ``crc32c.crc32c(buf, value)``'s result, on up to
    ``codec.threads.budget()`` threads when ``buf`` is large, each part folded by the kernels'
    CRC where it can be (:func:`_part`)."""
    mv = memoryview(buf).cast("B")
    n = mv.nbytes
    parts = min(threads.budget(), 8, n // (PARALLEL_MIN // 2)) if n >= PARALLEL_MIN else 1
    if parts <= 1:
        return _part(mv, value)
    step = -(-n // parts)
    cuts = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
    crcs = [0] * len(cuts)

    def part(i, _):
        lo, hi = cuts[i]
        crcs[i] = _part(mv[lo:hi], value if i == 0 else 0)

    threads.each(len(cuts), part)
    crc = crcs[0]
    for (lo, hi), c in zip(cuts[1:], crcs[1:]):
        crc = combine(crc, c, hi - lo)
    return crc


#: the shortest part :func:`_part` hands to the kernels' CRC (below it the package's one call
#: costs less than viewing the bytes as an array and entering a kernel)
FOLD_MIN = 16 << 10


def _part(mv, value: int) -> int:
    """``crc32c.crc32c(mv, value)`` (``mv`` a memoryview of bytes), without the GIL (the
    package releases it for large buffers, Numba's kernels always): from
    :data:`FOLD_MIN` bytes by the kernels' CRC when they are loaded (every encode and decode
    loads them; this module never imports Numba) and fold 256-byte blocks on this CPU
    (``codec.kernels.cpu._crc.FOLD``: about twice the package's speed, the same value), else
    by the ``crc32c`` package."""
    kern = sys.modules.get("codec.kernels.cpu._crc")
    if kern is None or not kern.FOLD or mv.nbytes < FOLD_MIN:
        return _crc32c.crc32c(mv, value)
    import numpy as np

    return int(kern.crc_bytes(np.frombuffer(mv, np.uint8), 0, mv.nbytes, value))

