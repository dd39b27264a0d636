"""``ErrorFeedback``: residual memory per key around any codec.

    acc = x + residual[key];  frame = codec.encode(acc);  residual[key] = acc - decoded(frame)

Each key also has a step counter and a ``state`` dict that stages may use between steps
(today only PowerSGD's warm-started Q; random-k and the schedules read the step count):
the stages receive them in their :class:`~codec.stage.Context`.  The step itself lives
here (:meth:`ErrorFeedback._step`), built on the codec's pipeline primitives
(``Codec.sections``, ``frame``, ``subtract``); stages plug in fused kernels through their
kind's hooks (``Select.fuses_feedback``, ``Value.encode_feedback``), and :meth:`Slot.commit`
is the one place a new residual is installed.  The whole state survives
``state_dict()`` / ``load_state_dict()`` and pickling.

``ErrorFeedback(codec, residuals=False)`` keeps the rest of a key's memory without a
residual: each ``encode`` is the codec's plain frame of ``x`` with the key's step (and stage
state), and advances the step.  A transport keeps every tensor's memory in one
ErrorFeedback this way whether error feedback is on or off.  A scheme that runs its own
step (the transport's two-round PowerSGD, whose residual is formed across two collectives)
takes a key's slot with :meth:`ErrorFeedback.slot` (changing nothing), stores it with
:meth:`ErrorFeedback.keep`, installs a residual with :meth:`Slot.commit` and advances
``slot.step``; :meth:`ErrorFeedback.check_slot` is where such a scheme adds the rules of
its own memory to the checks of a loaded state.

Loading a state (``load_state_dict``, unpickling) treats it as untrusted input: the whole
state is checked before anything is replaced, so on error the ErrorFeedback keeps what it
had, and every error is a ValueError naming the slot's key and the field
(``state: slot 'layer1.weight': residual: ...``).  The rules:

* ``codec`` (required) builds a codec equal to this one; ``momentum`` (default 0) is a
  number equal to this one's; ``residuals`` (default True) is a bool equal to this one's
  (unpickling takes all three from the state, checked the same way).  Any other top-level
  field is refused.
* ``slots`` (required) is a list of dicts with the fields ``key``, ``residual``, ``step``
  (required), ``state`` (default ``{}``) and ``velocity`` (default None), and, in a state
  without residuals, ``shape`` and ``dtype`` (required there, refused beside a residual);
  others are refused.
* ``key``: hashable, not equal to another slot's.
* ``residual``: present (an array) exactly when ``residuals`` is True, None otherwise.
* ``residual``: a NumPy array of float16, bfloat16, float32 or float64, any shape, layout or
  byte order; it is copied into a fresh C-contiguous base ndarray (``np.matrix`` and other
  subclasses as their plain data; masked arrays, lists and other types are refused).  NaN
  or inf is refused when the codec refuses non-finite input (:func:`passes_nonfinite`:
  every lossy stage without ``nonfinite=keep``; powersgd for tensors it compresses), since
  the next step would raise; a codec that carries NaN/inf makes such residuals itself and
  resumes from them.
* ``step``: an int (a NumPy integer is fine; bool and float are refused) in
  ``[0, 2**62)`` (``codec.stage.check_step``), the steps a randomk frame can record.
* ``shape`` and ``dtype`` (residual-less slots only): the key's array shape, a tuple or list of
  ints in ``[0, 2**63)``, and the name of a supported dtype (``"float32"``, ...).
* ``velocity``: None, or with ``momentum > 0`` an array like the residual (same shape and
  dtype, copied the same way, same finiteness rule); with momentum 0 it is refused, as it
  would be silently dropped.
* ``state``: a dict whose fields are named ``"<stage>.<field>"`` after a stage of the codec;
  each stage checks and copies its own fields (:meth:`codec.stage.Stage.check_state`:
  PowerSGD's ``powersgd.q`` must be a finite float32/float64 array of shape ``m x r``, only
  with ``warm_start`` and for a tensor it compresses); unknown fields are refused.
* then :meth:`ErrorFeedback.check_slot` (nothing by default) may refuse the clean slot.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codec.dtypes import NAMES, as_float_array, owned_float_array
from codec.errors import NonFiniteError
from codec.ops import round_to
from codec.pipeline import Codec, get_codec
from codec.stage import MAX_STEP, Context, check_step


@dataclass
class Slot:
    """Per-key memory: the residual (the key's shape and dtype; None in an ErrorFeedback
    without residuals), the step count, stage state.  ``shape`` and ``dtype`` are the key's
    array shape and dtype: the residual's, given on their own when there is no residual."""

    key: Any
    residual: np.ndarray | None
    step: int = 0
    state: dict = field(default_factory=dict)
    #: DGC's momentum u (ErrorFeedback(momentum=m)); None without momentum
    velocity: np.ndarray | None = field(default=None, repr=False)
    #: a second residual-sized buffer the next step's ``acc`` is written into (not saved)
    spare: np.ndarray | None = field(default=None, repr=False)
    shape: tuple | None = field(default=None, repr=False)
    dtype: np.dtype | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.residual is not None:
            self.shape, self.dtype = self.residual.shape, self.residual.dtype
        elif self.shape is None or self.dtype is None:
            raise TypeError("Slot: a slot without a residual needs shape and dtype")
        else:
            self.shape, self.dtype = tuple(int(n) for n in self.shape), np.dtype(self.dtype)

    def fits(self, shape, dtype) -> bool:
        """Whether this slot is for arrays of ``shape`` and ``dtype``."""
        return self.shape == tuple(shape) and self.dtype == np.dtype(dtype)

    def context(self, x: np.ndarray) -> Context:
        """The stages' context for encoding ``x`` under this key: key, step and state."""
        return Context(x.shape, x.dtype, key=self.key, step=self.step, state=self.state)

    def take_spare(self) -> np.ndarray:
        """A residual-sized buffer for the step's ``acc`` (the spare, or a new one); it is the
        caller's until :meth:`commit` (on error it is simply dropped: the residual is intact)."""
        acc = self.spare if self.spare is not None else np.empty_like(self.residual)
        self.spare = None
        return acc

    def commit(self, residual: np.ndarray) -> None:
        """Install ``residual`` (a buffer from :meth:`take_spare`, holding ``acc - decoded``)
        as the new residual; the old one becomes the spare.  The only writer of a residual."""
        self.spare, self.residual = self.residual, residual


class ErrorFeedback:
    """Error feedback around ``codec`` (a Codec, spec string or config dict).

    ``momentum=m`` (0 <= m < 1, default 0: off) adds Deep Gradient Compression's momentum
    correction with momentum-factor masking: per key, ``u = m*u + x`` (in x's dtype, ``m``
    rounded to it); the codec encodes
    ``u + residual``; then ``u`` is zeroed where the frame sent values (everywhere for a
    dense codec).  Works with any codec.

    ``residuals=False`` keeps per key only the step and the stage state: ``encode`` is then
    ``codec.encode(x, key=key, step=<the key's step>)`` (with the key's stage state) and
    advances the step; nothing is fed back.  A key whose shape or dtype changes keeps its
    step and starts its stage state over.  Momentum needs residuals.

    >>> ef = ErrorFeedback("topk(ratio=0.01)", momentum=0.9)
    >>> frame = ef.encode(grad, key="layer1.weight")   # doctest: +SKIP
    """

    def __init__(self, codec, *, momentum: float = 0.0, residuals: bool = True):
        self.codec: Codec = get_codec(codec)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"momentum: must be a number in [0, 1), got {momentum!r}")
        if not isinstance(residuals, (bool, np.bool_)):
            raise TypeError(f"residuals: expected True or False, got {residuals!r}")
        if momentum and not residuals:
            raise ValueError("momentum: DGC's momentum correction feeds the residual, and residuals=False keeps none")
        self.momentum = float(momentum)
        self.residuals = bool(residuals)
        self._slots: dict = {}

    def encode(self, x, key=None, *, dtype=None) -> bytes:
        """Encode ``x`` plus the residual of ``key``; the new residual is what the frame missed.
        Without residuals: the frame of ``x`` at the key's step.  Advances the key's step."""
        arr = as_float_array(x, dtype, "x")
        slot = self._slots.get(key)
        if slot is None:
            slot = self._fresh(key, arr.shape, arr.dtype)
        elif slot.step > MAX_STEP:
            raise ValueError(f"key: {key!r} has made 2**62 frames, the most a step count allows; call reset(key) to start it over")
        elif not slot.fits(arr.shape, arr.dtype):
            if self.residuals:
                raise ValueError(
                    f"x: key {key!r} was {slot.dtype}{list(slot.shape)}, now {arr.dtype}{list(arr.shape)}; "
                    "call reset(key) to start it over"
                )
            slot = self._fresh(key, arr.shape, arr.dtype, slot.step)  # nothing to feed back: the step goes on
        if not self.residuals:
            frame = self.codec.encode_with(arr, slot.context(arr))
        elif self.momentum:
            u = np.zeros_like(arr) if slot.velocity is None else slot.velocity
            m = round_to(self.momentum, arr.dtype)
            u = np.add(np.multiply(u, m, dtype=arr.dtype), arr, dtype=arr.dtype)  # in x's dtype, a new buffer
            frame, sent = self._step(u, slot)
            u.reshape(-1)[slice(None) if sent is None else sent] = 0  # momentum-factor masking
            slot.velocity = u
        else:
            frame = self._step(arr, slot)[0]
        slot.step += 1
        self._slots[key] = slot
        return frame

    def _step(self, x: np.ndarray, slot: Slot):
        """One error-feedback step: the frame of ``acc = x + slot.residual``, with ``acc -
        decoded`` committed as the new residual; also returns the sent positions (None: all).

        Three ways, the first that applies: a value stage alone may fuse the whole step
        (``Value.encode_feedback``: fp16/bf16 on float32); a select stage with
        ``fuses_feedback`` forms ``acc`` inside its selection pass; otherwise ``acc = x +
        residual`` is formed first.  Then ``acc -= decoded`` (a sparse frame touches only its
        positions) and ``acc`` is committed.  ``acc`` is a buffer other than the residual, so
        on error the residual is untouched."""
        c = self.codec
        ctx = slot.context(x)
        flat = x.reshape(-1)
        if c.select is None and c.transform is None:
            sections: list = []
            if c.value.encode_feedback(flat, slot, ctx, sections):
                return c.frame(sections, x.dtype, x.shape), None
        acc = slot.take_spare()
        if c.select is not None and c.select.fuses_feedback:
            sections = c.sections(flat, ctx, residual=slot.residual.reshape(-1), out=acc.reshape(-1))
        else:
            np.add(x, slot.residual, out=acc)
            sections = c.sections(acc.reshape(-1), ctx)
        frame = c.frame(sections, x.dtype, x.shape)
        c.subtract(frame, acc.reshape(-1))
        slot.commit(acc)
        return frame, ctx.positions

    def _fresh(self, key, shape, dtype, step: int = 0) -> Slot:
        """A new slot for arrays of ``shape`` and ``dtype``: a zero residual (none without
        residuals), no stage state, ``step``."""
        if self.residuals:
            return Slot(key, np.zeros(shape, dtype), step)
        return Slot(key, None, step, shape=shape, dtype=dtype)

    # ------------------------------------------------------------ a step run by the caller
    def slot(self, key, shape, dtype) -> Slot:
        """The slot of ``key`` for arrays of ``shape`` and ``dtype``, for a caller that runs the
        error-feedback step itself (the transport's two-round PowerSGD): the stored slot when
        it fits, else a new one (zero residual, no stage state, step 0; without residuals
        the step carries over), which is NOT stored: :meth:`keep` stores it.  Changes nothing.

        The caller forms ``acc`` from ``slot.residual``, installs the new residual with
        ``slot.take_spare()`` / ``slot.commit(...)``, keeps stage state in ``slot.state`` and
        advances ``slot.step`` by one per frame.  Unlike :meth:`encode`, a key whose shape or
        dtype changed starts over instead of raising."""
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        slot = self._slots.get(key)
        if slot is not None and slot.step > MAX_STEP:
            raise ValueError(f"key: {key!r} has made 2**62 frames, the most a step count allows; call reset(key) to start it over")
        if slot is not None and slot.fits(shape, dtype):
            return slot
        step = slot.step if slot is not None and not self.residuals else 0
        return self._fresh(key, shape, dtype, step)

    def keep(self, slot: Slot) -> None:
        """Store ``slot`` (from :meth:`slot`) as the memory of ``slot.key``, replacing any."""
        if not isinstance(slot, Slot) or (slot.residual is None) == self.residuals:
            raise ValueError(f"slot: expected a Slot {'with' if self.residuals else 'without'} a residual, as slot() makes")
        self._slots[slot.key] = slot

    def check_slot(self, slot: Slot, where: str) -> None:
        """Refuse (ValueError starting with ``where``) a loaded slot that passed every generic
        check but that this ErrorFeedback's step could not use; nothing by default.  A scheme
        that runs its own step and keeps stricter memory (the two-round PowerSGD's float32 or
        float64, finite residuals) overrides it."""

    # ------------------------------------------------------------ reading the memory
    def residual(self, key=None) -> np.ndarray | None:
        """The current residual of ``key`` (a read-only view); None without residuals."""
        r = self._slots[key].residual
        if r is None:
            return None
        r = r.view()
        r.flags.writeable = False
        return r

    def add_residual(self, key, values, positions=None) -> None:
        """``residual[key] += values`` (at the flat ``positions`` when given, else everywhere).

        For what a codec sent but the transport did not deliver: gTop-k returns the values a
        rank selected that missed the global top-k, so they are sent later, as error feedback
        intends.  ``values`` are rounded once into the residual's dtype."""
        if not self.residuals:
            raise ValueError("add_residual: this ErrorFeedback keeps no residuals (residuals=False)")
        slot = self._slots.get(key)
        if slot is None:
            raise KeyError(f"key: no residual for {key!r}; encode it first")
        from codec.modes import ADD
        from codec.ops import scatter, store

        flat = slot.residual.reshape(-1)
        vals = as_float_array(values, None, "values").reshape(-1)
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
            "residuals": self.residuals,
            "slots": [_saved(s) for s in self._slots.values()],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned; the codec and momentum must be the same.

        The state is untrusted input: it is checked whole before anything is replaced (on
        error this ErrorFeedback keeps what it had) and its arrays are copied into fresh
        C-contiguous ones.  The rules are in the module docstring; a state breaking one raises
        ValueError naming the slot's key and the field."""
        codec, momentum, residuals, slots = _check(state, self.codec, self.momentum, self.residuals, self.check_slot)
        self.codec, self.momentum, self.residuals, self._slots = codec, momentum, residuals, slots

    def __getstate__(self):
        return self.state_dict()

    def __setstate__(self, state):
        # unpickling: the codec, momentum and residuals come from the state, checked like the rest
        self.codec, self.momentum, self.residuals, self._slots = _check(state, None, None, None, self.check_slot)

    def __repr__(self):
        m = f", momentum={self.momentum}" if self.momentum else ""
        r = "" if self.residuals else ", residuals=False"
        return f"ErrorFeedback({self.codec.spec!r}{m}{r}, keys={len(self._slots)})"


def _saved(s: Slot) -> dict:
    """A slot as ``state_dict`` saves it (copies)."""
    out = {
        "key": s.key,
        "residual": None if s.residual is None else s.residual.copy(),
        "step": s.step,
        "state": copy.deepcopy(s.state),
        "velocity": None if s.velocity is None else s.velocity.copy(),
    }
    if s.residual is None:
        out["shape"], out["dtype"] = tuple(s.shape), s.dtype.name
    return out


# -------------------------------------------------------------------- loading a state

_STATE_FIELDS = ("codec", "momentum", "residuals", "slots")
_SLOT_FIELDS = ("key", "residual", "step", "state", "velocity", "shape", "dtype")


def passes_nonfinite(codec: Codec, shape) -> bool:
    """:meth:`Codec.passes_nonfinite` (kept as a function for callers of the first version)."""
    return codec.passes_nonfinite(shape)


def _show(key) -> str:
    text = repr(key)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_finite(arr: np.ndarray, where: str, codec: Codec) -> None:
    if passes_nonfinite(codec, arr.shape):
        return
    from codec.ops import first_nonfinite

    i = first_nonfinite(arr)
    if i >= 0:
        pos = tuple(int(v) for v in np.unravel_index(i, arr.shape))
        raise NonFiniteError(where, pos, repr(codec.spec), "refuses NaN/inf input, so the next step would fail")


def _check(state, codec: Codec | None, momentum: float | None, residuals: bool | None, check_slot):
    """``(codec, momentum, residuals, slots)`` from an untrusted state dict, every part checked
    and every array copied; ``codec``/``momentum``/``residuals`` None (unpickling) take the
    state's own.  ``check_slot(slot, where)`` may refuse each clean slot."""
    if not isinstance(state, dict):
        raise ValueError(f"state: expected the dict ErrorFeedback.state_dict() returns, got {type(state).__name__}")
    for name in state:
        if name not in _STATE_FIELDS:
            raise ValueError(f"state: unknown field {_show(name)}; expected {list(_STATE_FIELDS)}")
    for name in ("codec", "slots"):
        if name not in state:
            raise ValueError(f"state: {name}: missing; expected the dict ErrorFeedback.state_dict() returns")
    try:
        saved = get_codec(state["codec"])
    except Exception as e:  # noqa: BLE001 - any failure to build the codec is a bad state
        raise ValueError(f"state: codec: not a codec config ({type(e).__name__}: {e})") from None
    if codec is not None and saved != codec:
        raise ValueError(f"state: codec: saved for codec {saved.spec!r}, this one is {codec.spec!r}")
    codec = saved if codec is None else codec
    m = state.get("momentum", 0.0)
    if isinstance(m, (bool, np.bool_)) or not isinstance(m, (int, float, np.integer, np.floating)) or not 0 <= m < 1:
        raise ValueError(f"state: momentum: must be a number in [0, 1), got {_show(m)}")
    m = float(m)
    if momentum is not None and m != momentum:
        raise ValueError(f"state: momentum: saved with {m}, this ErrorFeedback has {momentum}")
    res = state.get("residuals", True)
    if not isinstance(res, (bool, np.bool_)):
        raise ValueError(f"state: residuals: expected True or False, got {_show(res)}")
    res = bool(res)
    if residuals is not None and res != residuals:
        raise ValueError(
            f"state: residuals: saved {'with' if res else 'without'} residuals, this ErrorFeedback keeps "
            f"{'them' if residuals else 'none'} (residuals={residuals})"
        )
    if m and not res:
        raise ValueError("state: momentum: DGC's momentum correction feeds the residual, and this state keeps none")
    raw = state["slots"]
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"state: slots: expected a list of dicts, got {type(raw).__name__}")
    slots: dict = {}
    for i, s in enumerate(raw):
        slot = _check_slot(s, i, codec, m, res)
        check_slot(slot, f"state: slot {_show(slot.key)}")
        if slot.key in slots:
            raise ValueError(f"state: slot {_show(slot.key)}: key: appears twice")
        slots[slot.key] = slot
    return codec, m, res, slots


def _check_shape(value, where: str) -> tuple:
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{where}: expected a tuple of ints, got {type(value).__name__}")
    if len(value) > 64:
        raise ValueError(f"{where}: {len(value)} dimensions; NumPy allows at most 64")
    for n in value:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or not 0 <= n < 1 << 63:
            raise ValueError(f"{where}: expected ints in [0, 2**63), got {_show(n)}")
    return tuple(int(n) for n in value)


def _check_slot(s, i: int, codec: Codec, momentum: float, residuals: bool) -> Slot:
    where = f"state: slot {i}"
    if not isinstance(s, dict):
        raise ValueError(f"{where}: expected a dict with {list(_SLOT_FIELDS)}, got {type(s).__name__}")
    if "key" not in s:
        raise ValueError(f"{where}: key: missing")
    key = s["key"]
    try:
        hash(key)
    except TypeError:
        raise ValueError(f"{where}: key: a {type(key).__name__} is not hashable") from None
    where = f"state: slot {_show(key)}"
    for name in s:
        if name not in _SLOT_FIELDS:
            raise ValueError(f"{where}: unknown field {_show(name)}; expected {list(_SLOT_FIELDS)}")
    for name in ("residual", "step"):
        if name not in s:
            raise ValueError(f"{where}: {name}: missing")
    if not residuals:
        if s["residual"] is not None:
            raise ValueError(f"{where}: residual: saved, but this state keeps no residuals (residuals=False)")
        for name in ("shape", "dtype"):
            if name not in s:
                raise ValueError(f"{where}: {name}: missing (a slot without a residual names its array's shape and dtype)")
        shape = _check_shape(s["shape"], f"{where}: shape")
        dt = s["dtype"]
        if not isinstance(dt, str) or dt not in NAMES:
            raise ValueError(f"{where}: dtype: expected one of {sorted(NAMES)}, got {_show(dt)}")
        step = check_step(s["step"], f"{where}: step")
        if s.get("velocity") is not None:
            raise ValueError(f"{where}: velocity: saved, but this state keeps no residuals, so no velocity")
        state = _check_stage_state(s.get("state", {}), codec, shape, NAMES[dt], where)
        return Slot(key, None, step, state, shape=shape, dtype=NAMES[dt])
    for name in ("shape", "dtype"):
        if name in s:
            raise ValueError(f"{where}: {name}: only a slot without a residual names it (the residual has its shape and dtype)")
    residual = owned_float_array(s["residual"], f"{where}: residual")
    _check_finite(residual, f"{where}: residual", codec)
    step = check_step(s["step"], f"{where}: step")
    velocity = s.get("velocity")
    if velocity is not None:
        if not momentum:
            raise ValueError(f"{where}: velocity: saved, but momentum is 0 here, which keeps no velocity")
        velocity = owned_float_array(velocity, f"{where}: velocity")
        if velocity.shape != residual.shape or velocity.dtype != residual.dtype:
            raise ValueError(
                f"{where}: velocity: expected {residual.dtype}{list(residual.shape)} like the residual, "
                f"got {velocity.dtype}{list(velocity.shape)}"
            )
        _check_finite(velocity, f"{where}: velocity", codec)
    return Slot(key, residual, step, _check_stage_state(s.get("state", {}), codec, residual.shape, residual.dtype, where), velocity)


def _check_stage_state(state, codec: Codec, shape: tuple, dtype: np.dtype, where: str) -> dict:
    """The per-key stage state: each field goes to the stage its ``"<stage>."`` prefix names,
    whose :meth:`~codec.stage.Stage.check_state` checks and copies it."""
    where = f"{where}: state"
    if not isinstance(state, dict):
        raise ValueError(f"{where}: expected a dict, got {type(state).__name__}")
    owned: dict = {s.name: {} for s in codec.stages}
    for name, value in state.items():
        if not isinstance(name, str):
            raise ValueError(f"{where}: field {_show(name)} is not a string")
        owner = max((s.name for s in codec.stages if name.startswith(s.name + ".")), key=len, default=None)
        if owner is None:
            raise ValueError(
                f"{where}: unknown field {_show(name)}; fields are named '<stage>.<field>' after a stage of {codec.spec!r}"
            )
        owned[owner][name] = value
    clean = {}
    for s in codec.stages:
        try:
            clean.update(s.check_state(owned[s.name], shape, dtype))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return clean
