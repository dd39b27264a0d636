"""Counter-based random bits shared by the kernels (Numba CPU), integer-only so a CUDA twin
reproduces them bit for bit (docs/codecs.md, "The random stream").

* ``mix``: SplitMix64's finaliser.
* ``stream(seed, khash, step)``: one uint64 per frame, keyed by (seed, tensor key, step).
* ``block_key(stream, i)`` and ``bits32(key, i)``: value ``i`` gets
  ``h32((mix(stream + (i >> 16)) mod 2**32) + (i mod 2**16))``; the 64-bit mix runs once per
  65,536 values, the 32-bit hash (which vectorises) once per value.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit
from codec.kernels.cpu._common import mul
from codec.layout import SPAN, SPAN_BITS, TO_UNIT

__all__ = ["mix", "stream", "block_key", "bits32", "uniform"]

_SHIFT = np.uint64(SPAN_BITS)
_LOW = np.uint64(SPAN - 1)


@jit
def mix(z):
    """SplitMix64's finaliser (uint64 in, uint64 out)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@jit
def stream(seed, khash, step):
    """The frame's stream ``mix(mix(mix(seed) ^ khash) ^ step)``."""
    return mix(mix(mix(np.uint64(seed)) ^ np.uint64(khash)) ^ np.uint64(step))


@jit
def block_key(strm, i):
    """The 32-bit key of the ``SPAN`` (65,536) values around value ``i``: low half of
    ``mix(stream + (i >> 16))``."""
    return np.uint32(mix(strm + (np.uint64(i) >> _SHIFT)) & np.uint64(0xFFFFFFFF))


@jit
def bits32(key, i):
    """32 random bits for value ``i``: ``h32(key + (i mod 2**16))`` (Wellons' 2-round hash)."""
    x = np.uint32(key + np.uint32(np.uint64(i) & _LOW))
    x = np.uint32(x ^ (x >> np.uint32(16)))
    x = np.uint32(x * np.uint32(0x21F0AAAD))
    x = np.uint32(x ^ (x >> np.uint32(15)))
    x = np.uint32(x * np.uint32(0x735A2D97))
    return np.uint32(x ^ (x >> np.uint32(15)))


@jit
def uniform(key, i):
    """``bits32(key, i) / 2**32``: uniform on [0, 1), float64 (exact)."""
    return mul(np.float64(bits32(key, i)), TO_UNIT)
