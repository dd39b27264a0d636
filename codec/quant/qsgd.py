"""``qsgd(levels=16, bucket=512, rounding=stochastic)``: QSGD (Alistarh et al., NeurIPS 2017),
per-bucket L2 norm and ``levels`` levels per sign (docs/codecs.md)."""

from __future__ import annotations

import numpy as np

from codec.errors import CorruptFrameError
from codec.quant.base import Dequant, Quantizer, code_dtype, codes_section, read_codes, read_scalars, rounding, scalars_section
from codec.stage import Param, register
from codec.streams import SEED


@register
class Qsgd(Quantizer):
    """QSGD: per bucket an L2 norm, each |v|/norm on s levels (stochastic, unbiased), sign+level packed."""

    name = "qsgd"
    params = (
        Param("levels", int, 16, "quantization levels s per sign", low=1, high=32767),
        Param("bucket", int, 512, "values per bucket (each has its own norm)", low=1),
        rounding("stochastic"),
        SEED,
    )

    @property
    def code_bits(self) -> int:
        return 1 + int(self.levels).bit_length()

    def quantize(self, x, ctx, sections):
        from codec.kernels import backend
        from codec.kernels.cpu.quant import LANES

        n = x.size
        nb = -(-n // self.bucket)
        norms = np.empty(nb)
        codes = np.empty(n, code_dtype(self.code_bits))
        per = max(1, (1 << 16) // self.bucket)
        bad = np.zeros(-(-nb // per), np.int64)
        if n:
            backend("quant", x).qsgd_encode(
                x, self.bucket, self.levels, self.rounding == "stochastic", self.stream(ctx), LANES, norms, codes, bad
            )
        if bad.any():
            self.raise_nonfinite(x, ctx)
        sections.append(scalars_section(norms))
        sections.append(codes_section(codes, self.code_bits))

    def parse(self, reader, ctx, count):
        nb = -(-count // self.bucket)
        norms = read_scalars(reader, nb)
        if norms.size and norms.min() < 0:
            raise CorruptFrameError("qsgd frame: a negative norm")
        s, w = self.levels, self.code_bits
        data = read_codes(reader, w, count, ((1 << w) - 1, 1, s))  # level = code >> 1 <= s
        level, negative = np.arange(1 << w) >> 1, np.arange(1 << w) & 1
        lut = np.where(negative == 1, -(level / s), level / s)
        return Dequant(data, w, count, lut, self.bucket, norms, np.empty(0), ctx.dtype)

