"""What the oracles compare and check: equal arrays (NaN-aware), plain C-contiguous ndarrays,
error messages that say something.
"""

from __future__ import annotations

import numpy as np

from codec.errors import CodecError
from codec.fuzzing.findings import Finding


def _same_nan_aware(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality, except that a NaN equals any NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.tobytes() == b.tobytes():
        return True
    wa, wb = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    na, nb = np.isnan(wa), np.isnan(wb)
    if not np.array_equal(na, nb):
        return False
    ua = a.reshape(-1)[~na]
    ub = b.reshape(-1)[~nb]
    return ua.tobytes() == ub.tobytes()


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values: bitwise except that NaNs are equal and +0.0 equals -0.0 (``0 + -0.0`` is
    ``+0.0`` in IEEE arithmetic, so adding into zeros may lose a zero's sign)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.tobytes() == b.tobytes():
        return True
    wa, wb = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return bool(np.all((wa == wb) | (np.isnan(wa) & np.isnan(wb))))


def _check_plain(arr, what: str, *, dtype=None, shape=None) -> None:
    if type(arr) is not np.ndarray:
        raise Finding(f"{what} is a {type(arr).__name__}, not a plain ndarray")
    if not arr.flags.c_contiguous:
        raise Finding(f"{what} is not C-contiguous", f"strides {arr.strides} for shape {arr.shape}")
    if dtype is not None and arr.dtype != dtype:
        raise Finding(f"{what} has dtype {arr.dtype}", f"expected {dtype}")
    if shape is not None and arr.shape != tuple(shape):
        raise Finding(f"{what} has another shape", f"{arr.shape}, expected {tuple(shape)}")


def _require_message(err: BaseException, what: str) -> None:
    """A refusal must say why: a Finding ``"{what}: <type> without a message"`` otherwise."""
    if not str(err).strip():
        raise Finding(f"{what}: {type(err).__name__} without a message")


def _encode_decoded(calls, what: str, encode, *args, dtype, shape):
    """``encode(*args)`` (a frame; it may refuse with a ValueError or TypeError that says why),
    then the frame decoded, a plain array of ``dtype`` and ``shape``: the decoded array, or
    None when ``encode`` refused."""
    import codec

    frame, err = calls.call(what, encode, *args, expect=(CodecError,))
    if err is not None:
        _require_message(err, what)
        return None
    dec, _ = calls.call("decode", codec.decode, frame, expect=())
    _check_plain(dec, "decode's result", dtype=dtype, shape=shape)
    return dec
