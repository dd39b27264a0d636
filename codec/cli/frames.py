"""What a frame file holds, whatever its kind: the one reader ``info`` and ``decode`` share.

A ``.gcf`` file is one of three things (docs/format.md):

* a **frame** (format v1): one tensor;
* a **container** (format v1): several v1 frames, each with its name;
* a **many-tensor frame** (format v2, :meth:`codec.Codec.encode_many`): a whole model in one
  frame, its tensors' layout written in it (the table form, joint or not) or given by hash
  (the layout-hash form: only the sender's ``codec.Layout`` decodes it, so the command line
  refuses it with a line that says so).

:func:`read_frame_file` tells them apart and gives every tensor's validated header
(``codec.inspect``) and a way to decode them; every library error becomes a
:class:`~codec.cli.errors.DataError` naming the file (exit 1), never anything else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from codec.cli.errors import DataError


@dataclass
class FrameFile:
    """A frame file's contents.  ``kind``: ``"frame"``, ``"container"`` or ``"many"``;
    ``info``: the whole file's validated header (``codec.inspect``'s dict for a frame or a
    many-tensor frame; a summary for a container); ``tensors``: per tensor ``(name, info)``,
    ``info`` its header fields (``codec``, ``dtype``, ``shape``, ``elements``, ``raw_bytes``,
    ...); ``decode()``: ``{name: array}`` of every tensor, in file order."""

    path: str
    kind: str
    info: dict
    tensors: list
    _decode: Callable = field(repr=False)

    @property
    def names(self) -> list:
        return [name for name, _ in self.tensors]

    def decode(self) -> dict:
        return self._decode()


def _fail(path: str, name, e: BaseException):
    """DataError for error ``e`` of tensor ``name`` (None: the file as a whole)."""
    return DataError(f"{path}: {e}" if name is None else f"{path}: tensor {name!r:.200}: {e}")


def _raw_bytes(d: dict) -> int:
    from codec.dtypes import NAMES

    return d["elements"] * NAMES[d["dtype"]].itemsize


def read_frame_file(path: str, buf) -> FrameFile:
    """The :class:`FrameFile` of the bytes ``buf`` read from ``path``: every header validated
    (nothing decoded yet); DataError naming the file (and the tensor) when any is not."""
    from codec.container import is_container
    from codec.manyframe import is_many

    if is_container(buf):
        return _container(path, buf)
    if is_many(buf):
        return _many(path, buf)
    return _frame(path, buf)


def _frame(path: str, buf) -> FrameFile:
    import codec

    try:
        d = codec.inspect(buf)
    except codec.CodecError as e:
        raise _fail(path, None, e) from None
    d["raw_bytes"] = _raw_bytes(d)
    name = os.path.splitext(os.path.basename(path))[0]  # a bare frame is named by the file's stem

    def decode():
        try:
            return {name: codec.decode(buf)}
        except codec.CodecError as e:
            raise _fail(path, None, e) from None

    return FrameFile(path, "frame", d, [(name, d)], decode)


def _container(path: str, buf) -> FrameFile:
    import codec
    from codec.container import unpack_frames
    from codec.manyframe import is_many

    try:
        frames = unpack_frames(buf)
    except codec.CodecError as e:
        raise _fail(path, None, e) from None
    tensors = []
    for name, frame in frames:
        if is_many(frame):  # a container holds byte strings: pack_frames took a v2 frame too
            raise _fail(path, name, "a many-tensor frame (format v2) inside a container; save it as a file of its own to read it here")
        try:
            d = codec.inspect(frame)
        except codec.CodecError as e:
            raise _fail(path, name, e) from None
        d["raw_bytes"] = _raw_bytes(d)
        tensors.append((name, d))
    frame_total = sum(d["frame_bytes"] for _, d in tensors)
    summary = {
        "format_version": 1,
        "count": len(tensors),
        "container_bytes": len(buf),
        "header_bytes": len(buf) - frame_total,
        "elements": sum(d["elements"] for _, d in tensors),
        "raw_bytes": sum(d["raw_bytes"] for _, d in tensors),
    }

    def decode():
        out = {}
        for name, frame in frames:
            try:
                out[name] = codec.decode(frame)
            except codec.CodecError as e:
                raise _fail(path, name, e) from None
        return out

    return FrameFile(path, "container", summary, tensors, decode)


def _many(path: str, buf) -> FrameFile:
    import codec
    from codec.manyframe import FLAG_LAYOUT_HASH
    from codec.manyframe.wire import FIXED

    hashed = len(buf) >= FIXED.size and FIXED.unpack_from(buf)[2] & FLAG_LAYOUT_HASH
    try:
        d = codec.inspect(buf)
    except codec.CodecError as e:
        if hashed and not isinstance(e, codec.CorruptFrameError):  # a valid header, and no layout to read it with
            raise _hash_form(path, buf) from None
        raise _fail(path, None, e) from None
    names = [t["name"] if t["name"] is not None else str(i) for i, t in enumerate(d["tensors"])]
    for t in d["tensors"]:
        t["raw_bytes"] = _raw_bytes(t)
    d["elements"] = sum(t["elements"] for t in d["tensors"])
    d["raw_bytes"] = sum(t["raw_bytes"] for t in d["tensors"])

    def decode():
        try:
            got = codec.decode_many(buf)
        except codec.CodecError as e:
            raise _fail(path, None, e) from None
        return dict(zip(names, got.values() if isinstance(got, dict) else got))

    return FrameFile(path, "many", d, list(zip(names, d["tensors"])), decode)


def _hash_form(path: str, buf) -> DataError:
    """The line for a layout-hash frame (its header already validated): what the header says,
    and why it cannot be read alone."""
    import codec
    from codec.manyframe import read_header

    try:
        h = read_header(memoryview(buf))
        what = f"{h.count} tensor{'s' * (h.count != 1)}, layout hash {h.stored_hash.hex()}"
    except codec.CorruptFrameError as e:
        return _fail(path, None, e)
    return DataError(
        f"{path}: a many-tensor frame in the layout-hash form ({what}): the tensors' names, dtypes and shapes "
        "are not in the frame, so only the sender's codec.Layout decodes it (codec.decode_many(frame, layout=...))"
    )
