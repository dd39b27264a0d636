"""Device (CUDA) arrays at gradcodec's edges: the one place that turns what a caller passes
into a Numba device array, allocates on the device and moves bytes between host and device.

A device array is anything :func:`codec.dtypes.on_device` recognises: an object exposing
``__cuda_array_interface__`` (PyTorch CUDA tensors, CuPy arrays) or a Numba device array.
It is viewed, never copied (``numba.cuda.as_cuda_array``), so encoding a gradient makes no
host copy of it: the only transfer of an encode is the frame's bytes to the host.

Numba's CUDA target is imported here on first use (:func:`codec._cuda_jit.numba_cuda`),
never when ``codec`` is imported.  With ``NUMBA_ENABLE_CUDASIM=1`` the same code runs on
Numba's simulator (no GPU needed), which is how the tests run it.
"""

from __future__ import annotations

import functools

import numpy as np

from codec import dlpack
from codec.dtypes import is_torch, on_device, readonly
from codec.errors import CodecTypeError, CodecValueError
from codec.kernels import backend

__all__ = ["add", "address", "clear", "as_device_array", "as_device_bytes", "as_input", "as_like", "check_dtype", "check_stages", "checked_out", "concat", "crc32c", "deliver", "empty", "Memory", "host_copy", "many_on_device", "put_bytes", "span", "spans", "to_device", "to_host", "zeros"]

#: the dtypes device arrays may have: float16 (a 16-bit input selects from, and adds in, its
#: exact float32 widening, as the host does), float32, float64.  bfloat16 is refused: the
#: CUDA array interface has no name for it
DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _cuda():
    from codec._cuda_jit import numba_cuda

    return numba_cuda()


def require_cuda(argname: str) -> None:
    """CodecTypeError naming ``argname`` (an argument that claims to be a device array:
    ``__cuda_array_interface__``, a CUDA DLPack tensor) when this process cannot run CUDA
    kernels: numba-cuda is not installed, or it finds no CUDA driver or GPU.  Asked once per
    process (:func:`_cuda_missing`), where a device array enters gradcodec
    (:func:`check_stages`, :func:`as_device_array`), so the caller never sees Numba's own
    CudaSupportError."""
    why = _cuda_missing()
    if why is not None:
        raise CodecTypeError(f"{argname}: a device (CUDA) array, but this process cannot run CUDA kernels: {why}; pass a host array")


@functools.lru_cache(maxsize=1)
def _cuda_missing() -> str | None:
    """Why this process cannot run CUDA kernels, or None when it can (a GPU, or the simulator)."""
    try:
        cuda = _cuda()
    except ImportError as e:
        return f"Numba's CUDA target is missing ({e})"
    return None if cuda.is_available() else "no CUDA driver or GPU was found"


def check_stages(stages, argname: str = "x") -> None:
    """TypeError naming ``argname`` unless every stage a device array reaches takes one
    (``Stage.devices``): all of ``stages``, except that behind a select stage the value stage
    codes the kept values, which the selection hands it on the host (a few per cent of the
    tensor, read back with the positions), so any value stage may follow one; and unless
    this process can run CUDA kernels (:func:`require_cuda`)."""
    select = any(s.kind == "select" for s in stages)
    missing = [s.name for s in stages if "cuda" not in s.devices and not (select and s.kind == "value")]
    if missing:
        raise CodecTypeError(
            f"{argname}: a device (CUDA) array, and {', '.join(missing)} has no CUDA path yet "
            "(every stage but the fft transform has); pass a host array"
        )
    require_cuda(argname)


def many_on_device(stages, arrays, argname: str = "tensors") -> bool:
    """Whether a many-tensor call's ``arrays`` are device arrays: all of them (after the
    stages are checked to take them), or none; a mix is a TypeError naming ``argname``."""
    on = [on_device(a) for a in arrays]
    if not any(on):
        return False
    if not all(on):
        raise CodecTypeError(f"{argname}: mixes device and host arrays; pass all of one kind")
    check_stages(stages, argname)
    return True


def as_input(stages, x, dtype=None, argname: str = "x"):
    """Device array ``x`` as a codec of ``stages`` encodes it: viewed (:func:`as_device_array`)
    once every stage is checked to take it; ``dtype`` (which reinterprets host buffers) is
    refused."""
    if dtype is not None:
        raise CodecTypeError(f"dtype: reinterprets host buffers; a device array {argname} keeps its own dtype")
    check_stages(stages, argname)
    return as_device_array(x, argname)


def as_device_array(x, argname: str = "x", write: bool = False):
    """A C-contiguous Numba device-array view of device array ``x`` (no copy); TypeError or
    ValueError naming ``argname`` for a dtype other than float16/float32/float64 or a
    non-contiguous array.  ``x`` may be a DLPack capsule or producer on a CUDA device
    (:mod:`codec.dlpack`), then viewed through its ``__cuda_array_interface__``
    description; ``write``: it will be written (a read-only one is a ValueError)."""
    arr = _viewed(x, argname, write)
    dt = np.dtype(arr.dtype)
    if dt not in DTYPES:
        raise CodecTypeError(f"{argname}: a device array of dtype {dt}; device arrays must be float16, float32 or float64")
    if not arr.is_c_contiguous():
        raise CodecValueError(f"{argname}: a device array must be C-contiguous")
    return arr


def as_device_bytes(buf, argname: str = "out", write: bool = False):
    """A flat Numba device-array view of the device byte buffer ``buf`` (a uint8 device array,
    a torch CUDA uint8 tensor, any ``__cuda_array_interface__`` of one-byte items, a CUDA
    DLPack tensor), no copy: where a device frame is written or read.  TypeError naming
    ``argname`` for items of another width; ValueError for a non-contiguous buffer, or a
    read-only one that will be written (``write``)."""
    arr = _viewed(buf, argname, write)
    if np.dtype(arr.dtype).itemsize != 1:
        raise CodecTypeError(f"{argname}: a device frame buffer holds bytes (uint8); got a device array of {np.dtype(arr.dtype)}")
    if not arr.is_c_contiguous():
        raise CodecValueError(f"{argname}: a device frame buffer must be C-contiguous")
    return arr.reshape(arr.size).view(np.uint8)


def deliver(codes, out) -> None:
    """Device array ``codes``' bytes into ``out``, a frame's section (a host uint8 array: one
    device-to-host copy; a device one: one device copy, or nothing when ``codes`` is ``out``'s
    own memory, a kernel having written the frame in place)."""
    if not codes.size:
        return
    if not on_device(out):
        to_host(codes, out)
        return
    dst = out.reshape(out.size).view(np.uint8)
    src = codes.reshape(codes.size).view(np.uint8)
    if address(src) != address(dst):
        dst.copy_to_device(src)


def put_bytes(data, out) -> None:
    """Host bytes ``data`` (any bytes-like, exactly ``out``'s length) into ``out``, a uint8
    array on the host or the device (one host-to-device copy)."""
    if not on_device(out):
        if out.size:  # (a uint8 array: its buffer takes the bytes as they are, without a NumPy view of them)
            memoryview(out)[:] = data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else memoryview(data).cast("B")
        return
    src = np.frombuffer(data, np.uint8, out.size) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    if out.size:
        out.copy_to_device(np.ascontiguousarray(src))


def _viewed(x, argname: str, write: bool):
    """Device array ``x`` (Numba's, ``__cuda_array_interface__``, a CUDA DLPack capsule or
    producer) as a Numba device array over its memory, no copy; ValueError naming
    ``argname`` when it is read-only and will be written (``write``)."""
    require_cuda(argname)
    if type(x).__module__.startswith("numba.cuda"):
        return x
    if is_torch(x) and str(x.dtype) == "torch.bfloat16":  # (torch gives bfloat16 no __cuda_array_interface__)
        raise CodecTypeError(f"{argname}: a bfloat16 CUDA tensor; device arrays are float16, float32 or float64 (docs/api.md, 'Device arrays')")
    if hasattr(x, "__cuda_array_interface__"):
        if write and x.__cuda_array_interface__["data"][1]:
            raise CodecValueError(f"{argname}: a read-only device array (its __cuda_array_interface__ says so); it would be written")
        return _cuda().as_cuda_array(x)
    cap = dlpack.capsule(x)  # a DLPack capsule or producer on a CUDA device (codec.dtypes.on_device)
    desc = dlpack.interface(cap, argname)
    if write and desc["data"][1]:
        raise CodecValueError(f"{argname}: a read-only DLPack tensor; it would be written")
    return _view(desc, cap)


def check_dtype(dtype, argname: str) -> None:
    """TypeError naming ``argname`` unless device arrays of ``dtype`` are supported."""
    if np.dtype(dtype) not in DTYPES:
        raise CodecTypeError(f"{argname}: a frame of {np.dtype(dtype)} cannot decode to a device array yet; device arrays must be float16, float32 or float64")


def as_like(arr, like):
    """Device array ``arr`` as the kind of array ``like`` is, without a copy (through
    ``__cuda_array_interface__``): a torch CUDA tensor, a CuPy array, else the Numba device
    array itself."""
    kind = type(like).__module__.split(".")[0]
    if kind == "torch":
        import torch

        return torch.as_tensor(arr, device=like.device)
    if kind == "cupy":
        import cupy

        return cupy.asarray(arr)
    return arr


def checked_out(out, n: int, shape, dtype, *, add: bool, argname: str = "out"):
    """The flat device view of device array ``out`` that decoding writes (as
    :func:`codec.dtypes.checked_out` for host arrays): ``n`` elements, float16/float32/float64,
    ``dtype`` itself unless adding, C-contiguous."""
    arr = as_device_array(out, argname, write=True)
    if arr.size != n:
        raise CodecValueError(f"{argname}: has {arr.size} elements, the frame holds {n} (shape {shape})")
    if not add and np.dtype(arr.dtype) != np.dtype(dtype):
        raise CodecValueError(f"{argname}: dtype {arr.dtype} does not match the frame's {dtype}")
    return arr.reshape(n)


def empty(n: int, dtype):
    """A new device array of ``n`` items (an int, or a shape) of ``dtype``."""
    return _cuda().device_array(n, np.dtype(dtype))


def to_device(a):
    """``a`` on the device: itself if it is there already, else one host-to-device copy."""
    from codec.kernels.cuda._common import dev

    return dev(a)


def to_host(a, out: np.ndarray) -> np.ndarray:
    """Copy device array ``a`` into the host array ``out`` (same number of bytes; ``out`` may be
    a uint8 view of a frame): one device-to-host copy.  Returns ``out``."""
    if a.size:  # (an empty one has nothing to copy, and Numba refuses its strides)
        a.copy_to_host(out.view(np.dtype(a.dtype)).reshape(a.shape))
    return out


def zeros(shape, dtype):
    """A new device array of zeros of ``shape`` (an int or a tuple): one host-to-device copy
    (a key's first residual, once; a selection's small count buffers)."""
    return _cuda().to_device(np.zeros(shape, np.dtype(dtype)))


def clear(a):
    """Device array ``a`` set to zeros by a kernel on the device (nothing crosses the link: an
    allreduce's accumulators, of a model's size); returns ``a``."""
    from codec.kernels.cuda._common import launch, zero

    if a.size:
        zero[launch(a.size)](a.reshape(a.size))
    return a


def add(x, r, out):
    """``out = x + r`` elementwise on the device, in their dtype (the error-feedback sum), one pass."""
    backend("convert", out).add(x.reshape(x.size), r.reshape(r.size), out.reshape(out.size))


def concat(arrays, out):
    """Copy device arrays ``arrays`` one after another into the flat device array ``out``
    (device-to-device copies, no kernel: one when they lie end to end, :func:`span`);
    returns ``out``."""
    whole = span(arrays)
    if whole is not None:
        out[: whole.size].copy_to_device(whole)
        return out
    at = 0
    for a in arrays:
        if a.size:  # (Numba refuses an empty one's strides)
            out[at : at + a.size].copy_to_device(a.reshape(a.size))
        at += a.size
    return out


def span(arrays):
    """One flat device array over the flat device arrays ``arrays`` when they lie end to end in
    device memory in this order, all of one dtype (views of one buffer, as a framework's
    gradient bucket gives): one launch, or one copy, then reads or writes them all.  None
    otherwise, or for fewer than two.  Empty arrays are skipped."""
    full = [a for a in arrays if a.size]
    if len(full) < 2 or len({np.dtype(a.dtype) for a in full}) > 1 or not all(a.is_c_contiguous() for a in full):
        return None
    at = [address(a) for a in full]
    if any(p + a.nbytes != q for a, p, q in zip(full, at, at[1:])):
        return None
    n = sum(a.size for a in full)
    desc = {"shape": (n,), "strides": None, "typestr": np.dtype(full[0].dtype).str, "data": (at[0], False), "version": 3}
    return _view(desc, full)


def spans(groups, arrays) -> dict:
    """Per group of several indices (a run of a many-tensor frame, a joint frame) whose
    ``arrays`` are all device arrays lying end to end (:func:`span`), the one array over
    them, keyed by the group's first index: a decode writes the group with one launch."""
    out = {}
    for g in groups:
        if len(g) > 1 and all(arrays[i] is not None and on_device(arrays[i]) for i in g):
            whole = span([arrays[i] for i in g])
            if whole is not None:
                out[g[0]] = whole
    return out


def address(a) -> int:
    """The device address of device array ``a``'s first element."""
    if hasattr(a, "_ary"):  # the simulator's
        return a._ary.__array_interface__["data"][0]
    return a.__cuda_array_interface__["data"][0]


def _view(desc: dict, owner):
    """A Numba device array over the memory a ``__cuda_array_interface__`` description
    ``desc`` names, keeping ``owner`` alive as long as it is.  Under the simulator, whose
    "device" memory is host memory, a NumPy array over the same addresses."""
    cuda = _cuda()
    if hasattr(cuda, "from_cuda_array_interface"):
        return cuda.from_cuda_array_interface(desc, owner=owner)
    import ctypes

    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    dtype, shape = np.dtype(desc["typestr"]), tuple(desc["shape"])
    if not all(shape):
        return FakeCUDAArray(np.empty(shape, dtype))
    strides = desc["strides"] or tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) * dtype.itemsize for i in range(len(shape)))
    extent = dtype.itemsize + sum((n - 1) * st for n, st in zip(shape, strides))  # (non-negative strides)
    memory = np.frombuffer((ctypes.c_char * extent).from_address(desc["data"][0]), dtype)
    fake = FakeCUDAArray(np.lib.stride_tricks.as_strided(memory, shape, strides))
    fake._owner = owner
    return fake


def host_copy(a):
    """A host (NumPy) copy of device array ``a``, or ``a.copy()`` of a host one."""
    if not on_device(a):
        return a.copy()
    if not a.size:  # (Numba refuses an empty one's strides)
        return np.empty(a.shape, np.dtype(a.dtype))
    return a.copy_to_host()


def crc32c(a, crc: int) -> int:
    """The CRC-32C of device array ``a``'s bytes continued from ``crc``, formed on the device
    (``codec/kernels/cuda/_crc.py``): ``crc32c.crc32c(bytes, crc)``'s value."""
    from codec.kernels.cuda import _crc

    return _crc.crc32c(a.reshape(a.size).view(np.uint8), crc)


class Memory:
    """Where a computation's buffers live: host NumPy arrays, or (``device``) device arrays,
    with ``host(a)`` giving a host array either way and ``put(a)`` a host array where the
    kernels take it: one code path for both (the selections, DGC's momentum)."""

    def __init__(self, device: bool):
        self.device = device

    def empty(self, shape, dtype):
        if self.device:
            return empty(shape, dtype)
        return np.empty(shape, dtype)

    def zeros(self, shape, dtype):
        if self.device:
            return zeros(shape, dtype)
        return np.zeros(shape, dtype)

    def host(self, a) -> np.ndarray:
        if self.device:
            return host_copy(a)
        return a

    def put(self, a: np.ndarray):
        if self.device:
            return to_device(a)
        return a

    def gather(self, src, idx):
        """``src[idx]`` (flat ``src``, integer positions ``idx`` in ``range(src.size)``, both
        where this memory is; on the device int64) in a new array there, by the ``scatter``
        family's ``gather``: on the device neither comes to the host.  16-bit values are
        gathered as their bits."""
        if not self.device:
            src, idx = readonly(src), readonly(np.ascontiguousarray(idx, np.int64).reshape(-1))
        bits = np.dtype(src.dtype).itemsize == 2
        out = self.empty(idx.size, src.dtype)
        if idx.size:
            backend("scatter", src).gather(src.view(np.uint16) if bits else src, idx, out.view(np.uint16) if bits else out)
        return out

    def arange(self, n: int):
        """``0, 1, ..., n - 1`` as int64, where this memory is."""
        return to_device(np.arange(n, dtype=np.int64)) if self.device else np.arange(n, dtype=np.int64)
