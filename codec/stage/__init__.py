"""The stage contract: one base class per kind, the registry spec strings resolve against.

A codec is a pipeline of stages (see ``codec.pipeline``), one of each kind at most, in this
order::

    transform -> select -> value -> bytes...

Each kind has a base class (one module each in this package: ``base`` holds :class:`Stage`
and :class:`Bound`, what every kind shares; ``transform``, ``select``, ``value``, ``bytes``
the kinds' bases; this module the registry) that declares the hooks a stage of that kind must define
(abstract methods) and the ones it may define (plain methods or class attributes with a
default); the implementations live in ``codec/stages/<kind>/``:

* :class:`Transform` (``codec/stages/transform/``: fft, powersgd): maps the flat array into
  another domain and back; it chooses its own coefficients, so no select stage follows it.
* :class:`Select` (``codec/stages/select/``: topk, adacomp, ...): which elements are sent,
  and the coding of their positions.
* :class:`Value` (``codec/stages/value/``: none, fp16, qsgd, ...): how the kept values are coded.
* :class:`Bytes` (``codec/stages/bytes/``: zstd, crc32): acts on the stored bytes.

A stage class derives from its kind's base, sets ``name``, ``params`` (a tuple of
:class:`~codec.params.Param`) and a one-line docstring, and is registered with
:func:`register`.  A class that sets ``name`` but misses a required hook raises TypeError
when it is defined.  Stage modules must not import Numba at module level: kernels are
reached inside methods through ``codec.kernels.backend``, so ``import codec`` stays cheap.
docs/adding-a-codec.md walks through adding one.
"""

from __future__ import annotations

from codec.context import MAX_STEP, Context, check_step
from codec.errors import CodecTypeError, CodecValueError, UnknownCodecError
from codec.params import Param
from codec.stage.base import KIND_BASES, KINDS, Bound, Stage
from codec.stage.bytes import Bytes
from codec.stage.select import Select
from codec.stage.transform import Transform
from codec.stage.value import Value

# what stage authors and the pipeline take from here (Context, check_step, MAX_STEP and Param
# re-exported: a stage module needs one import)
__all__ = ["KINDS", "MAX_STEP", "Bound", "Bytes", "Context", "Param", "Select", "Stage", "Transform", "Value",
           "check_step", "lookup", "register", "registered"]

_REGISTRY: dict[str, type[Stage]] = {}


def register(cls: type[Stage]) -> type[Stage]:
    """Class decorator: make a stage available to spec strings under ``cls.name``."""
    if not isinstance(cls, type) or not issubclass(cls, tuple(KIND_BASES.values())):
        raise CodecTypeError(f"stage {cls!r}: derive from codec.stage.Transform, Select, Value or Bytes")
    if cls.kind not in KINDS or not issubclass(cls, KIND_BASES[cls.kind]):
        raise CodecValueError(f"stage {cls.__name__}: kind must be the kind of its base class, got {cls.kind!r}")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise CodecValueError(f"stage name {cls.name!r} is already registered by {_REGISTRY[cls.name].__name__}")
    _REGISTRY[cls.name] = cls
    return cls


def lookup(name: str) -> type[Stage]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownCodecError(f"unknown codec or stage {name!r}; valid: {', '.join(sorted(_REGISTRY))}") from None


def registered() -> dict[str, type[Stage]]:
    return dict(sorted(_REGISTRY.items()))
