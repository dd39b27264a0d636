"""What every stage has (:class:`Stage`: parameters, validation, per-key state, schedules)
and what one stage's sections can take (:class:`Bound`).  The kinds' bases derive from
:class:`Stage` in this package's other modules (``codec.stage``)."""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from codec.context import Context
from codec.errors import CodecTypeError, CodecValueError
from codec.params import Param
from codec.spec import Call, format_stage

#: the stage kinds, in pipeline order
KINDS = ("transform", "select", "value", "bytes")
#: each kind's base class, by kind (filled as each base is defined: ``kind_base=True``)
KIND_BASES: dict[str, type["Stage"]] = {}


@dataclass(frozen=True)
class Bound:
    """The most one stage's sections can take for one array, known before encoding it: what
    :meth:`codec.Codec.max_frame_bytes` adds up (a buffer allocated once from it holds
    every frame of that array's shape and dtype, whatever the values).

    ``sections``: the most sections the stage appends; ``nbytes``: the most raw bytes of them
    in all (a section's raw length is ``ceil(count * bits / 8)``); ``values`` (a select or
    transform stage only): the value stage's context at its largest, ``values.n`` values of
    ``values.dtype`` (what :meth:`Value.bound` is then asked about)."""

    sections: int
    nbytes: int
    values: Context | None = None

    def __add__(self, other: "Bound") -> "Bound":
        return Bound(self.sections + other.sections, self.nbytes + other.nbytes)


class Stage(abc.ABC):
    """What every stage has: parameters, validation, per-key state, schedules.  Derive from
    the kind's base (:class:`Transform`, :class:`Select`, :class:`Value`, :class:`Bytes`),
    never from this class directly."""

    name: ClassVar[str]
    kind: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()
    #: True when the stage loses no information (``none``, ``zstd``, ``crc32``)
    lossless: ClassVar[bool] = True
    #: where the arrays this stage codes may live: "cpu", and "cuda" for a stage whose
    #: encode and decode take device arrays (its kernels' CUDA twins, docs/api.md "Device arrays")
    devices: ClassVar[frozenset] = frozenset({"cpu"})
    #: None when the stage's CUDA path gives the host's frames byte for byte; else the bound on
    #: how far apart what its device and host frames decode to may be, relative to the input
    #: (``||a - b||_2 <= tol * ||x||_2``; the fft stage's device FFT rounds otherwise than
    #: pocketfft: docs/kernels.md, "The FFT on the device")
    device_tolerance: ClassVar[float | None] = None

    def __init_subclass__(cls, kind_base: bool = False, **kwargs):
        """A class that sets ``name`` is a concrete stage: it must derive from its kind's base
        and define every hook that base requires; checked here, when the class is defined.
        A kind's base (``class Value(Stage, kind_base=True)``) is noted in :data:`KIND_BASES`."""
        super().__init_subclass__(**kwargs)
        if kind_base:
            KIND_BASES[cls.kind] = cls
            return
        if "name" not in cls.__dict__:
            return
        base = next((b for b in KIND_BASES.values() if b in cls.__mro__), None)
        if base is None:
            raise CodecTypeError(
                f"stage {cls.__name__}: derive from the base of its kind "
                f"({', '.join('codec.stage.' + KIND_BASES[k].__name__ for k in KINDS)}), not from Stage"
            )
        # the bases' abstract names (ABCMeta has computed them: every base is a finished class)
        # and any declared here; abstract if still unimplemented on cls
        names = {n for b in cls.__mro__[1:] for n in getattr(b, "__abstractmethods__", ())}
        names.update(n for n, v in vars(cls).items() if getattr(v, "__isabstractmethod__", False))
        missing = sorted(n for n in names if getattr(getattr(cls, n, None), "__isabstractmethod__", False))
        if missing:
            raise CodecTypeError(f"stage {cls.__name__} ({cls.kind}): does not define {', '.join(missing)}, which a {cls.kind} stage must")

    def __init__(self, **kwargs):
        declared = {p.name: p for p in self.params}
        for key in kwargs:
            if key not in declared:
                raise CodecValueError(
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
        """Reject inconsistent parameter combinations (override; raise CodecValueError)."""

    def check_state(self, state: dict, shape: tuple, dtype: np.dtype) -> dict:
        """Check the per-key state this stage keeps in ``ctx.state``, as a loaded checkpoint
        gives it (untrusted), and return a clean copy, or raise CodecValueError starting with the
        field's name.

        A stage names its fields ``"<stage name>.<field>"`` (``"powersgd.q"``);
        ``ErrorFeedback.load_state_dict`` hands each stage the fields with its prefix, for a
        key whose array has ``shape`` and ``dtype``.  The copy must be what ``encode`` itself
        would have stored: arrays as fresh C-contiguous base ndarrays of the exact shape and
        dtype, values in range.  Override in a stage that keeps state; this default refuses
        every field, as the stage keeps none."""
        for name in state:
            raise CodecValueError(f"{name}: unknown field; {self.name} keeps no per-key state")
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
        return format_stage(self.name, self.config)


