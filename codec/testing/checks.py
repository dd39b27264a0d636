"""The functional conformance checks: round trips from every buffer type, ``out=`` on both
sides, ``decode_add``, the config, and error feedback's invariant and saved state."""

from __future__ import annotations

import json
import pickle

import numpy as np

import codec as _codec
from codec.dtypes import bfloat16
from codec.ops import round_to
from codec.testing.arrays import same as _same, ulp

__all__ = ["check_encode_decode", "check_decode_out", "check_encode_out", "check_decode_add", "check_config", "check_error_feedback"]

def _get(codec):
    return _codec.get_codec(codec)


def _refused(call, error, word: str, what: str) -> None:
    """``call()`` must raise ``error`` with ``word`` (the argument's name) in its message;
    AssertionError saying ``what`` was not refused otherwise."""
    try:
        call()
    except error as e:
        assert word in str(e), f"{what}: the error does not name {word}: {e}"
    else:
        raise AssertionError(f"{what}: did not raise {error.__name__}")


def check_encode_decode(codec, arr: np.ndarray) -> bytes:
    """Encode from every buffer type, decode from every buffer type; returns the frame.

    Frames must be byte-identical whatever the input's container; decoded arrays have the
    input's dtype and shape; a lossless codec reproduces the input bit for bit.
    """
    c = _get(codec)
    frame = c.encode(arr)
    assert isinstance(frame, bytes), f"{c}: encode must return bytes, got {type(frame).__name__}"
    bound = c.max_frame_bytes(arr)
    assert len(frame) <= bound, f"{c}: a {len(frame)}-byte frame, above max_frame_bytes ({bound})"
    raw = arr.reshape(-1).view(np.uint8).tobytes() if arr.dtype == bfloat16 else arr.tobytes()
    flat = _codec.decode(c.encode(arr.reshape(-1)))  # a raw buffer is a 1-D array (AdaComp's bins depend on ndim)
    for other in (bytes(raw), bytearray(raw), memoryview(raw)):
        f2 = c.encode(other, dtype=arr.dtype)
        decoded = _codec.decode(f2)
        assert decoded.dtype == arr.dtype and decoded.size == arr.size, f"{c}: buffer input decoded wrongly"
        assert _same(decoded, flat), f"{c}: {type(other).__name__} input gave another result"
    if arr.dtype != bfloat16:
        assert c.encode(memoryview(arr)) == frame, f"{c}: memoryview input gave another frame"
    assert c.encode(arr.copy()) == frame, f"{c}: encoding is not deterministic"
    ref = _codec.decode(frame)
    for buf in (frame, bytearray(frame), memoryview(frame), np.frombuffer(frame, np.uint8)):
        y = c.decode(buf)
        assert _same(y, ref), f"{c}: decoding from {type(buf).__name__} differs"
    assert ref.shape == arr.shape and ref.dtype == arr.dtype, f"{c}: decoded {ref.dtype}{ref.shape}, input {arr.dtype}{arr.shape}"
    if c.lossless:
        assert _same(ref, arr), f"{c}: lossless codec changed the data"
    return frame


def check_decode_out(codec, arr: np.ndarray) -> None:
    """decode(frame, out=y) fills y; a wrong size or dtype raises ValueError naming out."""
    c = _get(codec)
    frame = c.encode(arr)
    ref = c.decode(frame)
    out = np.full(arr.shape, 7, arr.dtype)
    res = c.decode(frame, out=out)
    assert res is out and _same(out, ref), f"{c}: decode(out=) result differs from decode()"
    bad_size = np.empty(arr.size + 1, arr.dtype)
    other = np.float64 if arr.dtype != np.float64 else np.float32
    for bad in (bad_size, np.empty(arr.shape, other)):
        _refused(lambda: c.decode(frame, out=bad), ValueError, "out", f"{c}: decode into a wrong out ({bad.dtype}{bad.shape})")


def check_encode_out(codec, arr: np.ndarray, steps: int = 2) -> None:
    """encode(x, out=buf) writes the very frame encode(x) returns at the start of ``buf`` and
    returns a memoryview of it; so do ``encode_many`` and ErrorFeedback's ``encode`` (its
    residuals identical step by step).  A buffer one byte too small raises ValueError naming
    out, writes nothing and changes no residual or step; a read-only or non-buffer ``out``
    raises TypeError, one overlapping the input ValueError."""
    c = _get(codec)
    frame = c.encode(arr)
    buf = bytearray(len(frame) + 64)
    got = c.encode(arr, out=buf)
    assert isinstance(got, memoryview) and got.obj is not None, f"{c}: encode(out=) must return a memoryview of out"
    assert bytes(got) == frame and bytes(buf[: len(frame)]) == frame, f"{c}: encode(out=) wrote another frame"
    assert _same(c.decode(got), c.decode(frame)), f"{c}: the frame in out decodes differently"
    asked = []  # an allocator: asked once, for the frame's exact size
    got = c.encode(arr, out=lambda size: asked.append(size) or bytearray(size))
    assert asked == [len(frame)] and bytes(got) == frame, f"{c}: encode(out=allocator) asked for {asked}, wrote another frame"
    many = c.encode_many({"a": arr, "b": arr.reshape(-1)[:3].copy()})
    into = np.zeros(len(many), np.uint8)
    assert bytes(c.encode_many({"a": arr, "b": arr.reshape(-1)[:3].copy()}, out=into)) == many, f"{c}: encode_many(out=) differs"
    ef, ef_out = _codec.ErrorFeedback(c), _codec.ErrorFeedback(c)
    for step in range(steps):
        x = arr if step == 0 else (arr.astype(np.float64) * 0.5).astype(arr.dtype)
        want = ef.encode(x, key="k")
        small = bytearray(b"\x07" * (len(want) - 1))
        _refused(lambda: ef_out.encode(x, key="k", out=small), ValueError, "out", f"{c}: a frame larger than out")
        assert small == bytearray(b"\x07" * (len(want) - 1)), f"{c}: a too-small out was written"
        assert ef_out.step("k") == step, f"{c}: a failed encode(out=) advanced the step"
        assert bytes(ef_out.encode(x, key="k", out=bytearray(len(want) + 64))) == want, f"{c}: ErrorFeedback.encode(out=) differs at step {step}"
        r, r_out = ef.residual("k"), ef_out.residual("k")
        assert (r is None) == (r_out is None) and (r is None or _same(r, r_out)), f"{c}: residuals differ at step {step}"
    for bad in (bytes(len(frame)), 3):  # read-only, not a buffer
        _refused(lambda: c.encode(arr, out=bad), TypeError, "out", f"{c}: encode(out={type(bad).__name__})")
    if arr.size and arr.dtype != bfloat16:
        _refused(lambda: c.encode(arr, out=arr.reshape(-1).view(np.uint8)), ValueError, "out", f"{c}: an out overlapping x")


def check_decode_add(codec, arr: np.ndarray, seed: int = 1) -> None:
    """decode_add(frame, acc) equals acc + decode(frame) (and subtract=True its difference)."""
    c = _get(codec)
    frame = c.encode(arr)
    dec = c.decode(frame)
    rng = np.random.default_rng(seed)
    for acc_dtype in (np.dtype(np.float32), np.dtype(np.float64), arr.dtype):
        acc0 = rng.standard_normal(arr.shape).astype(acc_dtype)
        for subtract in (False, True):
            acc = acc0.copy()
            res = c.decode_add(frame, acc, subtract=subtract)
            assert res is acc, f"{c}: decode_add must return out"
            # the exact sum rounded once
            d = dec.astype(np.float64)
            want = _sum_rounded_once(acc0.astype(np.float64), -d if subtract else d, acc_dtype)
            assert _same(acc, want), f"{c}: decode_add into {acc_dtype} (subtract={subtract}) != acc + decode"


def _sum_rounded_once(a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray:
    """``a + b`` (float64 arrays) rounded once to ``dtype``: the float64 sum, made round-to-odd
    with its exact error (TwoSum), then rounded, so no double rounding can land on a tie
    (a float64 frame's decoded values can sit a rounding error away from float32 values)."""
    s = np.atleast_1d(a + b)
    if np.dtype(dtype) == np.float64:
        return s.reshape(np.shape(a))
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    even = (s.view(np.int64) & 1) == 0
    fix = (err != 0) & even
    s[fix] = np.nextafter(s[fix], np.where(err[fix] > 0, np.inf, -np.inf))
    return round_to(s.reshape(np.shape(a)), dtype)


def check_config(codec) -> None:
    """get_config is flat JSON with an id; get_codec(config) == codec; repr, hash, pickle round trip."""
    c = _get(codec)
    cfg = c.get_config()
    assert isinstance(cfg.get("id"), str), f"{c}: config has no string id"
    assert all(not isinstance(v, (dict, list)) for v in cfg.values()), f"{c}: config is not flat: {cfg}"
    back = _codec.get_codec(json.loads(json.dumps(cfg)))
    assert back == c and hash(back) == hash(c), f"{c}: config round trip gave {back}"
    assert _codec.get_codec(c.spec) == c, f"{c}: spec round trip differs"
    assert pickle.loads(pickle.dumps(c)) == c, f"{c}: pickle round trip differs"
    assert c.spec in repr(c), f"{c}: repr does not show the spec"


def check_error_feedback(codec, arr: np.ndarray, steps: int = 3, seed: int = 2) -> None:
    """decoded + new residual == x + old residual: exactly when values are coded exactly,
    within one ulp (of acc or of the residual, whichever is larger) elementwise otherwise; residual state survives state_dict and pickle."""
    c = _get(codec)
    ef = _codec.ErrorFeedback(c)
    rng = np.random.default_rng(seed)
    exact = c.value.lossless and c.transform is None and not (c.select is not None and c.select.scales_values)
    for step in range(steps):
        x = (arr.astype(np.float64) * (1 + 0.1 * rng.standard_normal(arr.shape))).astype(arr.dtype)
        old = ef.residual("k").copy() if step else np.zeros_like(arr)
        acc = np.add(x, old, dtype=arr.dtype)
        frame = ef.encode(x, key="k")
        bound = c.max_frame_bytes(x, step=step)
        assert len(frame) <= bound, f"{c}: step {step}: a {len(frame)}-byte frame, above max_frame_bytes ({bound})"
        dec = _codec.decode(frame)
        new = ef.residual("k")
        total = dec.astype(np.float64) + new.astype(np.float64)
        err = np.abs(total - acc.astype(np.float64))
        if exact:
            assert not np.any(err), f"{c}: step {step}: decoded + residual != acc (max error {err.max()})"
        else:
            # the residual is acc - decoded rounded once: off by at most half an ulp of itself
            # (a scale larger than |acc|, as AdaComp's, makes it larger than acc)
            bound = np.maximum(ulp(acc), ulp(np.asarray(new)))
            assert np.all(err <= bound), f"{c}: step {step}: decoded + residual is {err.max()} from acc (> 1 ulp)"
    assert ef.step("k") == steps
    state = ef.state_dict()
    ef2 = _codec.ErrorFeedback(c)
    ef2.load_state_dict(state)
    ef3 = pickle.loads(pickle.dumps(ef))
    x = arr.copy()
    f1 = ef.encode(x, key="k")
    assert ef2.encode(x, key="k") == f1 and ef3.encode(x, key="k") == f1, f"{c}: restored ErrorFeedback encodes differently"
    if arr.ndim:
        _refused(lambda: ef.encode(np.zeros(arr.size + 1, arr.dtype), key="k"), ValueError, "k", f"{c}: a key whose shape changed")
