"""Frame format v2: many tensors in one frame (docs/format.md, "Many-tensor frames").

A v2 frame holds every tensor of a step (a model's gradients) coded by one codec: the spec
once, then a compact table, then one payload.  Per tensor the frame carries its dtype and
shape (or nothing, in the layout-hash form) and, per section, only its item count as a
varint: the kind and item width of a tensor's sections are named once per distinct
*pattern* in a small pattern table, which also says which counts are derived (the same as an
earlier section's, or 1) and so not written per tensor.  Every section's raw bytes follow in tensor order; a
``zstd`` stage compresses the whole payload as one zstd frame.

Two forms:

* **table** (the default): the layout (dtype and shape of every tensor, and their names when
  the frame was encoded from a dict) is written in the frame; the frame decodes alone.
* **hash**: the layout is replaced by its 8-byte BLAKE2b hash (:attr:`Layout.hash`); for
  peers that already agreed on the layout (the transport checks it every step), decoding
  needs the layout and refuses a frame whose hash differs.

``parse_many`` validates the whole header, in the documented order and before allocating
anything in proportion to a declared size, and raises :class:`CorruptFrameError` with a
one-line reason at the first failure.  The same magic starts v1 and v2 frames; the version
byte tells them apart.

The package, one job a module: ``wire`` (the version, flags, varints and the bounded header
cursor), ``table`` (:class:`Layout`: the tensors, the table form and its hash), ``build``
(:func:`build_many`), ``parse`` (:func:`parse_many`, :class:`ManyFrame`), ``zstd`` (the
payload decompressed as the stages read it).
"""

from codec.manyframe.build import Entry, build_many
from codec.manyframe.parse import Header, ManyFrame, is_many, parse_many, read_header
from codec.manyframe.table import Layout, as_layout, read_table
from codec.manyframe.wire import (
    FLAG_DERIVED,
    FLAG_JOINT,
    FLAG_LAYOUT_HASH,
    FLAG_NAMES,
    FLAG_ZSTD,
    HASH_SIZE,
    MAX_SECTIONS,
    VERSION,
    Cursor,
    put_varint,
)
from codec.manyframe.zstd import ZstdPayload

__all__ = [
    "Cursor",
    "Entry",
    "FLAG_DERIVED",
    "FLAG_JOINT",
    "FLAG_LAYOUT_HASH",
    "FLAG_NAMES",
    "FLAG_ZSTD",
    "HASH_SIZE",
    "Header",
    "Layout",
    "MAX_SECTIONS",
    "ManyFrame",
    "VERSION",
    "ZstdPayload",
    "as_layout",
    "build_many",
    "is_many",
    "parse_many",
    "put_varint",
    "read_header",
    "read_table",
]
