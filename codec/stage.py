"""Stages, their declared parameters, and the registry that spec strings are resolved against.

A codec is a pipeline of stages (see ``codec.pipeline``), one of each kind at most, in this
order::

    transform -> select -> value -> bytes...

* ``transform``: maps the flat array into another domain (blocked rfft, low-rank) and back;
  it chooses its own coefficients, so no select stage follows it (see :class:`Transform`).
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
from codec.schedule import build
from codec.spec import Call, SpecError, parse_value

KINDS = ("transform", "select", "value", "bytes")

#: the largest step a codec accepts (steps key random streams and schedules; random-k's frame
#: records the step, and its decoder has refused 2**62 and above since format v1)
MAX_STEP = (1 << 62) - 1


def check_step(step, argname: str = "step") -> int:
    """``step`` as an int in ``[0, MAX_STEP]``, or ValueError naming ``argname``."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step <= MAX_STEP:
        raise ValueError(f"{argname}: must be an integer in [0, 2**62), got {step!r}")
    return int(step)

_REGISTRY: dict[str, type["Stage"]] = {}


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
    schedule: bool = False
    auto: bool = False

    def __post_init__(self):
        if self.schedule and self.type not in (int, float):
            raise ValueError(f"parameter {self.name}: schedule=True needs an int or float parameter, not {self.type.__name__}")
        if self.auto and self.default is not None:
            raise ValueError(f"parameter {self.name}: auto=True needs default None (None is what 'auto' means), got {self.default!r}")

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
            raise ValueError(f"{label} is not schedulable: it takes {self._expected(self._kind())}, got {value}")
        if self.type is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"{label} must be true or false, got {value!r}")
            return bool(value)
        if self.type is int:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{label} must be {self._expected('an integer')}, got {value!r}")
            value = int(value)
        elif self.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"{label} must be {self._expected('a number')}, got {value!r}")
            try:
                value = float(value)
            except OverflowError:  # an integer beyond float64's range
                raise ValueError(f"{label} must be finite, got an integer of {len(str(abs(int(value))))} digits") from None
            if not math.isfinite(value):
                raise ValueError(f"{label} must be finite, got {value!r}")
        elif self.type is str:
            if not isinstance(value, str):
                raise ValueError(f"{label} must be one of {list(self.choices)}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{label} must be one of {list(self.choices)}, got {value!r}")
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
        if self.low is not None and v < self.low:
            raise ValueError(f"{label} must be >= {self.low}, got {shown!r}{where}")
        if self.high is not None and v > self.high:
            raise ValueError(f"{label} must be <= {self.high}, got {shown!r}{where}")

    def _parse_schedule_text(self, text: str, label: str) -> Call:
        try:
            value = parse_value(text)
        except SpecError as e:
            raise ValueError(f"{label} must be {self._expected('a number')}, got {text!r} ({e})") from None
        if not isinstance(value, Call):
            raise ValueError(f"{label} must be {self._expected('a number')}, got the string {text!r}")
        return value

    def _convert_schedule(self, call: Call, label: str):
        try:
            sched = build(call)
        except ValueError as e:
            raise ValueError(f"{label}: {e}") from None
        for what, v in sched.points():
            self._check_bounds(v, label, v, f" ({what} of {sched})")
        return sched

    def describe(self) -> dict:
        d = {"name": self.name, "type": self.type.__name__, "default": self.default, "doc": self.doc}
        if self.choices:
            d["choices"] = list(self.choices)
        if self.low is not None:
            d["min"] = self.low
        if self.high is not None:
            d["max"] = self.high
        if self.schedule:
            d["schedule"] = True
        if self.auto:
            d["auto"] = True
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

    def domain(self, count: int, dtype) -> "Context":
        """The context of a transform's output (``count`` coefficients of ``dtype``): what the
        value stage after a transform sees.  Key, step, state and hints are shared."""
        return Context((count,), np.dtype(dtype), key=self.key, step=self.step, state=self.state, hints=self.hints)

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
    #: a select stage that sends changed values (randomk's n/k), so error feedback's residual
    #: at the sent positions is a rounding remainder, not 0, even with exact value coding
    scales_values: ClassVar[bool] = False

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

    def check_state(self, state: dict, shape: tuple, dtype: np.dtype) -> dict:
        """Check the per-key state this stage keeps in ``ctx.state``, as a loaded checkpoint
        gives it (untrusted), and return a clean copy, or raise ValueError starting with the
        field's name.

        A stage names its fields ``"<stage name>.<field>"`` (``"powersgd.q"``);
        ``ErrorFeedback.load_state_dict`` hands each stage the fields with its prefix, for a
        key whose array has ``shape`` and ``dtype``.  The copy must be what ``encode`` itself
        would have stored: arrays as fresh C-contiguous base ndarrays of the exact shape and
        dtype, values in range.  Override in a stage that keeps state; this default refuses
        every field, as the stage keeps none."""
        for name in state:
            raise ValueError(f"{name}: unknown field; {self.name} keeps no per-key state")
        return {}

    def passes_nonfinite(self, shape: tuple) -> bool:
        """Whether encoding an array of ``shape`` passes NaN/inf through this stage rather
        than raising ValueError: true for a lossless stage and for one whose ``nonfinite``
        parameter is ``keep``.  ``ErrorFeedback`` refuses to load a residual holding NaN/inf
        when a stage of its codec would refuse it (the next encode would raise)."""
        return self.lossless or self.config.get("nonfinite") == "keep"

    def at(self, name: str, step: int = 0):
        """The value of parameter ``name`` at ``step`` (``ctx.step``: 0 for a bare encode).

        A constant is returned as stored; a schedule is evaluated (an int parameter's schedule
        is rounded to the nearest int, halves up).  Raises KeyError for an undeclared name."""
        v = self.config[name]
        if not isinstance(v, Call):
            return v
        x = v(step)
        p = next(p for p in self.params if p.name == name)
        return math.floor(x + 0.5) if p.type is int else x

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


class Transform(Stage):
    """Base of the transform stages (``fft``, ``powersgd``): the array is mapped into another
    domain, the transform keeps what it sends, and the value stage codes the kept
    coefficients.  A subclass implements three methods:

    * ``forward(flat, ctx, sections) -> values``: the coefficients to code (1-D, float32 or
      float64: the value stage sees ``ctx.domain(values.size, values.dtype)``), appending
      the transform's own sections (e.g. the positions of the kept coefficients) first.
    * ``read(reader, ctx) -> (payload, vctx)``: check and read those sections, allocating
      nothing of the dense size; ``vctx`` is the value stage's context (count, dtype).
    * ``inverse(payload, values, out, mode)``: write the dense array for ``values`` (the
      decoded coefficients, float32/float64) into flat ``out`` through :meth:`emit`
      (``mode`` SET, ADD or SUB; any float dtype, rounded once).
    """

    kind = "transform"
    lossless = False

    @staticmethod
    def domain_dtype(dtype) -> np.dtype:
        """The coefficients' dtype for an array of ``dtype``: float64 for float64, else float32
        (16-bit input is widened exactly)."""
        from codec.ops import wide_dtype

        return wide_dtype(dtype)

    @staticmethod
    def emit(y, out, mode, dtype) -> None:
        """Write the dense piece ``y`` (the domain's float32/float64) into flat ``out`` per
        ``mode``.  A 16-bit frame's values are ``y`` rounded to its ``dtype`` first, so
        ``decode_add`` adds exactly what ``decode`` returns (and rounds once more, into ``out``)."""
        from codec.ops import WIDE, round_to, store

        store(y if dtype in WIDE else round_to(y, dtype), out, mode)


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
