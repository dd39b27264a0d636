"""Device gradients in the transport (docs/transport.md, "Device arrays"): what crosses between
host and device is the frames, never the gradients.

A step over device tensors encodes them on the device (``codec.ErrorFeedback.encode_many``:
each stage's codes are made there), and decodes every rank's frame into device accumulators
(``decode_add_many``), finishing the sum there (:func:`finish_on_device`: one division and
one rounding, the host's bits).  Between them the frames travel:

* when the MPI library is CUDA-aware (:func:`cuda_aware`, asked of the library itself, never
  of the user), frames are written into device buffers and handed to MPI as they are;
* otherwise through pinned host buffers (:class:`Pinned`) kept from step to step: this
  rank's frame is written straight into one (the codes cross once, device to host), the
  ranks' frames are received into another and read from there (each section's codes cross
  once, host to device).

``none`` (MPI Allreduce) sends the dense tensors themselves, so they are its frames: they
cross once each way (:func:`gathered`), or not at all with a CUDA-aware MPI.  gTop-k selects
on the device and merges its pairs on the host (they are its messages).  The two-round
PowerSGD has no device path yet: it takes host copies of device tensors
(:func:`host_copies`) and returns device copies of its results.

Every scheme's buffers come from one pool protocol (:class:`Buffers`: host memory; its
:class:`Pinned` and :class:`OnDevice` kinds), kept from step to step.
"""

from __future__ import annotations

import functools

import numpy as np

from codec.dtypes import on_device

__all__ = ["Buffers", "OnDevice", "Pinned", "cuda_aware", "finish_on_device", "gathered", "host_copies"]


def cuda_aware(comm=None) -> bool:
    """Whether ``comm`` takes device buffers as they are.  A communicator that says so itself
    (``device_buffers``: :class:`transport.torchdist.TorchComm`, True on NCCL) is asked;
    otherwise the MPI library: mpi4py's ``MPI.Query_cuda_support()`` where it has it, else
    the library's own ``MPIX_Query_cuda_support`` (MPICH, Open MPI), found among the
    libraries this process loaded; False when neither answers, and always under Numba's CUDA
    simulator (its "device" memory is host memory MPI must not be told about)."""
    told = getattr(comm, "device_buffers", None)
    return bool(told) if told is not None else _mpi_cuda_aware()


@functools.lru_cache(maxsize=1)
def _mpi_cuda_aware() -> bool:
    from numba import config

    if config.ENABLE_CUDASIM:
        return False
    from mpi4py import MPI

    if hasattr(MPI, "Query_cuda_support"):
        return bool(MPI.Query_cuda_support())
    return _mpix_query()


def _mpix_query() -> bool:
    """``MPIX_Query_cuda_support()`` of the MPI library mapped into this process (Linux:
    /proc/self/maps), False where there is none."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libmpi" in line}
    except OSError:
        return False
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        return bool(fn())
    return False


class Buffers:
    """Byte buffers kept from step to step for the frames a step sends and receives, so a
    step does not page-fault a fresh frame and a fresh receive buffer (for fp16 on ResNet-50
    at 4 ranks, 51 + 204 MB per rank: ~12 ms of first touches).  A step takes what it needs
    and gives it back when it finishes, decoded or failed (nothing decoded refers to them);
    steps in flight at once hold different buffers.  The ``KEEP`` most recently given are
    kept, so a buffer of a one-off large step is not held for good."""

    KEEP = 4

    def __init__(self):
        self.free: list = []

    def take(self, size: int) -> np.ndarray:
        """A uint8 buffer of at least ``size`` bytes: the smallest free one that fits and is
        not more than 4x too large (a receive buffer stays for the next receive), else a new
        one with a quarter to spare (a sparse frame's size varies from step to step)."""
        fits = [i for i, b in enumerate(self.free) if size <= b.size <= 4 * size + (1 << 20)]
        if fits:
            return self.free.pop(min(fits, key=lambda i: self.free[i].size))
        return self.allocate(size + size // 4 + 4096)

    def allocate(self, size: int):
        """A new buffer of ``size`` bytes (host memory here; pinned or device memory in the
        device pools of transport/device.py)."""
        return np.empty(size, np.uint8)

    def holder(self, held: list):
        """An ``out=`` allocator for ``encode``: takes a buffer of the asked size into ``held``."""

        def alloc(size):
            held.append(self.take(size))
            return held[-1]

        return alloc

    def give(self, bufs) -> None:
        self.free = (self.free + list(bufs))[-self.KEEP :]


class Pinned(Buffers):
    """Page-locked host byte buffers kept from step to step for the frames a step sends and
    receives (a copy between the device and pinned memory runs at the link's speed; pageable
    memory is staged by the driver: 21-24 ms against 1 ms for 50 MB on an H200's PCIe)."""

    def allocate(self, size: int):
        from numba import cuda

        return cuda.pinned_array(size, np.uint8)


class OnDevice(Buffers):
    """Device byte buffers kept from step to step: a CUDA-aware MPI's frames."""

    def allocate(self, size: int):
        from codec.device import empty

        return empty(size, np.uint8)


def finish_on_device(acc, dtype, size: int, average: bool, out=None):
    """``acc / size`` when averaging (one division, in ``acc``'s dtype), rounded once to
    ``dtype``, on the device: :func:`transport.schemes.base.finish_sum`'s bits.  ``acc`` is
    the accumulator of ``dtype`` (float32 for float16, else ``dtype`` itself); ``out``: the
    caller's device array of ``dtype`` (possibly ``acc`` itself) to write into and return;
    else the result is ``acc`` itself, or for float16 a new device array."""
    from codec.device import address, empty
    from codec.kernels import backend

    kern = backend("convert", acc)
    flat = acc.reshape(acc.size)
    dtype = np.dtype(dtype)
    target = None if out is None else out.reshape(out.size)
    same = target is not None and address(target) == address(flat)
    if np.dtype(acc.dtype) == dtype:
        if average and size > 1:
            kern.divide(flat, size, flat if target is None else target)
        elif target is not None and not same and flat.size:
            target.copy_to_device(flat)
        return acc if out is None else out
    if average and size > 1:  # float16: divided in float32, then rounded once
        kern.divide(flat, size, flat)
    if target is None:
        target = empty(acc.size, dtype)
    kern.narrow_codes(flat, target.view(np.uint16), False, -1)
    return target.reshape(acc.shape) if out is None else out


def gathered(parts, dtype, aware: bool):
    """Device arrays ``parts`` concatenated flat into one buffer of ``dtype`` (their
    accumulator dtype) for MPI Allreduce: on the device when MPI is CUDA-aware (``aware``;
    float16 parts widened there), else in pinned host memory, each part copied down once
    (float16 parts widened on the host)."""
    from codec import device
    from codec.modes import SET
    from codec.ops import store

    dtype = np.dtype(dtype)
    n = sum(p.size for p in parts)
    if aware:
        buf = device.empty(n, dtype)
    else:
        from numba import cuda

        buf = cuda.pinned_array(n, dtype)
    at = 0
    for p in parts:
        flat, dst = p.reshape(p.size), buf[at : at + p.size]
        at += p.size
        if not p.size:
            continue
        if aware:
            store(flat, dst, SET)
        elif np.dtype(p.dtype) == dtype:
            flat.copy_to_host(dst)
        else:
            dst[...] = flat.copy_to_host()
    return buf


def host_copies(arrays) -> list:
    """Host copies of device arrays (a scheme without a device path), others as they are."""
    from codec.device import host_copy

    return [host_copy(a) if on_device(a) else a for a in arrays]
