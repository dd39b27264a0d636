"""``ErrorFeedback``: residual memory per key around any codec.

    acc = x + residual[key];  frame = codec.encode(acc);  residual[key] = acc - decoded(frame)

Each key also has a step counter and a ``state`` dict that stages may use between steps
(today only PowerSGD's warm-started Q; random-k and the schedules read the step count):
the stages receive them in their :class:`~codec.stage.Context`.  The step of one tensor
lives in :mod:`codec.feedback.step` (:meth:`Step.begin`), built on the codec's pipeline primitives
(``Codec.sections``, ``frame``, ``subtract``); stages plug in fused kernels through their
kind's hooks (``Select.fuses_feedback``, ``Value.encode_feedback``), and :meth:`Slot.commit`
is the one place a new residual is installed.  The whole state survives
``state_dict()`` / ``load_state_dict()`` and pickling.

``ErrorFeedback(codec, residuals=False)`` keeps the rest of a key's memory without a
residual: each ``encode`` is the codec's plain frame of ``x`` with the key's step (and stage
state), and advances the step.  A transport keeps every tensor's memory in one
ErrorFeedback this way whether error feedback is on or off.  A scheme that runs its own
step (the transport's two-round PowerSGD, whose residual is formed across two collectives)
takes a key's slot with :meth:`ErrorFeedback.slot` (changing nothing), stores it with
:meth:`ErrorFeedback.keep`, installs a residual with :meth:`Slot.commit` and advances
``slot.step``; :meth:`ErrorFeedback.check_slot` is where such a scheme adds the rules of
its own memory to the checks of a loaded state.

Laid out by job: :mod:`codec.feedback.slot` (a key's memory, :class:`Slot`),
:mod:`codec.feedback.error_feedback` (:class:`ErrorFeedback`, which owns the memory: which
key has which slot, when a slot is stored), :mod:`codec.feedback.step` (what one tensor's
step does to its slot), :mod:`codec.feedback.runstep` (error feedback's half of a
many-tensor step: the runs that take their step together; the step's sequence is
:func:`codec.many.encode_step`, which ``Codec.encode_many`` runs too) and
:mod:`codec.feedback.state` (what ``state_dict`` saves and the rules ``load_state_dict``
checks).
"""

from codec.feedback.error_feedback import ErrorFeedback
from codec.feedback.slot import Slot

__all__ = ["ErrorFeedback", "Slot"]
