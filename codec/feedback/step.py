"""One tensor's error-feedback step on its key's :class:`~codec.feedback.Slot`, in two halves
(:meth:`Step.begin` and the ``finish`` it returns), so that a many-tensor step
(:func:`codec.many.encode_step`) can build the whole frame before any slot changes.

:class:`~codec.feedback.ErrorFeedback` owns the memory (which key has which slot, what a
saved state holds); this module owns what one step does to a slot, built on the codec's
pipeline primitives (``Codec.sections``, ``subtract``, the stages' fused hooks), and
:mod:`codec.feedback.runstep` the step of a run of tensors taken together.  Neither stores a
slot: the caller stores every slot of a step once the step has finished.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from codec.dtypes import on_device, readonly
from codec.feedback.slot import Slot
from codec.modes import SUB
from codec.ops import add, momentum, round_to, scatter, zero_at


@dataclass(frozen=True)
class Step:
    """The step an :class:`~codec.feedback.ErrorFeedback` takes: its ``codec``, DGC's
    ``momentum`` (0: off) and whether it feeds ``residuals`` back at all."""

    codec: object
    momentum: float = 0.0
    residuals: bool = True

    def begin(self, x: np.ndarray, slot: Slot, name: str = "x"):
        """The first half of a step: the sections of ``x`` (plus the residual) and
        ``finish(frame)``, run once the frame holding them is built: it completes the step in
        buffers of its own (``acc - decoded``, the masked velocity) and returns ``install()``,
        which alone changes ``slot`` (residual, velocity, stage state, step).  ``frame()``
        returns the parsed frame of this tensor (a v1 frame, or the tensor's view of a
        many-tensor frame).  Stages keep their state in a copy of the slot's, installed with
        the rest: an error anywhere before ``install`` loses nothing, and a many-tensor step
        installs only once every tensor has finished."""
        ctx = slot.context(x, name)
        if not self.residuals:
            sections = self.codec.sections(x.reshape(-1), ctx)
            return sections, lambda frame: lambda: advance(slot, ctx.state)
        if not self.momentum:
            sections, finish = self._feedback(x, slot, ctx)

            def done(frame):
                commit, _ = finish(frame)
                return lambda: (commit(), advance(slot, ctx.state))

            return sections, done
        u = momentum(slot.velocity, round_to(self.momentum, x.dtype)[()], x)  # in x's dtype, a new buffer where x lives
        sections, finish = self._feedback(u, slot, ctx)

        def done_momentum(frame):
            commit, sent = finish(frame)
            zero_at(u, sent)  # momentum-factor masking

            def install():
                commit()
                slot.velocity, slot.velocity_at = u, None
                advance(slot, ctx.state)

            return install

        return sections, done_momentum

    def _feedback(self, x: np.ndarray, slot: Slot, ctx):
        """The error-feedback step on ``acc = x + slot.residual`` (``ctx``: the stages'
        context): its sections, and ``finish(frame)`` forming ``acc - decoded`` in a buffer of
        its own and returning ``(commit, sent positions)`` (None: all); ``commit()`` installs
        it as the new residual.

        Three ways, the first that applies: a value stage alone may fuse the whole step
        (``Value.encode_feedback``: fp16/bf16 on float32); a select stage with
        ``fuses_feedback`` forms ``acc`` inside its selection pass; otherwise ``acc = x +
        residual`` is formed first.  Then ``acc -= decoded`` (a sparse frame touches only its
        positions: ``Value.decoded`` of the kept values when the value stage knows it,
        else the frame decoded) and ``acc`` is committed.  ``acc`` is a buffer other than the
        residual, so on error the residual is untouched."""
        c = self.codec
        flat = readonly(x.reshape(-1))  # (kernels take their inputs read-only: one signature a dtype)
        if c.select is None and c.transform is None:
            sections: list = []
            commit = c.value.encode_feedback(flat, slot, ctx, sections)
            if commit is not None:
                return sections, lambda frame: (commit, None)
        acc = slot.take_spare()
        if c.select is not None and c.select.fuses_feedback:
            sections = c.sections(flat, ctx, residual=slot.residual.reshape(-1), out=acc.reshape(-1))
        else:
            add(x, slot.residual, acc)
            sections = c.sections(acc.reshape(-1), ctx)

        def finish(frame):
            flat_acc = acc.reshape(-1)
            sent = None if ctx.positions is None or on_device(ctx.kept) else c.value.decoded(ctx.kept, ctx)
            if sent is None:
                c.subtract(frame(), flat_acc)
            else:  # what the frame decodes to at its positions, without decoding it
                scatter(sent, ctx.positions, flat_acc, SUB)
            return (lambda: slot.commit(acc)), ctx.positions

        return sections, finish


def advance(slot: Slot, state: dict | None = None) -> None:
    """Install a finished step's stage ``state`` in ``slot`` and count the step."""
    if state is not None:
        slot.state = state
    slot.step += 1
