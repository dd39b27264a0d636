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
Errors: a path with another extension raises :class:`UnsupportedFormatError`; a missing
path ``FileNotFoundError``; a file that cannot be read as its extension says, or that holds
an unsupported array, :class:`TensorFileError`; a name the output format cannot hold,
:class:`TensorNameError`.  All three error classes are ``CodecError`` and ``ValueError``
subclasses.

Modules: ``codec.io.common`` (extensions, errors, the float-type rule), ``codec.io.npy``
(``.npy``, ``.npz``), ``codec.io.safetensors``, ``codec.io.atomic`` (:func:`atomic_write`);
this one dispatches on the extension.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from codec.errors import CodecTypeError, CodecValueError
from codec.io import npy, safetensors
from codec.io.atomic import atomic_write
from codec.io.common import (
    PARSE_ERRORS, PATH_ERRORS, SUPPORTED, TensorFileError, TensorNameError, UnsupportedFormatError, as_float, check_readable,
    one_line, suffix,
)

__all__ = [
    "SUPPORTED", "TensorFileError", "TensorNameError", "UnsupportedFormatError", "atomic_write", "check_names",
    "read_tensors", "write_tensors",
]


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
    ext = suffix(path, "read")
    check_readable(path)
    try:
        if ext == ".npy":
            return npy.read_npy(path)
        if ext == ".npz":
            return npy.read_npz(path)
        return safetensors.read_safetensors(path)
    except (TensorFileError, *PATH_ERRORS):
        raise
    except MemoryError:
        raise TensorFileError(f"{path}: not enough memory to read it") from None
    except PARSE_ERRORS as e:
        raise TensorFileError(f"{path}: not a readable {ext} file: {one_line(e)}") from None


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
    ext = suffix(Path(path), "write")
    names = list(names)
    seen = set()
    for name in names:
        if not isinstance(name, str):
            raise CodecTypeError(f"a tensor name must be a str, got {type(name).__name__}")
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
            npy.check_npz_name(name, len(name_b))
        elif ext == ".safetensors" and name == "__metadata__":
            raise TensorNameError("'__metadata__' is reserved in .safetensors and cannot name a tensor; use .npz")
    if ext == ".npz":
        for name in names:
            if name.endswith(".npy") and name[:-4] in seen:
                raise TensorNameError(
                    f"tensors {name[:-4]!r:.200} and {name!r:.200} cannot share a .npz: both are read back by "
                    f"np.load as the key {name!r:.200}; use .safetensors"
                )


# ----------------------------------------------------------------------------- write
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
    ext = suffix(path, "write")
    pairs = list(tensors.items() if isinstance(tensors, dict) else tensors)
    names = [n for n, _ in pairs]
    check_names(path, names)
    arrays = []
    for name, arr in pairs:
        a = as_float(name, np.asarray(arr), "write_tensors")
        arrays.append(a if a.flags.c_contiguous else np.ascontiguousarray(a))
    if ext == ".npy" and len(arrays) != 1:
        raise CodecValueError(
            f"cannot write {len(arrays)} tensors to {str(path)!r}: a .npy file holds exactly one; use .npz or .safetensors"
        )
    if ext == ".npy":
        atomic_write(path, lambda f: npy.write_npy(f, arrays[0]))
    elif ext == ".npz":
        atomic_write(path, lambda f: npy.write_npz(f, names, arrays))
    else:
        head = safetensors.header(names, arrays)
        atomic_write(path, lambda f: safetensors.write_safetensors(f, head, arrays))
