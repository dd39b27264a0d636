"""Little-endian byte loads and stores (Numba CPU) shared by the ``pack`` family's kernels
(codec/kernels/cpu/pack.py) and the quantizer runs' reader (quantrun.py); their CUDA
twins are compiled from this source (codec/kernels/cuda/pack.py).  Byte by byte in the
source, so they read and write at any offset; LLVM merges the eight-byte forms into one
load or store."""

from __future__ import annotations

import numpy as np

from codec._jit import jit


@jit
def _put(out, pos, w, nb):
    """Store the low ``nb`` bytes of uint64 ``w`` little-endian at ``out[pos:]``."""
    p = np.uint64(pos)
    for t in range(nb):
        out[p + np.uint64(t)] = np.uint8((w >> np.uint64(8 * t)) & np.uint64(0xFF))


@jit
def _put8(out, pos, w):
    """Store uint64 ``w`` little-endian at ``out[pos:pos+8]`` (LLVM merges this into one store)."""
    p = np.uint64(pos)
    for t in range(8):
        out[p + np.uint64(t)] = np.uint8((w >> np.uint64(8 * t)) & np.uint64(0xFF))


@jit
def _get8(data, pos):
    """uint64 from ``data[pos:pos+8]`` little-endian (LLVM merges this into one load)."""
    p = np.uint64(pos)
    w = np.uint64(0)
    for t in range(8):
        w |= np.uint64(data[p + np.uint64(t)]) << np.uint64(8 * t)
    return w


@jit
def _get(data, pos, nb):
    """uint64 from the ``nb`` (0..8) bytes at ``data[pos:]``, little-endian."""
    if nb == 8:
        return _get8(data, pos)
    p = np.uint64(pos)
    w = np.uint64(0)
    for t in range(nb):
        w |= np.uint64(data[p + np.uint64(t)]) << np.uint64(8 * t)
    return w
