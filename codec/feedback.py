"""``ErrorFeedback``: residual memory per key around any codec.

    acc = x + residual[key];  frame = codec.encode(acc);  residual[key] = acc - decoded(frame)

Each key also has a step counter and a ``state`` dict that stages may use between steps
(PowerSGD's warm-started Q, a random-k counter, AdaComp's separate gradient and residual):
the codec receives them through ``Codec.encode_feedback(x, slot)``, which is also where a
stage plugs in a fused "encode and update the residual" kernel.  The whole state survives
``state_dict()`` / ``load_state_dict()`` and pickling.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codec.dtypes import as_float_array
from codec.pipeline import Codec, get_codec


@dataclass
class Slot:
    """Per-key memory: the residual (input's shape and dtype), the step count, stage state."""


    key: Any
    residual: np.ndarray
    step: int = 0
    state: dict = field(default_factory=dict)
    #: a second residual-sized buffer a fused kernel may write into and swap (not saved)
    spare: np.ndarray | None = field(default=None, repr=False)


class ErrorFeedback:
    """Error feedback around ``codec`` (a Codec, spec string or config dict).

    >>> ef = ErrorFeedback("fp16")
    >>> frame = ef.encode(grad, key="layer1.weight")   # doctest: +SKIP
    """

    def __init__(self, codec):
        self.codec: Codec = get_codec(codec)
        self._slots: dict = {}

    def encode(self, x, key=None, *, dtype=None) -> bytes:
        """Encode ``x`` plus the residual of ``key``; the new residual is what the frame missed."""
        arr = as_float_array(x, dtype)
        slot = self._slots.get(key)
        if slot is None:
            slot = Slot(key, np.zeros(arr.shape, arr.dtype))
        elif slot.residual.shape != arr.shape or slot.residual.dtype != arr.dtype:
            raise ValueError(
                f"x: key {key!r} was {slot.residual.dtype}{list(slot.residual.shape)}, now {arr.dtype}{list(arr.shape)}; "
                "call reset(key) to start it over"
            )
        frame = self.codec.encode_feedback(arr, slot)
        slot.step += 1
        self._slots[key] = slot
        return frame

    def residual(self, key=None) -> np.ndarray:
        """The current residual of ``key`` (a read-only view)."""
        r = self._slots[key].residual.view()
        r.flags.writeable = False
        return r

    def step(self, key=None) -> int:
        """How many frames ``key`` has produced."""
        slot = self._slots.get(key)
        return 0 if slot is None else slot.step

    def keys(self) -> list:
        return list(self._slots)

    def reset(self, key=None, *, all: bool = False) -> None:
        """Forget ``key`` (or every key with ``all=True``)."""
        if all:
            self._slots.clear()
        else:
            self._slots.pop(key, None)

    def state_dict(self) -> dict:
        """Everything needed to resume: codec config and, per key, residual, step and stage state."""
        return {
            "codec": self.codec.get_config(),
            "slots": [
                {"key": s.key, "residual": s.residual.copy(), "step": s.step, "state": copy.deepcopy(s.state)}
                for s in self._slots.values()
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned; the codec must be the same."""
        if not isinstance(state, dict) or "slots" not in state or "codec" not in state:
            raise ValueError("state: expected the dict ErrorFeedback.state_dict() returns")
        if get_codec(state["codec"]) != self.codec:
            raise ValueError(f"state: saved for codec {get_codec(state['codec']).spec!r}, this one is {self.codec.spec!r}")
        slots = {}
        for s in state["slots"]:
            res = np.array(s["residual"], copy=True)
            slots[s["key"]] = Slot(s["key"], res, int(s["step"]), copy.deepcopy(s.get("state", {})))
        self._slots = slots

    def __getstate__(self):
        return self.state_dict()

    def __setstate__(self, state):
        self.codec = get_codec(state["codec"])
        self._slots = {}
        self.load_state_dict(state)

    def __repr__(self):
        return f"ErrorFeedback({self.codec.spec!r}, keys={len(self._slots)})"
