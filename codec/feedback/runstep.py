"""Error feedback's half of a many-tensor step (:meth:`ErrorFeedback.encode_many`):
:class:`ManyFeedback`, which :func:`codec.many.encode_step` drives.  The small tensors a
segmented stage codes at once take their step together, host and device arrays alike, DGC's
momentum included; every other tensor takes its own (:meth:`codec.feedback.step.Step.begin`).

Per run (:func:`codec.runs.feedback_runs`): ``acc = x + residual`` is formed in ONE flat
buffer (:func:`run_acc`), the run is coded from it at once, ``acc -= decoded`` is one update
of it (:func:`codec.manydecode.subtract` with the run's span), and each key's new residual is its
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

from codec import many, manydecode
from codec.device import Memory, concat
from codec.dtypes import on_device
from codec.kernels import backend
from codec.manyframe import parse_many
from codec.modes import ADD, SUB
from codec.ops import add, momentum, offsets, round_to, scatter, zero_at
from codec.feedback.step import advance
from codec.runs import feedback_runs, feedback_shape


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
    if r is not None:  # the gradients copied in (one call), the residuals added at once: x + r as each tensor's step adds
        np.concatenate([x.reshape(-1) for x in xs], out=acc)
        add(acc, r, acc)
        return place
    at = 0
    for x, s, size in zip(xs, slots, sizes):
        add(x.reshape(-1), s.residual.reshape(-1), acc[at : at + size])
        at += size
    return place


class ManyFeedback:
    """The error-feedback half of a many-tensor step, which :func:`codec.many.encode_step`
    drives: ``step`` (:class:`codec.feedback.step.Step`), ``slots[i]`` tensor i's key's slot
    and ``named[i]`` how errors name tensor i.  The runs of :func:`codec.runs.feedback_runs`
    take their step together (:meth:`accumulate`, then :meth:`finish`); every other tensor,
    and a run the stage declines, takes its own (:meth:`alone`), as
    :meth:`ErrorFeedback.encode` would.  No slot changes until :meth:`finish`, after the
    frame is built; the caller stores the slots."""

    def __init__(self, step, slots, named):
        self.step, self.slots, self.named = step, slots, named
        self.arrays: list = []
        self.finishes: dict = {}  # per tensor taking its own step: its finish(frame)
        self.velocities: dict = {}  # with momentum, per run (keyed by its first tensor): u = m*u + x
        self.places: dict = {}  # per run: (buffer, offset) of its acc (:func:`run_acc`)
        self.flats: dict = {}  # per run: its acc, that buffer's slice
        self.sent: dict = {}  # per run whose coding was replayed: its sent positions, where acc - decoded is +0.0

    def plan(self, c, arrays, joint: bool = False):
        """``(groups, ctxs)`` for ``arrays``: the runs taking the step together (None without
        residuals: then the codec's own runs code the tensors, ``ctxs`` every tensor's
        context; ``joint``: the one concatenation takes its own step) and the run members'
        contexts (their stage state installed by :meth:`finish`; None for the others, whose
        own step makes theirs)."""
        self.arrays = arrays
        if not self.step.residuals:
            return None, [s.context(a, w) for a, s, w in zip(arrays, self.slots, self.named)]
        groups = [] if joint else feedback_runs(c, arrays)
        ctxs = [None] * len(arrays)
        for g in groups:
            for i in g:
                ctxs[i] = self.slots[i].context(arrays[i], self.named[i])
        return groups, ctxs

    def replayable(self, arrays) -> bool:
        """Whether a step over ``arrays`` (the runs' ``acc``, or the gradients) may be replayed
        (:func:`codec.replay.encode_feedback`, :func:`codec.replay.learn_lowrank_feedback`):
        residuals, no momentum (its masking reads each tensor's sent positions), host arrays."""
        return self.step.residuals and not self.step.momentum and not any(on_device(a) for a in arrays)

    def alone(self, i: int) -> list:
        """Tensor ``i``'s sections from its own step (its momentum too)."""
        sections, self.finishes[i] = self.step.begin(self.arrays[i], self.slots[i], self.named[i])
        return sections

    def accumulate(self, c, groups) -> tuple:
        """Each run's ``acc`` formed at once (:func:`run_acc`; with momentum from ``u = m*u +
        x``, :func:`run_velocity`): ``(inputs, flats, gradients)``, the tensors with each run
        member as its slice of its run's ``acc`` (a bad sum is named by its tensor), per run
        its ``acc`` (``{first index: flat}``), and per run the gradients (or velocity) a
        select stage that sees them is handed (:attr:`codec.stage.Select.sees_gradient`)."""
        arrays, slots = self.arrays, self.slots
        device = bool(arrays) and on_device(arrays[0])
        if self.step.momentum:
            for g in groups:
                xs = [arrays[i] for i in g]
                self.velocities[g[0]] = run_velocity(xs, [slots[i] for i in g], round_to(self.step.momentum, xs[0].dtype)[()], device)
        sees = c.select is not None and c.select.sees_gradient
        gradients, flats = {}, self.flats
        inputs = list(arrays)
        for g in groups:
            xs = [arrays[i] for i in g]
            if g[0] in self.velocities:  # the run's u in place of its gradients, each tensor's slice
                u, at = self.velocities[g[0]], np.cumsum([0] + [x.size for x in xs])
                xs = [u[a:b] for a, b in zip(at, at[1:])]
            if sees:
                gradients[g[0]] = self.velocities[g[0]] if g[0] in self.velocities else many.joined(xs)
            base, start = self.places[g[0]] = run_acc(xs, [slots[i] for i in g], device)
            flats[g[0]] = flat = base[start : start + sum(x.size for x in xs)]
            at = 0
            for i in g:
                inputs[i] = flat[at : at + arrays[i].size].reshape(arrays[i].shape)
                at += arrays[i].size
        return inputs, flats, gradients or None

    def finish(self, c, frame, lay, groups, ran, ctxs, joint: bool = False) -> None:
        """The step completed once ``frame`` is built: ``acc -= decoded`` through the frame's
        runs in one update per run the stage coded (``ran``), the runs' velocities masked, every
        other tensor's own step finished; then every slot changed, in tensor order (the order
        ``state_dict`` keeps)."""
        if groups is None:  # no residuals: the stage state and the step
            for slot, ctx in zip(self.slots, ctxs):
                advance(slot, ctx.state)
            return
        parsed = []

        def parse():
            if not parsed:
                parsed.append(parse_many(frame, layout=lay, verify_payload=False))
            return parsed[0]

        arrays = self.arrays
        done = [g for g in groups if g[0] in ran]
        targets, kept = {}, {}  # kept: per run member, its new residual and velocity, and where they lie
        for g in done:
            base, at = self.places[g[0]]
            u = self.velocities.get(g[0])
            for i in g:
                targets[i] = base[at : at + arrays[i].size]
                off = at - self.places[g[0]][1]
                velocity = None if u is None else (u[off : off + arrays[i].size].reshape(arrays[i].shape), (u, off))
                kept[i] = (targets[i].reshape(arrays[i].shape), (base, at), velocity)
                at += arrays[i].size
        decoding = [g for g in done if not self._subtract_sent(c, g, ctxs)]
        if decoding:
            manydecode.subtract(c, parse(), {i: targets[i] for g in decoding for i in g}, feedback_shape(c, arrays), {g[0]: self.flats[g[0]] for g in decoding})
        for g in done:  # momentum-factor masking: u zeroed where the frame sent values (all: a dense codec)
            if g[0] in self.velocities:
                sent = [ctxs[i].positions for i in g]
                zero_at(self.velocities[g[0]], None if any(p is None for p in sent) else _in_run(sent, [arrays[i].size for i in g]))
        tensor = (lambda i: parse().whole()) if joint else (lambda i: parse().tensor(i))
        installs = {i: self.finishes[i](lambda i=i: tensor(i)) for i in sorted(self.finishes)}  # every tensor finished first
        for i, slot in enumerate(self.slots):  # then installed, in tensor order
            if i in installs:
                installs[i]()
                continue
            residual, at, velocity = kept[i]
            slot.commit(residual, at=at)
            if velocity is not None:
                slot.velocity, slot.velocity_at = velocity
            advance(slot, ctxs[i].state)

    def _subtract_sent(self, c, g, ctxs) -> bool:
        """``acc -= decoded`` of the run ``g`` of a select stage, as each tensor's own step
        forms it (:meth:`codec.feedback.step.Step._feedback`): what the frame decodes to at the
        sent positions (``Value.decoded`` of the kept values), subtracted there by one
        scatter over the run's ``acc``, without parsing or decoding the frame.  False (nothing
        done) when the value stage does not know it (a quantizer's codes) or the positions
        are on a device."""
        if g[0] in self.sent:  # a replayed coding: the frame holds acc's own values there
            zero_at(self.flats[g[0]], self.sent[g[0]])
            return True
        kept = [ctxs[i].kept for i in g]
        sent = [ctxs[i].positions for i in g]
        if any(k is None or on_device(k) for k in kept) or any(p is None for p in sent):
            return False
        if c.value.elementwise:  # each value decodes alone: the run's at once
            values = c.value.decoded(np.concatenate(kept), ctxs[g[0]])
        else:  # (AdaComp's signs decode with their tensor's scale)
            parts = [c.value.decoded(k, ctxs[i]) for k, i in zip(kept, g)]
            values = None if any(p is None for p in parts) else np.concatenate(parts)
        if values is None:
            return False
        scatter(values, _in_run(sent, [self.arrays[i].size for i in g]), self.flats[g[0]], SUB)
        return True


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
