"""Error feedback's step for the runs of a many-tensor call (:meth:`ErrorFeedback.encode_many`):
the small tensors a segmented stage codes at once take their step together, host and device
arrays alike, DGC's momentum included.

Per run (:func:`codec.runs.feedback_runs`): ``acc = x + residual`` is formed in ONE flat
buffer (:func:`run_acc`), the run is coded from it at once, ``acc -= decoded`` is one update
of it (:func:`codec.many.subtract` with the run's span), and each key's new residual is its
slice of that buffer (``Slot.commit(..., at=(buffer, offset))``).  The old residuals become
the spares, so from the second step on the run's residuals and spares are each one buffer:
``acc`` is written into the spares' buffer and the residuals are read as one array, with no
allocation and no copy of them (:func:`span`).  On the device this makes a run's step a few
launches and one read-back whatever its tensor count: the gradients' copies into ``acc``,
one add, the segmented selection, one scatter.

With momentum (``ErrorFeedback(momentum=m)``) the run first forms ``u = m*u + x`` in one new
flat buffer (:func:`run_velocity`), codes ``u + residual``, zeroes ``u`` at every position the
frame sent (one call for the run) and keeps each key's velocity as its slice of ``u``.

Bit for bit the step each tensor's own :meth:`ErrorFeedback.encode` takes (the fused steps
equal the generic one), which the tests check.
"""

from __future__ import annotations

import numpy as np

from codec import many
from codec.device import Memory, concat
from codec.dtypes import on_device
from codec.kernels import backend
from codec.manyframe import parse_many
from codec.modes import ADD
from codec.ops import momentum, offsets, round_to, zero_at
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


def run_velocity(xs, slots, m, device: bool):
    """DGC's momentum of a run's tensors ``xs`` (one dtype): ``u = m*u + x`` for all of them in
    one new flat buffer (the velocities read where they lie when they are one buffer,
    :func:`span`; a key without one starts from zeros), as each tensor's own step forms it.
    Returns the buffer."""
    sizes = [x.size for x in xs]
    n, dtype = sum(sizes), xs[0].dtype
    mem = Memory(device)
    u = mem.empty(n, dtype)
    held = span([s.velocity_at for s in slots], sizes)
    if device and n:  # one launch over the run: the gradients and velocities as one array each
        x = concat(xs, mem.empty(n, dtype))
        if held is not None:
            v = held[0][held[1] : held[1] + n]
        elif all(s.velocity is None for s in slots):  # the first step: zeros (momentum's None)
            v = None
        else:  # a key new to the run starts from zeros
            v = concat([mem.zeros(size, dtype) if s.velocity is None else s.velocity for s, size in zip(slots, sizes)], mem.empty(n, dtype))
        return momentum(v, m, x, u)
    at = 0
    for x, s, size in zip(xs, slots, sizes):
        v = s.velocity if held is None else held[0][held[1] + at : held[1] + at + size]
        momentum(None if v is None else v.reshape(-1), m, x.reshape(-1), u[at : at + size])
        at += size
    return u


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
        r = concat([s.residual for s in slots], mem.empty(n, dtype))
    else:
        r = None
    if device:  # the gradients copied in, the residuals added in one launch
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
    ctxs = [None] * len(arrays)  # a run member's context (its state installed once the frame is built)
    for g in groups:
        for i in g:
            ctxs[i] = slots[i].context(arrays[i], named[i])
    velocities = {}  # with momentum: per run, u = m*u + x, which the run codes (plus the residuals)
    if ef.momentum:
        for g in groups:
            xs = [arrays[i] for i in g]
            velocities[g[0]] = run_velocity(xs, [slots[i] for i in g], round_to(ef.momentum, xs[0].dtype)[()], device)
    sees = c.select is not None and c.select.sees_gradient  # the stage is handed each run's gradients (AdaComp's dW)
    places, gradients = {}, {}
    for g in groups:
        xs = [arrays[i] for i in g]
        if g[0] in velocities:  # the run's u in place of its gradients, each tensor's slice
            u, at = velocities[g[0]], np.cumsum([0] + [x.size for x in xs])
            xs = [u[a:b] for a, b in zip(at, at[1:])]
        if sees:
            gradients[g[0]] = velocities[g[0]] if g[0] in velocities else many.joined(xs)
        places[g[0]] = run_acc(xs, [slots[i] for i in g], device)
    flats = {}
    for g in groups:
        base, at = places[g[0]]
        flats[g[0]] = base[at : at + sum(arrays[i].size for i in g)]
    finishes: dict = {}

    def alone(i):  # the tensor's own step (its momentum too), as ErrorFeedback.encode takes it
        sections, finishes[i] = ef._begin(arrays[i], slots[i], named[i])
        return sections

    inputs = list(arrays)  # a run's tensors as their slices of its acc (a bad sum is named by its tensor)
    for g in groups:
        at = 0
        for i in g:
            inputs[i] = flats[g[0]][at : at + arrays[i].size].reshape(arrays[i].shape)
            at += arrays[i].size
    sections, pieces, ran = many.sections(c, inputs, ctxs, alone, shape=FEEDBACK_RUNS, flats=flats, gradients=gradients or None)
    frame = c.frame_many(sections, lay, layout, pieces=pieces, out=dest)
    mf = parse_many(frame, layout=lay, verify_payload=False)
    done = [g for g in groups if g[0] in ran]
    targets, kept = {}, {}  # kept: per run member, its new residual and velocity, and where they lie
    for g in done:
        base, at = places[g[0]]
        u = velocities.get(g[0])
        for i in g:
            targets[i] = base[at : at + arrays[i].size]
            off = at - places[g[0]][1]
            velocity = None if u is None else (u[off : off + arrays[i].size].reshape(arrays[i].shape), (u, off))
            kept[i] = (targets[i].reshape(arrays[i].shape), (base, at), velocity)
            at += arrays[i].size
    many.subtract(c, mf, targets, FEEDBACK_RUNS, {g[0]: flats[g[0]] for g in done})
    for g in done:  # momentum-factor masking: u zeroed where the frame sent values (all: a dense codec)
        if g[0] in velocities:
            sent = [ctxs[i].positions for i in g]
            zero_at(velocities[g[0]], None if any(p is None for p in sent) else _in_run(sent, [arrays[i].size for i in g]))
    installs = {i: finishes[i](lambda i=i: mf.tensor(i)) for i in sorted(finishes)}  # every tensor finished first
    for i, slot in enumerate(slots):  # then installed, in tensor order (the order state_dict keeps)
        if i in installs:
            installs[i]()
            continue
        residual, at, velocity = kept[i]
        slot.commit(residual, at=at)
        if velocity is not None:
            slot.velocity, slot.velocity_at = velocity
        ef._advance(slot, ctxs[i].state)
    return frame


def _in_run(sent, sizes):
    """The positions ``sent[t]`` (each relative to its tensor, of ``sizes[t]`` elements) as
    positions in the run of the tensors, where they lie: on a device, one
    ``absolute_positions`` over them (a run's selection leaves them end to end in one array)."""
    starts = offsets(sizes)
    if not any(on_device(p) for p in sent):
        return np.concatenate([p + s for p, s in zip(sent, starts[:-1].tolist())])
    from codec.device import concat, span

    mem = Memory(True)
    kstarts = offsets([p.size for p in sent])
    whole = span(sent)
    if whole is None:
        whole = concat([mem.put(p) for p in sent], mem.empty(int(kstarts[-1]), np.int64))
    out = mem.empty(whole.size, np.int64)
    backend("index", whole).absolute_positions(whole, mem.put(kstarts), mem.put(starts), out)
    return out
