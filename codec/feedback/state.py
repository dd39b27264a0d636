"""What ``ErrorFeedback.state_dict`` saves, and the rules ``load_state_dict`` checks.

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
  or inf is refused when the codec refuses non-finite input (:meth:`Codec.passes_nonfinite`:
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

import numpy as np

from codec.dtypes import NAMES, owned_float_array
from codec.errors import CodecValueError, NonFiniteError
from codec.device import host_copy
from codec.feedback.slot import Slot
from codec.pipeline import Codec, get_codec
from codec.stage import check_step
from codec.ops import first_nonfinite


def saved(s: Slot) -> dict:
    """A slot as ``state_dict`` saves it (copies)."""
    out = {
        "key": s.key,
        "residual": None if s.residual is None else host_copy(s.residual),  # host arrays: a checkpoint loads anywhere
        "step": s.step,
        "state": copy.deepcopy(s.state),
        "velocity": None if s.velocity is None else host_copy(s.velocity),
    }
    if s.residual is None:
        out["shape"], out["dtype"] = tuple(s.shape), s.dtype.name
    return out


# -------------------------------------------------------------------- loading a state

_STATE_FIELDS = ("codec", "momentum", "residuals", "slots")
_SLOT_FIELDS = ("key", "residual", "step", "state", "velocity", "shape", "dtype")


def _show(key) -> str:
    text = repr(key)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_finite(arr: np.ndarray, where: str, codec: Codec) -> None:
    if codec.passes_nonfinite(arr.shape):
        return

    i = first_nonfinite(arr)
    if i >= 0:
        pos = tuple(int(v) for v in np.unravel_index(i, arr.shape))
        raise NonFiniteError(where, pos, repr(codec.spec), "refuses NaN/inf input, so the next step would fail")


def check(state, codec: Codec | None, momentum: float | None, residuals: bool | None, check_slot):
    """``(codec, momentum, residuals, slots)`` from an untrusted state dict, every part checked
    and every array copied; ``codec``/``momentum``/``residuals`` None (unpickling) take the
    state's own.  ``check_slot(slot, where)`` may refuse each clean slot."""
    if not isinstance(state, dict):
        raise CodecValueError(f"state: expected the dict ErrorFeedback.state_dict() returns, got {type(state).__name__}")
    for name in state:
        if name not in _STATE_FIELDS:
            raise CodecValueError(f"state: unknown field {_show(name)}; expected {list(_STATE_FIELDS)}")
    for name in ("codec", "slots"):
        if name not in state:
            raise CodecValueError(f"state: {name}: missing; expected the dict ErrorFeedback.state_dict() returns")
    try:
        saved = get_codec(state["codec"])
    except Exception as e:  # noqa: BLE001 - any failure to build the codec is a bad state
        raise CodecValueError(f"state: codec: not a codec config ({type(e).__name__}: {e})") from None
    if codec is not None and saved != codec:
        raise CodecValueError(f"state: codec: saved for codec {saved.spec!r}, this one is {codec.spec!r}")
    codec = saved if codec is None else codec
    m = state.get("momentum", 0.0)
    if isinstance(m, (bool, np.bool_)) or not isinstance(m, (int, float, np.integer, np.floating)) or not 0 <= m < 1:
        raise CodecValueError(f"state: momentum: must be a number in [0, 1), got {_show(m)}")
    m = float(m)
    if momentum is not None and m != momentum:
        raise CodecValueError(f"state: momentum: saved with {m}, this ErrorFeedback has {momentum}")
    res = state.get("residuals", True)
    if not isinstance(res, (bool, np.bool_)):
        raise CodecValueError(f"state: residuals: expected True or False, got {_show(res)}")
    res = bool(res)
    if residuals is not None and res != residuals:
        raise CodecValueError(
            f"state: residuals: saved {'with' if res else 'without'} residuals, this ErrorFeedback keeps "
            f"{'them' if residuals else 'none'} (residuals={residuals})"
        )
    if m and not res:
        raise CodecValueError("state: momentum: DGC's momentum correction feeds the residual, and this state keeps none")
    raw = state["slots"]
    if not isinstance(raw, (list, tuple)):
        raise CodecValueError(f"state: slots: expected a list of dicts, got {type(raw).__name__}")
    slots: dict = {}
    for i, s in enumerate(raw):
        slot = _check_slot(s, i, codec, m, res)
        check_slot(slot, f"state: slot {_show(slot.key)}")
        if slot.key in slots:
            raise CodecValueError(f"state: slot {_show(slot.key)}: key: appears twice")
        slots[slot.key] = slot
    return codec, m, res, slots


def _check_shape(value, where: str) -> tuple:
    if not isinstance(value, (tuple, list)):
        raise CodecValueError(f"{where}: expected a tuple of ints, got {type(value).__name__}")
    if len(value) > 64:
        raise CodecValueError(f"{where}: {len(value)} dimensions; NumPy allows at most 64")
    for n in value:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or not 0 <= n < 1 << 63:
            raise CodecValueError(f"{where}: expected ints in [0, 2**63), got {_show(n)}")
    return tuple(int(n) for n in value)


def _check_slot(s, i: int, codec: Codec, momentum: float, residuals: bool) -> Slot:
    where = f"state: slot {i}"
    if not isinstance(s, dict):
        raise CodecValueError(f"{where}: expected a dict with {list(_SLOT_FIELDS)}, got {type(s).__name__}")
    if "key" not in s:
        raise CodecValueError(f"{where}: key: missing")
    key = s["key"]
    try:
        hash(key)
    except TypeError:
        raise CodecValueError(f"{where}: key: a {type(key).__name__} is not hashable") from None
    where = f"state: slot {_show(key)}"
    for name in s:
        if name not in _SLOT_FIELDS:
            raise CodecValueError(f"{where}: unknown field {_show(name)}; expected {list(_SLOT_FIELDS)}")
    for name in ("residual", "step"):
        if name not in s:
            raise CodecValueError(f"{where}: {name}: missing")
    if not residuals:
        if s["residual"] is not None:
            raise CodecValueError(f"{where}: residual: saved, but this state keeps no residuals (residuals=False)")
        for name in ("shape", "dtype"):
            if name not in s:
                raise CodecValueError(f"{where}: {name}: missing (a slot without a residual names its array's shape and dtype)")
        shape = _check_shape(s["shape"], f"{where}: shape")
        dt = s["dtype"]
        if not isinstance(dt, str) or dt not in NAMES:
            raise CodecValueError(f"{where}: dtype: expected one of {sorted(NAMES)}, got {_show(dt)}")
        step = check_step(s["step"], f"{where}: step")
        if s.get("velocity") is not None:
            raise CodecValueError(f"{where}: velocity: saved, but this state keeps no residuals, so no velocity")
        state = _check_stage_state(s.get("state", {}), codec, shape, NAMES[dt], where)
        return Slot(key, None, step, state, shape=shape, dtype=NAMES[dt])
    for name in ("shape", "dtype"):
        if name in s:
            raise CodecValueError(f"{where}: {name}: only a slot without a residual names it (the residual has its shape and dtype)")
    residual = owned_float_array(s["residual"], f"{where}: residual")
    _check_finite(residual, f"{where}: residual", codec)
    step = check_step(s["step"], f"{where}: step")
    velocity = s.get("velocity")
    if velocity is not None:
        if not momentum:
            raise CodecValueError(f"{where}: velocity: saved, but momentum is 0 here, which keeps no velocity")
        like = f"{where}: velocity: expected {residual.dtype}{list(residual.shape)} like the residual"
        if isinstance(velocity, np.ndarray) and velocity.shape != residual.shape:  # before anything of its size is copied
            raise CodecValueError(f"{like}, got {velocity.dtype}{list(velocity.shape)}")
        velocity = owned_float_array(velocity, f"{where}: velocity")
        if velocity.dtype != residual.dtype:
            raise CodecValueError(f"{like}, got {velocity.dtype}{list(velocity.shape)}")
        _check_finite(velocity, f"{where}: velocity", codec)
    return Slot(key, residual, step, _check_stage_state(s.get("state", {}), codec, residual.shape, residual.dtype, where), velocity)


def _check_stage_state(state, codec: Codec, shape: tuple, dtype: np.dtype, where: str) -> dict:
    """The per-key stage state: each field goes to the stage its ``"<stage>."`` prefix names,
    whose :meth:`~codec.stage.Stage.check_state` checks and copies it."""
    where = f"{where}: state"
    if not isinstance(state, dict):
        raise CodecValueError(f"{where}: expected a dict, got {type(state).__name__}")
    owned: dict = {s.name: {} for s in codec.stages}
    for name, value in state.items():
        if not isinstance(name, str):
            raise CodecValueError(f"{where}: field {_show(name)} is not a string")
        owner = max((s.name for s in codec.stages if name.startswith(s.name + ".")), key=len, default=None)
        if owner is None:
            raise CodecValueError(
                f"{where}: unknown field {_show(name)}; fields are named '<stage>.<field>' after a stage of {codec.spec!r}"
            )
        owned[owner][name] = value
    clean = {}
    for s in codec.stages:
        try:
            clean.update(s.check_state(owned[s.name], shape, dtype))
        except ValueError as e:
            raise CodecValueError(f"{where}: {e}") from None
    return clean
