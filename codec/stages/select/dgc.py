"""``dgc(ratio=, sample=0.01)``: Deep Gradient Compression's sampled threshold with its
adaptation loop (docs/codecs.md)."""

from __future__ import annotations

import math

import numpy as np

from codec.stages.select.base import MagnitudeSelect
from codec.stages.select.magnitude import k_of, segment_room
from codec.params import Param, ratio
from codec.stage import register
from codec.device import Memory
from codec.dtypes import on_device
from codec.kernels import backend

MIN_SAMPLE = 4096
RETRIES = 10


@register
class DGC(MagnitudeSelect):
    """DGC threshold from a strided sample; x0.8 retries below 0.8k, exact top-k above 1.3k."""

    name = "dgc"
    params = (
        ratio(),
        Param("sample", float, 0.01, "sampled fraction, in (0, 1]", low=0.0, low_open=True, high=1.0),
    )

    def kept_range(self, n, step):
        """Up to ``min(n, floor(1.3 k))``: :meth:`choose` (and ``dgc_segments``) keeps the
        exact top-k when more than ``1.3 k`` reach the threshold, else every one that does
        (all ``n`` for a threshold of 0: all-zero samples, when ``n <= 1.3 k``); the count is
        the data's, down to 0 after the last retry (in practice at least one)."""
        k = k_of(self.at("ratio", step), n)
        return 0, min(n, math.floor(1.3 * k))

    def choose(self, mags, ctx):
        n = mags.n
        if n == 0:
            return np.empty(0, np.int64)
        ratio = self.at("ratio", ctx.step)
        k = k_of(ratio, n)
        m = max(math.ceil(self.sample * n), MIN_SAMPLE)
        stride = 1 if n <= m else n // m
        sample = mags.acc_sample(stride)  # acc at 0, stride, 2*stride, ... (on acc's device)
        ks = min(max(1, math.ceil(ratio * sample.size)), sample.size)
        thr = mags.kth(sample, ks)
        upper = math.floor(1.3 * k) + 1  # counts above 1.3k only need to be known as such
        mags.candidates(upper)
        for retry in range(RETRIES + 1):
            count = mags.count_at_least(thr) if thr >= mags.cut or mags.idx.size < upper else mags.idx.size
            if count > 1.3 * k:
                return mags.top(k)
            if count < 0.8 * k and retry < RETRIES:
                thr *= 0.8
                continue
            return mags.at_least(thr)
        raise AssertionError("unreachable")

    def find_segments(self, flat, starts, ctxs, gradient=None):
        """Every tensor's selection in one kernel call (``dgc_segments``: the sample, the
        adaptation loop and the exact top-k fallback per tensor, as :meth:`choose`)."""
        sizes = np.diff(starts)
        ratios = np.array([self.at("ratio", c.step) for c in ctxs], np.float64)
        ks = np.where(sizes > 0, np.minimum(sizes, np.maximum(1, np.floor(ratios * sizes))), 0).astype(np.int64)  # k_of
        m = np.maximum(np.ceil(self.sample * sizes), MIN_SAMPLE).astype(np.int64)
        strides = np.where(sizes <= m, 1, sizes // np.maximum(m, 1))
        drawn = -(-sizes // strides)
        picks = np.minimum(np.maximum(1, np.ceil(ratios * drawn)), drawn).astype(np.int64)
        room, pos, counts, bad = segment_room(np.minimum(sizes, np.floor(1.3 * ks).astype(np.int64) + 1))
        mem = Memory(on_device(flat))  # device arrays: the twin's one launch, the picked positions stay there
        put = mem.put
        pos, counts, bad = put(pos), put(counts), put(bad)
        backend("select", flat).dgc_segments(flat, put(starts), put(ks), put(strides), put(picks), RETRIES, put(room), pos, counts, bad)
        if mem.host(bad).any():
            return None  # select() raises the error naming the tensor and position
        return room, pos, mem.host(counts), None
