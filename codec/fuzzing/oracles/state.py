"""The state oracle: ErrorFeedback.load_state_dict and __setstate__ refuse with a message that
names the field, or accept plain arrays that then encode.
"""

from __future__ import annotations

import numpy as np

import codec
from codec.dtypes import CODES
from codec.errors import CodecError
from codec.fuzzing.findings import Finding, Outcome, _Calls
from codec.fuzzing.formats import loads_state
from codec.fuzzing.oracles.common import _check_plain, _encode_decoded, _same_nan_aware


_FIELDS = ("state", "slot", "residual", "step", "key", "velocity", "codec", "momentum")


def _prior_state(ef):
    """Give ``ef`` a key of its own before the load (None if its codec cannot encode it)."""
    try:
        ef.encode(np.linspace(-1, 1, 24).astype(np.float32).reshape(4, 6), key="__prior__")
        return ef.state_dict()
    except (ValueError, TypeError):
        return None


def _same_state(a, b) -> bool:
    if a["codec"] != b["codec"] or a["momentum"] != b["momentum"] or len(a["slots"]) != len(b["slots"]):
        return False
    for x, y in zip(a["slots"], b["slots"]):
        if x["key"] != y["key"] or x["step"] != y["step"] or not _same_nan_aware(x["residual"], y["residual"]):
            return False
    return True


def check_state(data, calls: _Calls) -> Outcome:
    try:
        obj = loads_state(bytes(data))
        spec, momentum, state = obj["codec"], obj["momentum"], obj["state"]
        ef = codec.ErrorFeedback(spec, momentum=momentum)
    except Exception:  # noqa: BLE001 - not an input the harness can use (a damaged pickle)
        return Outcome("invalid", "unreadable")
    before = _prior_state(ef)
    _, err = calls.call("load_state_dict", ef.load_state_dict, state, expect=(CodecError,))
    # unpickling an ErrorFeedback reads the same state through __setstate__ (codec and
    # momentum from the state): refused or accepted, with the same kinds of errors
    blank = codec.ErrorFeedback.__new__(codec.ErrorFeedback)
    _, perr = calls.call("ErrorFeedback.__setstate__", blank.__setstate__, state, expect=(CodecError,))
    for e, what in ((err, "load_state_dict"), (perr, "__setstate__")):
        if e is not None and not any(w in str(e) for w in _FIELDS):
            raise Finding(f"{what}: {type(e).__name__} that names no field", str(e)[:200])
    if err is not None:
        if before is not None and not _same_state(before, ef.state_dict()):
            raise Finding("a refused load_state_dict changed the ErrorFeedback", str(err)[:200])
        return Outcome("rejected", type(err).__name__)
    for key in ef.keys():
        slot = ef._slots[key]
        res = slot.residual
        _check_plain(res, "a loaded residual")
        if res.dtype not in CODES.values():
            raise Finding("a loaded residual has a non-float dtype", str(res.dtype))
        if not res.flags.writeable:
            raise Finding("a loaded residual is read-only")
        if type(slot.step) is not int or slot.step < 0:
            raise Finding("a loaded step is not an int >= 0", repr(slot.step)[:60])
        if slot.velocity is not None:
            _check_plain(slot.velocity, "a loaded velocity", dtype=res.dtype, shape=res.shape)
        x = np.linspace(-1, 1, res.size).astype(res.dtype).reshape(res.shape)
        if _encode_decoded(calls, "encode after load", ef.encode, x, key, dtype=res.dtype, shape=res.shape) is None:
            continue
        _check_plain(ef._slots[key].residual, "the residual after an encode", dtype=res.dtype, shape=res.shape)
    return Outcome("ok", "ok")
