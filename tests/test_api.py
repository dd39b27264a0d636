"""The public face: get_codec forms, input coercion, dtypes, NaN policy, errors, import cost."""

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import codec
from codec.dtypes import bfloat16


def test_get_codec_forms_agree():
    a = codec.get_codec("zstd(level=5)")
    b = codec.get_codec("zstd", level=5)
    c = codec.get_codec({"id": "none+zstd", "zstd.level": 5})
    d = codec.get_codec(a.get_config())
    assert a == b == c == d and codec.get_codec(a) is a
    assert codec.get_codec("fp16", nonfinite="keep").spec == "fp16(nonfinite=keep)"
    with pytest.raises(TypeError, match="spec"):
        codec.get_codec(3)
    with pytest.raises(ValueError, match="bare codec id"):
        codec.get_codec("fp16+zstd", level=3)
    with pytest.raises(ValueError, match="names no stage"):
        codec.get_codec({"id": "fp16", "zstd.level": 3})


def test_list_codecs_describes_parameters():
    listed = {c["id"]: c for c in codec.list_codecs()}
    assert {"none", "fp16", "bf16", "zstd", "crc32", "threshold"} <= set(listed)
    level = listed["zstd"]["params"][0]
    assert level["name"] == "level" and level["default"] == 3 and level["min"] == -7
    assert all(c["doc"] for c in listed.values())
    json.dumps(codec.list_codecs())


@pytest.mark.parametrize("bad", [np.arange(5), np.array([True]), np.zeros(3, np.complex64), np.array([object()])])
def test_non_float_input_is_a_type_error(bad):
    with pytest.raises(TypeError, match="x"):
        codec.get_codec("fp16").encode(bad)


def test_bytes_need_a_dtype():
    with pytest.raises(TypeError, match="dtype"):
        codec.get_codec("none").encode(b"\0" * 8)
    y = codec.decode(codec.get_codec("none").encode(b"\0" * 8, dtype="float32"))
    assert y.dtype == np.float32 and y.shape == (2,)
    with pytest.raises(ValueError, match="whole number"):
        codec.get_codec("none").encode(b"\0" * 7, dtype="float32")


def test_bfloat16_inputs():
    x = np.array([1.5, -2.25, 3e38], np.float32).astype(bfloat16)
    y = codec.decode(codec.get_codec("none").encode(x))
    assert y.dtype == bfloat16 and y.tobytes() == x.tobytes()
    # a uint16 view with an explicit dtype is reinterpreted, not converted
    y2 = codec.decode(codec.get_codec("none").encode(x.view(np.uint16), dtype="bfloat16"))
    assert y2.tobytes() == x.tobytes()
    assert np.dtype(ml_dtypes.bfloat16) == bfloat16


def test_non_contiguous_and_array_likes():
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    view = base[:, ::2]
    assert not view.flags.c_contiguous
    c = codec.get_codec("none")
    assert np.array_equal(codec.decode(c.encode(view)), view)
    assert np.array_equal(codec.decode(c.encode(view.T)), view.T)

    class Like:
        def __array__(self, dtype=None, copy=None):
            return base

    assert np.array_equal(codec.decode(c.encode(Like())), base)

    class DL:
        def __dlpack__(self, *a, **k):
            return base.__dlpack__(*a, **k)

        def __dlpack_device__(self):
            return base.__dlpack_device__()

    assert np.array_equal(codec.decode(c.encode(DL())), base)


def test_shapes_and_dtypes_survive():
    for dt in (np.float16, bfloat16, np.float32, np.float64):
        for shape in ((), (0,), (1,), (3, 0, 2), (2, 3, 4, 5, 1)):
            x = np.ones(shape, dt)
            for spec in ("none", "fp16", "bf16", "threshold(value=0.5)"):
                y = codec.decode(codec.get_codec(spec).encode(x))
                assert y.shape == shape and y.dtype == dt


def test_nonfinite_policy():
    x = np.array([[1.0, 2.0], [np.nan, np.inf]], np.float32)
    with pytest.raises(ValueError, match=r"position \(1, 0\)"):
        codec.get_codec("fp16").encode(x)
    with pytest.raises(ValueError, match=r"position \(1, 0\)"):
        codec.get_codec("bf16").encode(x.astype(np.float64))
    with pytest.raises(ValueError, match=r"position \(1, 0\)"):
        codec.get_codec("threshold(value=1)").encode(x)
    for spec in ("fp16(nonfinite=keep)", "bf16(nonfinite=keep)", "none", "zstd"):
        y = codec.decode(codec.get_codec(spec).encode(x))
        assert np.isnan(y[1, 0]) and y[1, 1] == np.inf and y[0, 1] == 2.0


def test_fp16_overflow_becomes_inf_and_bf16_keeps_range():
    x = np.array([65504.0, 65519.0, 65520.0, -1e6, 1e-7, 1e-8], np.float32)
    y = codec.decode(codec.get_codec("fp16").encode(x))
    assert y.tolist() == [65504.0, 65504.0, np.inf, -np.inf, 2.0**-23, 0.0]  # subnormals round to nearest even
    z = codec.decode(codec.get_codec("bf16").encode(np.array([3e38, -1e-30], np.float32)))
    assert np.allclose(z, [3e38, -1e-30], rtol=1e-2)


def test_decode_checks_the_codec_and_module_decode_needs_nothing():
    f = codec.get_codec("fp16").encode(np.ones(3, np.float32))
    with pytest.raises(codec.CodecError, match="encoded by 'fp16'"):
        codec.get_codec("bf16").decode(f)
    assert codec.get_codec("fp16(nonfinite=keep)").decode(f).tolist() == [1, 1, 1]
    assert codec.decode(f).tolist() == [1, 1, 1]


def test_decode_add_accepts_any_float_accumulator_and_rejects_wrong_size():
    f = codec.get_codec("fp16").encode(np.full(4, 0.5, np.float32))
    for dt in (np.float16, bfloat16, np.float32, np.float64):
        acc = np.ones(4, dt)
        codec.get_codec("fp16").decode_add(f, acc)
        assert acc.astype(np.float32).tolist() == [1.5] * 4
    with pytest.raises(ValueError, match="out"):
        codec.get_codec("fp16").decode_add(f, np.ones(5, np.float32))
    with pytest.raises(ValueError, match="out"):
        codec.get_codec("fp16").decode_add(f, np.ones(4, np.int32))
    with pytest.raises(ValueError, match="out"):
        codec.get_codec("fp16").decode_add(f, np.ones(8, np.float32)[::2])


def test_sparse_decode_add_touches_only_kept_positions():
    x = np.zeros(1000, np.float32)
    x[[3, 500, 999]] = [1.0, -2.0, 3.0]
    f = codec.get_codec("threshold(value=0.5)").encode(x)
    acc = np.full(1000, 10.0, np.float32)
    codec.get_codec("threshold(value=0.5)").decode_add(f, acc)
    assert acc[3] == 11.0 and acc[500] == 8.0 and acc[999] == 13.0
    assert np.all(np.delete(acc, [3, 500, 999]) == 10.0)
    assert codec.inspect(f)["sections"][0]["count"] == 3


def test_errors_hierarchy():
    assert issubclass(codec.CorruptFrameError, codec.CodecError) and issubclass(codec.CorruptFrameError, ValueError)
    assert issubclass(codec.UnknownCodecError, codec.CodecError) and issubclass(codec.UnknownCodecError, ValueError)
    with pytest.raises(TypeError, match="frame"):
        codec.decode(12345)
    with pytest.raises(TypeError, match="frame"):
        codec.decode(np.zeros(10, np.float32))


def test_import_is_cheap_and_compiles_nothing():
    code = (
        "import sys, time; t = time.perf_counter(); import codec; dt = time.perf_counter() - t;"
        "bad = [m for m in sys.modules if m.startswith(('numba', 'mpi4py', 'codec.kernels.cpu', 'zstandard', 'rich', 'torch'))];"
        "print(repr(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_codec_in_a_valid_frame():
    from codec.testing.malformed import _fix_crc  # noqa: PLC2701 - test helper
    from codec.frame import parse_frame

    f = bytearray(codec.get_codec("fp16").encode(np.ones(2, np.float32)))
    hl = parse_frame(bytes(f)).header_len
    i = bytes(f).index(b"fp16")
    f[i : i + 4] = b"fp17"
    _fix_crc(f, hl)
    with pytest.raises(codec.UnknownCodecError, match="fp17"):
        codec.decode(bytes(f))


@pytest.mark.parametrize("spec", ["topk(ratio=0.05)", "topk(ratio=0.05)+fp16+zstd", "randomk(ratio=0.1)", "adacomp", "threshold(value=0.5)"])
@pytest.mark.parametrize("dtype", [np.float16, codec.dtypes.bfloat16, np.float32, np.float64])
def test_decode_sparse_gives_the_positions_and_values_decode_scatters(spec, dtype):
    x = (np.random.default_rng(3).standard_t(2, size=1001)).astype(dtype)
    frame = codec.get_codec(spec).encode(x)
    pos, vals = codec.decode_sparse(frame)
    assert pos.dtype == np.int64 and np.all(np.diff(pos) > 0)
    assert vals.dtype == (np.dtype(dtype) if np.dtype(dtype) in (np.float32, np.float64) else np.float32)
    dense = np.zeros(x.size, np.float64)
    dense[pos] = vals
    np.testing.assert_array_equal(dense.astype(dtype), codec.decode(frame).reshape(-1))
    empty_pos, empty_vals = codec.decode_sparse(codec.get_codec(spec).encode(np.zeros(0, dtype)))
    assert empty_pos.size == 0 and empty_vals.size == 0


def test_decode_sparse_rejects_dense_and_corrupt_frames():
    frame = codec.get_codec("fp16").encode(np.ones(5, np.float32))
    with pytest.raises(ValueError, match="frame: 'fp16' has no select stage"):
        codec.decode_sparse(frame)
    sparse = codec.get_codec("topk(ratio=0.5)").encode(np.arange(10, dtype=np.float32))
    with pytest.raises(codec.CorruptFrameError):
        codec.decode_sparse(sparse[:-3])


def test_codec_decode_sparse_checks_the_codec():
    x = np.arange(20, dtype=np.float32)
    frame = codec.get_codec("topk(ratio=0.2)").encode(x)
    pos, vals = codec.get_codec("topk(ratio=0.2)").decode_sparse(frame)
    want_pos, want_vals = codec.decode_sparse(frame)
    np.testing.assert_array_equal(pos, want_pos)
    np.testing.assert_array_equal(vals, want_vals)
    with pytest.raises(codec.CodecError, match="encoded by"):
        codec.get_codec("randomk(ratio=0.2)").decode_sparse(frame)
