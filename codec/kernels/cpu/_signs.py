"""Floats' sign bits (Numba CPU), the kernels of the ``pack`` family's ``sign_bits``
(codec/kernels/cpu/pack.py): the top bit of each word of many tensors at once, one bit per value
LSB-first, a byte of output per iteration, its tensor found by a binary search of the
output offsets.  AdaComp codes its kept values' signs this way.  ``_sign_byte`` and
``_sign_out`` are also the CUDA twin's device functions, compiled from their source
(codec/kernels/cuda/pack.py).
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._common import owner


@jit
def _sign_byte(words, lo, n, top, j):
    """Byte ``j`` of the sign bits of ``words[lo:lo+n]``: their top bits, LSB-first."""
    b = np.uint64(0)
    first = np.int64(j) * 8
    for i in range(first, min(n, first + 8)):
        b |= ((np.uint64(words[lo + i]) >> top) & np.uint64(1)) << np.uint64(i - first)
    return np.uint8(b)


@jit
def _sign_out(words, starts, ostarts, top, b):
    """Byte ``b`` of :func:`sign_bits`' output: ``(whether a segment's bits lie there, the
    byte)`` (a device function of the CUDA twin too)."""
    t = owner(ostarts, b)
    if t < 0:
        return False, np.uint8(0)
    lo = starts[t]
    n = starts[t + 1] - lo
    j = b - ostarts[t]
    if j >= (n + 7) // 8:
        return False, np.uint8(0)
    return True, _sign_byte(words, lo, n, top, j)


@jit(parallel=True)
def _sign_bits(words, starts, ostarts, top, out):
    for b in prange(out.size):
        ok, v = _sign_out(words, starts, ostarts, top, b)
        if ok:
            out[b] = v
