"""DLPack at the edges (codec.dlpack): capsules and producers are read without a framework;
a CPU capsule encodes as its array does; a bad capsule is refused by name.  The CUDA side
(a capsule on a CUDA device, viewed without a copy) runs in tests/cuda/test_cuda_dlpack.py."""

from __future__ import annotations

import numpy as np
import pytest

import codec
from codec import dlpack
from codec.dtypes import on_device


def _data(shape=(30, 7), dtype=np.float32):
    return np.random.default_rng(3).standard_t(2, shape).astype(dtype)


@pytest.mark.parametrize("versioned", (False, True), ids=("dltensor", "dltensor_versioned"))
@pytest.mark.parametrize("dtype", (np.float16, np.float32, np.float64, np.int32, np.uint8))
def test_a_capsule_describes_its_tensor(versioned, dtype):
    a = _data(dtype=np.float64).astype(dtype)
    cap = a.__dlpack__(max_version=(1, 0)) if versioned else a.__dlpack__()
    desc = dlpack.interface(cap)
    assert desc == {"shape": (30, 7), "strides": None, "typestr": np.dtype(dtype).str, "data": (a.ctypes.data, False), "version": 3}
    assert dlpack.device_type(cap) == 1 and not dlpack.on_cuda(cap) and not on_device(cap)


def test_strides_offsets_and_read_only_flags():
    a = _data((8, 10), np.float64)
    view = a[2:, ::2]  # a byte offset and element strides (2 columns apart)
    desc = dlpack.interface(view.__dlpack__())
    assert desc["shape"] == (6, 5) and desc["strides"] == (80, 16) and desc["data"][0] == view.ctypes.data
    ro = a.copy()
    ro.flags.writeable = False
    assert dlpack.read_only(ro.__dlpack__(max_version=(1, 0)))
    assert not dlpack.read_only(a.__dlpack__(max_version=(1, 0))) and not dlpack.read_only(a.__dlpack__())


@pytest.mark.parametrize("spec", ["none", "fp16", "topk(ratio=0.1)", "qsgd"])
def test_a_cpu_capsule_encodes_as_its_array(spec):
    a = _data()
    c = codec.get_codec(spec)
    assert bytes(c.encode(a.__dlpack__())) == bytes(c.encode(a))
    assert bytes(c.encode(a.__dlpack__(max_version=(1, 0)))) == bytes(c.encode(a))


def test_bad_capsules_are_refused_by_name():
    a = _data()
    cap = a.__dlpack__()
    np.from_dlpack(type("P", (), {"__dlpack__": lambda self, **k: cap, "__dlpack_device__": lambda self: (1, 0)})())  # consumes it
    with pytest.raises(TypeError, match="x: a capsule that is not an unused DLPack tensor"):
        codec.get_codec("fp16").encode(cap)
    with pytest.raises(TypeError, match="x: dtype int32 is not supported"):
        codec.get_codec("fp16").encode(np.arange(5, dtype=np.int32).__dlpack__())
    with pytest.raises(TypeError, match="x: a DLPack tensor of dtype bfloat16"):
        dlpack.interface(_retag(a, code=4))  # bfloat16, which __cuda_array_interface__ cannot name
    fp8 = _retag(np.zeros(4, np.uint8), code=2)  # an 8-bit float (fp8), which NumPy cannot name
    with pytest.raises(TypeError, match="x: a DLPack tensor of dtype code 2, 8 bits"):
        codec.get_codec("fp16").encode(fp8)
    with pytest.raises(TypeError, match="x: a DLPack capsule on device type 10"):
        codec.get_codec("fp16").encode(_retag(a, device=10))  # ROCm: neither host nor CUDA


def _retag(a, *, code=None, device=None):
    """A capsule of ``a`` whose DLTensor claims another dtype code or device type."""
    cap = a.__dlpack__()
    t = dlpack.tensor(cap)
    if code is not None:
        t.dtype.code = code
    if device is not None:
        t.device.device_type = device
    return cap


def test_producers_say_where_they_live():
    class Producer:
        def __init__(self, dev):
            self.dev = dev

        def __dlpack__(self, **_):
            raise AssertionError("not consumed to find the device")

        def __dlpack_device__(self):
            return self.dev

    assert on_device(Producer((2, 0))) and on_device(Producer((13, 1)))
    assert not on_device(Producer((1, 0))) and not on_device(Producer((3, 0)))
    assert not on_device(np.zeros(3)) and dlpack.device_type(np.zeros(3)) is None
