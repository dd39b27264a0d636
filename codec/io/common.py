"""What every tensor-file format of :mod:`codec.io` shares: the supported extensions, the
error classes, the float-type rule and the errors a parse of untrusted bytes may raise."""

from __future__ import annotations

import errno
import struct
import tokenize
import zipfile
import zlib
from pathlib import Path

import numpy as np

from codec.dtypes import bfloat16
from codec.errors import CodecError

#: file extensions read_tensors and write_tensors understand
SUPPORTED = (".npy", ".npz", ".safetensors")


class UnsupportedFormatError(CodecError, ValueError):
    """The path's extension is not one of :data:`SUPPORTED`."""


class TensorFileError(CodecError, ValueError):
    """A tensor file is damaged, is not what its extension says, or holds a non-float array."""


class TensorNameError(CodecError, ValueError):
    """A tensor name that the output format cannot store faithfully (see :func:`codec.io.check_names`)."""


#: what a failed parse of untrusted bytes may raise, inside NumPy's .npy header reader (its
#: Python 2 header filter tokenizes), zipfile,
#: its decompressors (zlib, bz2 raises OSError, lzma) and json; all become TensorFileError
PARSE_ERRORS = (
    ValueError, TypeError, KeyError, IndexError, EOFError, OSError, RuntimeError, NotImplementedError,
    OverflowError, RecursionError, SyntaxError, tokenize.TokenError, zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, struct.error,
)
try:  # lzma is optional in some Python builds; zipfile then refuses LZMA members with NotImplementedError
    import lzma

    PARSE_ERRORS += (lzma.LZMAError,)
except ImportError:  # pragma: no cover
    pass
#: a missing or unreachable path: passed on as it is (the CLI names the path)
PATH_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def suffix(path: Path, action: str) -> str:
    """The lower-case extension of ``path``, or UnsupportedFormatError naming ``action``."""
    ext = path.suffix.lower()
    if ext not in SUPPORTED:
        raise UnsupportedFormatError(
            f"cannot {action} {str(path)!r}: unsupported extension {path.suffix or '(none)'!r}; "
            f"supported: {', '.join(SUPPORTED)}"
        )
    return ext


def float_dtype(name: str, dt: np.dtype, where: str) -> None:
    """TensorFileError unless ``dt`` is a float type gradcodec handles (or bfloat16 as '<V2')."""
    if dt.kind == "V" and dt.itemsize == 2 and dt.names is None and dt.subdtype is None:
        return
    if dt == bfloat16 or (dt.kind == "f" and dt.itemsize in (2, 4, 8)):
        return
    raise TensorFileError(
        f"{where}: tensor {name!r:.200} has dtype {dt}; gradcodec handles float16, bfloat16, float32 and float64 only"
    )


def as_float(name: str, arr, where: str) -> np.ndarray:
    """``arr`` as a supported float array (bfloat16 from the '<V2' convention), or TensorFileError."""
    if not isinstance(arr, np.ndarray):
        raise TensorFileError(f"{where}: entry {name!r:.200} is not an array")
    dt = arr.dtype
    float_dtype(name, dt, where)
    if dt.kind == "V":
        return arr.view(bfloat16)
    if dt == bfloat16:
        return arr
    return arr if dt.isnative else arr.astype(dt.newbyteorder("="))


def check_readable(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(path))


def one_line(e: BaseException) -> str:
    """The first line of an exception's message (its class name when it has none)."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
