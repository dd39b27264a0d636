"""``gaussiank(ratio=, exact=false)``: Shi et al.'s Gaussian threshold, with the kept count
guaranteed to lie in [ceil(2k/3), floor(4k/3)] (docs/codecs.md)."""

from __future__ import annotations

import sys

from codec.stages.select.base import MagnitudeSelect
from codec.stages.select.magnitude import k_of, segment_room
from codec.params import Param, ratio
from codec.stage import register
from codec.device import Memory
from codec.dtypes import on_device, readonly
from codec.kernels import backend
from codec.layout import CHUNK, LANES


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

    def kept_range(self, n, step):
        """``exact``: k.  Else the clamp of :meth:`choose` (and ``gaussiank_segments``):
        ``min(max(count, lo), hi, n)`` with ``lo <= k <= n``, so from ``lo`` to ``min(hi, n)``
        whatever the threshold counts (:func:`bounds`)."""
        k = k_of(self.at("ratio", step), n)
        if self.exact:
            return k, k
        lo, hi = bounds(k)
        return lo, min(hi, n)

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
        count = mags.count_candidates(t, strict=True) if t >= mags.cut else mags.idx.size
        return mags.top(min(max(count, lo), hi, mags.n))

    def find_segments(self, flat, starts, ctxs, gradient=None):
        """Every tensor's selection in one kernel call (``gaussiank_segments``: its moments,
        threshold, clamped count and top-k, as :meth:`choose`).  Each tensor's shift (its mean, the
        variance sums' origin) is its mean in lanes, as :class:`Magnitudes` takes it
        (``select.lane_means``, where the run lives: one number per tensor crosses)."""
        import numpy as np


        sizes = np.diff(starts)
        if sizes.size and sizes.max() > CHUNK:  # one chunk of sums per tensor
            return None
        ratios = [self.at("ratio", c.step) for c in ctxs]
        ks = np.array([k_of(r, int(n)) for r, n in zip(ratios, sizes.tolist())], np.int64)
        if self.exact:
            zs = np.zeros(sizes.size)
        else:
            memo: dict = {}
            zs = np.array([memo[r] if r in memo else memo.setdefault(r, _z(r)) for r in ratios])
        mem = Memory(on_device(flat))  # device arrays: the twin's one launch, the picked positions stay there
        room, pos, counts, bad = segment_room(np.minimum(sizes, ks if self.exact else 4 * ks // 3))
        pos, bad, put = mem.put(pos), mem.put(bad), mem.put
        kern = backend("select", flat)
        if self.exact:
            kern.topk_segments(readonly(flat), put(starts), put(ks), put(room), pos, bad)
            counts[:] = ks
        else:
            shifts = np.zeros(sizes.size)
            kern.lane_means(flat, starts, LANES, shifts)
            dev_counts = put(counts)
            kern.gaussiank_segments(flat, put(starts), put(shifts), put(zs), LANES, put(ks), put(room), pos, dev_counts, bad)
            counts = mem.host(dev_counts)
        if mem.host(bad).any():
            return None  # select() raises the error naming the tensor and position
        return room, pos, counts, None
