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

from codec.errors import CodecTypeError

#: DLPack device types whose memory is on a CUDA device
CUDA = (2, 13)
#: DLPack device types NumPy reads (CPU, CUDA pinned host memory)
HOST = (1, 3)

_NAMES = (b"dltensor", b"dltensor_versioned")
#: a DLManagedTensor begins with its DLTensor; a DLManagedTensorVersioned with its version
#: (2 x uint32), manager_ctx, deleter and flags (uint64): ``_Versioned``
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


class _Versioned(ctypes.Structure):
    """The head of a DLManagedTensorVersioned, before its DLTensor."""

    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64)]


#: the C API's capsule functions with prototypes of their own (``ctypes.pythonapi``'s are shared
#: with every other library in the process, so they are not changed)
_IS_VALID = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_POINTER = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))


def is_capsule(x) -> bool:
    """Whether ``x`` is a Python capsule (a DLPack one or not: :func:`tensor` tells)."""
    return type(x).__name__ == "PyCapsule" and type(x).__module__ == "builtins"


def tensor(capsule, argname: str = "x") -> _DLTensor:
    """The ``DLTensor`` a DLPack capsule points to; TypeError naming ``argname`` for a capsule
    of another kind or one already consumed (``used_dltensor``)."""
    for name in _NAMES:
        if _IS_VALID(capsule, name):
            at = _POINTER(capsule, name)
            if name == b"dltensor_versioned":
                head = _Versioned.from_address(at)
                if head.major > 1:
                    raise CodecTypeError(f"{argname}: a DLPack capsule of version {head.major}.{head.minor}; gradcodec reads version 1 and older")
                return _DLTensor.from_address(at + ctypes.sizeof(_Versioned))
            return _DLTensor.from_address(at)
    raise CodecTypeError(f"{argname}: a capsule that is not an unused DLPack tensor (dltensor or dltensor_versioned); a capsule can be consumed once")


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
    """``x`` if it is a capsule, else the capsule its producer makes: a versioned one when it
    can (``x.__dlpack__(max_version=(1, 0))``, which carries the read-only flag), else
    ``x.__dlpack__()``."""
    if is_capsule(x):
        return x
    try:
        return x.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer older than DLPack 1.0 takes no max_version
        return x.__dlpack__()


def interface(cap, argname: str = "x") -> dict:
    """The ``__cuda_array_interface__`` (version 3) description of DLPack capsule ``cap``'s
    tensor: shape, strides in bytes (None when C-contiguous), typestr, data pointer (with the
    byte offset).  TypeError naming ``argname`` for a dtype NumPy has no name for (lanes,
    complex, bool, and bfloat16, which ``__cuda_array_interface__`` cannot describe)."""
    t = tensor(cap, argname)
    dt = t.dtype
    if dt.lanes != 1 or dt.code not in _KINDS or dt.bits not in ((16, 32, 64) if dt.code == 2 else (8, 16, 32, 64)):
        what = "bfloat16" if dt.code == 4 else f"code {dt.code}, {dt.bits} bits, {dt.lanes} lanes"
        raise CodecTypeError(f"{argname}: a DLPack tensor of dtype {what}, which gradcodec cannot read")
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
    ``DLPACK_FLAG_BITMASK_READ_ONLY``)."""
    if not _IS_VALID(cap, b"dltensor_versioned"):
        return False
    return bool(_Versioned.from_address(_POINTER(cap, b"dltensor_versioned")).flags & 1)


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
