"""gradcodec: framework-agnostic gradient compression into self-describing byte frames.

>>> import codec, numpy as np
>>> c = codec.get_codec("fp16")
>>> frame = c.encode(np.ones(4, np.float32))
>>> codec.decode(frame)
array([1., 1., 1., 1.], dtype=float32)

Importing this package imports no Numba kernel and compiles nothing: kernels load on first use.
"""

from __future__ import annotations

from codec.errors import CodecError, CorruptFrameError, UnknownCodecError
from codec.feedback import ErrorFeedback
from codec.frame import parse_frame as _parse_frame
from codec.manyframe import Layout
from codec.decoding import decode, decode_add_many, decode_many, decode_sparse, decode_sparse_many
from codec.assembly import list_codecs
from codec.pipeline import Codec, get_codec
from codec.spec import format_spec, parse as parse_spec  # for transports: docs/api.md, "For transports"
from codec import stages as _stages  # noqa: F401  (registers every stage: codec/stages/<kind>/)

__version__ = "0.1.0"

__all__ = [
    "Codec",
    "CodecError",
    "CorruptFrameError",
    "ErrorFeedback",
    "Layout",
    "UnknownCodecError",
    "decode",
    "decode_add_many",
    "decode_many",
    "decode_sparse",
    "decode_sparse_many",
    "format_spec",
    "get_codec",
    "inspect",
    "list_codecs",
    "parse_spec",
]


def inspect(frame, *, layout=None) -> dict:
    """The validated header of ``frame`` as a dict (nothing is decoded).

    Keys: ``format_version``, ``codec`` (canonical spec), ``dtype``, ``shape``, ``elements``,
    ``payload_checksum`` (``"crc32c"``, ``"crc32"`` or None), ``header_bytes``, ``payload_bytes``, ``frame_bytes``, and
    ``sections``: a list of {kind, encoding, bits, count, raw_bytes, stored_bytes}.

    A many-tensor frame (format v2) gives ``format_version`` 2, ``codec``,
    ``payload_checksum``, ``header_bytes``, ``payload_bytes``, ``frame_bytes``, ``layout``
    ("table" or "hash"), ``compressed`` (the payload is one zstd frame), ``joint`` and
    ``tensors``: per tensor {name, dtype, shape, elements, sections}; a joint frame has one
    ``sections`` list, its concatenation's, beside them.  A hash-form frame needs ``layout=``.
    """
    from codec.manyframe import is_many

    if is_many(frame):
        return _inspect_many(frame, layout)
    fr = _parse_frame(frame)
    payload = sum(s.stored_len for s in fr.sections)
    return {
        "format_version": fr.version,
        "codec": fr.spec,
        "dtype": fr.dtype.name,
        "shape": list(fr.shape),
        "elements": fr.n,
        "payload_checksum": fr.checksum,
        "header_bytes": fr.header_len,
        "payload_bytes": payload,
        "frame_bytes": fr.header_len + payload,
        "sections": [_section(s) for s in fr.sections],
    }


def _section(s) -> dict:
    return {
        "kind": s.kind_name,
        "encoding": "zstd" if s.encoding else "raw",
        "bits": s.bits,
        "count": s.count,
        "raw_bytes": s.raw_len,
        "stored_bytes": s.stored_len,
    }


def _inspect_many(frame, layout=None) -> dict:
    from codec.manyframe import FLAG_LAYOUT_HASH, FLAG_ZSTD, parse_many

    mf = parse_many(frame, layout=layout)
    lay = mf.layout
    info = {
        "format_version": 2,
        "codec": mf.spec,
        "payload_checksum": mf.checksum,
        "layout": "hash" if mf.flags & FLAG_LAYOUT_HASH else "table",
        "compressed": bool(mf.flags & FLAG_ZSTD),
        "joint": mf.joint,
        "header_bytes": mf.header_len,
        "payload_bytes": mf.stored_len,
        "frame_bytes": mf.header_len + mf.stored_len,
        "tensors": [
            {"name": None if lay.names is None else lay.names[i], "dtype": lay.dtypes[i].name, "shape": list(lay.shapes[i]), "elements": lay.sizes[i]}
            for i in range(len(lay))
        ],
    }
    if mf.joint:  # one set of sections: the concatenation's
        info["sections"] = [_section(s) for s in mf.tensor_sections[0]]
    else:
        for t, secs in zip(info["tensors"], mf.tensor_sections):
            t["sections"] = [_section(s) for s in secs]
    return info
