"""``terngrad(clip=2.5)``: TernGrad (Wen et al., NeurIPS 2017): clip at ``clip`` standard
deviations, one scale per tensor, stochastic ternary values packed five per byte."""

from __future__ import annotations

import math

import numpy as np

from codec.device import Memory
from codec.dtypes import on_device
from codec.errors import CorruptFrameError
from codec.frame import SectionKind, Section
from codec.stages.value.dequant import Dequant
from codec.stages.value.quantizer import Quantizer
from codec.stages.value.sections import magnitude_bits, magnitude_values, read_codes, read_scalars, round_up_to, scale_section, sequential_sum
from codec.params import Param, SEED
from codec.stage import Bound, register
from codec.kernels import backend
from codec.layout import chunks, LANES

#: 3**5: a byte holds five trits, so byte values 243..255 never occur
TRIT_BYTES = 243


def trit_bytes(n: int) -> int:
    return -(-n // 5)


@register
class TernGrad(Quantizer):
    """TernGrad: clip at clip*sigma, values in {-s, 0, s} drawn unbiased, five trits per byte."""

    name = "terngrad"
    params = (Param("clip", float, 2.5, "clip at clip * standard deviation; 0 = no clipping", low=0.0), SEED)

    def quantize(self, x, ctx, sections):
        kern = backend("quantize", x)
        n = x.size
        nchunk = chunks(n)
        bits, mask = magnitude_bits(x)
        sums, top = np.zeros((nchunk, 2)), np.zeros(nchunk, bits.dtype)
        shift = float(x[0]) if n else 0.0
        if n:
            kern.tensor_moments(x, bits, mask, shift, LANES, sums, top)
        amax, bad = magnitude_values(top, x.dtype)
        if bad:
            self.raise_nonfinite(x, ctx)
        clip = math.inf
        if n and self.clip > 0:
            mean = sequential_sum(sums[:, 0]) / n
            sigma = math.sqrt(max(0.0, sequential_sum(sums[:, 1]) / n - mean * mean))
            if sigma > 0:
                clip = self.clip * sigma
        top = min(float(amax.max(initial=0.0)), clip)
        s = round_up_to(top, ctx.dtype) if top > 0 else 0.0
        out = Memory(on_device(x)).empty(trit_bytes(n), np.uint8)  # (device codes stay there until the frame is written)
        if n:
            kern.terngrad_encode(x, clip, s, self.stream(ctx), out)
        sections.append(scale_section(s))
        sections.append(Section(SectionKind.VALUES, 8, out.size, out))

    def bound(self, ctx):
        """Always the float64 scale and five trits per byte, whatever the values: exact."""
        return Bound(2, 8 + trit_bytes(ctx.n))

    def read(self, reader, ctx, count):
        s = float(read_scalars(reader, 1, bits=64)[0])
        if s < 0:
            raise CorruptFrameError(f"terngrad frame: scale {s} is negative")
        nbytes = trit_bytes(count)
        data = read_codes(reader, 8, nbytes, (0xFF, 0, TRIT_BYTES - 1), device=ctx.codes_on_device)
        if nbytes and int(data[-1]) >= 3 ** (count - 5 * (nbytes - 1)):
            raise CorruptFrameError("terngrad frame: the last byte holds trits past the last value")
        return Dequant(data, 8, count, np.array([0.0, 1.0, -1.0]), max(1, count), np.array([s]), np.empty(0), ctx.dtype, trits=True)
