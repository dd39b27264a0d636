"""Reading and writing named float tensors: ``.npy``, ``.npz`` and ``.safetensors`` files.

``read_tensors(path) -> {name: array}`` and ``write_tensors(path, {name: array})`` are what
the ``gradcodec`` command line uses for its INPUT and ``-o`` files.

==================  =====================================  ==================================
extension           read                                   write
==================  =====================================  ==================================
``.npy``            one tensor, named by the file stem     exactly one tensor
``.npz``            every array, named by its key          every tensor (uncompressed zip)
``.safetensors``    every tensor (F16, BF16, F32, F64)     every tensor
==================  =====================================  ==================================

Element types: float16, bfloat16 (``codec.dtypes.bfloat16``), float32 and float64; any
other array (integer, bool, complex, object, structured) is refused with a ValueError that
names the tensor.  Big-endian float arrays in ``.npy``/``.npz`` are converted to native order.

**bfloat16 in .npy/.npz.**  NumPy has no bfloat16 type of its own: ``np.save`` of an
``ml_dtypes.bfloat16`` array writes the header type ``'<V2'`` (an anonymous 2-byte record),
and a plain ``np.load`` gives those raw 2-byte records back (no pickle is involved, but the
type is lost).  gradcodec's convention: an array stored as ``'<V2'`` (a 2-byte void type
with no fields) *is* bfloat16.  ``write_tensors`` writes bfloat16 exactly as ``np.save``
does and ``read_tensors`` reads it back as bfloat16, so a round trip through gradcodec is
exact.  Other programs read such a file with ``np.load(f).view(ml_dtypes.bfloat16)``.
``.safetensors`` has a real ``BF16`` type and needs no convention.

**safetensors** is parsed here, not by the ``safetensors`` package (whose NumPy loader has
no BF16): an 8-byte little-endian header length N; N bytes of JSON mapping each name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the byte after the
header; an optional ``"__metadata__"`` entry is ignored); then the data.  Before any tensor
is built the reader checks: N fits the file (and is at most 100 MB), the JSON is an object
of well-formed entries, every shape is a list of non-negative integers, every
``end - begin`` equals ``prod(shape) * itemsize``, and the tensors tile the data area
exactly (sorted by offset, no gap, no overlap, nothing after the last).  Tensors come back
in the order of their data.  Byte order is little-endian (the format's), which must be the
host's.

Errors: a path with another extension raises :class:`UnsupportedFormatError`; a missing
path ``FileNotFoundError``; a file that cannot be read as its extension says, or that holds
an unsupported array, :class:`TensorFileError`.  Both error classes are ``ValueError``
subclasses.
"""

from __future__ import annotations

import errno
import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np

from codec.dtypes import bfloat16

__all__ = ["SUPPORTED", "TensorFileError", "UnsupportedFormatError", "read_tensors", "write_tensors"]

#: file extensions read_tensors and write_tensors understand
SUPPORTED = (".npy", ".npz", ".safetensors")

_FLOATS = (np.dtype(np.float16), bfloat16, np.dtype(np.float32), np.dtype(np.float64))
_ST_DTYPES = {"F16": np.dtype("<f2"), "BF16": bfloat16, "F32": np.dtype("<f4"), "F64": np.dtype("<f8")}
_ST_NAMES = {np.dtype(np.float16): "F16", bfloat16: "BF16", np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}
_ST_MAX_HEADER = 100_000_000


class UnsupportedFormatError(ValueError):
    """The path's extension is not one of :data:`SUPPORTED`."""


class TensorFileError(ValueError):
    """A tensor file is damaged, is not what its extension says, or holds a non-float array."""


def _suffix(path: Path, action: str) -> str:
    ext = path.suffix.lower()
    if ext not in SUPPORTED:
        raise UnsupportedFormatError(
            f"cannot {action} {str(path)!r}: unsupported extension {path.suffix or '(none)'!r}; "
            f"supported: {', '.join(SUPPORTED)}"
        )
    return ext


def _as_float(name: str, arr, where: str) -> np.ndarray:
    """``arr`` as a supported float array (bfloat16 from the '<V2' convention), or TensorFileError."""
    if not isinstance(arr, np.ndarray):
        raise TensorFileError(f"{where}: entry {name!r} is not an array")
    dt = arr.dtype
    if dt.kind == "V" and dt.itemsize == 2 and dt.names is None and dt.subdtype is None:
        return arr.view(bfloat16)
    if dt == bfloat16:
        return arr
    if dt.kind == "f" and dt.itemsize in (2, 4, 8):
        return arr if dt.isnative else arr.astype(dt.newbyteorder("="))
    raise TensorFileError(
        f"{where}: tensor {name!r} has dtype {dt}; gradcodec handles float16, bfloat16, float32 and float64 only"
    )


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(path))


# ----------------------------------------------------------------------------- read
def read_tensors(path) -> dict[str, np.ndarray]:
    """Every tensor in ``path`` (``.npy``, ``.npz`` or ``.safetensors``) as ``{name: array}``.

    A ``.npy`` file gives one tensor named by the file stem (``grad.npy`` -> ``"grad"``).
    Raises UnsupportedFormatError (another extension), FileNotFoundError, or TensorFileError
    (damaged file, or a tensor that is not float16/bfloat16/float32/float64, naming it).
    """
    path = Path(path)
    ext = _suffix(path, "read")
    _check_readable(path)
    if ext == ".npy":
        return _read_npy(path)
    if ext == ".npz":
        return _read_npz(path)
    return _read_safetensors(path)


def _np_load(path: Path, kind: str):
    """``np.load`` without pickle; a damaged file becomes a one-line TensorFileError."""
    try:
        return np.load(path, allow_pickle=False)
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as e:
        raise TensorFileError(f"{path}: not a readable {kind} file: {_one_line(e)}") from None


def _read_npy(path: Path) -> dict[str, np.ndarray]:
    arr = _np_load(path, ".npy")
    if not isinstance(arr, np.ndarray):  # np.load of a zip gives an NpzFile
        arr.close()
        raise TensorFileError(f"{path}: not a .npy file; it looks like a .npz (zip) file, rename it")
    return {path.stem: _as_float(path.stem, arr, str(path))}


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    z = _np_load(path, ".npz")
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise TensorFileError(f"{path}: not a .npz (zip) file; it looks like a .npy file, rename it")
    out = {}
    with z:
        for name in z.files:
            try:
                arr = z[name]
            except (ValueError, EOFError, OSError, zipfile.BadZipFile, KeyError) as e:
                raise TensorFileError(f"{path}: entry {name!r} cannot be read: {_one_line(e)}") from None
            out[name] = _as_float(name, arr, str(path))
    return out


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 8:
            raise TensorFileError(f"{path}: {size} bytes is too short for a safetensors file (needs an 8-byte header length)")
        (n,) = np.frombuffer(f.read(8), "<u8")
        n = int(n)
        if n > size - 8 or n > _ST_MAX_HEADER:
            raise TensorFileError(f"{path}: header length {n} does not fit a {size}-byte safetensors file")
        head = f.read(n)
        try:
            meta = json.loads(head.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TensorFileError(f"{path}: safetensors header is not valid JSON: {_one_line(e)}") from None
        if not isinstance(meta, dict):
            raise TensorFileError(f"{path}: safetensors header is not a JSON object")
        data_len = size - 8 - n
        plan = []
        for name, entry in meta.items():
            if name == "__metadata__":
                continue
            plan.append(_st_entry(path, name, entry, data_len))
        plan.sort(key=lambda p: (p[2], p[3]))
        pos = 0
        for name, _, begin, end, _ in plan:
            if begin != pos:
                what = "overlaps the previous tensor" if begin < pos else f"leaves a gap of {begin - pos} bytes before it"
                raise TensorFileError(f"{path}: tensor {name!r} at data offset {begin} {what}")
            pos = end
        if pos != data_len:
            raise TensorFileError(f"{path}: tensors end at data offset {pos} but the data area is {data_len} bytes")
        data = bytearray(data_len)
        if f.readinto(data) != data_len:
            raise TensorFileError(f"{path}: file shrank while it was being read")
    out = {}
    for name, dt, begin, end, shape in plan:
        arr = np.frombuffer(data, dt, count=(end - begin) // dt.itemsize, offset=begin)
        if begin % dt.itemsize:  # unaligned: give kernels an aligned copy
            arr = arr.copy()
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        out[name] = arr.reshape(shape)
    return out


def _st_entry(path: Path, name, entry, data_len: int):
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise TensorFileError(f"{where}: header entry is not a JSON object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise TensorFileError(f"{where}: header entry has no dtype")
    if dtype not in _ST_DTYPES:
        raise TensorFileError(
            f"{where} has dtype {dtype}; gradcodec handles {', '.join(_ST_DTYPES)} (float16, bfloat16, float32, float64) only"
        )
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise TensorFileError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_len
    ):
        raise TensorFileError(f"{where}: data_offsets {offsets!r} are not [begin, end] inside the {data_len}-byte data area")
    dt = _ST_DTYPES[dtype]
    need = math.prod(shape) * dt.itemsize
    if offsets[1] - offsets[0] != need:
        raise TensorFileError(f"{where}: {offsets[1] - offsets[0]} data bytes for shape {shape} of {dtype} (needs {need})")
    return name, dt, offsets[0], offsets[1], tuple(shape)


# ----------------------------------------------------------------------------- write
def write_tensors(path, tensors) -> None:
    """Write ``tensors`` (``{name: array}`` or ``[(name, array)]``) to ``path``.

    ``.npy`` takes exactly one tensor (its name is not stored); ``.npz`` and ``.safetensors``
    keep every name and the order.  bfloat16 in ``.npy``/``.npz`` follows the ``'<V2'``
    convention of this module's docstring.  The file is written under a temporary name in the
    same folder and renamed into place, so a failure leaves no partial file.  Raises
    UnsupportedFormatError for another extension, ValueError for the wrong number of tensors,
    a repeated name or a non-float array.
    """
    path = Path(path)
    ext = _suffix(path, "write")
    pairs = list(tensors.items() if isinstance(tensors, dict) else tensors)
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"write_tensors: a name appears twice in {names!r:.200}")
    arrays = []
    for name, arr in pairs:
        if not isinstance(name, str):
            raise TypeError(f"write_tensors: a name must be a str, got {type(name).__name__}")
        a = _as_float(name, np.asarray(arr), "write_tensors")
        arrays.append(a if a.flags.c_contiguous else np.ascontiguousarray(a))
    if ext == ".npy" and len(arrays) != 1:
        raise ValueError(
            f"cannot write {len(arrays)} tensors to {str(path)!r}: a .npy file holds exactly one; use .npz or .safetensors"
        )
    if ext == ".safetensors" and "__metadata__" in names:
        raise ValueError("write_tensors: '__metadata__' is reserved in .safetensors and cannot name a tensor")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            if ext == ".npy":
                np.lib.format.write_array(f, arrays[0], allow_pickle=False)
            elif ext == ".npz":
                _write_npz(f, names, arrays)
            else:
                _write_safetensors(f, names, arrays)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_npz(f, names, arrays) -> None:
    # what np.savez does, minus its keyword-argument names (a tensor may be called "file")
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in zip(names, arrays):
            with zf.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, arr, allow_pickle=False)


def _write_safetensors(f, names, arrays) -> None:
    header = {}
    pos = 0
    for name, arr in zip(names, arrays):
        header[name] = {"dtype": _ST_NAMES[arr.dtype], "shape": list(arr.shape), "data_offsets": [pos, pos + arr.nbytes]}
        pos += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned, as the reference writer does
    f.write(len(text).to_bytes(8, "little"))
    f.write(text)
    for arr in arrays:
        f.write(arr.reshape(-1).view(np.uint8).data if arr.size else b"")


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
