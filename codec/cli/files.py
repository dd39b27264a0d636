"""The files and specs a command is given: reading inputs, writing outputs atomically, and the
checks made before any work (an output that is the input, an extension, a tensor name the
output cannot hold).  Each turns a library error into a :class:`UsageError` (exit 2) or a
:class:`DataError` (exit 1) whose line names the file."""

from __future__ import annotations

import os

from codec.cli.errors import DataError, UsageError


def user_codec(spec: str):
    """The codec for a user-given spec; any failure is a usage error."""
    import codec

    try:
        return codec.get_codec(spec)
    except codec.CodecError as e:
        raise UsageError(str(e)) from None


def read_input(path: str) -> dict:
    from codec import io

    try:
        return io.read_tensors(path)
    except io.UnsupportedFormatError as e:
        raise UsageError(str(e)) from None
    except io.TensorFileError as e:
        raise DataError(str(e)) from None


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def refuse_overwrite(output: str, *inputs: str) -> None:
    """UsageError when ``output`` is (or, through a symlink or hard link, is the same file as)
    one of ``inputs``: a command never replaces its own input."""
    for path in inputs:
        try:
            same = os.path.samefile(output, path)  # same device and inode: any path, symlink or hard link
        except (OSError, ValueError):  # one of them does not exist (yet): not the same file
            same = False
        if same:
            raise UsageError(f"output {output!r} is the input file {path!r}; refusing to overwrite it, choose another -o")


def write_bytes(path: str, data) -> None:
    """Write under a fresh temporary name, then rename: no partial OUT on failure."""
    from codec.io import atomic_write

    try:
        atomic_write(path, lambda f: f.write(data))
    except OSError as e:
        raise DataError(f"cannot write {path}: {e.strerror or e}") from None


def write_output(path: str, tensors) -> None:
    from codec import io

    try:
        io.write_tensors(path, tensors)
    except OSError as e:
        raise DataError(f"cannot write {path}: {e.strerror or e}") from None
    except io.UnsupportedFormatError as e:
        raise UsageError(str(e)) from None
    except (ValueError, TypeError) as e:  # a name the format cannot hold, a non-float array
        raise DataError(f"cannot write {path}: {e}") from None


def check_names(path: str, names) -> None:
    """Refuse, before any decoding, a tensor name that OUT's format cannot store unchanged."""
    from codec import io

    try:
        io.check_names(path, names)
    except io.UnsupportedFormatError as e:
        raise UsageError(str(e)) from None
    except (ValueError, TypeError) as e:
        raise DataError(f"cannot write {path}: {e}") from None


def check_container_names(path: str, names) -> None:
    """Refuse, before any encoding, a name a container cannot hold (docs/format.md)."""
    from codec.container import MAX_NAME

    for name in names:
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            raise DataError(f"cannot write {path}: tensor {name!r:.200}: the name is not valid Unicode text (it holds a lone surrogate)") from None
        if size > MAX_NAME:
            raise DataError(f"cannot write {path}: tensor {name[:40]!r}...: the name is {size:,} UTF-8 bytes; a container name holds at most {MAX_NAME:,}")


def check_out_ext(path: str) -> str:
    from codec import io

    ext = os.path.splitext(path)[1].lower()
    if ext not in io.SUPPORTED:
        raise UsageError(f"output {path!r}: unsupported extension {ext or '(none)'!r}; supported: {', '.join(io.SUPPORTED)}")
    return ext

