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

**Names** are never renamed, truncated or dropped on the way through a file:
:func:`check_names` (called by ``write_tensors``) refuses with :class:`TensorNameError` a
name the format cannot store as it is (``.npz``: NUL, backslash, absolute or ``.``/``..``/empty
path components, over 65,531 UTF-8 bytes, ``X`` beside ``X.npy``; every named format: lone
surrogates; ``.safetensors``: ``__metadata__``, a header over 100 MB).  Reading refuses a
``.npz`` whose members give one name twice and a ``.safetensors`` header naming one twice.

**Untrusted bytes.**  ``.npy`` data (a file, or a ``.npz`` member read straight from the
zip) is read only after its header's shape and dtype are checked to account for exactly the
bytes that follow; any failure inside NumPy's header parser, zipfile or its decompressors is
a :class:`TensorFileError`.  Arrays come back C-contiguous, native-endian and writeable.

Errors: a path with another extension raises :class:`UnsupportedFormatError`; a missing
path ``FileNotFoundError``; a file that cannot be read as its extension says, or that holds
an unsupported array, :class:`TensorFileError`; a name the output format cannot hold,
:class:`TensorNameError`.  All three error classes are ``ValueError`` subclasses.
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import stat
import struct
import tokenize
import zipfile
import zlib
from pathlib import Path

import numpy as np

from codec.dtypes import bfloat16

__all__ = [
    "SUPPORTED", "TensorFileError", "TensorNameError", "UnsupportedFormatError", "atomic_write", "check_names",
    "read_tensors", "write_tensors",
]

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


class TensorNameError(ValueError):
    """A tensor name that the output format cannot store faithfully (see :func:`check_names`)."""


#: what a failed parse of untrusted bytes may raise, inside NumPy's .npy header reader (its
#: Python 2 header filter tokenizes), zipfile,
#: its decompressors (zlib, bz2 raises OSError, lzma) and json; all become TensorFileError
_PARSE_ERRORS = (
    ValueError, TypeError, KeyError, IndexError, EOFError, OSError, RuntimeError, NotImplementedError,
    OverflowError, RecursionError, SyntaxError, tokenize.TokenError, zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, struct.error,
)
try:  # lzma is optional in some Python builds; zipfile then refuses LZMA members with NotImplementedError
    import lzma

    _PARSE_ERRORS += (lzma.LZMAError,)
except ImportError:  # pragma: no cover
    pass
_PATH_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_ZIP_MAX_NAME = 0xFFFF  # a zip member name's length is a u16
_CHUNK = 1 << 24


def _suffix(path: Path, action: str) -> str:
    ext = path.suffix.lower()
    if ext not in SUPPORTED:
        raise UnsupportedFormatError(
            f"cannot {action} {str(path)!r}: unsupported extension {path.suffix or '(none)'!r}; "
            f"supported: {', '.join(SUPPORTED)}"
        )
    return ext


def _float_dtype(name: str, dt: np.dtype, where: str) -> None:
    """TensorFileError unless ``dt`` is a float type gradcodec handles (or bfloat16 as '<V2')."""
    if dt.kind == "V" and dt.itemsize == 2 and dt.names is None and dt.subdtype is None:
        return
    if dt == bfloat16 or (dt.kind == "f" and dt.itemsize in (2, 4, 8)):
        return
    raise TensorFileError(
        f"{where}: tensor {name!r:.200} has dtype {dt}; gradcodec handles float16, bfloat16, float32 and float64 only"
    )


def _as_float(name: str, arr, where: str) -> np.ndarray:
    """``arr`` as a supported float array (bfloat16 from the '<V2' convention), or TensorFileError."""
    if not isinstance(arr, np.ndarray):
        raise TensorFileError(f"{where}: entry {name!r:.200} is not an array")
    dt = arr.dtype
    _float_dtype(name, dt, where)
    if dt.kind == "V":
        return arr.view(bfloat16)
    if dt == bfloat16:
        return arr
    return arr if dt.isnative else arr.astype(dt.newbyteorder("="))


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
    Every length a file declares is checked against the bytes really there before anything is
    allocated for it, and every array comes back C-contiguous, native-endian and writeable.
    """
    path = Path(path)
    ext = _suffix(path, "read")
    _check_readable(path)
    try:
        if ext == ".npy":
            return _read_npy(path)
        if ext == ".npz":
            return _read_npz(path)
        return _read_safetensors(path)
    except (TensorFileError, *_PATH_ERRORS):
        raise
    except MemoryError:
        raise TensorFileError(f"{path}: not enough memory to read it") from None
    except _PARSE_ERRORS as e:
        raise TensorFileError(f"{path}: not a readable {ext} file: {_one_line(e)}") from None


def _read_array(fp, avail: int, name: str, where: str) -> np.ndarray:
    """One .npy array from the file object ``fp``, which has ``avail`` bytes from its position.

    The header (format 1.0 or 2.0, no pickles) is parsed by NumPy; its shape and dtype must
    account for exactly the bytes that follow it before any memory is allocated for the data.
    """
    start = fp.tell()
    try:
        magic = fp.read(len(_NPY_MAGIC) + 2)
        if len(magic) != len(_NPY_MAGIC) + 2 or magic[: len(_NPY_MAGIC)] != _NPY_MAGIC:
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
    except _PARSE_ERRORS as e:
        raise TensorFileError(f"{where}: tensor {name!r:.200}: not a readable .npy header: {_one_line(e)}") from None
    if dt.hasobject:
        raise TensorFileError(f"{where}: tensor {name!r:.200} holds Python objects (a pickle); refused")
    _float_dtype(name, dt, where)
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
    return _as_float(name, arr, where)


def _read_npy(path: Path) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if f.read(4) in _ZIP_MAGICS:
            raise TensorFileError(f"{path}: not a .npy file; it looks like a .npz (zip) file, rename it")
        f.seek(0)
        if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
            raise TensorFileError(f"{path}: not a readable .npy file (it does not start with the NumPy magic)")
        f.seek(0)
        return {path.stem: _read_array(f, size, path.stem, str(path))}


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The members of a .npz, read straight from the zip (not through np.load's NpzFile, whose
    lookup by key confuses a member ``a.npy`` with the key ``a.npy`` of a member ``a.npy.npy``).
    A member ``X.npy`` is the tensor ``X``; a key that two members would both give is refused."""
    with open(path, "rb") as f:
        if f.read(len(_NPY_MAGIC)) == _NPY_MAGIC:
            raise TensorFileError(f"{path}: not a .npz (zip) file; it looks like a .npy file, rename it")
    try:
        zf = zipfile.ZipFile(path)
    except _PATH_ERRORS:
        raise
    except _PARSE_ERRORS as e:
        raise TensorFileError(f"{path}: not a readable .npz file: {_one_line(e)}") from None
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
            except _PARSE_ERRORS as e:
                raise TensorFileError(f"{path}: entry {name!r:.200} cannot be read: {_one_line(e)}") from None
    return out


def _unique_object(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


class _DuplicateKey(Exception):
    pass


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
            meta = json.loads(head.decode("utf-8"), object_pairs_hook=_unique_object)
        except _DuplicateKey as e:
            raise TensorFileError(f"{path}: safetensors header names {e.args[0]!r} twice") from None
        except (ValueError, RecursionError) as e:  # bad UTF-8, bad JSON, too deep, a number too long
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
                raise TensorFileError(f"{path}: tensor {name!r:.200} at data offset {begin} {what}")
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
    where = f"{path}: tensor {name!r:.200}"
    if not isinstance(entry, dict):
        raise TensorFileError(f"{where}: header entry is not a JSON object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise TensorFileError(f"{where}: header entry has no dtype")
    if dtype not in _ST_DTYPES:
        raise TensorFileError(
            f"{where} has dtype {dtype!r:.40}; gradcodec handles {', '.join(_ST_DTYPES)} (float16, bfloat16, float32, float64) only"
        )
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise TensorFileError(f"{where}: shape {shape!r:.200} is not a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_len
    ):
        raise TensorFileError(f"{where}: data_offsets {offsets!r:.200} are not [begin, end] inside the {data_len}-byte data area")
    dt = _ST_DTYPES[dtype]
    need = math.prod(shape) * dt.itemsize
    if offsets[1] - offsets[0] != need:
        raise TensorFileError(f"{where}: {offsets[1] - offsets[0]} data bytes for shape {shape!r:.200} of {dtype} (needs {need})")
    return name, dt, offsets[0], offsets[1], tuple(shape)


# ----------------------------------------------------------------------------- names
def check_names(path, names) -> None:
    """Refuse, before anything is written, a tensor name that ``path``'s format cannot store
    faithfully: one that would be renamed, truncated, dropped or collide with another on the
    way through the file and back (by this module's reader or NumPy's ``np.load``).

    Every format: a name is a ``str`` of valid Unicode (encodable as UTF-8: no lone
    surrogates) and no name appears twice.  ``.npy`` stores no name (exactly one tensor, any name).
    ``.npz`` stores tensor ``X`` as the zip member ``X.npy``: no NUL (zip names end there), no
    backslash (a path separator to zip tools and on Windows), a relative ``/``-separated path
    with no empty, ``.`` or ``..`` component and no leading ``/``, at most 65,535 UTF-8 bytes
    with the ``.npy`` added, and never both ``X`` and ``X.npy`` (``np.load(f)["X.npy"]`` would
    return ``X``).  ``.safetensors``: ``__metadata__`` is reserved.  Raises
    UnsupportedFormatError for another extension, TypeError for a non-str name, and
    :class:`TensorNameError` (a ValueError) naming the tensor otherwise.
    """
    ext = _suffix(Path(path), "write")
    names = list(names)
    seen = set()
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"a tensor name must be a str, got {type(name).__name__}")
        if name in seen:
            raise TensorNameError(f"tensor {name!r:.200} appears twice; names in a tensor file are unique")
        seen.add(name)
        if ext == ".npy":  # the name is not stored
            continue
        try:
            name_b = name.encode("utf-8")
        except UnicodeEncodeError:
            raise TensorNameError(f"tensor {name!r:.200}: the name is not valid Unicode text (it holds a lone surrogate)") from None
        if ext == ".npz":
            _check_npz_name(name, len(name_b))
        elif ext == ".safetensors" and name == "__metadata__":
            raise TensorNameError("'__metadata__' is reserved in .safetensors and cannot name a tensor; use .npz")
    if ext == ".npz":
        for name in names:
            if name.endswith(".npy") and name[:-4] in seen:
                raise TensorNameError(
                    f"tensors {name[:-4]!r:.200} and {name!r:.200} cannot share a .npz: both are read back by "
                    f"np.load as the key {name!r:.200}; use .safetensors"
                )


def _check_npz_name(name: str, nbytes: int) -> None:
    what = f"tensor {name!r:.200} cannot be a .npz member"
    if "\x00" in name:
        raise TensorNameError(f"{what}: it contains a NUL byte, where zip names end; use .safetensors")
    if "\\" in name:
        raise TensorNameError(f"{what}: it contains a backslash, a path separator to zip tools; use .safetensors")
    if name.startswith("/"):
        raise TensorNameError(f"{what}: it is an absolute path; use .safetensors")
    if any(part in ("", ".", "..") for part in (name + ".npy").split("/")):
        raise TensorNameError(f"{what}: it has an empty, '.' or '..' path component; use .safetensors")
    if nbytes + 4 > _ZIP_MAX_NAME:
        raise TensorNameError(
            f"{what}: it is {nbytes:,} UTF-8 bytes, and a zip member name (with '.npy') holds at most {_ZIP_MAX_NAME:,}; "
            "use .safetensors"
        )


# ----------------------------------------------------------------------------- write
def atomic_write(path, write) -> None:
    """Create ``path`` through ``write(f)`` (``f`` a binary file) under a fresh temporary name in
    the same folder (created exclusively, never an existing file), then rename it into place:
    a failure, an interrupt included, leaves no partial file and ``path`` as it was.  The new
    file gets the usual permissions (0666 less the umask).  An existing ``path`` that is not a
    regular file or a folder (a pipe, ``/dev/null``, a terminal) is written in place instead:
    renaming over it would replace the device or pipe itself."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        with open(path, "wb") as f:
            write(f)
        return
    while True:
        # a short prefix of the name: the temporary name must fit NAME_MAX whenever the real one does
        tmp = path.with_name(f".{path.name[:32]}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_tensors(path, tensors) -> None:
    """Write ``tensors`` (``{name: array}`` or ``[(name, array)]``) to ``path``.

    ``.npy`` takes exactly one tensor (its name is not stored); ``.npz`` and ``.safetensors``
    keep every name and the order.  Every name must survive the format unchanged
    (:func:`check_names`): none is ever renamed or dropped.  bfloat16 in ``.npy``/``.npz``
    follows the ``'<V2'`` convention of this module's docstring.  The file is written through
    :func:`atomic_write`, so a failure leaves no partial file.  Raises UnsupportedFormatError
    for another extension, TensorNameError for a name the format cannot hold, ValueError for
    the wrong number of tensors, and TensorFileError for a non-float array.
    """
    path = Path(path)
    ext = _suffix(path, "write")
    pairs = list(tensors.items() if isinstance(tensors, dict) else tensors)
    names = [n for n, _ in pairs]
    check_names(path, names)
    arrays = []
    for name, arr in pairs:
        a = _as_float(name, np.asarray(arr), "write_tensors")
        arrays.append(a if a.flags.c_contiguous else np.ascontiguousarray(a))
    if ext == ".npy" and len(arrays) != 1:
        raise ValueError(
            f"cannot write {len(arrays)} tensors to {str(path)!r}: a .npy file holds exactly one; use .npz or .safetensors"
        )
    if ext == ".npy":
        atomic_write(path, lambda f: np.lib.format.write_array(f, arrays[0], allow_pickle=False))
    elif ext == ".npz":
        atomic_write(path, lambda f: _write_npz(f, names, arrays))
    else:
        header = _st_header(names, arrays)
        atomic_write(path, lambda f: _write_safetensors(f, header, arrays))


def _write_npz(f, names, arrays) -> None:
    # what np.savez does, minus its keyword-argument names (a tensor may be called "file")
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in zip(names, arrays):
            with zf.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, arr, allow_pickle=False)


def _st_header(names, arrays) -> bytes:
    header = {}
    pos = 0
    for name, arr in zip(names, arrays):
        header[name] = {"dtype": _ST_NAMES[arr.dtype], "shape": list(arr.shape), "data_offsets": [pos, pos + arr.nbytes]}
        pos += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("ascii")
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned, as the reference writer does
    if len(text) > _ST_MAX_HEADER:
        raise TensorNameError(
            f"the .safetensors header of these {len(names)} tensors would be {len(text):,} bytes; readers refuse more than "
            f"{_ST_MAX_HEADER:,} (shorten the names, or use .npz)"
        )
    return text


def _write_safetensors(f, header: bytes, arrays) -> None:
    f.write(len(header).to_bytes(8, "little"))
    f.write(header)
    for arr in arrays:
        f.write(arr.reshape(-1).view(np.uint8).data if arr.size else b"")


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
