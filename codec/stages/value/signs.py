"""One bit per value: ``sign(scale=none|l1)`` (signSGD), ``efsign`` (EF-signSGD) and ``onebit``
(1-bit SGD's two reconstruction values); docs/codecs.md.  Zero counts as non-negative."""

from __future__ import annotations

import math

import numpy as np

from codec.device import Memory
from codec.dtypes import on_device
from codec.frame import SectionKind, Section, raw_length
from codec.stages.value.dequant import Dequant, top_of
from codec.stages.value.quantizer import Quantizer
from codec.stages.value.sections import F32_MAX, read_codes, read_scalars, scalars_bytes, scalars_section, scale_section, sequential_sum
from codec.params import Param
from codec.stage import Bound, register
from codec.kernels import backend
from codec.layout import chunks, LANES
from codec.ops import round_to


class _Bits(Quantizer):
    """Sign bits (1 = negative) plus whatever reconstruction values ``levels`` gives."""

    def quantize(self, x, ctx, sections):
        n = x.size
        nchunk = chunks(n)
        out = Memory(on_device(x)).empty(-(-n // 8), np.uint8)  # (device codes stay there until the frame is written)
        sums, nneg, bad = np.zeros((nchunk, 3)), np.zeros(nchunk, np.int64), np.zeros(nchunk, np.int64)
        if n:
            backend("quantize", x).sign_encode(x, out, LANES, sums, nneg, bad)
        if bad.any():
            self.raise_nonfinite(x, ctx)
        self.add_levels(sections, n, [sequential_sum(sums[:, j]) for j in range(3)], int(nneg.sum()), ctx.dtype)
        sections.append(Section(SectionKind.VALUES, 1, n, out))

    def bound(self, ctx):
        """The reconstruction values' sections (:meth:`levels_bound`), then one bit per value."""
        return self.levels_bound(ctx) + Bound(1, raw_length(ctx.n, 1))

    def read(self, reader, ctx, count):
        lut = self.read_levels(reader, ctx)
        data = read_codes(reader, 1, count, device=ctx.codes_on_device)
        return Dequant(data, 1, count, lut, count, np.ones(1), np.empty(0), ctx.dtype)


@register
class Sign(_Bits):
    """signSGD: one bit per value (1 = negative, zero positive); decoded +-1 or +-mean|x| (scale=l1)."""

    name = "sign"
    params = (Param("scale", str, "none", "none: decode +-1; l1: decode +-mean|x|", choices=("none", "l1")),)

    def add_levels(self, sections, n, sums, nneg, dtype):
        if self.scale == "l1":
            sections.append(scale_section(float(round_to(np.float64(sums[0] / n if n else 0.0), dtype))))

    def levels_bound(self, ctx):
        """scale=l1: one float64 scale; none: nothing (exact)."""
        return Bound(1, 8) if self.scale == "l1" else Bound(0, 0)

    def read_levels(self, reader, ctx):
        a = read_scalars(reader, 1, bits=64)[0] if self.scale == "l1" else 1.0
        return np.array([a, -a])


@register
class EfSign(Sign):
    """EF-signSGD (Karimireddy et al. 2019): sign(scale=l1), meant to run under ErrorFeedback."""

    name = "efsign"
    params = ()

    def validate(self):
        self.scale = "l1"


@register
class OneBit(_Bits):
    """1-bit SGD (Seide et al. 2014): one bit per value, decoded as the mean of its sign group."""

    name = "onebit"

    def add_levels(self, sections, n, sums, nneg, dtype):
        npos = n - nneg
        means = np.array([sums[2] / npos if npos else 0.0, sums[1] / nneg if nneg else 0.0])
        fits = np.abs(means).max(initial=0.0) <= F32_MAX
        sections.append(scalars_section(means.astype(np.float32).astype(np.float64) if fits else means))

    def levels_bound(self, ctx):
        """The two means, float32 items when they fit: a mean of ``n < 2**29`` values of at
        most float32's maximum never exceeds it (a float64 partial sum of ``c`` of them is at
        most ``c * F32_MAX``, exact there, and rounding is monotone); ``n = 0`` gives means of 0.
        Exact but for float64 values or ``n >= 2**29``, allowed float64 items."""
        n = ctx.n
        return Bound(1, scalars_bytes(2, 0.0 if not n else top_of(ctx.dtype) if n < 1 << 29 else math.inf))

    def read_levels(self, reader, ctx):
        return read_scalars(reader, 2)
