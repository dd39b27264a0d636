"""The base of the select stages (``codec/stages/select/``)."""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from codec.stage.base import Bound, Stage

class Select(Stage, kind_base=True):
    """Base of the select stages (sparsifiers): which elements a frame carries.  Required
    hooks: :meth:`select`, :meth:`positions`.  A select stage may leave facts for the value
    stage in ``ctx.hints`` (AdaComp's scale)."""

    kind = "select"
    lossless = False
    #: the value stage a spec without one gets: a registered name, or a Value class of its own
    #: that spec strings cannot name (AdaComp's sign coding)
    default_value: ClassVar[str | type] = "none"
    #: ``select`` takes ``residual=`` and ``out=`` and selects from ``acc = values + residual``,
    #: written into ``out`` in its own pass (error feedback without a separate add)
    fuses_feedback: ClassVar[bool] = False
    #: the stage sends changed values (randomk's n/k), so error feedback's residual at the
    #: sent positions is a rounding remainder, not 0, even with exact value coding
    scales_values: ClassVar[bool] = False
    #: a tensor's sections are a key then its values, their sizes fixed by its size and the
    #: step (random-k: positions drawn from the key, never sent), so a many-tensor frame's
    #: header is its layout's (:mod:`codec.replay` replays its decoding); such a stage has
    #: ``keys_at(data, at, sizes, room) -> (kstarts, keys)``: every tensor's key at a known
    #: byte of the payload, checked, and ``scatter_keyed(values, kstarts, keys, sizes, addrs,
    #: starts, like, mode)``: the kept values written at the positions drawn from the keys
    keyed: ClassVar[bool] = False

    @abc.abstractmethod
    def select(self, values, ctx, sections, residual=None, out=None):
        """``(positions, kept_values)``: sorted flat int64 positions and the values to code,
        appending the index sections.  ``residual``/``out`` only with :attr:`fuses_feedback`."""

    def select_segments(self, flat, starts, ctxs, gradient=None):
        """:meth:`select` for many small tensors at once (a many-tensor frame's run):
        ``flat`` holds them concatenated (float32 or float64), tensor ``i`` is
        ``flat[starts[i]:starts[i + 1]]`` with context ``ctxs[i]``.  Returns ``(positions,
        kstarts, values, index)``: tensor i's positions (counted from its own start) and kept
        values are ``positions[kstarts[i]:kstarts[i+1]]`` and the same slice of ``values``,
        and ``index`` (a :class:`codec.frame.SectionRun`) holds its first section (the index
        section, or random-k's key), all exactly as
        :meth:`select` would give them for that tensor alone; or None (the default) to let the
        pipeline call :meth:`select` per tensor; also None when a tensor needs
        :meth:`select`'s own handling (its error on a NaN).  ``gradient`` (a stage that
        :attr:`sees_gradient`, under error feedback): the run's gradients concatenated as
        ``flat`` is, ``flat`` being ``acc = gradient + residual``."""
        return None

    #: under error feedback the selection depends on the new gradient as well as on ``acc = x
    #: + residual`` (AdaComp's ``|G + dW|``), so it is not the selection of ``acc`` alone:
    #: error feedback's many-tensor runs hand such a stage the run's gradients too
    #: (:meth:`select_segments`' ``gradient``)
    sees_gradient: ClassVar[bool] = False

    def positions_segments(self, data, sections, sizes, value=None) -> list | None:
        """Every tensor's positions of a many-tensor frame read at once: ``data`` the raw
        payload (uint8), ``sections[t]`` tensor t's section infos (offsets into ``data``),
        ``sizes[t]`` its element count, ``value`` the codec's value stage (``Context.value``).  Returns each tensor's positions, checked as
        :meth:`positions` checks them, which the pipeline then hands to :meth:`positions` as
        ``known``; or None (the default, or any section that is not what it expects): each
        tensor's positions are then read, and refused, by :meth:`positions` alone.  Each
        tensor's share of :meth:`positions_run`."""
        got = self.positions_run(data, sections, sizes, value)
        if got is None:
            return None
        pos, kstarts = got
        o = kstarts.tolist()
        return [pos[o[t] : o[t + 1]] for t in range(len(sizes))]

    def positions_run(self, data, sections, sizes, value=None) -> tuple | None:
        """:meth:`positions_segments` as one array: ``(positions, kstarts)``, tensor t's
        (from its own start) being ``positions[kstarts[t]:kstarts[t+1]]``; None (the
        default) as it refuses."""
        return None

    def pairs_run(self, data, sections, starts, arrays) -> bool | None:
        """Every tensor's pairs of a many-tensor frame written into its array at once (SET,
        the rest zeroed): ``data`` the raw payload (uint8), ``sections[t]`` tensor t's
        section infos (the stage's, then its values stored raw in the arrays' dtype, one per
        position: the caller checked them), ``starts`` where each tensor starts in the run,
        ``arrays`` flat C-contiguous host float32/float64 arrays of one dtype.  True when
        written; False, having written nothing, when a section is refused (the general path
        then names it); None (the default) when the stage does not: its positions are then
        read by :meth:`positions_run` and scattered."""
        return None

    @abc.abstractmethod
    def bound(self, ctx) -> Bound:
        """The most the stage's own sections (its positions, a key) take for an array of
        ``ctx.shape`` and ``ctx.dtype`` at ``ctx.step``, whatever its values, and
        (``values``) the value stage's context at its largest: the most values it can keep
        (``ctx.domain(k, ctx.dtype)``)."""

    @abc.abstractmethod
    def positions(self, reader, ctx, known=None) -> np.ndarray:
        """Check and read the position sections of a frame: the sorted flat positions, each in
        ``range(ctx.n)`` and unique (decoding scatters them unchecked).  ``known``: what
        :meth:`positions_segments` read and checked for this tensor; the sections are then
        only taken (a stage without :meth:`positions_segments` is never passed ``known``)."""
