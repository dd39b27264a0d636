"""What a stage is told about the array it codes (:class:`Context`), and the one check of a
step number (:func:`check_step`); ``codec.stage`` re-exports both."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codec.errors import CodecValueError

#: the largest step a codec accepts (steps key random streams and schedules; random-k's frame
#: records the step, and its decoder has refused 2**62 and above since format v1)
MAX_STEP = (1 << 62) - 1


def check_step(step, argname: str = "step") -> int:
    """``step`` as an int in ``[0, MAX_STEP]``, or ValueError naming ``argname``."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step <= MAX_STEP:
        raise CodecValueError(f"{argname}: must be an integer in [0, 2**62), got {step!r}")
    return int(step)


@dataclass
class Context:
    """What a stage knows about the array it codes.

    ``key``, ``step`` and ``state`` come from :class:`codec.ErrorFeedback` (per-key memory
    a stage may keep between steps, e.g. PowerSGD's Q or a random-k counter); a bare
    ``encode`` uses ``key=None, step=0`` and a fresh ``state``.  ``positions`` maps the
    i-th coded value back to its flat index when a select stage ran (None when dense).
    ``hints`` carries per-call facts one stage hands the next (AdaComp's scale for its
    sign-bit value coding).  ``name`` is what an error about the array calls it: ``x`` for
    ``encode``, ``tensors['w']`` for a tensor of ``encode_many``.  ``kept`` holds the values a
    select stage handed the value stage (what error feedback subtracts, :meth:`Value.decoded`).
    ``device``: a decode writes a device array, so positions may be read there.  ``value``:
    when decoding, the pipeline's value stage (a select stage whose positions are not in the
    frame bounds their count by what that stage's sections can hold: :meth:`Value.most_values`).
    """

    shape: tuple
    dtype: np.dtype
    key: Any = None
    step: int = 0
    state: dict = field(default_factory=dict)
    positions: Any = None
    hints: dict = field(default_factory=dict)
    name: str = "x"
    #: the values the value stage coded after a select stage (with ``positions``)
    kept: Any = None
    #: decoding into a device array: a select stage may read ``positions`` on the device
    #: (:func:`codec.pack.decode_indices` with ``device=True``)
    device: bool = False
    #: decoding: the value stage that codes the kept values (None: one bit per value at least)
    value: Any = None
    #: decoding checks the frame's payload in the pass that writes the output (its value
    #: stage's ``write`` is given a :class:`codec.payloadcheck.PayloadCheck`): a value stage
    #: may leave its codes' range check to that pass (:meth:`codec.stages.value.quantizer.Quantizer.read_values_section`)
    checked_in_pass: bool = False

    @property
    def n(self) -> int:
        return math.prod(self.shape)

    @property
    def codes_on_device(self) -> bool:
        """A value stage reads its codes where a device frame holds them
        (:meth:`codec.frame.SectionReader.take` with ``device=True``): the decode writes a
        device array (a select stage's kept values are then decoded there too:
        :meth:`codec.stage.Value.written`)."""
        return self.device

    def domain(self, count: int, dtype) -> "Context":
        """The context of a transform's output (``count`` coefficients of ``dtype``): what the
        value stage after a transform sees.  Key, step, state and hints are shared."""
        return Context((count,), np.dtype(dtype), key=self.key, step=self.step, state=self.state, hints=self.hints, name=self.name)

    def where(self, i: int) -> tuple:
        """The array position of coded value ``i``, for error messages."""
        flat = int(i) if self.positions is None else int(self.positions[i])
        return tuple(int(v) for v in np.unravel_index(flat, self.shape)) if self.shape else ()


def where(names, count: int) -> list[str]:
    """How errors name each tensor of a many-tensor call: ``tensors['w']`` or ``tensors[3]``
    (the contexts' ``name``: :mod:`codec.many`, a replayed step, error feedback)."""
    return [f"tensors[{k!r}]" for k in (names if names is not None else range(count))]
