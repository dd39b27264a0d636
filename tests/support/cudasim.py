"""The simulator's launch shapes, shared by tests/cuda/conftest.py (every simulator test) and
the scripts it launches under mpiexec (tests/mpi_device.py): one block of 32 threads for the
grid-stride launches, scanning blocks of 4 threads of 128 values, a short thread switch
interval, and every index section a device decode meets read there.  Why: tests/cuda/conftest.py."""

from __future__ import annotations

import sys

import numba

#: the interpreter's thread switch interval in the simulator (tests/cuda/conftest.py)
SWITCH_INTERVAL = 5e-4


def settings() -> list:
    """``(module, attribute, value)`` of every setting, the simulator's shapes only under it."""
    import codec.pack

    out = [(codec.pack, "DEVICE_SECTION", 0)]
    if numba.config.ENABLE_CUDASIM:
        from codec.kernels.cuda import _common

        out += [(_common, "THREADS", 32), (_common, "MAX_BLOCKS", 1), (_common, "SCAN_BLOCK", 4), (_common, "SCAN_ITEMS", 128)]
    return out


def apply(setattr_=setattr) -> None:
    """Apply :func:`settings` with ``setattr_`` (pytest's ``monkeypatch.setattr`` in a test)."""
    if numba.config.ENABLE_CUDASIM:
        sys.setswitchinterval(SWITCH_INTERVAL)
        lock_shared_arrays()
        device_arrays_as_on_a_gpu()
    for module, name, value in settings():
        setattr_(module, name, value)


def lock_shared_arrays() -> None:
    """Make the simulator's ``cuda.shared.array`` atomic.  numba-cuda's simulator gives a
    block's threads one array per source line (``FakeCUDAShared.array``), found in a dict or
    made and stored there without a lock: two threads that reach a line's first call
    together each make their own, and the block no longer shares that array.  With the
    short switch interval above it happened in CI (2026-11-30): the device FFT's top-k
    (``_topk_block``'s scans) wrote too few positions and ``_gather_top`` read an unwritten
    one.  Here the lookup and the store are one step under a lock, keyed as numba-cuda keys
    it (the calling line's file and number, read off the caller's frame); shape 0 (dynamic
    shared memory, one buffer for all) and alignment go to numba-cuda's own method."""
    import threading

    import numpy as np
    from numba.cuda.simulator import kernelapi

    cls = kernelapi.FakeCUDAShared
    if getattr(cls, "_gradcodec_locked", False):
        return
    real, lock = cls.array, threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return real(self, shape, dtype, alignment)
        if isinstance(dtype, kernelapi.types.Type):  # (numba-cuda's own types, as its method converts them)
            dtype = kernelapi.numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res

    cls.array = array
    cls._gradcodec_locked = True


#: the public attributes of numba-cuda's ``DeviceNDArray`` (its class's, numba-cuda 0.30, and
#: those ``DeviceNDBase.__init__`` sets); under the simulator ``numba.cuda.cudadrv.devicearray``
#: is the simulator's module, so the list is written out here
DEVICE_ARRAY_ATTRIBUTES = frozenset({
    "T", "as_cuda_arg", "bind", "copy_to_device", "copy_to_host", "device_ctypes_pointer", "flags", "get_ipc_handle",
    "getitem", "is_c_contiguous", "is_f_contiguous", "nbytes", "ravel", "reshape", "setitem", "split", "squeeze",
    "transpose", "view", "ndim", "shape", "strides", "dtype", "size", "alloc_size", "gpu_data", "stream",
})


def device_arrays_as_on_a_gpu() -> None:
    """Give host code the simulator's device arrays with only what a real ``DeviceNDArray``
    has.  numba-cuda's ``FakeCUDAArray`` hands any other attribute on to the NumPy array it
    wraps, so a host wrapper that reads, say, ``.itemsize`` of a device array passed every
    simulator test and raised AttributeError on a GPU (codec/kernels/cuda/quantize.py's
    ``absmax_units``, 2026-12-03).  Kernel code (the simulator's block threads) still sees
    the whole array, as a kernel's own array type has ``itemsize`` and the rest."""
    import threading

    from numba.cuda.simulator import kernel
    from numba.cuda.simulator.cudadrv import devicearray

    cls = devicearray.FakeCUDAArray
    if getattr(cls, "_gradcodec_gpu_like", False):
        return
    real = cls.__getattr__

    def __getattr__(self, name):
        if not (name.startswith("_") or name in DEVICE_ARRAY_ATTRIBUTES or isinstance(threading.current_thread(), kernel.BlockThread)):
            raise AttributeError(f"a device array has no attribute {name!r} on a GPU (the simulator's wraps a NumPy array that has)")
        return real(self, name)

    cls.__getattr__ = __getattr__
    cls._gradcodec_gpu_like = True
