"""The spec oracle: get_codec, the canonical spec and config parse back to the same codec, then
a small encode / decode round trip, with and without error feedback.
"""

from __future__ import annotations

import numpy as np

import codec
from codec.dtypes import bfloat16
from codec.errors import CodecError
from codec.fuzzing.findings import Finding, Outcome, _Calls
from codec.fuzzing.oracles.common import _check_plain, _encode_decoded, _require_message, _same_nan_aware


_SPEC_ARRAYS = None


def _spec_arrays():
    global _SPEC_ARRAYS
    if _SPEC_ARRAYS is None:
        rng = np.random.default_rng(5)
        _SPEC_ARRAYS = [
            rng.standard_normal(37).astype(np.float32),
            np.zeros(600, np.float32),  # zeros and a constant: what Elias coding writes in a bit per bucket
            np.full((3, 50), -0.25, np.float32),
            (rng.standard_t(2, 300) * 1e-3).astype(np.float64),
            (rng.standard_normal((5, 7)) * 0.1).astype(np.float16),
            rng.standard_normal((4, 6)).astype(bfloat16),
            np.array(1.5, np.float64),
        ]
    return _SPEC_ARRAYS


def check_spec(data, calls: _Calls) -> Outcome:
    text = bytes(data).decode("utf-8", "replace")
    c, err = calls.call("get_codec", codec.get_codec, text, expect=(CodecError,))
    if err is not None:
        _require_message(err, "get_codec")
        return Outcome("rejected", type(err).__name__)
    for what, again in (("spec", c.spec), ("config", c.get_config())):
        back, berr = calls.call(f"get_codec(codec.{what})", codec.get_codec, again, expect=(CodecError,))
        if berr is not None:
            raise Finding(f"a codec's canonical {what} does not parse back", f"{text!r} -> {again!r}: {berr}"[:300])
        if back != c:
            raise Finding(f"a codec's canonical {what} gives another codec", f"{text!r} -> {again!r}"[:300])
    ef = codec.ErrorFeedback(c)
    for arr in _spec_arrays()[:3]:  # the error-feedback path (fused kernels) too, two steps
        for _ in range(2):
            if _encode_decoded(calls, "ErrorFeedback.encode", ef.encode, arr, "k", dtype=arr.dtype, shape=arr.shape) is None:
                break
        ef.reset(all=True)
    for arr in _spec_arrays():
        dec = _encode_decoded(calls, "encode", c.encode, arr, dtype=arr.dtype, shape=arr.shape)
        if dec is not None and c.lossless and not _same_nan_aware(dec, arr):
            raise Finding("a lossless codec changed the data", c.spec)
    _check_many_round_trip(c, calls)
    return Outcome("ok", "ok")


def _check_many_round_trip(c, calls: _Calls) -> None:
    """The arrays as one many-tensor frame (each tensor coded as alone), and the float32 ones
    as a joint frame (one coding of their concatenation): what the encoder writes, the
    decoder reads, with every tensor's name, shape and dtype."""
    arrays = _spec_arrays()
    for joint, tensors in ((False, {f"t{i}": a for i, a in enumerate(arrays)}),
                           (True, {f"t{i}": a for i, a in enumerate(arrays) if a.dtype == np.float32})):
        frame, err = calls.call("encode_many", c.encode_many, tensors, joint=joint, expect=(CodecError,))
        if err is not None:
            _require_message(err, "encode_many")
            continue
        back, _ = calls.call("decode_many", codec.decode_many, frame, expect=())
        if list(back) != list(tensors):
            raise Finding("decode_many gave other names", f"{c.spec}: {list(back)} for {list(tensors)}"[:300])
        for name, a in tensors.items():
            _check_plain(back[name], f"decode_many's {name}", dtype=a.dtype, shape=a.shape)
