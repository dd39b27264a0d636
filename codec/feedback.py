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
from codec.ops import round_to
from codec.pipeline import Codec, get_codec


@dataclass
class Slot:
    """Per-key memory: the residual (input's shape and dtype), the step count, stage state."""


    key: Any
    residual: np.ndarray
    step: int = 0
    state: dict = field(default_factory=dict)
    #: DGC's momentum u (ErrorFeedback(momentum=m)); None without momentum
    velocity: np.ndarray | None = field(default=None, repr=False)
    #: a second residual-sized buffer a fused kernel may write into and swap (not saved)
    spare: np.ndarray | None = field(default=None, repr=False)


class ErrorFeedback:
    """Error feedback around ``codec`` (a Codec, spec string or config dict).

    ``momentum=m`` (0 <= m < 1, default 0: off) adds Deep Gradient Compression's momentum
    correction with momentum-factor masking: per key, ``u = m*u + x`` (in x's dtype, ``m``
    rounded to it); the codec encodes
    ``u + residual``; then ``u`` is zeroed where the frame sent values (everywhere for a
    dense codec).  Works with any codec.

    >>> ef = ErrorFeedback("topk(ratio=0.01)", momentum=0.9)
    >>> frame = ef.encode(grad, key="layer1.weight")   # doctest: +SKIP
    """

    def __init__(self, codec, *, momentum: float = 0.0):
        self.codec: Codec = get_codec(codec)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"momentum: must be a number in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)
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
        if self.momentum:
            u = np.zeros_like(arr) if slot.velocity is None else slot.velocity
            m = round_to(self.momentum, arr.dtype)
            u = np.add(np.multiply(u, m, dtype=arr.dtype), arr, dtype=arr.dtype)  # in x's dtype, a new buffer
            frame, sent = self.codec._feedback(u, slot)
            u.reshape(-1)[slice(None) if sent is None else sent] = 0  # momentum-factor masking
            slot.velocity = u
        else:
            frame = self.codec.encode_feedback(arr, slot)
        slot.step += 1
        self._slots[key] = slot
        return frame

    def residual(self, key=None) -> np.ndarray:
        """The current residual of ``key`` (a read-only view)."""
        r = self._slots[key].residual.view()
        r.flags.writeable = False
        return r

    def add_residual(self, key, values, positions=None) -> None:
        """``residual[key] += values`` (at the flat ``positions`` when given, else everywhere).

        For what a codec sent but the transport did not deliver: gTop-k returns the values a
        rank selected that missed the global top-k, so they are sent later, as error feedback
        intends.  ``values`` are rounded once into the residual's dtype."""
        slot = self._slots.get(key)
        if slot is None:
            raise KeyError(f"key: no residual for {key!r}; encode it first")
        from codec.modes import ADD
        from codec.ops import scatter, store

        flat = slot.residual.reshape(-1)
        vals = as_float_array(values, argname="values").reshape(-1)
        if positions is None:
            if vals.size != flat.size:
                raise ValueError(f"values: has {vals.size} elements, the residual of {key!r} has {flat.size}")
            store(vals, flat, ADD)
            return
        pos = np.asarray(positions)
        if pos.ndim != 1 or pos.dtype.kind not in "iu" or pos.size != vals.size:
            raise ValueError(f"positions: expected a 1-D integer array as long as values, got {pos.dtype}{list(pos.shape)} for {vals.size} values")
        if pos.size and (pos.min() < 0 or pos.max() >= flat.size):
            raise ValueError(f"positions: must lie in [0, {flat.size}) for the residual of {key!r}")
        scatter(vals, pos, flat, ADD)

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
            "momentum": self.momentum,
            "slots": [
                {
                    "key": s.key,
                    "residual": s.residual.copy(),
                    "step": s.step,
                    "state": copy.deepcopy(s.state),
                    "velocity": None if s.velocity is None else s.velocity.copy(),
                }
                for s in self._slots.values()
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned; the codec must be the same."""
        if not isinstance(state, dict) or "slots" not in state or "codec" not in state:
            raise ValueError("state: expected the dict ErrorFeedback.state_dict() returns")
        if get_codec(state["codec"]) != self.codec:
            raise ValueError(f"state: saved for codec {get_codec(state['codec']).spec!r}, this one is {self.codec.spec!r}")
        if float(state.get("momentum", 0.0)) != self.momentum:
            raise ValueError(f"state: saved with momentum {state.get('momentum', 0.0)}, this ErrorFeedback has {self.momentum}")
        slots = {}
        for s in state["slots"]:
            res = np.array(s["residual"], copy=True)
            vel = s.get("velocity")
            slots[s["key"]] = Slot(
                s["key"], res, int(s["step"]), copy.deepcopy(s.get("state", {})), None if vel is None else np.array(vel, copy=True)
            )
        self._slots = slots

    def __getstate__(self):
        return self.state_dict()

    def __setstate__(self, state):
        self.codec = get_codec(state["codec"])
        self.momentum = float(state.get("momentum", 0.0))
        self._slots = {}
        self.load_state_dict(state)

    def __repr__(self):
        m = f", momentum={self.momentum}" if self.momentum else ""
        return f"ErrorFeedback({self.codec.spec!r}{m}, keys={len(self._slots)})"
