"""``randomk(ratio=, seed=0, scale=false)``: k positions drawn by a counter-based generator
keyed by (seed, tensor key, step); the frame carries the key, not the positions."""

from __future__ import annotations

import numpy as np

from codec.errors import CorruptFrameError, NonFiniteError
from codec.frame import Section, SectionKind, SectionRun
from codec.stages.select.magnitude import k_of, ks_of
from codec.params import SEED, Param, ratio
from codec.stage import Bound, Select, register
from codec.streams import key_hash
from codec.ops import add, first_nonfinite, HALF, offsets, round_to, WIDE, widen
from codec.device import Memory
from codec.dtypes import on_device, readonly
from codec.kernels import backend
from codec.layout import feistel_half

__all__ = ["RandomK", "key_hash", "positions"]

#: the kind, width and count of a tensor's first section: its key (seed, step, key hash)
_KEY = (SectionKind.INTS, 64, 3)


def positions(n: int, k: int, seed: int, khash: int, step: int, device: bool = False) -> np.ndarray:
    """The sorted kept positions: images of 0..k-1 under a permutation of [0, n) keyed by
    (seed, khash, step) (docs/codecs.md, randomk); ``device``: drawn on the device, a device
    array (the ``randomk`` twin: the same positions)."""
    mem = Memory(device)
    if k == 0:
        return mem.empty(0, np.int64)
    if n == 1:
        return mem.zeros(1, np.int64)


    out = mem.empty(k, np.int64)
    u64 = np.uint64
    backend("randomk", out).sorted_positions(out, u64(seed), u64(khash), u64(step % (1 << 64)), u64(feistel_half(n)), n)
    return out


def _scaled(kept, starts, factors, dtype, mem):
    """``kept`` times its tensor's ``n/k`` (``factors``, per segment of ``starts``), the float64
    product rounded once to ``dtype`` (``convert.scale``; 16-bit through float64 and the
    ``convert`` family's rounding), where ``kept`` lives."""
    kern = backend("convert", kept)
    args = (mem.put(np.ascontiguousarray(starts, np.int64)), mem.put(np.asarray(factors, np.float64)))
    if np.dtype(dtype) in WIDE:
        out = mem.empty(kept.size, dtype)
        kern.scale(kept, *args, out)
        return out
    wide = mem.empty(kept.size, np.float64)
    kern.scale(widen(kept), *args, wide)
    if not mem.device:
        return round_to(wide, dtype)
    codes = mem.empty(kept.size, np.uint16)
    kern.narrow_codes(wide, codes, np.dtype(dtype) != HALF, -1)
    return codes.view(dtype)


def _finite(kept) -> bool:
    """Whether ``kept`` (host or device) holds no NaN or inf: one pass on the host; on a
    device, every magnitude is at least 0 (a NaN's is not) and none reaches inf, two counts
    where the values live (8 bytes each come back)."""
    if not on_device(kept):
        return bool(np.isfinite(kept).all())
    count = backend("select", kept).count_at_least
    return not kept.size or (count(kept, 0.0) == kept.size and count(kept, np.inf) == 0)


@register
class RandomK(Select):
    """k uniformly random positions from (seed, key, step); positions regenerated, not sent."""

    name = "randomk"
    fuses_feedback = True
    keyed = True
    devices = frozenset({"cpu", "cuda"})
    params = (
        ratio(0.01, "fraction kept, in (0, 1]"),
        SEED,
        Param("scale", bool, False, "multiply kept values by n/k (unbiased)"),
    )

    @property
    def scales_values(self) -> bool:
        """Kept values are sent multiplied by n/k (so the residual there is rounded, not 0)."""
        return self.scale

    def bound(self, ctx):
        """Exact: the one key section, ``(seed, step, key hash)`` as three 64-bit INTS (24
        bytes), and ``k_of(ratio at the step, n)`` values of the array's dtype (scaled ones
        too), whatever the values."""
        return Bound(1, 24, ctx.domain(k_of(self.at("ratio", ctx.step), ctx.n), ctx.dtype))

    def select(self, values, ctx, sections, residual=None, out=None):
        """The positions are drawn where ``values`` live (they depend on the key, not the
        data: on the device by the ``randomk`` twin), and the values gathered there; they stay
        there for the value stage (scaled there too), so a device array sends back only what
        the value stage codes."""
        acc = values if residual is None else add(values, residual, out)
        n = acc.size
        khash = key_hash(ctx.key)
        idx = positions(n, k_of(self.at("ratio", ctx.step), n), self.seed, khash, ctx.step, device=on_device(acc))
        mem = Memory(on_device(acc))
        kept = mem.gather(acc.reshape(n), idx)
        if not _finite(kept):  # only kept values are looked at (the rest is never read)
            bad = first_nonfinite(mem.host(kept))
            raise NonFiniteError(ctx.name, ctx.where(int(idx[bad])), "randomk", "needs finite kept values")
        if self.scale and idx.size:
            kept = _scaled(kept, np.array([0, idx.size], np.int64), np.array([n / idx.size]), acc.dtype, mem)
        sections.append(Section(SectionKind.INTS, 64, 3, np.array([self.seed, ctx.step, khash], np.uint64)))
        return idx, kept

    def counts(self, sizes, step: int) -> np.ndarray:
        """How many positions tensors of ``sizes`` elements (int64) keep at ``step``."""
        return ks_of(self.at("ratio", step), sizes)

    def select_segments(self, flat, starts, ctxs):
        """Every tensor's positions drawn in one kernel call (``random_positions_segments``),
        its key section written into one buffer, the kept values gathered at once."""
        sizes = np.diff(starts)
        steps = [c.step for c in ctxs]
        ks = np.array([k_of(self.at("ratio", st), int(n)) for n, st in zip(sizes.tolist(), steps)], np.int64)
        khashes = np.array([key_hash(c.key) for c in ctxs], np.uint64)
        kstarts = offsets(ks)
        mem = Memory(on_device(flat))  # drawn, gathered and scaled where the run lives
        pos = mem.empty(int(kstarts[-1]), np.int64)
        wrapped = np.array([st % (1 << 64) for st in steps], np.uint64)
        seeds = np.full(ks.size, self.seed, np.uint64)
        backend("randomk", pos).random_positions_segments(pos, readonly(kstarts), readonly(sizes), seeds, khashes, wrapped)  # (read-only as the decode's: one signature)
        where = mem.empty(pos.size, np.int64)
        backend("index", pos).absolute_positions(pos, mem.put(kstarts), mem.put(np.ascontiguousarray(starts, np.int64)), where)
        kept = mem.gather(flat, where)
        if not _finite(kept):
            return None  # select() raises the error naming the tensor and position
        if self.scale and kept.size:
            factors = np.array([n / k if k else 0.0 for n, k in zip(sizes.tolist(), ks.tolist())])
            kept = _scaled(kept, kstarts, factors, flat.dtype, mem)
        keys = np.empty((ks.size, 3), "<u8")
        keys[:, 0], keys[:, 1], keys[:, 2] = self.seed, steps, khashes
        run = SectionRun(keys.reshape(-1).view(np.uint8), np.arange(ks.size + 1, dtype=np.int64) * 24, [SectionKind.INTS] * ks.size, [64] * ks.size, [3] * ks.size)
        return pos, kstarts, kept, run

    def positions_run(self, data, sections, sizes, value=None):
        """Every tensor's key section read and checked, and its positions drawn in one kernel
        call; None when a tensor's sections are not a key then values (read alone).
        ``value``: the value stage (its :meth:`~codec.stage.Value.most_values` bounds k)."""
        at = np.empty(len(sizes), np.int64)
        bits = np.empty(len(sizes), np.int64)
        for t, secs in enumerate(sections):
            if not secs or (secs[0].kind, secs[0].bits, secs[0].count) != _KEY:
                return None
            at[t] = secs[0].offset
            bits[t] = 8 * sum(s.raw_len for s in secs[1:])
        return self.positions_at(data, at, np.asarray(sizes, np.int64), bits if value is None else value.most_values(bits))

    def positions_at(self, data, at, sizes, room):
        """Every tensor's positions from its key at byte ``at[t]`` of ``data`` (tensor ``t``
        of ``sizes[t]`` elements, its values sections coding ``room[t]`` values at most;
        int64 arrays), checked (:meth:`keys_at`) and drawn with one kernel call:
        ``(positions, kstarts)``, tensor ``t``'s sorted positions (from its own start) being
        ``positions[kstarts[t]:kstarts[t+1]]``.  What :meth:`positions_run` reads."""
        kstarts, keys = self.keys_at(data, at, sizes, room)
        pos = np.empty(int(kstarts[-1]), np.int64)
        if pos.size:
            backend("randomk", pos).random_positions_segments(pos, readonly(kstarts), readonly(sizes), *keys)
        return pos, kstarts

    def keys_at(self, data, at, sizes, room):
        """Every tensor's key at byte ``at[t]`` of ``data`` read and checked
        (:meth:`_checked_ks`; arguments as :meth:`positions_at` takes them): ``(kstarts,
        keys)``, tensor ``t`` keeping ``kstarts[t+1] - kstarts[t]`` positions drawn from
        ``keys`` (its seed, key hash and step: three uint64 arrays), what
        :meth:`scatter_keyed` takes."""
        keys = data[at[:, None] + np.arange(24)].view("<u8")  # (seed, step, khash) per tensor
        steps = keys[:, 1].copy()
        kstarts = offsets(self._checked_ks(keys[:, 0], steps, sizes, room))
        return kstarts, (keys[:, 0].copy(), keys[:, 2].copy(), steps)

    def scatter_keyed(self, values, kstarts, keys, sizes, addrs, starts, like, mode) -> None:
        """Tensor ``t``'s kept ``values[kstarts[t]:kstarts[t+1]]`` written at its positions
        drawn from ``keys`` (:meth:`keys_at`; ``sizes[t]`` elements) into the host array of
        ``like``'s dtype at ``addrs[t]`` (its elements ``starts[t]:starts[t+1]`` of the run),
        the rest zeroed with SET: one kernel call that draws while it zeroes
        (``random_scatter_segments``).  How :mod:`codec.replay` decodes a keyed frame."""
        backend("randomk", like).random_scatter_segments(values, kstarts, sizes, *keys, addrs, starts, like, mode)

    def _checked_ks(self, seeds, steps, sizes, room) -> np.ndarray:
        """How many positions each tensor of a frame keeps (``sizes[t]`` elements, keyed by
        ``seeds[t]`` and ``steps[t]``, uint64), checked: the codec's seed, a possible step, and
        no more than its values sections can code (``room[t]``,
        :meth:`codec.stage.Value.most_values`); int64."""
        seen, told = set(seeds.tolist()), set(steps.tolist())  # (lists: a frame has a few hundred tensors)
        if seen != {self.seed} and seen:
            raise CorruptFrameError(f"randomk frame records seed {min(seen - {self.seed})}, its codec tag says {self.seed}")
        if told and max(told) >= 1 << 62:
            raise CorruptFrameError(f"randomk frame records an impossible step {max(told)}")
        if len(told) == 1:  # (a frame's tensors share their step)
            ks = ks_of(self.at("ratio", told.pop()), sizes)
        else:
            ks = np.empty(sizes.size, np.int64)
            for step in told:
                at = steps == step
                ks[at] = ks_of(self.at("ratio", step), sizes[at])
        if np.count_nonzero(ks > room):
            t = int(np.flatnonzero(ks > room)[0])
            raise CorruptFrameError(f"randomk frame keeps {ks[t]} of {sizes[t]} elements but its values sections hold {room[t]} values at most")
        return ks

    def positions(self, reader, ctx, known=None):
        info, raw = reader.take(SectionKind.INTS, bits=64, count=3)
        if known is not None:  # read and checked by positions_segments
            return known
        seed, step, khash = raw.view("<u8")[:, None]
        k = self._checked_ks(seed, step, np.array([ctx.n]), np.array([_room(ctx.value, reader.remaining())]))[0]
        return positions(ctx.n, int(k), int(seed[0]), int(khash[0]), int(step[0]))


def _room(value, sections) -> int:
    """The most kept values the values ``sections`` (infos: their raw bytes) can code in the
    value stage ``value``'s format (:meth:`codec.stage.Value.most_values`; None: one bit per
    value at least)."""
    bits = 8 * sum(s.raw_len for s in sections)
    return bits if value is None else value.most_values(bits)
