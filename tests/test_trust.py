"""Regression tests for issue 13 ("Trust"), defects 1, 3, 4, 5 and 7: what reaches a kernel,
forged frames, parameter bounds and numeric edges.  Each test failed on the main it was
written against."""

from __future__ import annotations

import functools
import tracemalloc

import numpy as np
import pytest

import codec
from codec.dtypes import bfloat16
from codec.frame import Section, build_frame, parse_frame

pytestmark = pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")  # np.matrix on purpose

# every registered codec alone, plus pipelines whose decode takes another path
SPECS = [c["id"] for c in codec.list_codecs()] + [
    "topk(ratio=0.1)+fp16", "topk(ratio=0.1)+qsgd", "fft(theta=0.5)+fp16", "powersgd(rank=1,min_compression_rate=0)",
    "adacomp+fp16+zstd", "rangefloat(bits=6,block=7)", "fp16+crc32",
]


def _reframe(frame: bytes, spec: str | None = None, shape=None) -> bytes:
    """``frame`` rebuilt with another spec text or shape and every checksum recomputed: a
    forgery that passes the CRCs, so it reaches the checks behind them."""
    fr = parse_frame(frame)
    sections = [Section(s.kind, s.bits, s.count, bytes(fr.raw(i))) for i, s in enumerate(fr.sections)]
    return build_frame(fr.spec if spec is None else spec, fr.dtype, fr.shape if shape is None else shape, sections, checksum="crc32c")


def _x(shape=(8, 16), dtype=np.float32):
    return (np.random.default_rng(1).standard_normal(shape) * 3).astype(dtype)


# ------------------------------------------------------------ defect 1: what reaches a kernel
@pytest.mark.parametrize("spec", SPECS)
def test_matrix_out_is_written_inside_its_buffer(spec):
    """An np.matrix ``out`` kept reshape(-1) 2-D, so kernels wrote row i for element i,
    outside the buffer (SIGSEGV, heap corruption, wrong values)."""
    x = _x()
    frame = codec.get_codec(spec).encode(x)
    want = codec.decode(frame)
    big = np.zeros(128 * 129, np.float32)
    out = np.asmatrix(big[:128].reshape(1, 128))
    got = codec.decode(frame, out=out)
    assert got is out
    assert not np.count_nonzero(big[128:]), "decode wrote outside out"
    assert np.array_equal(np.asarray(out).reshape(-1), want.reshape(-1))
    # decode_add into a float16 matrix (used to leak a Numba TypingError) adds like a plain array
    plain = np.full(128, 0.5, np.float16)
    codec.get_codec(spec).decode_add(frame, plain)
    big16 = np.full(128 * 3, 0.5, np.float16)
    m16 = np.asmatrix(big16[:128].reshape(8, 16))
    codec.get_codec(spec).decode_add(frame, m16)
    assert np.array_equal(np.asarray(m16).reshape(-1).view(np.uint16), plain.view(np.uint16))
    assert np.all(big16[128:] == 0.5)


@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.1)", "qsgd"])
def test_masked_out_is_refused_naming_out(spec):
    frame = codec.get_codec(spec).encode(_x())
    for call in (lambda o: codec.decode(frame, out=o), lambda o: codec.get_codec(spec).decode_add(frame, o)):
        with pytest.raises(TypeError, match="out: masked"):
            call(np.ma.masked_array(np.zeros((8, 16), np.float32)))


def test_out_must_be_plain_writable_aligned():
    frame = codec.get_codec("fp16").encode(_x())
    strided = np.zeros((8, 32), np.float32)[:, ::2]
    ro = np.zeros((8, 16), np.float32)
    ro.flags.writeable = False
    unaligned = np.frombuffer(bytearray(8 * 16 * 4 + 1), np.float32, 128, offset=1)
    big_endian = np.zeros((8, 16), ">f4")
    for out in (strided, ro, unaligned, big_endian):
        with pytest.raises(ValueError, match="out"):
            codec.decode(frame, out=out)
    with pytest.raises(TypeError, match="out"):
        codec.decode(frame, out=[0.0] * 128)


@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.1)", "qsgd", "adacomp", "powersgd(rank=1,min_compression_rate=0)"])
def test_subclassed_big_endian_and_unaligned_input_encode_as_plain(spec):
    c = codec.get_codec(spec)
    x = _x()
    want = c.encode(x)
    assert c.encode(np.asmatrix(x)) == want
    assert c.encode(x.astype(">f4")) == want
    raw = bytearray(x.nbytes + 1)
    unaligned = np.frombuffer(raw, np.float32, x.size, offset=1).reshape(x.shape)
    unaligned[...] = x
    assert c.encode(unaligned) == want
    assert c.encode(np.asfortranarray(x)) == want
    with pytest.raises(TypeError, match="x: masked"):
        c.encode(np.ma.masked_array(x))


def test_broadcast_input_is_refused_before_allocating():
    """np.broadcast_to(1, (2**33,)) made every codec try to allocate 32 GiB."""
    x = np.broadcast_to(np.float32(1), (1 << 33,))
    tracemalloc.start()
    try:
        for spec in ("fp16", "topk", "qsgd", "none"):
            with pytest.raises(ValueError, match="x: a broadcast array"):
                codec.get_codec(spec).encode(x)
            with pytest.raises(ValueError, match="x: a broadcast array"):
                codec.ErrorFeedback(spec).encode(x)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    # a small broadcast is refused the same way; its contiguous copy encodes
    small = np.broadcast_to(np.float32(2), (5,))
    with pytest.raises(ValueError, match="ascontiguousarray"):
        codec.get_codec("fp16").encode(small)
    assert codec.decode(codec.get_codec("fp16").encode(np.ascontiguousarray(small))).tolist() == [2.0] * 5


# ------------------------------------------------------------ defect 3: forged frames
@pytest.mark.parametrize("shape", [(2**62, 0), (0, 2**63 - 1), (2**31, 2**31, 0), (2**41, 0)])
def test_forged_empty_shape_is_corrupt(shape):
    """A shape such as (2**62, 0) passed the element limit, then np.empty raised NumPy's
    "array is too big"."""
    frame = _reframe(codec.get_codec("none").encode(np.zeros(0, np.float32)), shape=shape)
    for call in (codec.decode, codec.inspect, codec.decode_sparse):
        with pytest.raises(codec.CorruptFrameError, match="shape"):
            call(frame)
    # the non-zero dimensions are held to max_elements too: raising it admits what NumPy can make
    if shape == (2**41, 0):
        assert codec.decode(frame, max_elements=2**42).shape == shape
    else:
        with pytest.raises(codec.CorruptFrameError, match="shape"):
            codec.decode(frame, max_elements=2**60)


def test_empty_shapes_an_encoder_makes_still_decode():
    for shape in [(0,), (3, 0), (0, 5, 7), (2**20, 0)]:
        x = np.zeros(shape, np.float32)
        assert codec.decode(codec.get_codec("fp16").encode(x)).shape == shape


def test_max_elements_is_checked():
    frame = codec.get_codec("fp16").encode(_x())
    for bad in (-1, 2**61, 1.5, True, "10"):
        with pytest.raises(ValueError, match="max_elements"):
            codec.decode(frame, max_elements=bad)
    with pytest.raises(codec.CorruptFrameError, match="limit"):
        codec.decode(frame, max_elements=127)
    assert codec.decode(frame, max_elements=128).shape == (8, 16)


@pytest.mark.parametrize(
    "source, forged",
    [
        ("qsgd(bucket=7)", "qsgd(bucket=9223372036854775808)"),
        ("qsgd(bucket=7)", "qsgd(bucket=1e308)"),
        ("qsgd(bucket=7)", "qsgd(bucket=1099511627777)"),
        ("minmax(bucket=7)", "minmax(bucket=18446744073709551616)"),
        ("rangefloat(block=7)", "rangefloat(block=9007199254740993)"),
        ("rangefloat(block=7)", "rangefloat(block=1e308)"),
        ("adacomp(bin=7)", "adacomp(bin=18446744073709551616)"),
        ("topk(k=5)", "topk(k=9223372036854775808)"),
        ("fft(block=8)", "fft(block=9223372036854775807)"),
        ("randomk", "randomk(seed=9223372036854775808)"),
        ("fp16", "fp16(nonfinite=nonsense)"),
    ],
)
def test_frame_with_out_of_range_parameter_is_corrupt(source, forged):
    """A CRC-valid frame whose spec carries a parameter no encoder accepts raised
    OverflowError from the jit dispatch."""
    frame = _reframe(codec.get_codec(source).encode(_x()), spec=forged)
    with pytest.raises(codec.CorruptFrameError, match="invalid codec"):
        codec.decode(frame)
    with pytest.raises(codec.CorruptFrameError):
        codec.get_codec(source).decode_add(frame, np.zeros(128, np.float32))


def test_frame_naming_an_unknown_codec_is_unknown_codec_error():
    frame = _reframe(codec.get_codec("fp16").encode(_x()), spec="fp17")
    with pytest.raises(codec.UnknownCodecError, match="fp17"):
        codec.decode(frame)
    assert isinstance(codec.UnknownCodecError("x"), codec.CodecError)


# ------------------------------------------------------------ defect 4: parameter bounds
@pytest.mark.parametrize(
    "spec",
    [
        "qsgd(bucket=9223372036854775808)", "qsgd(bucket=18446744073709551616)", "minmax(bucket=18446744073709551616)",
        "adacomp(bin=18446744073709551616)", "rangefloat(block=9007199254740993)", "topk(k=18446744073709551616)",
        "fft(block=9223372036854775807)", "qsgd(bucket=1e308)",
    ],
)
def test_length_parameters_have_upper_bounds(spec):
    with pytest.raises(ValueError, match="must be <= 1099511627776"):
        codec.get_codec(spec)


@pytest.mark.parametrize("spec", ["threshold(value=1" + "0" * 400 + ")", "topk(ratio=-1" + "0" * 400 + ")", "terngrad(clip=1" + "0" * 309 + ")"])
def test_float_parameter_beyond_float64_is_a_value_error(spec):
    """A float parameter given an integer beyond float64 raised OverflowError (found by the fuzzer)."""
    with pytest.raises(ValueError, match="must be finite"):
        codec.get_codec(spec)


def test_keyword_parameters_are_bounded_too():
    for name, kw in [("qsgd", {"bucket": 2**64}), ("minmax", {"bucket": 2**63}), ("adacomp", {"bin": 2**64})]:
        with pytest.raises(ValueError, match="<= 1099511627776"):
            codec.get_codec(name, **kw)


def test_a_window_longer_than_the_message_costs_nothing_extra():
    """rangefloat(block=2**53+1) asked for 512 GiB to encode 128 values; at the bound (2**40) a
    window longer than the message is the message, with the same bytes as block=0."""
    x = _x()
    tracemalloc.start()
    try:
        long = codec.get_codec(f"rangefloat(block={1 << 40})").encode(x)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    whole = codec.get_codec("rangefloat").encode(x)
    assert np.array_equal(codec.decode(long), codec.decode(whole))
    assert parse_frame(long).sections[0].count == parse_frame(whole).sections[0].count


@pytest.mark.parametrize("ratio", [1e-300, 5e-324, 1e-17, 1e-16])
def test_gaussiank_takes_any_positive_ratio(ratio):
    """gaussiank(ratio=1e-300) raised statistics.StatisticsError."""
    x = np.random.default_rng(2).standard_normal(4096).astype(np.float32)
    pos, _ = codec.decode_sparse(codec.get_codec(f"gaussiank(ratio={ratio})").encode(x))
    assert pos.size == 1  # k = max(1, floor(ratio * n)) = 1: the window [ceil(2/3), floor(4/3)] is 1


# ------------------------------------------------------------ defect 5: numeric edges
@pytest.mark.parametrize("dtype", [np.float32, np.float16, bfloat16])
@pytest.mark.parametrize("spec", ["qsgd", "qsgd(rounding=nearest)", "qsgd(coding=elias)", "topk(ratio=0.5)+qsgd", "qsgd(levels=1)"])
def test_quantizer_saturates_at_the_dtype_maximum(spec, dtype):
    """qsgd turned 50 values at float32/float16 max into 13 infinities."""
    top = float(np.finfo(dtype).max) if dtype is not bfloat16 else float(np.asarray(3.3895e38, np.float32).astype(bfloat16))
    x = np.full(50, top, np.float32).astype(dtype)
    x[::3] = -x[::3]
    c = codec.get_codec(spec)
    frame = c.encode(x)
    y = codec.decode(frame)
    wide = y.astype(np.float64)
    assert np.all(np.isfinite(wide)) and np.all(np.abs(wide) <= top)
    acc = np.zeros_like(x)
    c.decode_add(frame, acc)
    assert np.array_equal(acc.view(np.uint16 if acc.itemsize == 2 else np.uint32), y.view(acc.view(np.uint16 if acc.itemsize == 2 else np.uint32).dtype))
    ef = codec.ErrorFeedback(spec)
    ef.encode(x, key="w")
    assert np.all(np.isfinite(ef.residual("w").astype(np.float64)))


@pytest.mark.parametrize("spec", ["qsgd", "sign(scale=l1)", "efsign", "topk(ratio=0.5)+qsgd", "terngrad"])
def test_float64_scale_overflow_is_an_encode_error_not_a_frame_the_decoder_rejects(spec):
    x = np.full(50, np.finfo(np.float64).max)
    x[::3] = -x[::3]
    try:
        frame = codec.get_codec(spec).encode(x)
    except ValueError as e:
        assert str(e).startswith("x:")
        return
    assert np.all(np.isfinite(codec.decode(frame)))


@pytest.mark.parametrize("spec", ["randomk", "topk", "fp16", "qsgd", "dgc", "terngrad"])
def test_step_is_bounded_the_same_way_everywhere(spec):
    """randomk.encode(x, step=1 << 70) raised OverflowError while other codecs accepted it."""
    c = codec.get_codec(spec)
    for bad in (1 << 70, 1 << 62, -1, True, 1.0):
        with pytest.raises(ValueError, match=r"step: must be an integer in \[0, 2\*\*62\)"):
            c.encode(_x(), step=bad)
    assert codec.decode(c.encode(_x(), step=(1 << 62) - 1)).shape == (8, 16)


def test_decode_add_into_none_is_refused():
    """Codec.decode_add(frame, None) decoded into a throw-away buffer and returned None."""
    c = codec.get_codec("fp16")
    with pytest.raises(TypeError, match="out"):
        c.decode_add(c.encode(_x()), None)


@pytest.mark.parametrize("key", ["\ud800", "a\udfffb", ("layer", "\ud834"), "\x00"])
def test_keys_with_lone_surrogates(key):
    """A surrogate string as key raised a UnicodeEncodeError that did not name key."""
    c = codec.get_codec("randomk(ratio=0.25)")
    f1, f2 = c.encode(_x(), key=key), c.encode(_x(), key=key)
    assert f1 == f2 and f1 != c.encode(_x(), key="other")
    ef = codec.ErrorFeedback(c)
    ef.encode(_x(), key=key)
    assert ef.step(key) == 1


# ------------------------------------------------------------------ a device claim without CUDA (issue 28)
class _ClaimsCuda:
    """An object that says it is a CUDA array (``__cuda_array_interface__``) on a machine where
    no CUDA kernel can run."""

    def __init__(self, n=10):
        self._host = np.ones(n, np.float32)
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (self._host.ctypes.data, False), "version": 3, "strides": None}


def _device_calls():
    a = np.ones(10, np.float32)
    fp16 = codec.get_codec("fp16")
    frame, many = fp16.encode(a), fp16.encode_many({"w": a})
    return [
        ("x", lambda: fp16.encode(_ClaimsCuda())),
        ("x", lambda: codec.ErrorFeedback("topk").encode(_ClaimsCuda(), key="w")),
        ("tensors['w']", lambda: fp16.encode_many({"w": _ClaimsCuda()})),
        ("tensors['w']", lambda: codec.ErrorFeedback("fp16").encode_many({"w": _ClaimsCuda()})),
        ("out", lambda: codec.decode(frame, out=_ClaimsCuda())),
        ("out", lambda: fp16.decode_add(frame, _ClaimsCuda())),
        ("out", lambda: codec.decode_many(many, out={"w": _ClaimsCuda()})),
    ]


@pytest.mark.parametrize("missing", ["driver", "numba-cuda"])
def test_a_device_claim_without_cuda_is_a_type_error_naming_the_argument(monkeypatch, missing):
    """Numba's CudaSupportError reached the caller from codec/device.py; now every entry point
    refuses with a CodecTypeError (a TypeError) naming the argument, and says why."""
    from codec import device

    if missing == "driver":
        try:
            import numba.cuda
        except ImportError:
            pytest.skip("numba-cuda is not installed")
        if numba.cuda.is_available():
            pytest.skip("this machine runs CUDA kernels")
        why = "no CUDA driver or GPU was found"
    else:
        def absent():
            raise ImportError("CUDA kernels need Numba's CUDA target: pip install numba-cuda (No module named 'numba.cuda')")

        monkeypatch.setattr(device, "_cuda", absent)
        why = "Numba's CUDA target is missing"
    device._cuda_missing.cache_clear()
    monkeypatch.setattr(device, "_cuda_missing", functools.lru_cache(maxsize=1)(device._cuda_missing.__wrapped__))
    for argname, call in _device_calls():
        with pytest.raises(codec.CodecError) as info:
            call()
        assert isinstance(info.value, TypeError)
        assert str(info.value).startswith(f"{argname}: a device (CUDA) array, but this process cannot run CUDA kernels: {why}"), str(info.value)
