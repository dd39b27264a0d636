"""``.npy`` and ``.npz`` files: reading untrusted ``.npy`` arrays (alone, or as the members of
a zip read straight from it), writing a ``.npz``, and the rule for a ``.npz`` member's name.
The conventions (bfloat16 as ``'<V2'``, names) are in :mod:`codec.io`'s docstring."""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path

import numpy as np

from codec.io.common import PARSE_ERRORS, PATH_ERRORS, TensorFileError, TensorNameError, as_float, float_dtype, one_line

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
ZIP_MAX_NAME = 0xFFFF  # a zip member name's length is a u16
_CHUNK = 1 << 24


def _read_array(fp, avail: int, name: str, where: str) -> np.ndarray:
    """One .npy array from the file object ``fp``, which has ``avail`` bytes from its position.

    The header (format 1.0 or 2.0, no pickles) is parsed by NumPy; its shape and dtype must
    account for exactly the bytes that follow it before any memory is allocated for the data.
    """
    start = fp.tell()
    try:
        magic = fp.read(len(NPY_MAGIC) + 2)
        if len(magic) != len(NPY_MAGIC) + 2 or magic[: len(NPY_MAGIC)] != NPY_MAGIC:
            raise TensorFileError(f"{where}: entry {name!r:.200} is not a .npy array (no NumPy magic)")
        version = (magic[-2], magic[-1])
        if version == (1, 0):
            shape, fortran, dt = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, fortran, dt = np.lib.format.read_array_header_2_0(fp)
        else:
            raise TensorFileError(f"{where}: tensor {name!r:.200}: .npy format version {version} is not supported (1.0, 2.0)")
    except TensorFileError:
        raise
    except PARSE_ERRORS as e:
        raise TensorFileError(f"{where}: tensor {name!r:.200}: not a readable .npy header: {one_line(e)}") from None
    if dt.hasobject:
        raise TensorFileError(f"{where}: tensor {name!r:.200} holds Python objects (a pickle); refused")
    float_dtype(name, dt, where)
    if not all(type(d) is int and d >= 0 for d in shape):
        raise TensorFileError(f"{where}: tensor {name!r:.200}: shape {shape!r:.200} is not a tuple of non-negative integers")
    count = math.prod(shape)
    need = count * dt.itemsize
    have = avail - (fp.tell() - start)
    if need != have:
        raise TensorFileError(
            f"{where}: tensor {name!r:.200}: its header declares shape {shape!r:.200} of {dt} ({need} bytes) "
            f"but {max(have, 0)} bytes of data follow"
        )
    try:
        buf = bytearray(need)
    except MemoryError:
        raise TensorFileError(f"{where}: tensor {name!r:.200}: not enough memory for its {need} bytes") from None
    mv, pos = memoryview(buf), 0
    while pos < need:
        got = fp.readinto(mv[pos : pos + _CHUNK])
        if not got:
            raise TensorFileError(f"{where}: tensor {name!r:.200}: data ends after {pos} of {need} bytes")
        pos += got
    arr = np.frombuffer(buf, dtype=dt, count=count)
    if fortran and len(shape) > 1:
        arr = np.ascontiguousarray(arr.reshape(shape[::-1]).T)
    else:
        arr = arr.reshape(shape)
    return as_float(name, arr, where)


def read_npy(path: Path) -> dict[str, np.ndarray]:
    """The one tensor of a .npy file, named by the file stem."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if f.read(4) in ZIP_MAGICS:
            raise TensorFileError(f"{path}: not a .npy file; it looks like a .npz (zip) file, rename it")
        f.seek(0)
        if f.read(len(NPY_MAGIC)) != NPY_MAGIC:
            raise TensorFileError(f"{path}: not a readable .npy file (it does not start with the NumPy magic)")
        f.seek(0)
        return {path.stem: _read_array(f, size, path.stem, str(path))}


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The members of a .npz, read straight from the zip (not through np.load's NpzFile, whose
    lookup by key confuses a member ``a.npy`` with the key ``a.npy`` of a member ``a.npy.npy``).
    A member ``X.npy`` is the tensor ``X``; a key that two members would both give is refused."""
    with open(path, "rb") as f:
        if f.read(len(NPY_MAGIC)) == NPY_MAGIC:
            raise TensorFileError(f"{path}: not a .npz (zip) file; it looks like a .npy file, rename it")
    try:
        zf = zipfile.ZipFile(path)
    except PATH_ERRORS:
        raise
    except PARSE_ERRORS as e:
        raise TensorFileError(f"{path}: not a readable .npz file: {one_line(e)}") from None
    out = {}
    with zf:
        size = os.path.getsize(path)
        for info in zf.infolist():
            if info.is_dir() and info.file_size == 0:  # a folder entry ('zip -r' writes them): no tensor
                continue
            member = info.filename
            name = member[:-4] if member.endswith(".npy") else member
            if name in out:
                raise TensorFileError(f"{path}: two zip members give the tensor name {name!r:.200}")
            if info.compress_type == zipfile.ZIP_STORED and info.file_size > size:
                raise TensorFileError(f"{path}: entry {name!r:.200} declares {info.file_size} bytes, more than the whole file")
            try:
                with zf.open(info) as m:
                    out[name] = _read_array(m, info.file_size, name, str(path))
            except TensorFileError:
                raise
            except MemoryError:
                raise TensorFileError(f"{path}: entry {name!r:.200}: not enough memory to read it") from None
            except PARSE_ERRORS as e:
                raise TensorFileError(f"{path}: entry {name!r:.200} cannot be read: {one_line(e)}") from None
    return out


def check_npz_name(name: str, nbytes: int) -> None:
    """TensorNameError unless ``name`` (``nbytes`` long in UTF-8) can be the member ``name.npy``."""
    what = f"tensor {name!r:.200} cannot be a .npz member"
    if "\x00" in name:
        raise TensorNameError(f"{what}: it contains a NUL byte, where zip names end; use .safetensors")
    if "\\" in name:
        raise TensorNameError(f"{what}: it contains a backslash, a path separator to zip tools; use .safetensors")
    if name.startswith("/"):
        raise TensorNameError(f"{what}: it is an absolute path; use .safetensors")
    if any(part in ("", ".", "..") for part in (name + ".npy").split("/")):
        raise TensorNameError(f"{what}: it has an empty, '.' or '..' path component; use .safetensors")
    if nbytes + 4 > ZIP_MAX_NAME:
        raise TensorNameError(
            f"{what}: it is {nbytes:,} UTF-8 bytes, and a zip member name (with '.npy') holds at most {ZIP_MAX_NAME:,}; "
            "use .safetensors"
        )


def write_npy(f, arr) -> None:
    np.lib.format.write_array(f, arr, allow_pickle=False)


def write_npz(f, names, arrays) -> None:
    # what np.savez does, minus its keyword-argument names (a tensor may be called "file")
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in zip(names, arrays):
            with zf.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, arr, allow_pickle=False)
