"""Schedules: a numeric stage parameter as a function of the step.

A stage parameter declared ``Param(..., schedule=True)`` may hold a constant or a
:class:`Schedule`.  The step ``t`` is an int >= 0: ``ErrorFeedback`` counts steps per key, a
bare ``encode`` is step 0.  A stage reads its parameter with ``self.at(name, ctx.step)``.

Forms (``u = min(floor(t / every) * every, steps) / steps``; computed in float64)::

    linear(start, end, steps=N, every=1)   start + (end - start) * u
    exp(start, end, steps=N, every=1)      start * (end / start) ** u          (start, end > 0)
    warmup(start, end, steps=N, every=1)   the same as exp, under the name DGC users know
    step(v0, v1, ..., every=N)             v_i for t in [i*N, (i+1)*N), the last value afterwards

Spec text: ``topk(ratio=warmup(0.25,0.001,steps=1000))``.  Python:
``get_codec("topk", ratio=warmup(0.25, 0.001, steps=1000))``.

A :class:`Schedule` is a :class:`codec.spec.Call` (``str(s)`` is its canonical spec text) whose
fields are normalised at construction: values are floats, given positionally; ``steps`` and
``every`` are ints given by name, in declared order, with defaults dropped.  So
``build(parse_value(str(s))) == s`` and two spellings of the same schedule compare equal.
The name the user wrote is kept (``warmup`` stays ``warmup``, and is not equal to ``exp``).

This module imports nothing heavy (no NumPy, no Numba): ``import codec`` stays cheap.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from codec.errors import CodecValueError
from codec.spec import Call, parse_value

__all__ = ["Schedule", "build", "exp", "linear", "parse", "step", "warmup", "FORMS"]


@dataclass(frozen=True)
class _Form:
    name: str
    values: tuple  # names of the positional values; empty for a variadic form
    variadic: bool
    keywords: tuple  # ((name, default or None when required), ...), in canonical order


_RAMP = (("steps", None), ("every", 1))

#: The schedule forms by name (the head of a schedule's spec text).
FORMS: dict[str, _Form] = {
    "linear": _Form("linear", ("start", "end"), False, _RAMP),
    "exp": _Form("exp", ("start", "end"), False, _RAMP),
    "warmup": _Form("warmup", ("start", "end"), False, _RAMP),
    "step": _Form("step", (), True, (("every", None),)),
}

_EXAMPLE = {
    "linear": "linear(0.1,0.01,steps=1000)",
    "exp": "exp(0.9,0.5,steps=1000)",
    "warmup": "warmup(0.25,0.001,steps=1000)",
    "step": "step(0.1,0.01,0.001,every=1000)",
}


def _signature(form: _Form) -> str:
    vals = "v0, v1, ..." if form.variadic else ", ".join(form.values)
    kws = ", ".join(f"{k}=N" if d is None else f"{k}={d}" for k, d in form.keywords)
    return f"{form.name}({vals}, {kws})"


def _number(sched: str, what: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise CodecValueError(f"schedule {sched}: {what} must be a number, got {v!r}")
    try:
        f = float(v)
    except OverflowError:  # an integer beyond float64's range
        f = math.inf
    if not math.isfinite(f):
        raise CodecValueError(f"schedule {sched}: {what} must be finite, got {str(v)[:40]!r}")
    return f


def _count(sched: str, what: str, v) -> int:
    if isinstance(v, numbers.Real) and not isinstance(v, (bool, numbers.Integral)):
        if math.isfinite(float(v)) and float(v).is_integer():
            v = int(v)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise CodecValueError(f"schedule {sched}: {what} must be an integer >= 1, got {v!r}")
    if v < 1:
        raise CodecValueError(f"schedule {sched}: {what} must be an integer >= 1, got {v!r}")
    return int(v)


@dataclass(frozen=True, repr=False)
class Schedule(Call):
    """A validated, canonical schedule: ``s(step) -> float``; ``str(s)`` is its spec text.

    Construct with :func:`linear`, :func:`exp`, :func:`warmup`, :func:`step` or :func:`build`
    (``Schedule(name, args, kwargs)`` validates and normalises the same way).  Raises
    ValueError naming the schedule on any bad argument.
    """

    def __post_init__(self):
        name = self.name
        form = FORMS.get(name) if isinstance(name, str) else None
        if form is None:
            raise CodecValueError(f"unknown schedule {name!r}; valid: {', '.join(sorted(FORMS))} (e.g. {_EXAMPLE['warmup']})")
        sig = _signature(form)
        args = tuple(self.args)
        kwargs = tuple(self.kwargs)
        given: dict = {}
        for k, v in kwargs:
            if k in given:
                raise CodecValueError(f"schedule {name}: argument {k!r} given twice; expected {sig}")
            given[k] = v
        keywords = dict(form.keywords)
        if form.variadic:
            for k in given:
                if k not in keywords:
                    raise CodecValueError(f"schedule {name}: unknown argument {k!r}; expected {sig}")
            if not args:
                raise CodecValueError(f"schedule {name}: needs at least one value; expected {sig}, e.g. {_EXAMPLE[name]}")
            values = tuple(_number(name, f"value {i} (v{i})", v) for i, v in enumerate(args))
        else:
            if len(args) > len(form.values):
                raise CodecValueError(
                    f"schedule {name}: takes {len(form.values)} positional values ({', '.join(form.values)}), "
                    f"got {len(args)}; give {' and '.join(k + '=' for k, _ in form.keywords)} by name, e.g. {_EXAMPLE[name]}"
                )
            for k in given:
                if k not in keywords and k not in form.values:
                    raise CodecValueError(f"schedule {name}: unknown argument {k!r}; expected {sig}")
            vals = dict(zip(form.values, args))
            for k in form.values:
                if k in given:
                    if k in vals:
                        raise CodecValueError(f"schedule {name}: {k} given twice (by position and by name)")
                    vals[k] = given[k]
                if k not in vals:
                    raise CodecValueError(f"schedule {name}: missing {k}; expected {sig}, e.g. {_EXAMPLE[name]}")
            values = tuple(_number(name, k, vals[k]) for k in form.values)
        counts = []
        for k, default in form.keywords:
            if k not in given:
                if default is None:
                    raise CodecValueError(f"schedule {name}: missing {k}=; expected {sig}, e.g. {_EXAMPLE[name]}")
                continue
            c = _count(name, k, given[k])
            if c != default:
                counts.append((k, c))
        if name in ("exp", "warmup") and min(values) <= 0:
            raise CodecValueError(
                f"schedule {name}: start and end must be > 0 (geometric interpolation), got "
                f"start={values[0]!r}, end={values[1]!r}; use linear(...) to reach or cross 0"
            )
        object.__setattr__(self, "args", values)
        object.__setattr__(self, "kwargs", tuple(counts))

    # ------------------------------------------------------------ fields by name
    @property
    def form(self) -> str:
        """The schedule's form: ``linear``, ``exp``, ``warmup`` or ``step`` (its name)."""
        return self.name

    @property
    def values(self) -> tuple:
        """The positional values: ``(start, end)`` or ``(v0, v1, ...)`` for ``step``."""
        return self.args

    @property
    def steps(self) -> int | None:
        """The ramp length (None for ``step``)."""
        return None if FORMS[self.name].variadic else dict(self.kwargs)["steps"]

    @property
    def every(self) -> int:
        return dict(self.kwargs).get("every", 1)

    def points(self) -> tuple:
        """``((label, value), ...)``: every value the schedule passes through that can be an
        extreme; every value it produces lies between their min and max."""
        form = FORMS[self.name]
        labels = [f"v{i}" for i in range(len(self.args))] if form.variadic else list(form.values)
        return tuple(zip(labels, self.args))

    # ------------------------------------------------------------ evaluation
    def __call__(self, step) -> float:
        """The value at ``step`` (an int >= 0), a Python float."""
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise CodecValueError(f"schedule {self}: step must be an integer >= 0, got {step!r}")
        t = int(step)
        every = self.every
        if self.name == "step":
            return self.args[min(t // every, len(self.args) - 1)]
        start, end = self.args
        n = self.steps
        done = min((t // every) * every, n)
        if done == 0:
            return start
        if done >= n:
            return end
        u = done / n
        if self.name == "linear":
            v = start + (end - start) * u
        else:
            v = start * (end / start) ** u
        lo, hi = (start, end) if start <= end else (end, start)
        return min(max(v, lo), hi)  # never outside [start, end], whatever the rounding

    def __repr__(self) -> str:
        return str(self)


def build(call) -> Schedule:
    """A :class:`Schedule` from a parsed :class:`codec.spec.Call` (a Schedule is returned as is).

    Raises ValueError with a sentence naming the schedule on an unknown name, missing or extra
    arguments, wrong types, ``steps``/``every`` < 1, or non-positive values for ``exp``/``warmup``.
    """
    if isinstance(call, Schedule):
        return call
    if not isinstance(call, Call):
        raise CodecValueError(f"expected a schedule such as {_EXAMPLE['warmup']}, got {call!r}")
    return Schedule(call.name, tuple(call.args), tuple(call.kwargs))


def parse(text: str) -> Schedule:
    """A :class:`Schedule` from its spec text (``"warmup(0.25,0.001,steps=1000)"``)."""
    v = parse_value(text)
    if not isinstance(v, Call):
        raise CodecValueError(f"expected a schedule such as {_EXAMPLE['warmup']}, got {text!r}")
    return build(v)


def _ramp(name, start, end, steps, every):
    return Schedule(name, (start, end), (("steps", steps), ("every", every)))


def linear(start, end, *, steps, every=1) -> Schedule:
    """``start + (end - start) * u`` with ``u = min(floor(t/every)*every, steps) / steps``."""
    return _ramp("linear", start, end, steps, every)


def exp(start, end, *, steps, every=1) -> Schedule:
    """``start * (end / start) ** u`` (start, end > 0): geometric from start to end."""
    return _ramp("exp", start, end, steps, every)


def warmup(start, end, *, steps, every=1) -> Schedule:
    """The same as :func:`exp` under DGC's name: ``warmup(0.25, 0.001, steps=4*E, every=E)``
    gives densities 0.25, 0.0629, 0.0158, 0.00397, 0.001 over five epochs of E steps."""
    return _ramp("warmup", start, end, steps, every)


def step(*values, every) -> Schedule:
    """Piecewise constant: ``values[i]`` for t in ``[i*every, (i+1)*every)``, the last value afterwards."""
    return Schedule("step", values, (("every", every),))
