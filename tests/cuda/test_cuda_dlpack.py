"""DLPack on a CUDA device (codec.dlpack): a capsule or producer whose tensor is on a CUDA
device is viewed through its __cuda_array_interface__ description, never copied, and takes
every device path: frames are the host's, decode writes into it, a read-only one is
refused as an output.  In the simulator "device" memory is host memory, so a NumPy
capsule retagged as a CUDA one (device type 2) stands in for a framework's."""

from __future__ import annotations

import numpy as np
import pytest

import codec
from codec import dlpack


def cuda_capsule(a, versioned=False):
    """A DLPack capsule of ``a`` whose DLTensor says it lives on CUDA device 0."""
    cap = a.__dlpack__(max_version=(1, 0)) if versioned else a.__dlpack__()
    dlpack.tensor(cap).device.device_type = 2
    return cap


class Producer:
    """A framework tensor that speaks only DLPack (TensorFlow's, PaddlePaddle's)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **_):
        return cuda_capsule(self.a)

    def __dlpack_device__(self):
        return (2, 0)


@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.1)", "randomk(ratio=0.2)+bf16"])
@pytest.mark.parametrize("versioned", (False, True), ids=("dltensor", "versioned"))
def test_cuda_capsules_take_the_device_path(spec, versioned, monkeypatch):
    from codec import device

    viewed = []
    real = device._view
    monkeypatch.setattr(device, "_view", lambda desc, owner: viewed.append(desc) or real(desc, owner))
    c = codec.get_codec(spec)
    a = np.random.default_rng(2).standard_normal((40, 9)).astype(np.float32)
    frame = c.encode(cuda_capsule(a, versioned))
    assert bytes(frame) == bytes(c.encode(a)) and viewed[0]["data"][0] == a.ctypes.data  # viewed where it lies
    assert bytes(c.encode(Producer(a))) == bytes(frame)
    y = np.full((40, 9), 7, np.float32)
    codec.decode(frame, out=cuda_capsule(y, versioned))
    assert np.array_equal(y, codec.decode(frame))
    ef, ref = codec.ErrorFeedback(spec), codec.ErrorFeedback(spec)
    assert bytes(ef.encode(cuda_capsule(a), key="w")) == bytes(ref.encode(a, key="w"))
    assert np.array_equal(ef.residual("w").copy_to_host(), ref.residual("w"))
    ts = [np.random.default_rng(i).standard_normal(n).astype(np.float32) for i, n in enumerate((5, 60, 9))]
    assert bytes(c.encode_many([cuda_capsule(t) for t in ts])) == bytes(c.encode_many(ts))


def test_cuda_capsules_are_checked_by_name(host_only):
    frame = codec.get_codec("fp16").encode(np.ones(6, np.float32))
    ro = np.zeros(6, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out: a read-only DLPack tensor"):
        codec.decode(frame, out=cuda_capsule(ro, versioned=True))
    with pytest.raises(TypeError, match="x: a device array of dtype int32"):
        codec.get_codec("fp16").encode(cuda_capsule(np.arange(6, dtype=np.int32)))
    with pytest.raises(ValueError, match="x: a device array must be C-contiguous"):
        codec.get_codec("fp16").encode(cuda_capsule(np.ones((6, 4), np.float32)[:, ::2]))
    with pytest.raises(TypeError, match=r"x: a device \(CUDA\) array, and int8 has no CUDA path"):
        codec.get_codec(host_only).encode(cuda_capsule(np.ones(6, np.float32)))


def test_read_only_outputs_and_newer_versions_are_refused():
    frame = codec.get_codec("fp16").encode(np.ones(6, np.float32))
    ro = np.zeros(6, np.float32)
    ro.flags.writeable = False

    class ReadOnlyProducer(Producer):  # asked for a versioned capsule, which carries the flag
        def __dlpack__(self, max_version=None, **_):
            assert max_version == (1, 0)
            return cuda_capsule(self.a, versioned=True)

    with pytest.raises(ValueError, match="out: a read-only DLPack tensor"):
        codec.decode(frame, out=ReadOnlyProducer(ro))

    class ReadOnlyInterface:
        __cuda_array_interface__ = {"shape": (6,), "strides": None, "typestr": "<f4", "data": (ro.ctypes.data, True), "version": 3}

    with pytest.raises(ValueError, match="out: a read-only device array"):
        codec.decode(frame, out=ReadOnlyInterface())
    cap = cuda_capsule(np.ones(6, np.float32), versioned=True)
    import ctypes

    ctypes.c_uint32.from_address(dlpack._POINTER(cap, b"dltensor_versioned")).value = 2  # a DLPack 2.x capsule
    with pytest.raises(TypeError, match="x: a DLPack capsule of version 2.0"):
        codec.get_codec("fp16").encode(cap)
