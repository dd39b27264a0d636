"""The spec oracle: get_codec, the canonical spec and config parse back to the same codec, then
a small encode / decode round trip, with and without error feedback.
"""

from __future__ import annotations

import numpy as np

import codec
from codec.dtypes import bfloat16
from codec.fuzzing.findings import Finding, Outcome, _Calls
from codec.fuzzing.oracles.common import _encode_decoded, _require_message, _same_nan_aware


_SPEC_ARRAYS = None


def _spec_arrays():
    global _SPEC_ARRAYS
    if _SPEC_ARRAYS is None:
        rng = np.random.default_rng(5)
        _SPEC_ARRAYS = [
            rng.standard_normal(37).astype(np.float32),
            (rng.standard_normal((5, 7)) * 0.1).astype(np.float16),
            rng.standard_normal((4, 6)).astype(bfloat16),
            np.array(1.5, np.float64),
        ]
    return _SPEC_ARRAYS


def check_spec(data, calls: _Calls) -> Outcome:
    text = bytes(data).decode("utf-8", "replace")
    c, err = calls.call("get_codec", codec.get_codec, text, expect=(ValueError, TypeError))
    if err is not None:
        _require_message(err, "get_codec")
        return Outcome("rejected", type(err).__name__)
    for what, again in (("spec", c.spec), ("config", c.get_config())):
        back, berr = calls.call(f"get_codec(codec.{what})", codec.get_codec, again, expect=(ValueError, TypeError))
        if berr is not None:
            raise Finding(f"a codec's canonical {what} does not parse back", f"{text!r} -> {again!r}: {berr}"[:300])
        if back != c:
            raise Finding(f"a codec's canonical {what} gives another codec", f"{text!r} -> {again!r}"[:300])
    ef = codec.ErrorFeedback(c)
    for arr in _spec_arrays()[:2]:  # the error-feedback path (fused kernels) too, two steps
        for _ in range(2):
            if _encode_decoded(calls, "ErrorFeedback.encode", ef.encode, arr, "k", dtype=arr.dtype, shape=arr.shape) is None:
                break
        ef.reset(all=True)
    for arr in _spec_arrays():
        dec = _encode_decoded(calls, "encode", c.encode, arr, dtype=arr.dtype, shape=arr.shape)
        if dec is not None and c.lossless and not _same_nan_aware(dec, arr):
            raise Finding("a lossless codec changed the data", c.spec)
    return Outcome("ok", "ok")
