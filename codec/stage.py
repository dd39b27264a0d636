"""Stages, their declared parameters, and the registry that spec strings are resolved against.

A codec is a pipeline of stages (see ``codec.pipeline``), one of each kind at most, in this
order::

    transform -> select -> value -> bytes...

* ``transform``: maps the flat array into another domain (blocked rfft, low-rank) and back.
* ``select``: picks which elements are sent (top-k, AdaComp, ...) and codes their positions.
* ``value``: codes the kept values (``none`` keeps them exactly, ``fp16``, ``bf16``, ...).
* ``bytes``: acts on the stored bytes of every section (``zstd``) or the frame (``crc32``).

A stage class declares ``name``, ``kind``, ``params`` (a tuple of :class:`Param`) and a
one-line docstring, and is registered with :func:`register`.  Stage modules must not import
Numba at module level: kernels are imported inside methods, so ``import codec`` stays cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from codec.errors import UnknownCodecError

KINDS = ("transform", "select", "value", "bytes")

_REGISTRY: dict[str, type["Stage"]] = {}


@dataclass(frozen=True)
class Param:
    """One declared parameter of a stage: name, type, default, bounds or choices, and a doc line."""

    name: str
    type: type
    default: Any
    doc: str
    choices: tuple = ()
    low: float | None = None
    high: float | None = None

    def convert(self, value, where: str):
        """Check and normalise a user-given value; raises ValueError naming ``where.name``."""
        label = f"{where}: parameter {self.name}"
        if self.type is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"{label} must be true or false, got {value!r}")
            return bool(value)
        if self.type is int:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{label} must be an integer, got {value!r}")
            value = int(value)
        elif self.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"{label} must be a number, got {value!r}")
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"{label} must be finite, got {value!r}")
        elif self.type is str:
            if not isinstance(value, str):
                raise ValueError(f"{label} must be one of {list(self.choices)}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{label} must be one of {list(self.choices)}, got {value!r}")
        if self.low is not None and value < self.low:
            raise ValueError(f"{label} must be >= {self.low}, got {value!r}")
        if self.high is not None and value > self.high:
            raise ValueError(f"{label} must be <= {self.high}, got {value!r}")
        return value

    def describe(self) -> dict:
        d = {"name": self.name, "type": self.type.__name__, "default": self.default, "doc": self.doc}
        if self.choices:
            d["choices"] = list(self.choices)
        if self.low is not None:
            d["min"] = self.low
        if self.high is not None:
            d["max"] = self.high
        return d


@dataclass
class Context:
    """What a stage knows about the array it codes.

    ``key``, ``step`` and ``state`` come from :class:`codec.ErrorFeedback` (per-key memory
    a stage may keep between steps, e.g. PowerSGD's Q or a random-k counter); a bare
    ``encode`` uses ``key=None, step=0`` and a fresh ``state``.  ``positions`` maps the
    i-th coded value back to its flat index when a select stage ran (None when dense).
    ``hints`` carries per-call facts one stage hands the next (AdaComp's scale for its
    sign-bit value coding).
    """

    shape: tuple
    dtype: np.dtype
    key: Any = None
    step: int = 0
    state: dict = field(default_factory=dict)
    positions: Any = None
    hints: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return math.prod(self.shape)

    def where(self, i: int) -> tuple:
        """The array position of coded value ``i``, for error messages."""
        flat = int(i) if self.positions is None else int(self.positions[i])
        return tuple(int(v) for v in np.unravel_index(flat, self.shape)) if self.shape else ()


class Stage:
    """Base class of every pipeline stage (see the module docstring for the contract)."""

    name: ClassVar[str]
    kind: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()
    #: True when the stage loses no information (``none``, ``zstd``, ``crc32``)
    lossless: ClassVar[bool] = True

    def __init__(self, **kwargs):
        declared = {p.name: p for p in self.params}
        for key in kwargs:
            if key not in declared:
                raise ValueError(
                    f"{self.name}: unknown parameter {key!r}; valid: {sorted(declared) or 'none (takes no parameters)'}"
                )
        values = {}
        for p in self.params:
            v = kwargs.get(p.name, p.default)
            values[p.name] = None if v is None and p.default is None else p.convert(v, self.name)
        self.config = values
        self.__dict__.update(values)
        self.validate()

    def validate(self) -> None:
        """Reject inconsistent parameter combinations (override; raise ValueError)."""

    @classmethod
    def summary(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    def __eq__(self, other):
        return type(self) is type(other) and self.config == other.config

    def __hash__(self):
        return hash((self.name, tuple(self.config.items())))

    def __repr__(self):
        from codec.spec import format_stage

        return format_stage(self.name, self.config)


def register(cls: type[Stage]) -> type[Stage]:
    """Class decorator: make a stage available to spec strings under ``cls.name``."""
    if cls.kind not in KINDS:
        raise ValueError(f"stage {cls.__name__}: kind must be one of {KINDS}, got {cls.kind!r}")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"stage name {cls.name!r} is already registered by {_REGISTRY[cls.name].__name__}")
    _REGISTRY[cls.name] = cls
    return cls


def lookup(name: str) -> type[Stage]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownCodecError(f"unknown codec or stage {name!r}; valid: {', '.join(sorted(_REGISTRY))}") from None


def registered() -> dict[str, type[Stage]]:
    return dict(sorted(_REGISTRY.items()))
