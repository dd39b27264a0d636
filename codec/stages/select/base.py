"""The select stages' bases: :class:`IndexSelect` (positions through the shared index coder,
error feedback fused with the selection) and :class:`MagnitudeSelect` (a rule over the top of
``|acc|``, asked of :class:`codec.stages.select.magnitude.Magnitudes`)."""

from __future__ import annotations

import abc

import numpy as np

from codec.stage import Bound, Select
from codec.stages.select.magnitude import Magnitudes, segments_picked
from codec.frame import SectionKind
from codec.kernels import backend
from codec.ops import addresses, readonly
from codec.pack import decode_index_run, decode_indices, encode_indices, index_bound, INDEX_KINDS, section_table

__all__ = ["IndexSelect", "MagnitudeSelect"]


class IndexSelect(Select):
    """A select stage whose positions travel through the shared index coder (codec.pack).

    ``select`` may take ``residual`` and ``out``: it then selects from ``acc = values +
    residual``, written into ``out`` (error feedback, fused with the selection pass).  A
    subclass says how many positions it keeps (:meth:`kept_range`), which gives :meth:`bound`."""

    #: select() accepts residual= and out= (Codec.encode_feedback uses it)
    fuses_feedback = True

    @abc.abstractmethod
    def kept_range(self, n: int, step: int) -> tuple[int, int]:
        """``(least, most)``: the fewest and the most positions :meth:`select` keeps of ``n``
        elements at ``step``, whatever their values (``most`` at most ``n``)."""

    def bound(self, ctx) -> Bound:
        """One index section, at most the worst :func:`codec.pack.encode_indices` gives for
        any set of between ``least`` and ``most`` positions (:meth:`kept_range`): the kept
        positions are such a set whatever the values, and values large at the worst
        positions (the last ones) make the stages keep them, so the bound is reached where the
        count is fixed (topk, randomk aside).  The value stage then codes at most ``most``
        values of the array's dtype (``acc``'s values, in its dtype)."""
        least, most = self.kept_range(ctx.n, ctx.step)
        return Bound(1, index_bound(most, ctx.n, least), ctx.domain(most, ctx.dtype))

    def find_segments(self, flat, starts, ctxs, gradient=None):
        """What :meth:`select_segments` finds before it is packed and coded: ``(room, pos,
        counts, values)``, tensor t's ``counts[t]`` sorted positions (counted from its own
        start) at ``pos[room[t]:]`` (``room``, ``counts`` host arrays; ``pos`` where ``flat``
        lives) and ``values`` the kept values at the same places, or None (they are read
        from ``flat``); or None, as :meth:`select_segments` answers None (the default: each
        tensor is selected alone).  A stage that selects many tensors at once implements
        this; the replayed encode (:func:`codec.replaydecode.encode_selected`) writes a
        frame straight from it."""
        return None

    def select_segments(self, flat, starts, ctxs, gradient=None):
        """:meth:`codec.stage.Select.select_segments` from :meth:`find_segments`: the finds
        packed, every tensor's index section made at once and the kept values gathered
        (:func:`codec.stages.select.magnitude.segments_picked`)."""
        finds = self.find_segments(flat, starts, ctxs, gradient)
        return None if finds is None else segments_picked(flat, starts, *finds)

    def positions_run(self, data, sections, sizes, value=None):
        """Every tensor's index section read at once (:func:`codec.pack.decode_index_run`;
        the positions are in the frame, so ``value`` bounds nothing here)."""
        firsts = [secs[0] if secs else None for secs in sections]
        if any(f is None or f.kind not in INDEX_KINDS for f in firsts):
            return None
        return decode_index_run(data, firsts, sizes)

    def pairs_run(self, data, sections, starts, arrays):
        """Every tensor's index section read, checked and its pairs written in one kernel call
        (``scatter.index_scatter_segments``: what :meth:`positions_run` reads and
        ``scatter_segments`` writes, without the positions and values gathered in between)."""
        if any(secs[0].kind not in INDEX_KINDS for secs in sections):  # (two sections each: the caller checked)
            return None
        table = section_table([secs[0] for secs in sections])
        values_at = readonly(np.array([secs[1].offset for secs in sections], np.int64))
        counts = readonly(np.array([secs[1].count for secs in sections], np.int64))
        return backend("scatter", arrays[0]).index_scatter_segments(readonly(data), table, values_at, counts, readonly(addresses(arrays)), starts, arrays[0]) < 0

    def positions(self, reader, ctx, known=None):
        info, raw = reader.take((SectionKind.INDEX_DELTA, SectionKind.INDEX_BITMAP), device=ctx.device and known is None)
        return known if known is not None else decode_indices(info, raw, ctx.n, device=ctx.device)


class MagnitudeSelect(IndexSelect):
    """Base of the sparsifiers that keep a set of large magnitudes (topk, gaussiank, dgc,
    threshold): positions through the shared index coder, values to the value stage.
    Subclasses implement ``choose(mags: Magnitudes, ctx) -> sorted positions``."""

    #: Magnitudes should gather mean and standard deviation
    needs_sums = False
    #: device arrays select through the ``select`` family's CUDA twin (the candidates pass)
    devices = frozenset({"cpu", "cuda"})

    def select(self, values, ctx, sections, residual=None, out=None):
        mags = Magnitudes(values, ctx, self.name, residual, out, sums=self.needs_sums)
        idx = self.choose(mags, ctx)
        if mags.cut is None:  # a rule that never looked (threshold 0 keeps all) still forms and checks acc
            mags.candidates(0)
        sections.append(encode_indices(idx, values.size))
        return idx, mags.values(idx)
