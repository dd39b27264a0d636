"""The stage contract: one base class per kind, the registry spec strings resolve against.

A codec is a pipeline of stages (see ``codec.pipeline``), one of each kind at most, in this
order::

    transform -> select -> value -> bytes...

Each kind has a base class here that declares the hooks a stage of that kind must define
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

import abc
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from codec.context import MAX_STEP, Context, check_step  # noqa: F401  (re-exported: stages take them from here)
from codec.errors import CodecTypeError, CodecValueError, UnknownCodecError
from codec.params import Param  # noqa: F401  (re-exported: stage authors import it from here)
from codec.spec import Call

#: the stage kinds, in pipeline order
KINDS = ("transform", "select", "value", "bytes")

_REGISTRY: dict[str, type["Stage"]] = {}


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

    def __init_subclass__(cls, **kwargs):
        """A class that sets ``name`` is a concrete stage: it must derive from its kind's base
        and define every hook that base requires; checked here, when the class is defined."""
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            return
        base = next((b for b in _KIND_BASES.values() if b in cls.__mro__), None)
        if base is None:
            raise CodecTypeError(
                f"stage {cls.__name__}: derive from the base of its kind "
                f"({', '.join('codec.stage.' + b.__name__ for b in _KIND_BASES.values())}), not from Stage"
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
        from codec.spec import format_stage

        return format_stage(self.name, self.config)


class Transform(Stage):
    """Base of the transform stages (``fft``, ``powersgd``): the array is mapped into another
    domain, the transform keeps what it sends, and the value stage codes the kept
    coefficients.  Required hooks: :meth:`forward`, :meth:`read`, :meth:`inverse`."""

    kind = "transform"
    lossless = False
    #: the value stage a spec without one gets: a registered name, or a Value class of its own
    default_value: ClassVar[str | type] = "none"
    #: the stage codes a many-tensor frame's runs at once (:meth:`forward_segments`,
    #: :meth:`read_segments`), so error feedback's runs take their step together
    segmented: ClassVar[bool] = False

    @abc.abstractmethod
    def forward(self, flat, ctx, sections) -> np.ndarray:
        """The coefficients to code (1-D, float32 or float64: the value stage sees
        ``ctx.domain(values.size, values.dtype)``), appending the transform's own sections
        (e.g. the positions of the kept coefficients) first."""

    def forward_segments(self, flat, starts, ctxs):
        """:meth:`forward` for many small tensors at once (a many-tensor frame's run, as
        :meth:`Select.select_segments`): ``flat`` holds them concatenated (float32 or
        float64), tensor ``i`` is ``flat[starts[i]:starts[i + 1]]`` with context ``ctxs[i]``.
        Returns ``(vstarts, values, index)``: tensor i's coefficients to code are
        ``values[vstarts[i]:vstarts[i+1]]`` and ``index`` (a :class:`codec.frame.SectionRun`)
        holds its transform section, exactly as :meth:`forward` gives them for that tensor
        alone (a transform with one section of its own); or None (the default, and whenever
        a tensor needs :meth:`forward`'s own handling, its error) to run each alone."""
        return None

    def passes(self, shape) -> bool:
        """Whether a tensor of ``shape`` passes through uncoded: :meth:`forward` returns it
        as it is and writes no section, :meth:`read` reads none and :meth:`inverse` stores the
        values (PowerSGD's vectors and small matrices).  A many-tensor call then codes a run
        of such tensors as an elementwise value stage codes one (:func:`codec.runs.passing_runs`).
        False by default."""
        return False

    def read_segments(self, data, sections, sizes, dtype):
        """:meth:`read` of a run's tensors at once (a :attr:`segmented` stage's inverse of
        :meth:`forward_segments`): ``data`` the raw payload (uint8), ``sections[t]`` tensor
        t's transform section (its info, an offset into ``data``), ``sizes[t]`` its element
        count, ``dtype`` the frame's.  Returns ``(payload, counts)``: what :meth:`inverse`
        writes the run's concatenation from, and per tensor the number of values its value
        sections hold; every section checked as :meth:`read` checks it (CorruptFrameError)."""
        raise NotImplementedError(f"{self.name} does not read runs (segmented is False)")

    @abc.abstractmethod
    def read(self, reader, ctx):
        """Check and read the transform's sections, allocating nothing of the dense size;
        returns ``(payload, vctx)``, ``vctx`` being the value stage's context (count, dtype)."""

    @abc.abstractmethod
    def bound(self, ctx) -> Bound:
        """The most the transform's own sections take for an array of ``ctx.shape`` and
        ``ctx.dtype`` at ``ctx.step``, and (``values``) the value stage's context at its
        largest: the most coefficients :meth:`forward` hands on, and their dtype."""

    @abc.abstractmethod
    def inverse(self, payload, values, out, mode) -> None:
        """Write the dense array for ``values`` (the decoded coefficients, float32/float64)
        into flat ``out`` through :meth:`emit` (``mode`` SET, ADD or SUB; any float dtype,
        rounded once)."""

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
        from codec.dtypes import on_device
        from codec.ops import WIDE, round_to, store

        if dtype not in WIDE and on_device(out):  # rounded to the 16-bit codes on the device, then stored or added from them
            from codec.device import empty, to_device
            from codec.kernels import backend

            kern = backend("convert", out)
            y = y if on_device(y) else to_device(np.ascontiguousarray(y))
            codes = empty(y.size, np.uint16)
            bf16 = np.dtype(dtype) != np.float16
            if y.size:
                kern.narrow_codes(y, codes, bf16, -1)
                kern.half_decode(codes, out, mode, bf16)
            return
        store(y if dtype in WIDE else round_to(y, dtype), out, mode)


class Select(Stage):
    """Base of the select stages (sparsifiers): which elements a frame carries.  Required
    hooks: :meth:`select`, :meth:`positions`.  A select stage may leave facts for the value
    stage in ``ctx.hints`` (AdaComp's scale)."""

    kind = "select"
    lossless = False
    #: the value stage a spec without one gets: a registered name, or a Value class of its own
    #: that spec strings cannot name (AdaComp's sign coding)
    default_value: ClassVar[str | type] = "none"
    #: ``select`` takes ``residual=`` and ``out=`` and selects from ``acc = values + residual``,
    #: written into ``out`` in its own pass (error feedback without a separate add)
    fuses_feedback: ClassVar[bool] = False
    #: the stage sends changed values (randomk's n/k), so error feedback's residual at the
    #: sent positions is a rounding remainder, not 0, even with exact value coding
    scales_values: ClassVar[bool] = False

    @abc.abstractmethod
    def select(self, values, ctx, sections, residual=None, out=None):
        """``(positions, kept_values)``: sorted flat int64 positions and the values to code,
        appending the index sections.  ``residual``/``out`` only with :attr:`fuses_feedback`."""

    def select_segments(self, flat, starts, ctxs, gradient=None):
        """:meth:`select` for many small tensors at once (a many-tensor frame's run):
        ``flat`` holds them concatenated (float32 or float64), tensor ``i`` is
        ``flat[starts[i]:starts[i + 1]]`` with context ``ctxs[i]``.  Returns ``(positions,
        kstarts, values, index)``: tensor i's positions (counted from its own start) and kept
        values are ``positions[kstarts[i]:kstarts[i+1]]`` and the same slice of ``values``,
        and ``index`` (a :class:`codec.frame.SectionRun`) holds its first section (the index
        section, or random-k's key), all exactly as
        :meth:`select` would give them for that tensor alone; or None (the default) to let the
        pipeline call :meth:`select` per tensor; also None when a tensor needs
        :meth:`select`'s own handling (its error on a NaN).  ``gradient`` (a stage that
        :attr:`sees_gradient`, under error feedback): the run's gradients concatenated as
        ``flat`` is, ``flat`` being ``acc = gradient + residual``."""
        return None

    #: under error feedback the selection depends on the new gradient as well as on ``acc = x
    #: + residual`` (AdaComp's ``|G + dW|``), so it is not the selection of ``acc`` alone:
    #: error feedback's many-tensor runs hand such a stage the run's gradients too
    #: (:meth:`select_segments`' ``gradient``)
    sees_gradient: ClassVar[bool] = False

    def positions_segments(self, data, sections, sizes, value=None) -> list | None:
        """Every tensor's positions of a many-tensor frame read at once: ``data`` the raw
        payload (uint8), ``sections[t]`` tensor t's section infos (offsets into ``data``),
        ``sizes[t]`` its element count, ``value`` the codec's value stage (``Context.value``).  Returns each tensor's positions, checked as
        :meth:`positions` checks them, which the pipeline then hands to :meth:`positions` as
        ``known``; or None (the default, or any section that is not what it expects): each
        tensor's positions are then read, and refused, by :meth:`positions` alone."""
        return None

    @abc.abstractmethod
    def bound(self, ctx) -> Bound:
        """The most the stage's own sections (its positions, a key) take for an array of
        ``ctx.shape`` and ``ctx.dtype`` at ``ctx.step``, whatever its values, and
        (``values``) the value stage's context at its largest: the most values it can keep
        (``ctx.domain(k, ctx.dtype)``)."""

    @abc.abstractmethod
    def positions(self, reader, ctx, known=None) -> np.ndarray:
        """Check and read the position sections of a frame: the sorted flat positions, each in
        ``range(ctx.n)`` and unique (decoding scatters them unchecked).  ``known``: what
        :meth:`positions_segments` read and checked for this tensor; the sections are then
        only taken (a stage without :meth:`positions_segments` is never passed ``known``)."""


class Value(Stage):
    """Base of the value stages: how the kept values are coded.  Required hooks:
    :meth:`encode`, :meth:`read`, :meth:`write`; optional: :meth:`encode_feedback`."""

    kind = "value"
    #: True when each element's code depends only on that element, its dtype and the stage's
    #: parameters (never on the key, the step, other elements or state), in one ``values``
    #: section of ``n`` items whose width is a whole number of bytes: then the codes of
    #: consecutive same-dtype tensors are the codes of their concatenation, and a many-tensor
    #: frame codes a run of small tensors with one kernel call (``none``, ``fp16``, ``bf16``)
    elementwise: ClassVar[bool] = False
    #: True when :meth:`write` takes ``check=`` (a :class:`codec.payloadcheck.PayloadCheck`) and
    #: notes the CRC-32C of the payload bytes its kernel reads, so a decode verifies the
    #: frame in the same pass (``fp16``, ``bf16``); a stage without it is checked before
    #: decoding, as the whole payload
    checks_payload: ClassVar[bool] = False
    #: True when the stage has ``encode_segments(arrays, ctx, sections)``: ``encode`` of the
    #: concatenation of ``arrays`` (flat host float32/float64 arrays of one dtype) without
    #: forming it, in one pass where they lie (``fp16``, ``bf16``).  Every :attr:`elementwise`
    #: stage has ``write_segments(payload, outs, mode, check=None)``: ``write`` of a run's
    #: concatenation straight into each tensor's own flat host array (codec.many)
    segmented: ClassVar[bool] = False

    @abc.abstractmethod
    def encode(self, values, ctx, sections) -> None:
        """Append the sections coding ``values`` (1-D, the array's dtype or the domain's)."""

    @abc.abstractmethod
    def read(self, reader, ctx, count):
        """Check and read the sections of ``count`` values; returns a compact payload and
        allocates nothing dense."""

    @abc.abstractmethod
    def write(self, payload, out, mode) -> None:
        """Write the decoded values into the float32/float64 buffer ``out`` (``mode`` SET, ADD
        or SUB)."""

    @abc.abstractmethod
    def bound(self, ctx) -> Bound:
        """The most the sections coding ``ctx.n`` values of ``ctx.dtype`` take at
        ``ctx.step``, whatever the values (the array itself, or what a select or transform
        stage hands on: its :attr:`Bound.values`)."""

    def most_values(self, bits: int) -> int:
        """The most values that sections of ``bits`` raw bits in all can code in this stage's
        format: a bound a reader checks a count it did not read against (``randomk`` draws
        its positions from a key, so only the values' bits bound their number) before
        allocating anything of that size.  It must hold for every frame the stage writes; the
        default assumes one bit per value at least."""
        return bits

    def written(self, payload, count: int, ctx) -> np.ndarray:
        """``count`` decoded values of ``payload`` (what :meth:`read` gave) in a new array of
        the accumulator dtype of ``ctx.dtype`` (float32; float64 for float64): exact."""
        from codec.device import Memory
        from codec.modes import SET
        from codec.ops import wide_dtype

        out = Memory(ctx.device).empty(count, wide_dtype(ctx.dtype))  # (decoding into a device array: there)
        self.write(payload, out, SET)
        return out

    def decoded(self, values, ctx):
        """What decoding this stage's coding of ``values`` gives, in the accumulator dtype of
        the array (float32; float64 for float64 arrays), computed from ``values`` without the
        frame and bit for bit what :meth:`read` then :meth:`write` (SET) give; or None (the
        default) when only decoding the frame knows.  Error feedback after a select stage
        subtracts it at the sent positions instead of decoding the frame it has just built."""
        return None

    def encode_run(self, flat, starts, ctxs):
        """Code a run of small same-dtype tensors of a many-tensor frame at once (a codec of
        this value stage alone): ``flat`` their concatenation, tensor ``t`` being
        ``flat[starts[t]:starts[t+1]]`` with context ``ctxs[t]``.  Returns ``(table, piece)``:
        per tensor its sections as :class:`codec.manyframe.Entry` (kind, width, count), and
        one :class:`codec.frame.Section` holding the run's payload, exactly the bytes that
        coding each tensor alone gives, in tensor order.  None (the default, or whenever a
        tensor needs its own encode, e.g. to raise its error) codes them one by one."""
        return None

    def encode_kept(self, values, kstarts, ctxs):
        """The kept values of a sparse many-tensor run coded at once (after a select stage's
        ``select_segments``): tensor t's are ``values[kstarts[t]:kstarts[t+1]]``, its context
        ``ctxs[t]``.  Returns ``(table, section, starts)``: per tensor its value sections as
        :class:`codec.manyframe.Entry`, and one :class:`codec.frame.Section` whose bytes
        ``starts[t]:starts[t+1]`` are exactly what :meth:`encode` writes for tensor t; or
        None to code each tensor's on its own.  The default codes an elementwise stage's
        values as one array (the codes of the concatenation are the tensors' codes), and
        another's as a run of them (:meth:`encode_run`, when the stage has one)."""
        from codec.frame import raw_length
        from codec.manyframe import Entry
        from codec.ops import offsets

        if not self.elementwise:  # a quantizer's run of the kept values (its tensors' codes end to end)
            got = self.encode_run(values, kstarts, ctxs)
            if got is None:
                return None
            table, piece = got
            return table, piece, offsets([sum(raw_length(e.count, e.bits) for e in entries) for entries in table])
        secs: list = []
        self.encode(values, Context(values.shape, values.dtype, name="tensors"), secs)
        (sec,) = secs
        return [[Entry(sec.kind, sec.bits, k)] for k in np.diff(kstarts).tolist()], sec, kstarts * (sec.bits // 8)

    def read_kept(self, data, sections, counts, dtype):
        """The inverse of :meth:`encode_kept`: from the raw payload ``data`` (uint8) and per
        tensor its value sections (infos, offsets into ``data``) and kept count, a payload that
        :meth:`write` decodes into the run's kept values (``dtype`` the frame's), after
        :meth:`read`'s checks; None (the default) when a tensor's sections are not what the
        run expects.  An elementwise stage needs none: the many-tensor decoder reads its
        run's values sections as one section (``codec.many``); another reads them as a run
        of its own (:meth:`read_run`, when it has one)."""
        if self.elementwise:
            return None
        return self.read_run(data, sections, counts, dtype)

    def read_run(self, data, infos, sizes, dtype):
        """The inverse of :meth:`encode_run`: from the raw payload ``data`` (uint8) and, per
        tensor of the run, its section infos (offsets into ``data``) and size, a payload that
        :meth:`write` decodes into the run's concatenation (``dtype``), after the checks
        :meth:`read` makes (CorruptFrameError); None (the default, or sections that are not
        what the run expects) reads each tensor on its own."""
        return None

    def encode_feedback(self, x, slot, ctx, sections):
        """A fused error-feedback step for a codec of this value stage alone: append the
        sections coding ``x + slot.residual``, writing the new residual into a buffer from
        ``slot.take_spare()`` (in a section's ``fill`` or here), and return a function of no
        arguments that commits it (``slot.commit``), which ``ErrorFeedback`` calls once the
        whole frame is built; or return None (the default) to let ``ErrorFeedback`` add,
        encode and subtract."""
        return None


class Bytes(Stage):
    """Base of the byte stages: they act on the stored bytes.  Required hook:
    :meth:`frame_options`."""

    kind = "bytes"
    devices = frozenset({"cpu", "cuda"})  # they act on the frame's bytes, on the host

    @abc.abstractmethod
    def frame_options(self) -> dict:
        """Options for ``codec.frame.build_frame``: ``compressor`` (a section compressor) or
        ``checksum`` (the payload checksum's name)."""


_KIND_BASES: dict[str, type[Stage]] = {"transform": Transform, "select": Select, "value": Value, "bytes": Bytes}


def register(cls: type[Stage]) -> type[Stage]:
    """Class decorator: make a stage available to spec strings under ``cls.name``."""
    if not isinstance(cls, type) or not issubclass(cls, tuple(_KIND_BASES.values())):
        raise CodecTypeError(f"stage {cls!r}: derive from codec.stage.Transform, Select, Value or Bytes")
    if cls.kind not in KINDS or not issubclass(cls, _KIND_BASES[cls.kind]):
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
