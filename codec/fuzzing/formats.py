"""The inputs as editable structures: a frame's fields (:class:`FrameFields`), a container's
(:class:`ContainerFields`), split without validation and joined back with the checksums
recomputed; and the state target's restricted pickles (:func:`dumps_state`, :func:`loads_state`).
"""

from __future__ import annotations

import io
import math
import pickle
import struct
from dataclasses import dataclass, field

from codec.fuzzing.checksums import (
    CFLAG_CRC32C,
    CONTAINER_MAGIC,
    FLAG_CRC32,
    FLAG_CRC32C,
    FRAME_MAGIC,
    fix_container_checksums,
    fix_frame_checksums,
)


@dataclass
class FrameFields:
    """A frame's fields, split without validation (docs/format.md), to edit and rejoin.

    ``ndim``, ``nsec`` and ``spec_len`` are None when they follow ``shape``, ``sections`` and
    ``spec``; an int forces a (possibly inconsistent) value.  ``sections`` holds
    ``[kind, encoding, bits, count, raw_len, stored_len]`` lists; ``payloads`` their stored
    bytes; ``trailing`` anything after them."""

    magic: bytes = FRAME_MAGIC
    version: int = 1
    flags: int = 0
    dtype: int = 3
    reserved: int = 0
    shape: list = field(default_factory=list)
    spec: bytes = b""
    sections: list = field(default_factory=list)
    payloads: list = field(default_factory=list)
    trailing: bytes = b""
    ndim: int | None = None
    nsec: int | None = None
    spec_len: int | None = None

    def copy(self) -> "FrameFields":
        return FrameFields(
            self.magic, self.version, self.flags, self.dtype, self.reserved, list(self.shape), self.spec,
            [list(s) for s in self.sections], list(self.payloads), self.trailing, self.ndim, self.nsec, self.spec_len,
        )

    def join(self, fix: bool = True) -> bytes:
        """The frame bytes; checksums recomputed when ``fix`` (else left zero)."""
        ndim = len(self.shape) if self.ndim is None else self.ndim
        nsec = len(self.sections) if self.nsec is None else self.nsec
        spec_len = len(self.spec) if self.spec_len is None else self.spec_len
        out = bytearray(self.magic[:4].ljust(4, b"\0"))
        out += struct.pack("<BBBBBBH", self.version & 255, self.flags & 255, self.dtype & 255, ndim & 255, nsec & 255,
                           self.reserved & 255, spec_len & 0xFFFF)
        for d in self.shape:
            out += struct.pack("<Q", d % (1 << 64))
        out += self.spec
        for s in self.sections:
            out += struct.pack("<BBHQQQ", s[0] & 255, s[1] & 255, s[2] & 0xFFFF, s[3] % (1 << 64), s[4] % (1 << 64), s[5] % (1 << 64))
        if self.flags & (FLAG_CRC32 | FLAG_CRC32C):
            out += b"\0\0\0\0"
        out += b"\0\0\0\0"
        for p in self.payloads:
            out += p
        out += self.trailing
        return fix_frame_checksums(out) if fix else bytes(out)

    @property
    def n(self) -> int:
        return math.prod(self.shape)


def split_frame(buf) -> FrameFields | None:
    """Split a frame into :class:`FrameFields` (None when even the fixed header is missing)."""
    b = bytes(buf)
    if len(b) < 16:
        return None
    magic, version, flags, dt, ndim, nsec, reserved, spec_len = struct.unpack_from("<4sBBBBBBH", b, 0)
    off = 12
    if off + 8 * ndim + spec_len + 28 * nsec > len(b):
        return None
    shape = list(struct.unpack_from(f"<{ndim}Q", b, off))
    off += 8 * ndim
    spec = b[off : off + spec_len]
    off += spec_len
    sections = []
    for _ in range(nsec):
        sections.append(list(struct.unpack_from("<BBHQQQ", b, off)))
        off += 28
    off += 8 if flags & (FLAG_CRC32 | FLAG_CRC32C) else 4
    payloads = []
    for s in sections:
        take = min(s[5], max(0, len(b) - off))
        payloads.append(b[off : off + take])
        off += take
    return FrameFields(magic, version, flags, dt, reserved, shape, spec, sections, payloads, b[off:])


# ----------------------------------------------------------------------------- container fields
@dataclass
class ContainerFields:
    """A container split without validation: entries ``[name_bytes, frame]`` plus raw fields."""

    magic: bytes = CONTAINER_MAGIC
    version: int = 1
    flags: int = 0
    reserved: int = 0
    entries: list = field(default_factory=list)  # [name bytes, frame bytes, name_len override|None, frame_len override|None]
    count: int | None = None
    trailing: bytes = b""

    def join(self, fix: bool = True) -> bytes:
        count = len(self.entries) if self.count is None else self.count
        out = bytearray(self.magic[:4].ljust(4, b"\0"))
        out += struct.pack("<BBHI", self.version & 255, self.flags & 255, self.reserved & 0xFFFF, count % (1 << 32))
        for name, frame, nl, fl in self.entries:
            out += struct.pack("<H", (len(name) if nl is None else nl) & 0xFFFF) + name
            out += struct.pack("<Q", (len(frame) if fl is None else fl) % (1 << 64))
        if self.flags & CFLAG_CRC32C:
            out += b"\0\0\0\0"
        out += b"\0\0\0\0"
        for e in self.entries:
            out += e[1]
        out += self.trailing
        return fix_container_checksums(out) if fix else bytes(out)


def split_container(buf) -> ContainerFields | None:
    b = bytes(buf)
    if len(b) < 16:
        return None
    magic, version, flags, reserved, count = struct.unpack_from("<4sBBHI", b, 0)
    off, table = 12, []
    for _ in range(count):
        if off + 10 > len(b):
            return None
        (nl,) = struct.unpack_from("<H", b, off)
        if off + 10 + nl > len(b):
            return None
        name = b[off + 2 : off + 2 + nl]
        (fl,) = struct.unpack_from("<Q", b, off + 2 + nl)
        table.append((name, fl))
        off += 10 + nl
    off += 8 if flags & CFLAG_CRC32C else 4
    entries = []
    for name, fl in table:
        take = min(fl, max(0, len(b) - off))
        entries.append([name, b[off : off + take], None, None])
        off += take
    return ContainerFields(magic, version, flags, reserved, entries, None, b[off:])


# ----------------------------------------------------------------------------- state pickles
_STATE_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy", "matrix"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"),
    ("numpy.matrixlib.defmatrix", "matrix"), ("numpy._core.defchararray", "chararray"),
    ("builtins", "complex"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"),
    ("builtins", "slice"), ("builtins", "range"), ("numpy", "broadcast_to"),
}


class Broadcast:
    """A broadcast array in a state pickle: ``np.broadcast_to(value, shape)``, made when the
    pickle loads (a zero-stride view that costs nothing until something copies it; pickling
    the view itself would write out every element)."""

    def __init__(self, value, shape):
        self.value, self.shape = value, tuple(shape)

    def __reduce__(self):
        import numpy as np

        return (np.broadcast_to, (self.value, self.shape))


class _StateUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays, scalars and dtypes (any ``numpy.dtypes`` class, ml_dtypes types),
    broadcast views (:class:`Broadcast`) and plain containers; nothing else (a corpus file
    must not run code)."""

    def find_class(self, module, name):
        if (module, name) in _STATE_GLOBALS or module == "numpy.dtypes" or (
            module == "ml_dtypes" and name.replace("_", "").isalnum()
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"state pickle: global {module}.{name} is not allowed")


def dumps_state(obj) -> bytes:
    """The state pickle of ``obj``; a broadcast view in it (one a loaded pickle made) is
    written as its :class:`Broadcast`, never element by element."""
    return pickle.dumps(_broadcasts_kept(obj), protocol=4)


def _broadcasts_kept(obj):
    import numpy as np

    from codec.dtypes import is_broadcast

    if type(obj) is np.ndarray and is_broadcast(obj):
        base = obj[tuple(slice(0, 1) if st == 0 else slice(None) for st in obj.strides)].copy()
        return Broadcast(base, obj.shape)
    if isinstance(obj, dict):
        return {k: _broadcasts_kept(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(_broadcasts_kept(v) for v in obj)
    return obj


def loads_state(data: bytes):
    return _StateUnpickler(io.BytesIO(data)).load()


# ------------------------------------------------------------------ many-tensor frames
def layout_prefix(layout) -> bytes:
    """A layout as the many target's input carries it: a names flag byte, the tensor count
    (varint) and the layout table (docs/format.md); ``layout`` may be a :func:`raw_layout`."""
    from codec.manyframe import put_varint

    out = bytearray([layout.names is not None])
    put_varint(out, len(layout))
    return bytes(out) + layout.table()


def layout_of_prefix(prefix: bytes):
    """The :class:`codec.Layout` of a :func:`layout_prefix` (CorruptFrameError if it is not
    one); one whose names repeat, which the constructor refuses, as a :func:`raw_layout`."""
    from codec.errors import CorruptFrameError
    from codec.manyframe import Cursor, Layout, read_table

    mv = memoryview(prefix)
    if not mv.nbytes or mv[0] > 1:
        raise CorruptFrameError("layout prefix: bad names flag")
    cur = Cursor(mv, 1, mv.nbytes)
    count = cur.varint("the tensor count")
    if count > mv.nbytes:
        raise CorruptFrameError("layout prefix: too many tensors")
    shapes, dts, names = read_table(cur, count, bool(mv[0]))
    if cur.pos != mv.nbytes:
        raise CorruptFrameError("layout prefix: trailing bytes")
    names = None if names is None else tuple(names)
    if names is not None and len(set(names)) != len(names):  # the constructor refuses it: the parser must too
        return raw_layout(shapes, dts, names)
    return Layout(tuple(shapes), tuple(dts), names)


def raw_layout(shapes, dtypes, names=None):
    """A :class:`codec.Layout` built without its constructor (so without its checks: repeated
    names, say), as a layout can reach the parser by another route (``object.__new__``, a
    subclass, ``copy``): what the many target hands ``decode_many`` to check that the parser
    checks every layout it meets itself."""
    from codec.manyframe import Layout

    lay = object.__new__(Layout)
    for k, v in (("shapes", tuple(tuple(s) for s in shapes)), ("dtypes", tuple(dtypes)), ("names", None if names is None else tuple(names))):
        object.__setattr__(lay, k, v)
    return lay


def layout_fields(prefix: bytes):
    """``(shapes, dtypes, names)`` of a :func:`layout_prefix`, or None when it is not one."""
    from codec.errors import CodecError

    try:
        lay = layout_of_prefix(prefix)
    except CodecError:
        return None
    return [list(s) for s in lay.shapes], list(lay.dtypes), None if lay.names is None else list(lay.names)


def join_many(prefix: bytes, frame: bytes) -> bytes:
    """A many target input: u32 length of the layout prefix, the prefix, the frame."""
    return struct.pack("<I", len(prefix)) + prefix + frame


def split_many(data: bytes):
    """``(prefix, frame)`` of a many target input, or None when it is too short for its prefix."""
    if len(data) < 4:
        return None
    (n,) = struct.unpack_from("<I", data, 0)
    if 4 + n > len(data):
        return None
    return data[4 : 4 + n], data[4 + n :]
