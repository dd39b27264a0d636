"""Frames held in device memory (codec/devframe.py, docs/api.md "Frames on the device"):
encode_many writes the host's frame byte for byte into a device buffer (both layouts, joint,
under error feedback); decode_many and decode_add_many read a device frame as the host's;
a forged device frame raises CorruptFrameError before any output is touched; and what
crosses between host and device is the header, not the payload.  (Single-tensor device
frames of every codec: codec.testing.check_device, tests/cuda/test_cuda_conformance.py.)"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import cuda

import codec
from codec import devframe
from codec.errors import CorruptFrameError

SPECS = ["fp16", "none+zstd", "topk(ratio=0.1)", "randomk(ratio=0.2)", "minmax(bits=3,bucket=16)", "qsgd(bucket=16)", "sign", "powersgd", "fp16+crc32"]


def tensors(dtype=np.float32):
    rng = np.random.default_rng(5)
    return {
        "conv": rng.standard_t(2, (2, 3, 4, 5)).astype(dtype),
        "bias": rng.standard_normal(7).astype(dtype),
        "empty": np.zeros((0, 3), dtype),
        "fc": rng.standard_normal((9, 23)).astype(dtype),
    }


def on_device(frame):
    """A host frame's bytes, held on the device."""
    return cuda.to_device(np.frombuffer(frame, np.uint8))


@pytest.mark.parametrize("form", ("table", "hash", "joint"))
@pytest.mark.parametrize("spec", SPECS)
def test_many_tensor_device_frames_are_the_hosts(spec, form):
    c = codec.get_codec(spec)
    host = tensors()
    dev = {k: cuda.to_device(v) for k, v in host.items()}
    joint = form == "joint"
    layout = "hash" if form == "hash" else "table"
    want = c.encode_many(host, step=2, layout=layout, joint=joint)
    buf = cuda.device_array(c.max_frame_bytes_many(host, step=2, layout=layout, joint=joint), np.uint8)  # (the bound, from the tensors)
    for src in (dev, host):  # device tensors, and host ones written into a device frame
        frame = c.encode_many(src, step=2, layout=layout, joint=joint, out=buf)
        assert len(frame) == len(want) and frame.copy_to_host().tobytes() == bytes(want), src is dev
    lay = host if form == "hash" else None
    held = on_device(want)
    decoded = codec.decode_many(want, layout=lay)
    got = codec.decode_many(held, layout=lay)
    outs = {k: cuda.device_array(v.shape, v.dtype) for k, v in host.items()}
    codec.decode_many(held, out=outs, layout=lay)
    liked = codec.decode_many(want, layout=lay, like=next(iter(dev.values())))  # new device arrays
    base = {k: np.random.default_rng(9).standard_normal(v.shape) for k, v in host.items()}
    acc = {k: cuda.to_device(v) for k, v in base.items()}
    codec.decode_add_many(held, acc, layout=lay, subtract=True)
    codec.decode_add_many(want, base, layout=lay, subtract=True)
    for k in host:
        assert np.array_equal(got[k], decoded[k]), k
        assert np.array_equal(outs[k].copy_to_host(), decoded[k]), k
        assert not isinstance(liked[k], np.ndarray) and np.array_equal(liked[k].copy_to_host(), decoded[k]), k
        assert np.array_equal(acc[k].copy_to_host(), base[k]), k


@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.1)", "minmax(bits=4,bucket=16)"])
def test_error_feedback_writes_device_frames(spec):
    """ErrorFeedback.encode_many into a device buffer: the host's frames and residuals step by
    step (the step reads its own device frame back to subtract it)."""
    host = tensors()
    dev = {k: cuda.to_device(v) for k, v in host.items()}
    ef, ref = codec.ErrorFeedback(spec), codec.ErrorFeedback(spec)
    buf = cuda.device_array(1 << 14, np.uint8)
    for step in range(2):
        frame = ef.encode_many(dev, out=buf)
        assert frame.copy_to_host().tobytes() == bytes(ref.encode_many(host)), step
    for k in host:
        assert np.array_equal(ef.residual(k).copy_to_host(), ref.residual(k)), k


def forged(frame: bytes, at: int) -> np.ndarray:
    bad = np.frombuffer(frame, np.uint8).copy()
    bad[at] ^= 0x10
    return bad


@pytest.mark.parametrize("many", (False, True), ids=("v1", "v2"))
@pytest.mark.parametrize("where", ("payload", "header", "short"))
def test_a_forged_device_frame_is_refused_before_any_output_is_touched(many, where):
    c = codec.get_codec("fp16")
    host = tensors()
    frame = c.encode_many(host) if many else c.encode(host["fc"])
    bad = {"payload": forged(frame, len(frame) - 3), "header": forged(frame, 9), "short": np.frombuffer(frame, np.uint8)[:-1]}[where]
    outs = {k: cuda.to_device(np.full(v.shape, 7, v.dtype)) for k, v in host.items()}
    with pytest.raises(CorruptFrameError):
        if many:
            codec.decode_add_many(cuda.to_device(bad), outs)
        else:
            c.decode_add(cuda.to_device(bad), outs["fc"])
    for k, v in outs.items():
        assert np.all(v.copy_to_host() == 7), k


def test_a_long_many_tensor_header_is_read_whole(monkeypatch):
    """A v2 header longer than the first bytes copied (many named tensors) is copied again,
    larger, and read as the host reads it; a forged one is still refused."""
    monkeypatch.setattr(devframe, "FIRST_COPY", 64)
    host = {f"layer{i}.weight": np.full(3, i, np.float32) for i in range(40)}
    frame = codec.get_codec("fp16").encode_many(host)
    assert len(frame) > 4 * 64 * 4  # three copies: 64, 256, 1024 bytes
    got = codec.decode_many(on_device(frame))
    assert list(got) == list(host) and all(np.array_equal(got[k], host[k]) for k in host)
    with pytest.raises(CorruptFrameError):
        codec.decode_many(cuda.to_device(forged(frame, 40)))


@pytest.mark.skipif(not numba.config.ENABLE_CUDASIM, reason="counts the simulator's copies")
@pytest.mark.parametrize("spec", ["fp16", "minmax(bits=4,bucket=512)", "sign"])
def test_a_dense_device_frame_crosses_only_its_header(spec, monkeypatch):
    """Encoding a device array into a device frame, and decoding that frame into a device
    array, copies to the host no more than the header and a few numbers (the checksum's
    joined values, a quantizer's bounds), whatever the tensor's size: never the payload."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    x = np.random.default_rng(3).standard_normal(6000).astype(np.float32)
    c = codec.get_codec(spec)
    d = cuda.to_device(x)
    buf = cuda.device_array(len(c.encode(x)) + 1, np.uint8)
    out = cuda.device_array(x.size, np.float32)
    down = []
    real = FakeCUDAArray.copy_to_host
    monkeypatch.setattr(FakeCUDAArray, "copy_to_host", lambda self, *a, **k: down.append(self._ary.nbytes) or real(self, *a, **k))
    frame = c.encode(d, out=buf)
    encoded = sum(down)
    down.clear()
    c.decode(frame, out=out)
    decoded = sum(down)
    payload = len(frame) - codec.frame.parse_frame(frame.copy_to_host()).header_len
    assert payload > 700 and encoded + decoded < payload // 4, (encoded, decoded, payload)
    monkeypatch.undo()
    assert np.array_equal(out.copy_to_host(), codec.decode(c.encode(x)))
