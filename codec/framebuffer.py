"""Where a frame's bytes are written: a new ``bytes`` object filled in place (on 2 MiB pages
when large), or the start of a caller's buffer (``encode(..., out=)``: a buffer, or an
allocator asked once for the frame's exact size).  Both frame builders (:mod:`codec.frame`,
:mod:`codec.manyframe.build`) take their destination from :func:`frame_bytes`."""

from __future__ import annotations

import numpy as np

from codec.dtypes import on_device
from codec.errors import CodecTypeError, CodecValueError
from codec.device import address, as_device_bytes

__all__ = ["new_bytes", "frame_out", "frame_bytes"]


def new_bytes(size: int) -> tuple[bytes, np.ndarray]:
    """A new ``bytes`` of ``size`` bytes and a writable uint8 view of it, to fill before it is shared.

    This is what C code does with ``PyBytes_FromStringAndSize(NULL, size)``: the frame is
    written once, in place, instead of being assembled elsewhere and copied (a 50 MB copy
    plus its page faults costs more than the fp16 conversion itself).  Outside CPython a
    bytearray is filled and copied.
    """
    if _PyBytes_FromStringAndSize is None:  # pragma: no cover - not CPython
        buf = bytearray(size)
        return buf, np.frombuffer(buf, np.uint8)
    obj = _PyBytes_FromStringAndSize(None, size)
    if not size:
        return obj, np.empty(0, np.uint8)
    addr = id(obj) + _BYTES_DATA_OFFSET
    if size >= _HUGE and _madvise is not None:
        # as NumPy does for its own large arrays: 2 MiB pages, so filling a fresh 100 MB frame
        # takes ~50 page faults instead of ~25,000 (measured 64 ms -> 15 ms for 100 MB)
        start, end = -(-addr // _HUGE) * _HUGE, (addr + size) // _HUGE * _HUGE
        if end > start:
            _madvise(start, end - start, _MADV_HUGEPAGE)
    return obj, np.frombuffer((ctypes.c_ubyte * size).from_address(addr), np.uint8)


try:
    import ctypes
    import platform

    if platform.python_implementation() != "CPython":
        raise ImportError
    _PyBytes_FromStringAndSize = ctypes.pythonapi.PyBytes_FromStringAndSize
    _PyBytes_FromStringAndSize.restype = ctypes.py_object
    _PyBytes_FromStringAndSize.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
    _BYTES_DATA_OFFSET = bytes.__basicsize__ - 1  # offsetof(PyBytesObject, ob_sval)
except (ImportError, AttributeError):  # pragma: no cover
    _PyBytes_FromStringAndSize = None

_HUGE = 1 << 21
_MADV_HUGEPAGE = 14
try:  # Linux transparent huge pages; elsewhere nothing to do
    if platform.system() != "Linux":
        raise OSError
    _madvise = ctypes.CDLL(None, use_errno=True).madvise
    _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
except (OSError, AttributeError, NameError):  # pragma: no cover
    _madvise = None


def frame_out(out, inputs=()):
    """``out`` (a caller's buffer to encode into: a writable, C-contiguous bytes-like object
    such as a bytearray or a uint8 array) as a writable uint8 array.  TypeError when it is
    not one; ValueError when it overlaps one of the ``inputs`` arrays (the frame would
    overwrite what it is coding).  ``out`` may also be a callable ``size -> buffer`` (a pool,
    a growing send buffer): it is then called once the frame's size is known, before
    anything is written, and what it returns is checked the same way.  None stays None (a
    new frame).  A device byte buffer (a uint8 device array, a CUDA uint8 tensor) becomes
    its flat Numba device view: the frame is then written on the device (a device frame,
    docs/api.md), header and checksum included."""
    if out is None:
        return None
    if on_device(out):  # a device frame (codec.device.as_device_bytes): the inputs it may overlap are device arrays too

        buf = as_device_bytes(out, "out", write=True)
        for x in inputs:
            if buf.size and on_device(x) and x.size and _overlap(buf, x):
                raise CodecValueError("out: the buffer overlaps an input array")
        return buf
    if callable(out) and not isinstance(out, (bytearray, memoryview, np.ndarray)):
        return lambda size: frame_out(out(size), inputs)
    try:
        mv = memoryview(out)
    except TypeError:
        raise CodecTypeError(f"out: expected a writable bytes-like buffer (bytearray, uint8 array), got {type(out).__name__}") from None
    if mv.readonly:
        raise CodecTypeError(f"out: the buffer is read-only ({type(out).__name__})")
    if not mv.c_contiguous:
        raise CodecValueError("out: the buffer must be C-contiguous")
    buf = np.frombuffer(mv.cast("B"), np.uint8) if mv.nbytes else np.empty(0, np.uint8)
    for x in inputs:
        if buf.size and not on_device(x) and np.may_share_memory(buf, x):
            raise CodecValueError("out: the buffer overlaps an input array")
    return buf


def frame_bytes(size: int, out):
    """Where a frame of ``size`` bytes is written: a new ``bytes`` (:func:`new_bytes`), or
    the start of ``out`` (from :func:`frame_out`: a uint8 array, or an allocator called with
    ``size``), returned as a memoryview of exactly the frame; ValueError naming ``out`` when
    it is too small (before anything is written)."""
    if out is None:
        return new_bytes(size)
    if callable(out):  # an allocator (frame_out of a callable): asked for exactly this size
        out = out(size)
    if out.size < size:
        raise CodecValueError(f"out: the frame needs {size} bytes, the buffer holds {out.size}")
    if on_device(out):  # a device frame: the result is the device array of exactly its bytes
        return out[:size], out[:size]
    return memoryview(out[:size]), out[:size]


def _overlap(buf, x) -> bool:
    """Whether device arrays ``buf`` and ``x`` share any byte."""
    a, b = address(buf), address(x)
    return a < b + x.nbytes and b < a + buf.nbytes
