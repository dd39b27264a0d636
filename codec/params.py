"""Declared stage parameters: :class:`Param`, and the parameters many stages share.

A stage lists its parameters as a tuple of :class:`Param`; spec strings, config dicts and
keyword arguments are all checked against it at construction.  Parameters with the same
meaning in several stages are built here, once: :func:`ratio`, :data:`SEED`,
:func:`rounding`, :data:`NONFINITE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from codec.errors import CodecValueError
from codec.schedule import build
from codec.spec import Call, SpecError, parse_value

__all__ = ["Param", "NONFINITE", "SEED", "ratio", "rounding"]


@dataclass(frozen=True)
class Param:
    """One declared parameter of a stage: name, type, default, bounds or choices, and a doc line.

    ``schedule=True`` (int or float parameters): the value may also be a schedule of the step
    (:mod:`codec.schedule`): a ``Schedule``, a parsed ``codec.spec.Call`` or its text (how a
    config dict carries it), e.g. ``warmup(0.25,0.001,steps=1000)``.  Every value the schedule
    can produce must lie within ``low``/``high``.  A stage reads it with ``self.at(name, step)``.

    ``auto=True`` (default must be None): ``None`` and the word ``auto`` both mean "use the
    stage's default rule" and convert to None, so ``adacomp(bin=auto)`` is ``adacomp``.
    """

    name: str
    type: type
    default: Any
    doc: str
    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    #: the lower bound is open: values must be > ``low`` (a ratio in (0, 1])
    low_open: bool = False
    schedule: bool = False
    auto: bool = False

    def __post_init__(self):
        if self.schedule and self.type not in (int, float):
            raise CodecValueError(f"parameter {self.name}: schedule=True needs an int or float parameter, not {self.type.__name__}")
        if self.auto and self.default is not None:
            raise CodecValueError(f"parameter {self.name}: auto=True needs default None (None is what 'auto' means), got {self.default!r}")

    def convert(self, value, where: str):
        """Check and normalise a user-given value; raises ValueError naming ``where.name``."""
        label = f"{where}: parameter {self.name}"
        if self.auto and (value is None or (isinstance(value, str) and value.strip().lower() == "auto")):
            return None
        if self.schedule and isinstance(value, str):
            value = self._parse_schedule_text(value, label)
        if isinstance(value, Call):
            if self.schedule:
                return self._convert_schedule(value, label)
            raise CodecValueError(f"{label} is not schedulable: it takes {self._expected(self._kind())}, got {value}")
        if self.type is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise CodecValueError(f"{label} must be true or false, got {value!r}")
            return bool(value)
        if self.type is int:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise CodecValueError(f"{label} must be {self._expected('an integer')}, got {value!r}")
            value = int(value)
        elif self.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise CodecValueError(f"{label} must be {self._expected('a number')}, got {value!r}")
            try:
                value = float(value)
            except OverflowError:  # an integer beyond float64's range
                raise CodecValueError(f"{label} must be finite, got an integer of {len(str(abs(int(value))))} digits") from None
            if not math.isfinite(value):
                raise CodecValueError(f"{label} must be finite, got {value!r}")
        elif self.type is str:
            if not isinstance(value, str):
                raise CodecValueError(f"{label} must be one of {list(self.choices)}, got {value!r}")
        if self.choices and value not in self.choices:
            raise CodecValueError(f"{label} must be one of {list(self.choices)}, got {value!r}")
        self._check_bounds(value, label, value)
        return value

    def _kind(self) -> str:
        if self.choices:
            return f"one of {list(self.choices)}"
        return {bool: "true or false", int: "an integer", float: "a number"}.get(self.type, f"a {self.type.__name__}")

    def _expected(self, what: str) -> str:
        if self.schedule:
            what += " or a schedule such as warmup(0.25,0.001,steps=1000)"
        if self.auto:
            what += " or auto"
        return what

    def _check_bounds(self, v, label, shown, where=""):
        if self.low is not None and (v <= self.low if self.low_open else v < self.low):
            raise CodecValueError(f"{label} must be {'>' if self.low_open else '>='} {self.low}, got {shown!r}{where}")
        if self.high is not None and v > self.high:
            raise CodecValueError(f"{label} must be <= {self.high}, got {shown!r}{where}")

    def _parse_schedule_text(self, text: str, label: str) -> Call:
        try:
            value = parse_value(text)
        except SpecError as e:
            raise CodecValueError(f"{label} must be {self._expected('a number')}, got {text!r} ({e})") from None
        if not isinstance(value, Call):
            raise CodecValueError(f"{label} must be {self._expected('a number')}, got the string {text!r}")
        return value

    def _convert_schedule(self, call: Call, label: str):
        try:
            sched = build(call)
        except ValueError as e:
            raise CodecValueError(f"{label}: {e}") from None
        for what, v in sched.points():
            self._check_bounds(v, label, v, f" ({what} of {sched})")
        return sched

    def describe(self) -> dict:
        d = {"name": self.name, "type": self.type.__name__, "default": self.default, "doc": self.doc}
        if self.choices:
            d["choices"] = list(self.choices)
        if self.low is not None:
            d["min"] = self.low
            if self.low_open:
                d["min_open"] = True
        if self.high is not None:
            d["max"] = self.high
        if self.schedule:
            d["schedule"] = True
        if self.auto:
            d["auto"] = True
        return d


# -------------------------------------------------------------------- shared parameters


def ratio(default: float = 0.01, doc: str = "target density k/n, in (0, 1]") -> Param:
    """A fraction of the elements, in (0, 1], schedulable (topk, gaussiank, dgc, randomk)."""
    return Param("ratio", float, default, doc, low=0.0, low_open=True, high=1.0, schedule=True)


#: the seed of a stage's random stream (codec.streams: counter-based, keyed by seed, key and step)
SEED = Param("seed", int, 0, "random stream seed", low=0, high=(1 << 63) - 1)


def rounding(default: str) -> Param:
    """How a quantizer rounds: ``nearest`` (ties to even) or ``stochastic`` (unbiased)."""
    return Param("rounding", str, default, "nearest (ties to even) or stochastic (unbiased)", choices=("nearest", "stochastic"))


#: what a lossy value stage does with NaN/inf input
NONFINITE = Param(
    "nonfinite",
    str,
    "raise",
    "NaN/inf input: raise CodecValueError naming the first position, or keep (sent as IEEE NaN/inf)",
    choices=("raise", "keep"),
)
