"""The ``int8`` family on the CPU (docs/adding-a-codec.md): the stage's whole numeric work.

``__all__`` is the contract a CUDA twin (``kernels/cuda/int8.py``) would provide under the
same names and arguments.  Decorated with the project's jit (``codec._jit``: cache, no
fastmath, compiled on first call); imported only from inside the stage's methods.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit

__all__ = ["absmax", "dequantize", "invalid_codes", "quantize"]

#: the largest code; -128 is never written (the code range is symmetric)
TOP = 127


@jit
def absmax(x):
    """max |x| over a float32/float64 array (0.0 when empty), or -1.0 if any value is NaN/inf."""
    m = 0.0
    for i in range(x.size):
        v = abs(np.float64(x[i]))
        if not v <= 1.7976931348623157e308:  # NaN or inf
            return -1.0
        if v > m:
            m = v
    return m


@jit
def quantize(x, scale, out):
    """``out[i] = clip(rint(x[i] / scale), -127, 127)`` in float64 (``scale > 0``), as int8."""
    for i in range(x.size):
        q = np.rint(np.float64(x[i]) / scale)
        if q > TOP:
            q = TOP
        elif q < -TOP:
            q = -TOP
        out[i] = np.int8(q)


@jit
def invalid_codes(codes):
    """How many codes an encoder never writes (-128)."""
    bad = 0
    for i in range(codes.size):
        if codes[i] < -TOP:
            bad += 1
    return bad


@jit
def dequantize(codes, scale, out):
    """``out[i] = codes[i] * scale``, exact in float64 (a float64 ``out``)."""
    for i in range(codes.size):
        out[i] = np.float64(codes[i]) * scale
