"""DLPack at gradcodec's edges: a capsule (``"dltensor"`` or ``"dltensor_versioned"``), or an
object exposing ``__dlpack__`` / ``__dlpack_device__`` (TensorFlow, JAX, PaddlePaddle, ...),
read without importing any framework.

A capsule is a pointer to a ``DLManagedTensor`` (or its versioned twin), whose ``DLTensor``
is read here through ``ctypes`` (the DLPack ABI, dlpack.h)::

    void* data; DLDevice {int32 device_type; int32 device_id}; int32 ndim;
    DLDataType {uint8 code; uint8 bits; uint16 lanes}; int64* shape; int64* strides;
    uint64 byte_offset

A CUDA tensor (device type 2, or 13: managed memory) becomes a ``__cuda_array_interface__``
description (:func:`interface`) that :mod:`codec.device` views with Numba, keeping the
capsule alive for as long as the view: nothing is copied.  A CPU one (device type 1, or 3:
CUDA pinned host memory) is read by NumPy (:func:`host_array`).  The capsule is not renamed
``used_dltensor``: it stays the owner, and its deleter runs when the last view of it is gone.
"""

from __future__ import annotations

import ctypes

import numpy as np

#: DLPack device types whose memory is on a CUDA device
CUDA = (2, 13)
#: DLPack device types NumPy reads (CPU, CUDA pinned host memory)
HOST = (1, 3)

_NAMES = (b"dltensor", b"dltensor_versioned")
#: where the DLTensor starts: a DLManagedTensor begins with it; a DLManagedTensorVersioned
#: with its version (2 x uint32), manager_ctx, deleter and flags (uint64)
_OFFSET = {b"dltensor": 0, b"dltensor_versioned": 32}
#: DLDataType code -> NumPy kind letter (kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4)
_KINDS = {0: "i", 1: "u", 2: "f"}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _api():
    api = ctypes.pythonapi
    api.PyCapsule_IsValid.restype = ctypes.c_int
    api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return api


def is_capsule(x) -> bool:
    """Whether ``x`` is a Python capsule (a DLPack one or not: :func:`tensor` tells)."""
    return type(x).__name__ == "PyCapsule" and type(x).__module__ == "builtins"


def tensor(capsule, argname: str = "x") -> _DLTensor:
    """The ``DLTensor`` a DLPack capsule points to; TypeError naming ``argname`` for a capsule
    of another kind or one already consumed (``used_dltensor``)."""
    api = _api()
    for name in _NAMES:
        if api.PyCapsule_IsValid(capsule, name):
            return _DLTensor.from_address(api.PyCapsule_GetPointer(capsule, name) + _OFFSET[name])
    raise TypeError(f"{argname}: a capsule that is not an unused DLPack tensor (dltensor or dltensor_versioned); a capsule can be consumed once")


def device_type(x) -> int | None:
    """The DLPack device type of ``x``: a capsule's (read from it), or what
    ``x.__dlpack_device__()`` says; None for anything else (or a capsule of another kind)."""
    if is_capsule(x):
        try:
            return int(tensor(x).device.device_type)
        except TypeError:
            return None
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None or isinstance(x, np.ndarray):
        return None
    try:
        return int(dev()[0])
    except Exception:  # a producer that cannot say: not taken as DLPack
        return None


def on_cuda(x) -> bool:
    """Whether ``x`` is a DLPack capsule or producer on a CUDA device."""
    return device_type(x) in CUDA


def capsule(x):
    """``x`` if it is a capsule, else the capsule its producer makes (``x.__dlpack__()``)."""
    return x if is_capsule(x) else x.__dlpack__()


def interface(cap, argname: str = "x") -> dict:
    """The ``__cuda_array_interface__`` (version 3) description of DLPack capsule ``cap``'s
    tensor: shape, strides in bytes (None when C-contiguous), typestr, data pointer (with the
    byte offset).  TypeError naming ``argname`` for a dtype NumPy has no name for (lanes,
    complex, bool, and bfloat16, which ``__cuda_array_interface__`` cannot describe)."""
    t = tensor(cap, argname)
    dt = t.dtype
    if dt.lanes != 1 or dt.code not in _KINDS or dt.bits not in (8, 16, 32, 64):
        what = "bfloat16" if dt.code == 4 else f"code {dt.code}, {dt.bits} bits, {dt.lanes} lanes"
        raise TypeError(f"{argname}: a DLPack tensor of dtype {what}, which gradcodec cannot read")
    dtype = np.dtype(f"<{_KINDS[dt.code]}{dt.bits // 8}")
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    strides = None
    if t.strides:
        elems = [int(t.strides[i]) for i in range(t.ndim)]
        contiguous = int(np.prod(shape, dtype=np.int64)) <= 1 or all(
            n == 1 or s == int(np.prod(shape[i + 1 :], dtype=np.int64)) for i, (n, s) in enumerate(zip(shape, elems))
        )
        strides = None if contiguous else tuple(s * dtype.itemsize for s in elems)
    ptr = (t.data or 0) + int(t.byte_offset)
    return {"shape": shape, "strides": strides, "typestr": dtype.str, "data": (ptr, read_only(cap)), "version": 3}


def read_only(cap) -> bool:
    """Whether DLPack capsule ``cap`` marks its tensor read-only (a versioned capsule's flag
    ``DLPACK_FLAG_BITMASK_READ_ONLY``, after its version, manager_ctx and deleter)."""
    api = _api()
    if not api.PyCapsule_IsValid(cap, b"dltensor_versioned"):
        return False
    return bool(ctypes.c_uint64.from_address(api.PyCapsule_GetPointer(cap, b"dltensor_versioned") + 24).value & 1)


class _Producer:
    """A capsule dressed as a DLPack producer, for ``np.from_dlpack``."""

    def __init__(self, cap, device):
        self._cap, self._device = cap, device

    def __dlpack__(self, **_):
        return self._cap

    def __dlpack_device__(self):
        return self._device


def host_array(x) -> np.ndarray:
    """A NumPy view of DLPack capsule ``x`` on the CPU (or in CUDA pinned host memory); NumPy
    takes the capsule over."""
    t = tensor(x)
    return np.from_dlpack(_Producer(x, (int(t.device.device_type), int(t.device.device_id))))
