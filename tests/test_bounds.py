"""Frame size bounds (codec/bounds.py, ``Codec.max_frame_bytes`` and ``max_frame_bytes_many``):
exact where a frame's size does not depend on the values, never exceeded where it does
(adversarial inputs below; the conformance checks assert it on every sample array of every
codec, codec/testing/checks.py), and a buffer allocated once from the bound takes every
step's frame."""

from __future__ import annotations

import numpy as np
import pytest

import codec
from codec.dtypes import bfloat16
from codec.errors import CodecError
from codec.manyframe import Layout

ALL = (np.float32, np.float16, np.float64, bfloat16)
#: frames whose size depends only on the shape, dtype and parameters: the bound is the size
#: (a quantizer's scalars are float32 when they fit, which for some dtypes depends on the
#: values: a float64 bucket of 1e300s, float32 norms above 3.4e38)
EXACT = (
    ("none", ALL),
    ("fp16", ALL),
    ("bf16", ALL),
    ("minmax(bits=4,bucket=7)", (np.float32, np.float16, bfloat16)),
    ("qsgd(levels=5,bucket=9)", (np.float16,)),
    ("rangefloat(bits=5,block=7)", ALL),
    ("fp8(scale=true)", ALL),
    ("sign(scale=l1)", ALL),
    ("onebit", (np.float32, np.float16, bfloat16)),
    ("terngrad", ALL),
    ("powersgd(rank=2)", ALL),
    ("powersgd(rank=3,min_compression_rate=0)+fp16", ALL),
    ("randomk(ratio=0.3)+fp16", ALL),
    ("fft(theta=0,block=0)+none", ALL),
)

def _adversarial(n: int, dtype, rng) -> list[np.ndarray]:
    """Inputs that push a data-dependent size up: everything large (a threshold keeps all),
    ties, a spike among tiny values, evenly spread large values (the widest index gaps),
    alternating signs at full scale, heavy tails, random."""
    spread = np.full(n, 1e-6)
    spread[:: max(1, n // 3)] = 1.0
    spike = np.full(n, 1e-30)
    spike[n // 2 :: 97] = 1e30 if dtype != np.float16 else 6e4
    alt = np.where(np.arange(n) % 2, 1.0, -1.0)
    arrays = [np.ones(n), spread, spike, alt * 3.0, rng.standard_t(1.5, n), rng.standard_normal(n), np.zeros(n)]
    return [a.astype(dtype) for a in arrays]


@pytest.mark.parametrize("spec, dtypes", EXACT, ids=[s for s, _ in EXACT])
@pytest.mark.parametrize("shape", [(0,), (1,), (33, 17), (5, 7, 3)], ids=["0", "1", "33x17", "5x7x3"])
def test_exact_where_the_size_is_fixed(spec, dtypes, shape):
    c = codec.get_codec(spec)
    rng = np.random.default_rng(1)
    for dt in dtypes:
        x = rng.standard_normal(shape).astype(dt)
        assert len(c.encode(x)) == c.max_frame_bytes(x), f"{spec} {np.dtype(dt)}{list(shape)}"


SPARSE = (
    "threshold(value=0.5)",
    "threshold(value=0)+fp16+zstd",
    "topk(ratio=0.3)",
    "topk(k=1000)+bf16",
    "dgc(ratio=0.05,sample=0.1)",
    "gaussiank(ratio=0.2)",
    "gaussiank(ratio=0.05,exact=true)+minmax(bits=3)",
    "adacomp(bin=5)",
    "adacomp+fp16",
    "fft(theta=0.7,block=16,keep=global)+none+zstd",
    "fft(theta=0.5,block=8)+qsgd(bucket=4)",
    "qsgd(levels=300,coding=elias)",
    "qsgd(levels=2,bucket=3,coding=elias)+zstd",
    "topk(ratio=0.5)+qsgd(levels=4,bucket=7,coding=elias)",
    "none+zstd(level=1)+crc32",
)


@pytest.mark.parametrize("spec", SPARSE)
def test_never_exceeded_by_adversarial_inputs(spec):
    c = codec.get_codec(spec)
    rng = np.random.default_rng(2)
    for n in (1, 2, 7, 300, 4097):
        for dt in (np.float32, np.float16, bfloat16, np.float64):
            bound = c.max_frame_bytes(np.empty(n, dt))
            for x in _adversarial(n, dt, rng):
                size = len(c.encode(x))
                assert size <= bound, f"{spec}: {np.dtype(dt)}[{n}] frame of {size} bytes, bound {bound}"


def test_a_buffer_allocated_once_takes_every_step():
    """The use the bound is for: one ``out=`` buffer for every error-feedback step, at the
    bound's size, reused (a scheduled ratio's bound is its largest, at step 0)."""
    spec = "topk(ratio=warmup(0.5,0.01,steps=3))+fp16"
    c = codec.get_codec(spec)
    x = np.random.default_rng(3).standard_normal((64, 9)).astype(np.float32)
    buf = np.empty(c.max_frame_bytes(x), np.uint8)
    assert c.max_frame_bytes(x, step=5) < len(buf)  # the ratio has decayed
    ef, ref = codec.ErrorFeedback(c), codec.ErrorFeedback(c)
    for step in range(5):
        got = ef.encode(x, key="w", out=buf)
        assert bytes(got) == ref.encode(x, key="w"), f"step {step}"


DENSE_MANY = ("fp16", "powersgd(rank=2)", "minmax(bits=2)+crc32")


@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.1)", "adacomp", "qsgd(coding=elias)+zstd", "powersgd(rank=2)", "minmax(bits=2)+crc32"])
def test_many_tensor_frames(spec):
    c = codec.get_codec(spec)
    rng = np.random.default_rng(4)
    tensors = {"conv": rng.standard_t(2, (8, 3, 3, 3)).astype(np.float32), "bias": rng.standard_normal(8).astype(np.float16),
               "fc": rng.standard_normal((40, 30)), "empty": np.zeros((0, 4), np.float32), "one": np.ones(1, np.float32)}
    for layout in ("table", "hash"):
        for named in (True, False):
            ts = tensors if named else list(tensors.values())
            frame = c.encode_many(ts, layout=layout)
            bound = c.max_frame_bytes_many(ts, layout=layout)
            assert len(frame) <= bound, f"{spec} {layout}: {len(frame)} > {bound}"
            if spec in DENSE_MANY:  # only the varints' slack: a few bytes per tensor
                assert bound - len(frame) <= 6 * len(tensors) + 12, f"{spec} {layout}: {len(frame)} bytes, bound {bound}"
            assert c.max_frame_bytes_many(Layout.of(ts), layout=layout) == bound  # a Layout is read as the tensors
    same = [v.astype(np.float32) for v in tensors.values()]
    assert len(c.encode_many(same, joint=True)) <= c.max_frame_bytes_many(same, joint=True)


def test_many_tensor_bound_is_tight_for_dense_codecs():
    """A dense codec's v2 bound is its payload plus at most a few bytes per tensor beyond
    the frame (each count and pattern bounded as the longest varint it could be)."""
    c = codec.get_codec("fp16")
    ts = [np.zeros((64, 3 + i), np.float32) for i in range(50)]
    frame = c.encode_many(ts)
    assert 0 <= c.max_frame_bytes_many(ts) - len(frame) <= 6 * len(ts)


def test_read_for_shape_and_dtype_only():
    c = codec.get_codec("fp16")
    raw = np.zeros(40, np.float32).tobytes()
    assert c.max_frame_bytes(raw, dtype="float32") == len(c.encode(raw, dtype="float32"))
    with pytest.raises(CodecError, match="x: expected an array-like"):  # as encode refuses it
        c.max_frame_bytes([1.0, 2.0, 3.0])
    with pytest.raises(CodecError, match="x: dtype int32"):
        c.max_frame_bytes(np.zeros(3, np.int32))
    with pytest.raises(CodecError, match=r"tensors\['a'\]: dtype int8"):
        c.max_frame_bytes_many({"a": np.zeros(3, np.int8)})
    with pytest.raises(CodecError, match="tensors: expected a dict"):
        c.max_frame_bytes_many(np.zeros(3, np.float32))
    with pytest.raises(CodecError, match="layout: expected 'table' or 'hash'"):
        c.max_frame_bytes_many([np.zeros(3, np.float32)], layout="flat")
    with pytest.raises(CodecError, match="step"):
        c.max_frame_bytes(np.zeros(3, np.float32), step=-1)
