"""``threshold(value=)``: keep the elements with |x| >= value."""

from __future__ import annotations

import numpy as np

from codec.frame import Kind
from codec.stage import Param, Stage, register


@register
class Threshold(Stage):
    """Keep elements with |x| >= value; positions as a bitmap or packed gaps, whichever is smaller."""

    name = "threshold"
    kind = "select"
    lossless = False
    params = (Param("value", float, 0.0, "magnitude threshold; elements with |x| >= value are sent", low=0.0),)

    def select(self, values, ctx, sections):
        from codec.ops import widen
        from codec.pack import encode_indices

        wide = widen(values)
        finite = np.isfinite(wide)
        if not finite.all():
            first = int(np.flatnonzero(~finite)[0])
            raise ValueError(f"x: non-finite value at position {ctx.where(first)}; threshold selection needs finite input")
        idx = np.flatnonzero(np.abs(wide) >= self.value)
        sections.append(encode_indices(idx, values.size))
        return idx, values[idx]

    def positions(self, reader, ctx):
        from codec.pack import decode_indices

        info, raw = reader.take((Kind.INDEX_DELTA, Kind.INDEX_BITMAP))
        return decode_indices(info, raw, ctx.n)
