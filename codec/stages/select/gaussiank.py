"""``gaussiank(ratio=, exact=false)``: Shi et al.'s Gaussian threshold, with the kept count
guaranteed to lie in [ceil(2k/3), floor(4k/3)] (docs/codecs.md)."""

from __future__ import annotations

import sys

from codec.stages.select.magnitude import MagnitudeSelect, k_of
from codec.params import Param, ratio
from codec.stage import register


def bounds(k: int) -> tuple[int, int]:
    """The kept-count window ``[ceil(2k/3), floor(4k/3)]``."""
    return (2 * k + 2) // 3, 4 * k // 3


def _z(ratio: float) -> float:
    """The two-sided normal quantile z with P(|N(0,1)| > z) = ``ratio``.  Below ratio ~2e-16,
    ``1 - ratio/2`` rounds to 1 (no quantile): the lower tail gives it instead, clamped to
    float64's smallest normal so every ratio > 0 has one."""
    from statistics import NormalDist  # here, not at import: statistics pulls in decimal and fractions

    p = 1 - ratio / 2
    return NormalDist().inv_cdf(p) if p < 1 else -NormalDist().inv_cdf(max(ratio / 2, sys.float_info.min))


@register
class GaussianK(MagnitudeSelect):
    """Gaussian-fit threshold |mu| + z*sigma; count clamped to [2k/3, 4k/3] (Shi et al. 2019)."""

    name = "gaussiank"
    needs_sums = True
    params = (
        ratio(),
        Param("exact", bool, False, "keep exactly k elements (then equal to topk)"),
    )

    def choose(self, mags, ctx):
        ratio = self.at("ratio", ctx.step)
        k = k_of(ratio, mags.n)
        lo, hi = bounds(k)
        mags.candidates(hi)  # the pass: acc, its mean and std, and at least hi candidates
        if self.exact:
            return mags.top(k)
        t = abs(mags.mean) + _z(ratio) * mags.std
        # t >= cut: every element above t is a candidate.  t < cut: the candidates all lie
        # above t, and they are either >= hi of them (the clamp gives hi) or every non-zero
        # element (the cut fell back to the smallest subnormal, so t is 0)
        count = int((mags.mag > t).sum()) if t >= mags.cut else mags.idx.size
        return mags.top(min(max(count, lo), hi, mags.n))
