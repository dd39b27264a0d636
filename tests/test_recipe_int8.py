"""The recipe of docs/adding-a-codec.md, followed once: the ``int8`` value stage of
tests/recipe/ (its module, its kernel file, its fixture) against a plain-NumPy reference.

The stage is registered only while this module's tests run (a module fixture imports it and
takes the registration back), so the library's own suites (which walk every registered
codec) never see it.  Its frozen fixture lives in tests/recipe/fixtures/; it was written once
with ``codec.testing.write_fixture`` (see :data:`FIXTURE`) and is never regenerated.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import codec
from codec import testing
from codec.dtypes import bfloat16
from codec.errors import CorruptFrameError, NonFiniteError
from conftest import BF16, F16, round16

FIXTURES = Path(__file__).parent / "recipe" / "fixtures"
#: the frozen frame: name -> (spec, array), written once by
#: ``testing.write_fixture(FIXTURES, name, spec, array)`` with the stage registered
FIXTURE = {"int8-f32": ("int8", (np.random.default_rng(20261125).standard_t(2, size=(6, 7)) * 1e-2).astype(np.float32))}
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), F16, BF16]
SIZES = [0, 1, 2, 7, 255, 1001]
PACKAGE = "recipe.kernels"


@pytest.fixture(scope="module", autouse=True)
def int8_registered():
    """Register the stage for this module only (:func:`recipe.registered`)."""
    import recipe

    with recipe.registered():
        yield


# ------------------------------------------------------------------ the NumPy reference


def ref_scale(x) -> float:
    x = np.asarray(x, np.float64).reshape(-1)
    return float(np.abs(x).max()) / 127 if x.size else 0.0


def ref_codes(x, scale) -> np.ndarray:
    x = np.asarray(x, np.float64).reshape(-1)
    if scale == 0:
        return np.zeros(x.size, np.int8)
    return np.clip(np.rint(x / scale), -127, 127).astype(np.int8)


def ref_values(codes, scale, dtype) -> np.ndarray:
    """``codes * scale`` in float64, rounded once to ``dtype`` (correctly rounded, by conftest's
    round16 for the 16-bit formats)."""
    v = codes.astype(np.float64) * scale
    dtype = np.dtype(dtype)
    if dtype in (F16, BF16):
        return round16(v, dtype).view(dtype)
    return v.astype(dtype)


def ref_decode(x) -> np.ndarray:
    x = np.asarray(x)
    s = ref_scale(x)
    return ref_values(ref_codes(x, s), s, x.dtype).reshape(x.shape)


def sample(n, dtype, kind="normal", seed=0):
    rng = np.random.default_rng([seed, n, ["normal", "heavy", "zeros"].index(kind)])
    if kind == "zeros":
        x = np.zeros(n)
    elif kind == "heavy":
        x = rng.standard_t(1.5, n) * 1e-3
    else:
        x = rng.standard_normal(n)
    return x.astype(dtype)


# ------------------------------------------------------------------ the kernel, per backend


def kernels(backend):
    return codec.kernels.module("int8", backend, package=PACKAGE)


@pytest.mark.parametrize("kind", ["normal", "heavy", "zeros"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_kernels_match_the_reference(backend, dt, n, kind):
    k = kernels(backend)
    x = sample(n, dt, kind)
    assert k.absmax(x) == (float(np.abs(x.astype(np.float64)).max()) if n else 0.0)
    s = ref_scale(x)
    codes = np.zeros(n, np.int8)
    if s > 0:
        k.quantize(x, s, codes)
    assert np.array_equal(codes, ref_codes(x, s))
    out = np.empty(n, np.float64)
    k.dequantize(codes, s, out)
    assert np.array_equal(out, codes.astype(np.float64) * s)
    assert k.invalid_codes(codes) == 0


def test_kernels_flag_nonfinite_and_invalid_codes(backend):
    k = kernels(backend)
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones(9, np.float32)
        x[4] = bad
        assert k.absmax(x) == -1.0
    codes = np.array([0, -128, 127, -127, -128], np.int8)
    assert k.invalid_codes(codes) == 2


def test_quantize_rounds_half_to_even_and_clips(backend):
    k = kernels(backend)
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 127.4, 200.0, -200.0], np.float64)
    codes = np.zeros(x.size, np.int8)
    k.quantize(x, 1.0, codes)
    assert codes.tolist() == [0, 2, 2, 0, -2, 127, 127, -127]


# ------------------------------------------------------------------ the stage


@pytest.mark.parametrize("kind", ["normal", "heavy", "zeros"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_decode_matches_the_reference(dt, n, kind):
    x = sample(n, dt, kind, seed=1)
    frame = codec.get_codec("int8").encode(x)
    got = codec.decode(frame)
    assert got.dtype == dt and got.shape == x.shape
    testing.assert_identical(got, ref_decode(x), f"int8 {dt} n={n} {kind}")
    assert codec.inspect(frame)["codec"] == "int8"


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_conformance(dt):
    for arr in testing.sample_arrays():
        testing.check_codec("int8", arr.astype(dt), n_random=200)


def test_after_a_select_stage():
    x = sample(1000, np.float32, "heavy", seed=2)
    c = codec.get_codec("topk(ratio=0.1)+int8")
    pos, vals = codec.decode_sparse(c.encode(x))
    kept = x[pos]
    s = ref_scale(kept)
    assert np.array_equal(vals, ref_values(ref_codes(kept, s), s, np.float32))
    testing.check_codec(c, x.reshape(20, 50), n_random=100)


def test_nonfinite_input_is_refused_with_its_position():
    x = np.zeros((3, 4), np.float32)
    x[2, 1] = np.nan
    with pytest.raises(NonFiniteError, match=r"position \(2, 1\).*int8"):
        codec.get_codec("int8").encode(x)


def _payload(frame: bytes, scale: float) -> int:
    at = frame.find(struct.pack("<d", scale))
    assert at > 0
    return at


@pytest.mark.parametrize("scale", [-1.0, np.nan, np.inf, 3.5e38 / 127 * 2])
def test_a_forged_scale_is_a_corrupt_frame(scale):
    x = sample(50, np.float32, seed=3)
    c = codec.get_codec("int8", checksum=False)  # no payload checksum: the forgery reaches the checks
    frame = bytearray(c.encode(x))
    at = _payload(bytes(frame), ref_scale(x))
    frame[at : at + 8] = struct.pack("<d", scale)
    with pytest.raises(CorruptFrameError, match="int8: scale"):
        codec.decode(bytes(frame))


def test_code_minus_128_is_a_corrupt_frame():
    x = sample(50, np.float32, seed=3)
    c = codec.get_codec("int8", checksum=False)
    frame = bytearray(c.encode(x))
    at = _payload(bytes(frame), ref_scale(x)) + 8  # the codes follow the scale
    frame[at + 7] = 0x80
    with pytest.raises(CorruptFrameError, match="-128"):
        codec.decode(bytes(frame))


def test_frozen_fixture_still_decodes():
    for name, (spec, arr) in FIXTURE.items():
        testing.check_fixture(FIXTURES, name)
        assert np.array_equal(np.load(FIXTURES / f"{name}.npy"), ref_decode(arr)), "the fixture's array is the reference's"


def test_frames_of_every_dtype_name_their_dtype():
    x = sample(10, np.float32)
    for dt in DTYPES:
        info = codec.inspect(codec.get_codec("int8").encode(x.astype(dt)))
        assert info["dtype"] == ("bfloat16" if dt == bfloat16 else dt.name)
