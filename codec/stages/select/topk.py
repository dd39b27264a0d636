"""``topk(ratio= | k=)``: the exact top-k by magnitude, ties to the lower index."""

from __future__ import annotations

from codec.errors import CodecValueError
from codec.stages.select.base import MagnitudeSelect
from codec.stages.select.magnitude import k_of, ks_of, segment_room
from codec.frame import MAX_ELEMENTS
from codec.params import Param, ratio
from codec.stage import register
from codec.device import Memory
from codec.dtypes import on_device, readonly
from codec.kernels import backend

RATIO = 0.01


@register
class TopK(MagnitudeSelect):
    """Exact top-k by |x| (k = max(1, floor(ratio*n)) or given), ties to the lower index."""

    name = "topk"
    params = (
        ratio(RATIO, "fraction kept, in (0, 1]; unused when k is given"),
        Param("k", int, None, "keep exactly min(k, n) elements instead of a ratio", low=1, high=MAX_ELEMENTS),
    )

    def validate(self):
        if self.k is not None and self.ratio != RATIO:
            raise CodecValueError("topk: give ratio or k, not both")

    def kept(self, n: int, step: int) -> int:
        if self.k is not None:
            return min(self.k, n)
        return k_of(self.at("ratio", step), n)

    def kept_range(self, n, step):
        """Exactly :meth:`kept` positions, whatever the values (ties too): the bound is exact."""
        k = self.kept(n, step)
        return k, k

    def counts(self, sizes, step: int):
        """How many positions tensors of ``sizes`` elements (int64) keep at ``step``: each
        :meth:`kept`, at once."""
        import numpy as np


        if self.k is not None:
            return np.minimum(sizes, self.k).astype(np.int64)
        return ks_of(self.at("ratio", step), sizes)

    def choose(self, mags, ctx):
        return mags.top(self.kept(mags.n, ctx.step))

    def find_segments(self, flat, starts, ctxs, gradient=None):
        """Every tensor's top-k in one kernel call (``topk_segments``)."""
        import numpy as np



        sizes = starts[1:] - starts[:-1]
        step = ctxs[0].step if ctxs else 0
        if all(c.step == step for c in ctxs):  # (a many-tensor call's: every count at once)
            ks = self.counts(sizes, step)
        else:
            ks = np.array([self.kept(int(n), c.step) for n, c in zip(sizes.tolist(), ctxs)], np.int64)  # (at most n)
        room, pos, counts, bad = segment_room(ks)
        mem = Memory(on_device(flat))  # device arrays: the twin's one launch, the picked positions stay there
        pos, bad = mem.put(pos), mem.put(bad)
        backend("select", flat).topk_segments(readonly(flat), mem.put(starts), mem.put(ks), mem.put(room), pos, bad)
        if mem.host(bad).any():
            return None  # select() raises the error naming the tensor and position
        counts[:] = ks
        return room, pos, counts, None
