"""``threshold(value=)``: keep |x| >= value."""

from __future__ import annotations

from codec.stages.select.base import MagnitudeSelect
from codec.params import Param
from codec.stage import register


@register
class Threshold(MagnitudeSelect):
    """Keep elements with |x| >= value; positions as a bitmap or packed gaps, whichever is smaller."""

    name = "threshold"
    params = (Param("value", float, 0.0, "magnitude threshold; elements with |x| >= value are sent", low=0.0, schedule=True),)

    def kept_range(self, n, step):
        """Data-dependent: any count from none to all ``n`` reach a threshold above 0 (the
        bound is then the bitmap, ``ceil(n/8)`` bytes, and ``n`` values); a threshold of 0 keeps
        every element, exactly."""
        return (n, n) if self.at("value", step) <= 0 else (0, n)

    def choose(self, mags, ctx):
        return mags.at_least(self.at("value", ctx.step))
