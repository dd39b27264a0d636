"""A many-tensor frame's layout: the dtype, shape and name of every tensor, the table form
that writes them (:meth:`Layout.table`), its 8-byte hash (the layout-hash form) and the reader
of the table (:func:`read_table`)."""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

import numpy as np

from codec import dtypes
from codec.ops import offsets
from codec.errors import CodecTypeError, CodecValueError, CorruptFrameError
from codec.frame import MAX_NDIM
from codec.manyframe.wire import HASH_SIZE, Cursor, put_varint


@dataclass(frozen=True)
class Layout:
    """The dtype and shape of every tensor of a many-tensor frame, in order, and their names
    (None for a frame encoded from a list).  ``Layout.of(tensors)`` reads it off arrays;
    :attr:`hash` is what the layout-hash form stores."""

    shapes: tuple
    dtypes: tuple
    names: tuple | None = None

    def __post_init__(self):
        if len(self.shapes) != len(self.dtypes) or (self.names is not None and len(self.names) != len(self.shapes)):
            raise CodecValueError("layout: shapes, dtypes and names must have one entry per tensor")
        if not self.names_unique:  # a dict of the decoded tensors would silently drop one (issue 28)
            raise CodecValueError(f"names: {self.repeated!r} appears twice; a layout's tensor names must be unique")

    def __getstate__(self):  # the fields only: never a cached hash, table or check
        return (self.shapes, self.dtypes, self.names)

    def __setstate__(self, state):
        """Unpickling checks the fields as the constructor does (a pickle of a Layout made
        before ``__getstate__`` carries its ``__dict__``, cached values included: only the
        fields are kept)."""
        shapes, dtypes, names = (state["shapes"], state["dtypes"], state.get("names")) if isinstance(state, dict) else state
        for k, v in (("shapes", shapes), ("dtypes", dtypes), ("names", names)):
            object.__setattr__(self, k, v)
        self.__post_init__()

    @functools.cached_property
    def sizes(self) -> tuple:
        """Elements per tensor."""
        return tuple(math.prod(s) for s in self.shapes)

    @functools.cached_property
    def starts(self) -> np.ndarray:
        """Where each tensor starts in the flat concatenation, and the total: ``len + 1`` int64."""
        out = offsets(self.sizes)
        out.flags.writeable = False  # a Layout is shared (the recent tables' cache, several frames)
        return out

    @functools.cached_property
    def at(self) -> tuple:
        """:attr:`starts` as Python ints, for indexing tensor by tensor."""
        return tuple(self.starts.tolist())

    @classmethod
    def of(cls, tensors, names=None) -> "Layout":
        """The layout of ``tensors``: a dict name -> array (names kept), or a sequence of arrays
        with the optional ``names`` (a sequence of str); anything with ``shape`` and ``dtype``."""
        if isinstance(tensors, dict):
            names, tensors = tuple(tensors), tensors.values()
        arrays = tuple(tensors)
        lay = cls(
            tuple(tuple(int(d) for d in a.shape) for a in arrays),
            tuple(np.dtype(a.dtype) for a in arrays),
            None if names is None else tuple(names),
        )
        return _recent_of(lay) if names is None or all(isinstance(k, str) for k in lay.names) else lay


    def __len__(self) -> int:
        return len(self.shapes)

    def table(self) -> bytes:
        """The layout's bytes as the table form writes them (docs/format.md); computed once."""
        return self._table

    @functools.cached_property
    def _table(self) -> bytes:
        out = bytearray()
        for i, (shape, dt) in enumerate(zip(self.shapes, self.dtypes)):
            out.append(dtypes.code_of(dt))
            if len(shape) > MAX_NDIM:
                raise CodecValueError(f"tensors[{i}]: {len(shape)} dimensions; the frame format allows {MAX_NDIM}")
            out.append(len(shape))
            for d in shape:
                put_varint(out, d)
            if self.names is not None:
                name = self.names[i]
                if not isinstance(name, str):
                    raise CodecTypeError(f"tensors: a name must be a str, got {type(name).__name__}")
                b = name.encode("utf-8")
                put_varint(out, len(b))
                out += b
        return bytes(out)

    @functools.cached_property
    def largest(self) -> int:
        """The largest product of a tensor's non-zero dimensions (what
        :func:`codec.frame.check_dims` bounds), 0 for no tensors; computed once."""
        return max((math.prod(d for d in s if d) for s in self.shapes), default=0)

    @functools.cached_property
    def names_unique(self) -> bool:
        """Whether no name appears twice (True without names); computed once.  A Layout made
        by its constructor or unpickled always has unique names; :func:`parse_many` checks
        every layout it meets (one read from a table, or built some other way)."""
        return self.repeated is None

    @property
    def repeated(self):
        """The first name that appears a second time, or None."""
        seen = set()
        for name in self.names or ():
            try:
                if name in seen:
                    return name
                seen.add(name)
            except TypeError:  # unhashable: not a str
                raise CodecTypeError(f"names: a name must be a str, got {type(name).__name__}") from None
        return None

    @functools.cached_property
    def hash(self) -> bytes:
        """BLAKE2b-64 of :meth:`table`, prefixed by the tensor count (as a varint); computed once."""
        head = bytearray()
        put_varint(head, len(self))
        return hashlib.blake2b(bytes(head) + self.table(), digest_size=HASH_SIZE).digest()


@functools.lru_cache(maxsize=8)
def _recent_of(layout: Layout) -> Layout:
    """The first of the last few layouts read off tensors that equals ``layout``: a training
    loop encodes the same model every step, and the layout found again keeps its table, hash
    and sizes, computed once (200 tensors: the table ~0.6 ms a step)."""
    return layout


def as_layout(layout) -> Layout:
    """``layout`` as a :class:`Layout`: one already, or tensors to read it off."""
    if isinstance(layout, Layout):
        return layout
    if isinstance(layout, (dict, list, tuple)):
        return Layout.of(layout)
    raise CodecTypeError(f"layout: expected a codec.Layout or the tensors (dict or list), got {type(layout).__name__}")


#: the layouts of the latest tables read, most recent first, as ``(table bytes, named,
#: Layout)``: a training loop decodes the same model's table every step, and the bytes
#: that gave a layout once give it again (a table is read deterministically)
_RECENT: tuple = ()
_RECENT_MAX = 8


def read_layout(cur: Cursor, count: int, named: bool) -> Layout:
    """The :class:`Layout` of ``count`` tensors from a layout table at ``cur`` (advanced past
    it).  A table whose bytes equal one of the last few read is that layout again, found by
    one comparison of bytes instead of a field-by-field read (200 tensors: ~0.8 ms -> ~1
    us), with its cached hash, sizes and checks."""
    global _RECENT
    mv, pos = cur.mv, cur.pos
    for entry in _RECENT:
        raw, was_named, lay = entry
        if was_named == named and len(lay) == count and mv[pos : pos + len(raw)] == raw:
            cur.pos = pos + len(raw)
            if entry is not _RECENT[0]:
                _RECENT = (entry,) + tuple(e for e in _RECENT if e is not entry)
            return lay
    shapes, dts, names = read_table(cur, count, named)
    lay = _unchecked(tuple(shapes), tuple(dts), None if names is None else tuple(names))
    _RECENT = ((bytes(mv[pos : cur.pos]), named, lay),) + _RECENT[: _RECENT_MAX - 1]
    return lay


def _unchecked(shapes: tuple, dts: tuple, names) -> Layout:
    """A Layout of a table's fields, one entry each by construction, its names not yet
    checked: a table whose names repeat is a corrupt frame, which :func:`parse_many` says
    after the header's CRC (docs/format.md, "Validation order"), not a bad argument."""
    lay = object.__new__(Layout)
    for k, v in (("shapes", shapes), ("dtypes", dts), ("names", names)):
        object.__setattr__(lay, k, v)
    return lay


def read_table(cur: Cursor, count: int, named: bool):
    """``(shapes, dtypes, names)`` of ``count`` tensors from a layout table at ``cur``."""
    shapes, dts, names = [], [], [] if named else None
    for i in range(count):
        code = cur.byte("a tensor's dtype")
        ndim = cur.byte("a tensor's ndim")
        if code not in dtypes.CODES or ndim > MAX_NDIM:
            raise CorruptFrameError(f"tensor {i}: unknown dtype code {code} or ndim {ndim} beyond {MAX_NDIM}")
        dts.append(dtypes.CODES[code])
        shapes.append(tuple(cur.varint("a dimension") for _ in range(ndim)))
        if named:
            raw_name = bytes(cur.take(cur.varint("a name length"), "a name"))
            try:
                names.append(raw_name.decode("utf-8"))
            except UnicodeDecodeError:
                raise CorruptFrameError(f"tensor {i}: name is not UTF-8") from None
    return shapes, dts, names
