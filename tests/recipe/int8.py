"""``int8``: per-tensor absmax quantization to 8-bit integers (the recipe's example stage).

    scale = max|x| / 127                     (float64; 0 for an all-zero array)
    code  = clip(rint(x / scale), -127, 127)  (int8, round half to even, in float64)
    value = code * scale                     (float64, rounded once to the frame's dtype)

Sections: one SCALARS section (the scale, 64 bits), one VALUES section (n codes of 8 bits).
NaN/inf input raises :class:`codec.errors.NonFiniteError`.  A decoder refuses (as
``CorruptFrameError``) what no encoder writes: a scale that is negative, non-finite or
larger than the frame dtype's maximum / 127, and the code -128.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from codec.errors import CorruptFrameError, NonFiniteError
from codec.frame import SectionKind, Section
from codec.stage import Bound, Value, register

PACKAGE = "recipe.kernels"  # in the library: leave package= out (codec.kernels)
TOP = 127


@dataclass
class Payload:
    """What ``read`` returns: the codes as read from the frame, the scale, the frame's dtype."""

    codes: np.ndarray
    scale: float
    dtype: np.dtype


@register
class Int8(Value):
    """Per-tensor absmax int8 quantization (scale = max|x| / 127, round half to even)."""

    name = "int8"
    lossless = False

    def encode(self, values, ctx, sections):
        from codec.kernels import backend
        from codec.ops import first_nonfinite, readonly, widen

        x = readonly(np.ascontiguousarray(widen(values)).reshape(-1))  # 16-bit widened exactly
        kern = backend("int8", x, package=PACKAGE)
        m = kern.absmax(x)
        if m < 0:
            raise NonFiniteError("x", ctx.where(first_nonfinite(x)), self.name)
        scale = m / TOP
        codes = np.zeros(x.size, np.int8)
        if scale > 0:
            kern.quantize(x, scale, codes)
        sections.append(Section(SectionKind.SCALARS, 64, 1, np.array([scale], "<f8")))
        sections.append(Section(SectionKind.VALUES, 8, codes.size, codes))

    def bound(self, ctx):
        """Always the float64 scale and one byte per value, whatever the values: exact."""
        return Bound(2, 8 + ctx.n)

    def read(self, reader, ctx, count):
        from codec.kernels import backend
        from codec.ops import readonly

        _, raw = reader.take(SectionKind.SCALARS, bits=64, count=1)
        scale = float(raw.view("<f8")[0])
        if not 0 <= scale <= float(ml_dtypes.finfo(ctx.dtype).max) / TOP:
            raise CorruptFrameError(f"int8: scale {scale!r} is not one an encoder writes for {ctx.dtype}")
        _, raw = reader.take(SectionKind.VALUES, bits=8, count=count)
        codes = readonly(raw.view(np.int8))
        if backend("int8", codes, package=PACKAGE).invalid_codes(codes):
            raise CorruptFrameError("int8: code -128, which no encoder writes")
        return Payload(codes, scale, ctx.dtype)

    def write(self, payload, out, mode):
        from codec.kernels import backend
        from codec.ops import round_to, store

        wide = np.empty(payload.codes.size, np.float64)
        backend("int8", wide, package=PACKAGE).dequantize(payload.codes, payload.scale, wide)
        store(round_to(wide, payload.dtype), out, mode)  # rounded once to the frame's dtype
