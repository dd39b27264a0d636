"""Error feedback's step for the runs of a many-tensor call (:meth:`ErrorFeedback.encode_many`
without momentum): the small tensors a segmented stage codes at once take their step
together, host and device arrays alike.

Per run (:func:`codec.runs.feedback_runs`): ``acc = x + residual`` is formed in ONE flat
buffer (:func:`run_acc`), the run is coded from it at once, ``acc -= decoded`` is one update
of it (:func:`codec.many.subtract` with the run's span), and each key's new residual is its
slice of that buffer (``Slot.commit(..., at=(buffer, offset))``).  The old residuals become
the spares, so from the second step on the run's residuals and spares are each one buffer:
``acc`` is written into the spares' buffer and the residuals are read as one array, with no
allocation and no copy of them (:func:`span`).  On the device this makes a run's step a few
launches and one read-back whatever its tensor count: the gradients' copies into ``acc``,
one add, the segmented selection, one scatter.

Bit for bit the step each tensor's own :meth:`ErrorFeedback.encode` takes (the fused steps
equal the generic one), which the tests check.
"""

from __future__ import annotations

import numpy as np

from codec import many
from codec.device import Memory
from codec.dtypes import on_device
from codec.manyframe import parse_many
from codec.modes import ADD
from codec.runs import FEEDBACK_RUNS


def span(places, sizes):
    """``(buffer, offset)`` when ``places`` (each a slot's ``at`` or ``spare_at``) are slices of
    one buffer lying end to end in this order from ``offset``, with ``sizes`` elements each;
    else None."""
    if not places or places[0] is None:
        return None
    base, start = places[0]
    at = start
    for place, n in zip(places, sizes):
        if place is None or place[0] is not base or place[1] != at:
            return None
        at += n
    return base, start


def run_acc(xs, slots, device: bool):
    """``acc = x + residual`` of a run's tensors ``xs`` (one dtype) and their slots, in one
    flat buffer: the spares' when they are one (:func:`span`), else a new one.  Returns
    ``(buffer, offset)``; the run's ``acc`` is ``buffer[offset:offset + total]``."""
    sizes = [x.size for x in xs]
    n, dtype = sum(sizes), xs[0].dtype
    mem = Memory(device)
    place = span([s.spare_at for s in slots], sizes) or (mem.empty(n, dtype), 0)
    if not n:
        return place
    acc = place[0][place[1] : place[1] + n]
    held = span([s.at for s in slots], sizes)
    if held is not None:
        r = held[0][held[1] : held[1] + n]
    elif device:
        from codec.device import concat

        r = concat([s.residual for s in slots], mem.empty(n, dtype))
    else:
        r = None
    if device:  # the gradients copied in, the residuals added in one launch
        from codec.device import concat
        from codec.kernels import backend

        backend("convert", acc).combine(r, concat(xs, acc), ADD)
        return place
    at = 0
    for x, s, size in zip(xs, slots, sizes):
        np.add(x.reshape(-1), s.residual.reshape(-1) if r is None else r[at : at + size], out=acc[at : at + size])
        at += size
    return place


def encode_runs(ef, arrays, slots, named, groups, lay, layout, dest) -> bytes:
    """:meth:`ErrorFeedback.encode_many`'s frame and step when runs of its tensors (``groups``,
    :func:`codec.runs.feedback_runs`) take the step together: each run's ``acc`` formed at
    once (:func:`run_acc`), the run coded from it, ``acc -= decoded`` through the frame's
    runs in one update per run; every other tensor (and a run the stage declines) takes its
    own step, as :meth:`ErrorFeedback.encode` would.  Nothing changes until all finished."""
    c = ef.codec
    device = bool(arrays) and on_device(arrays[0])
    ctxs = [s.context(a, w) for a, s, w in zip(arrays, slots, named)]  # state installed once the frame is built
    places = {g[0]: run_acc([arrays[i] for i in g], [slots[i] for i in g], device) for g in groups}
    flats = {}
    for g in groups:
        base, at = places[g[0]]
        flats[g[0]] = base[at : at + sum(arrays[i].size for i in g)]
    finishes: dict = {}

    def alone(i):
        sections, finishes[i] = ef._feedback(arrays[i], slots[i], ctxs[i])
        return sections

    inputs = list(arrays)  # a run's tensors as their slices of its acc (a bad sum is named by its tensor)
    for g in groups:
        at = 0
        for i in g:
            inputs[i] = flats[g[0]][at : at + arrays[i].size].reshape(arrays[i].shape)
            at += arrays[i].size
    sections, pieces, ran = many.sections(c, inputs, ctxs, alone, shape=FEEDBACK_RUNS, flats=flats)
    frame = c.frame_many(sections, lay, layout, pieces=pieces, out=dest)
    mf = parse_many(frame, layout=lay, verify_payload=False)
    done = [g for g in groups if g[0] in ran]
    targets, commits = {}, []
    for g in done:
        base, at = places[g[0]]
        for i in g:
            view = base[at : at + arrays[i].size]
            targets[i] = view
            commits.append((slots[i], view.reshape(arrays[i].shape), (base, at)))
            at += arrays[i].size
    many.subtract(c, mf, targets, FEEDBACK_RUNS, {g[0]: flats[g[0]] for g in done})
    installs = [finishes[i](lambda i=i: mf.tensor(i))[0] for i in sorted(finishes)]
    for install in installs:  # only once every tensor has finished
        install()
    for slot, residual, at in commits:
        slot.commit(residual, at=at)
    for s, ctx in zip(slots, ctxs):
        ef._advance(s, ctx.state)
    return frame
