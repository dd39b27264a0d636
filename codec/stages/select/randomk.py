"""``randomk(ratio=, seed=0, scale=false)``: k positions drawn by a counter-based generator
keyed by (seed, tensor key, step); the frame carries the key, not the positions."""

from __future__ import annotations

import numpy as np

from codec.errors import CorruptFrameError, NonFiniteError
from codec.frame import SectionKind, Section
from codec.stages.select.magnitude import k_of
from codec.params import SEED, Param, ratio
from codec.stage import Select, register
from codec.streams import key_hash

__all__ = ["RandomK", "key_hash", "positions"]


def positions(n: int, k: int, seed: int, khash: int, step: int) -> np.ndarray:
    """The sorted kept positions: images of 0..k-1 under a permutation of [0, n) keyed by
    (seed, khash, step) (docs/codecs.md, randomk)."""
    if k == 0:
        return np.empty(0, np.int64)
    if n == 1:
        return np.zeros(1, np.int64)
    from codec.kernels import backend

    h = max(2, (n - 1).bit_length())
    out = np.empty(k, np.int64)
    u64 = np.uint64
    backend("select", out).random_positions(out, u64(seed), u64(khash), u64(step % (1 << 64)), u64((h + 1) // 2), n)
    out.sort()
    return out


@register
class RandomK(Select):
    """k uniformly random positions from (seed, key, step); positions regenerated, not sent."""

    name = "randomk"
    fuses_feedback = True
    params = (
        ratio(0.01, "fraction kept, in (0, 1]"),
        SEED,
        Param("scale", bool, False, "multiply kept values by n/k (unbiased)"),
    )

    @property
    def scales_values(self) -> bool:
        """Kept values are sent multiplied by n/k (so the residual there is rounded, not 0)."""
        return self.scale

    def select(self, values, ctx, sections, residual=None, out=None):
        acc = values if residual is None else np.add(values, residual, out=out)
        n = acc.size
        khash = key_hash(ctx.key)
        idx = positions(n, k_of(self.at("ratio", ctx.step), n), self.seed, khash, ctx.step)
        from codec.ops import first_nonfinite, round_to

        kept = acc[idx]
        bad = first_nonfinite(kept)
        if bad >= 0:  # only kept values are looked at (the rest is never read)
            raise NonFiniteError(ctx.name, ctx.where(idx[bad]), "randomk", "needs finite kept values")
        if self.scale and idx.size:
            kept = round_to(kept.astype(np.float64) * (n / idx.size), acc.dtype)
        sections.append(Section(SectionKind.INTS, 64, 3, np.array([self.seed, ctx.step, khash], np.uint64)))
        return idx, kept

    def positions(self, reader, ctx, known=None):  # regenerated from the key: never known
        info, raw = reader.take(SectionKind.INTS, bits=64, count=3)
        seed, step, khash = (int(v) for v in raw.view("<u8"))
        if seed != self.seed:
            raise CorruptFrameError(f"randomk frame records seed {seed}, its codec tag says {self.seed}")
        if step >= 1 << 62:
            raise CorruptFrameError(f"randomk frame records an impossible step {step}")
        k = k_of(self.at("ratio", step), ctx.n)
        room = 8 * sum(s.raw_len for s in reader.remaining())  # every kept value needs >= 1 bit
        if k > room:
            raise CorruptFrameError(f"randomk frame keeps {k} of {ctx.n} elements but carries {room} bits of values")
        return positions(ctx.n, k, seed, khash, step)
