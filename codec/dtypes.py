"""Element dtypes gradcodec accepts, their one-byte codes in a frame, and input coercion.

Accepted: float16, bfloat16 (``ml_dtypes.bfloat16``), float32, float64.  A bfloat16 array
may arrive as an ``ml_dtypes.bfloat16`` NumPy array, a ``torch.bfloat16`` tensor, or any
buffer together with ``dtype="bfloat16"`` (the buffer's bytes are reinterpreted).
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

from codec import dlpack
from codec.errors import CodecTypeError, CodecValueError

bfloat16 = np.dtype(ml_dtypes.bfloat16)

#: frame code -> dtype (the code is part of the frame format, never renumber)
CODES = {1: np.dtype(np.float16), 2: bfloat16, 3: np.dtype(np.float32), 4: np.dtype(np.float64)}
_BY_DTYPE = {dt: code for code, dt in CODES.items()}
NAMES = {dt.name: dt for dt in CODES.values()}


def code_of(dtype: np.dtype) -> int:
    return _BY_DTYPE[np.dtype(dtype)]


def dtype_of(code: int) -> np.dtype:
    return CODES[code]


def resolve_dtype(dtype, argname: str = "dtype") -> np.dtype:
    """The supported float dtype named by ``dtype`` (a name, NumPy dtype or type)."""
    if isinstance(dtype, str) and dtype in NAMES:
        return NAMES[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise CodecTypeError(f"{argname}: {dtype!r} is not a dtype; supported: {sorted(NAMES)}") from None
    if dt not in _BY_DTYPE:
        raise CodecTypeError(f"{argname}: dtype {dt} is not supported; supported: {sorted(NAMES)}")
    return dt


def on_device(*arrays) -> bool:
    """True when any argument is a device (CUDA) array: it exposes ``__cuda_array_interface__``
    and is not a NumPy array (CuPy, PyTorch CUDA tensors, Numba device arrays), it is a
    Numba device array (whose simulator twin, under ``NUMBA_ENABLE_CUDASIM=1``, has no such
    interface), or a DLPack capsule or producer on a CUDA device (:mod:`codec.dlpack`).  The
    one test of "is this a device array" (kernel dispatch, input coercion, transport staging)."""
    for a in arrays:
        if isinstance(a, np.ndarray):
            continue
        if hasattr(a, "__cuda_array_interface__") or type(a).__module__.startswith("numba.cuda") or dlpack.on_cuda(a):
            return True
    return False


def is_torch(x) -> bool:
    """Whether ``x`` is a torch tensor (without importing torch: only a loaded torch made one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def torch_view(t, argname: str = "out") -> np.ndarray:
    """The NumPy array over a CPU torch tensor's memory (no copy) that decoding writes: a
    ``torch.bfloat16`` tensor as ``ml_dtypes.bfloat16`` (through its int16 view); detached,
    so a parameter's ``.grad`` or the parameter itself is written in place.  CodecValueError
    naming ``argname`` for a tensor that is not contiguous (its elements are not one run of
    memory to write)."""
    torch = sys.modules["torch"]
    if not t.is_contiguous():
        raise CodecValueError(f"{argname}: a non-contiguous torch tensor (strides {tuple(t.stride())}); pass a contiguous one")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(bfloat16).reshape(tuple(t.shape))
    return t.numpy()


def host_like(arr: np.ndarray, like):
    """Host array ``arr`` as the kind of array ``like`` is, without a copy: a CPU torch tensor
    (bfloat16 included) for a torch ``like``, else ``arr`` itself."""
    if not is_torch(like):
        return arr
    torch = sys.modules["torch"]
    if arr.dtype == bfloat16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _from_torch(x):
    if x.device.type != "cpu":
        raise CodecTypeError(f"x: a torch tensor on {x.device} must be moved to the CPU first (device arrays are taken through __cuda_array_interface__)")
    return torch_view(x.contiguous(), "x")  # (a strided tensor is copied once here, as as_float_array would copy it)


def as_float_array(x, dtype=None, argname: str = "x") -> np.ndarray:
    """A C-contiguous NumPy view (or copy) of ``x`` with a supported float dtype.

    ``x`` may be a NumPy array, anything with ``__array__``, DLPack (CPU), a torch tensor, or
    a buffer (bytes, bytearray, memoryview).  With ``dtype`` given, the raw bytes of ``x`` are
    reinterpreted as that dtype (bytes input, or a same-width integer view such as uint16 for
    bfloat16); the result is then 1-D unless ``x`` already had that dtype.  Integer, bool,
    complex and object input without ``dtype`` raise CodecTypeError naming ``argname``.
    """
    if type(x) is np.ndarray and dtype is None and x.dtype in _BY_DTYPE and x.flags.c_contiguous and x.flags.aligned:
        return x  # (what the rest gives such an array, at a small model's per-tensor cost)
    if on_device(x):
        raise CodecTypeError(
            f"{argname}: a device (CUDA) array; so far encode, decode, decode_add and ErrorFeedback.encode of "
            "none, fp16 and bf16 take one (docs/api.md, 'Device arrays'); copy it to host memory for this call"
        )
    if type(x).__module__.startswith("torch"):
        arr = _from_torch(x)
    elif isinstance(x, np.ndarray):
        arr = base_view(x, argname)
    elif isinstance(x, (bytes, bytearray, memoryview)):
        arr = np.asarray(memoryview(x))
        if dtype is None and arr.dtype == np.uint8:
            raise CodecTypeError(f"{argname}: a byte buffer has no float dtype; pass dtype=")
    elif hasattr(x, "__array__") or hasattr(x, "__array_interface__"):
        arr = np.asarray(x)
    elif hasattr(x, "__dlpack__"):
        arr = np.from_dlpack(x)
    elif dlpack.is_capsule(x):
        arr = dlpack.host_array(_check_capsule(x, argname))
    else:
        try:
            arr = np.asarray(memoryview(x))
        except TypeError:
            raise CodecTypeError(f"{argname}: expected an array-like of floats, got {type(x).__name__}") from None
    if dtype is not None:
        want = resolve_dtype(dtype)
        if arr.dtype != want:
            if arr.dtype.kind == "O":
                raise CodecTypeError(f"{argname}: object arrays are not supported")
            raw = _materialize(arr, argname).reshape(-1).view(np.uint8)
            if raw.size % want.itemsize:
                raise CodecValueError(f"{argname}: {raw.size} bytes is not a whole number of {want} elements")
            arr = raw.view(want)
    if arr.dtype not in _BY_DTYPE and arr.dtype.kind == "f" and arr.dtype.newbyteorder("=") in _BY_DTYPE:
        arr = arr.astype(arr.dtype.newbyteorder("="))  # big-endian floats: the same values, native order
    if arr.dtype not in _BY_DTYPE:
        raise CodecTypeError(
            f"{argname}: dtype {arr.dtype} is not supported; gradcodec encodes float16, bfloat16, float32 or float64"
        )
    return _materialize(arr, argname)


def _check_capsule(x, argname: str):
    """``x``, a DLPack capsule NumPy can read (TypeError naming ``argname`` otherwise)."""
    dlpack.interface(x, argname)  # a DLPack tensor of a dtype NumPy names
    if dlpack.device_type(x) not in dlpack.HOST:
        raise CodecTypeError(f"{argname}: a DLPack capsule on device type {dlpack.device_type(x)}, neither host memory nor a CUDA device")
    return x


def base_view(a: np.ndarray, argname: str) -> np.ndarray:
    """``a`` as a plain ``np.ndarray`` (a view: same memory, shape and strides).

    Kernels index arrays flat through ``reshape(-1)``, which an ndarray subclass may override
    (``np.matrix`` stays 2-D, so a kernel would write row i for element i, outside the
    buffer): nothing but a base ndarray reaches them.  A masked array is refused: its mask
    would be silently ignored."""
    if type(a) is np.ndarray:
        return a
    if isinstance(a, np.ma.MaskedArray):
        raise CodecTypeError(f"{argname}: masked arrays are not supported (the mask would be ignored); pass {argname}.filled(0) or .data")
    return a.view(np.ndarray)


def _materialize(a: np.ndarray, argname: str) -> np.ndarray:
    """``a`` itself when it is C-contiguous and aligned, else a C-contiguous copy.

    A broadcast array (a zero stride over an extent > 1: ``np.broadcast_to``, torch's
    ``expand``) is refused with ValueError: its elements alias, which no gradient does, and
    copying it could ask for far more memory than the caller holds (a 4-byte scalar
    broadcast to 2**33 elements is 32 GiB)."""
    if a.flags.c_contiguous and a.flags.aligned:
        return a
    refuse_broadcast(a, argname, f"pass np.ascontiguousarray({argname}) to encode its {a.size} elements")
    return a.copy(order="C")  # (ascontiguousarray turns 0-d into 1-d)


def is_broadcast(a: np.ndarray) -> bool:
    """Whether ``a`` has a zero stride over an extent > 1 (elements that alias, as
    ``np.broadcast_to`` makes); an empty array's strides say nothing, so it never is."""
    return bool(a.size) and any(st == 0 and d > 1 for st, d in zip(a.strides, a.shape))


def refuse_broadcast(a: np.ndarray, argname: str, hint: str) -> None:
    """CodecValueError naming ``argname`` when ``a`` is a broadcast array (a zero stride over
    an extent > 1, elements there), before anything of its size is allocated: the one rule for arrays taken
    in (encode's input, a loaded state's residual and velocity)."""
    if is_broadcast(a):
        raise CodecValueError(
            f"{argname}: a broadcast array (zero stride, shape {a.shape}) is not a gradient; {hint}"
        )


def owned_float_array(value, where: str) -> np.ndarray:
    """A fresh, owned, writeable C-contiguous base-ndarray copy of ``value``, for state loaded
    from a checkpoint: a NumPy array of float16, bfloat16, float32 or float64 in any layout or
    byte order (a subclass such as ``np.matrix`` is copied as its plain data).  Anything
    else, a masked array included (its mask would be lost), or a broadcast array (zero
    stride: as :func:`as_float_array` refuses one, so a scalar broadcast to 2**40 elements
    asks for no 4 TiB copy), is a ValueError naming ``where``, raised before the copy is
    allocated."""
    if isinstance(value, np.ma.MaskedArray):
        raise CodecValueError(f"{where}: a masked array is not accepted (its mask would be lost); pass a plain NumPy array")
    if not isinstance(value, np.ndarray):
        raise CodecValueError(f"{where}: expected a NumPy array, got {type(value).__name__}")
    dt = value.dtype
    native = dt.newbyteorder("=") if dt.kind == "f" else dt
    if native not in _BY_DTYPE:
        raise CodecValueError(f"{where}: dtype {dt} is not supported; expected float16, bfloat16, float32 or float64")
    refuse_broadcast(value, where, "a state holds the arrays state_dict() saved, never a view of one value")
    out = np.empty(value.shape, native)
    out[...] = value.view(np.ndarray)
    return out


def checked_out(out, n: int, shape, dtype, *, add: bool, argname: str = "out") -> np.ndarray:
    """The flat base-ndarray view of ``out`` that decoding writes: a writeable, aligned,
    C-contiguous NumPy array (a subclass is written through a base view; masked arrays are
    refused) or a contiguous CPU torch tensor (:func:`torch_view`) with ``n`` elements (``shape`` for the message) and ``dtype`` (any supported
    dtype when adding); TypeError/ValueError naming ``argname`` otherwise."""
    if type(out) is np.ndarray and out.size == n and (out.dtype in _BY_DTYPE if add else out.dtype == dtype):
        flags = out.flags
        if flags.c_contiguous and flags.writeable and flags.aligned:
            return out.reshape(-1)  # (what the checks below give such an array)
    if out is None:
        raise CodecTypeError(f"{argname}: decode_add adds into an existing array; pass one (None would add into a throw-away buffer)")
    if is_torch(out):  # a CPU tensor: written through its NumPy view (device tensors go to codec.device)
        out = torch_view(out, argname)
    if not isinstance(out, np.ndarray):
        raise CodecTypeError(f"{argname}: expected a NumPy array, got {type(out).__name__}")
    plain = base_view(out, argname)
    if plain.size != n:
        raise CodecValueError(f"{argname}: has {plain.size} elements, the frame holds {n} (shape {shape})")
    if add and plain.dtype not in CODES.values():
        raise CodecValueError(f"{argname}: dtype {plain.dtype} cannot accumulate; use float16, bfloat16, float32 or float64 (native byte order)")
    if not add and plain.dtype != dtype:
        raise CodecValueError(f"{argname}: dtype {plain.dtype} does not match the frame's {dtype}")
    if not plain.flags.c_contiguous or not plain.flags.writeable or not plain.flags.aligned:
        raise CodecValueError(f"{argname}: must be a writeable, aligned, C-contiguous array")
    return plain.reshape(-1)


def readonly(a):
    """A read-only view of ``a``.  Kernels get every input read-only (as frame sections are), so
    each compiles one signature per dtype instead of one per dtype and writability.  A device
    array is returned as it is (it has no read-only flag).  (``codec.ops.readonly``; here so
    that :mod:`codec.device` can take it without importing :mod:`codec.ops`.)"""
    if isinstance(a, np.ndarray) and a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a
