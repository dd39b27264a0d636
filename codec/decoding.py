"""Decoding with nothing but the frame: the codec its header names does the work.

``codec.decode``, ``decode_sparse`` (format v1) and ``decode_many``, ``decode_add_many``,
``decode_sparse_many`` (format v2) live here; ``Codec``'s methods of the same names also
check that the frame is theirs.
"""

from __future__ import annotations

from codec import manydecode, replay
from codec.frame import parse_frame
from codec.manyframe import parse_many
from codec.pipeline import codec_of

__all__ = ["decode", "decode_add_many", "decode_many", "decode_sparse", "decode_sparse_many"]


def decode(frame, out=None, *, max_elements=None, like=None):
    """Decode any gradcodec frame with nothing but the frame (the codec is read from its header).

    ``out``: an array to fill (a NumPy array or a CPU torch tensor, bfloat16 included; or a
    device array for the codecs with a CUDA path), written without a copy; else a new array:
    a NumPy array, or with ``like`` a new array of ``like``'s kind: a CPU torch tensor, or on
    the device for a device array (a torch CUDA tensor, a CuPy array, a Numba device array;
    docs/api.md, "Device arrays")."""
    fr = parse_frame(frame, max_elements=max_elements, verify_payload="defer")  # checked as it is decoded
    return codec_of(fr).decode_frame(fr, out, like=like)


def decode_sparse(frame, *, max_elements=None):
    """The ``(positions, values)`` a sparse frame carries, without a dense array.

    ``positions`` are sorted flat int64 indices; ``values`` are the decoded kept values, in the
    frame's dtype (float32 for 16-bit frames, which holds them exactly).  Only frames of a codec
    with a select stage (``topk``, ``adacomp``, ``randomk``, ...) are sparse; any other frame
    raises ``ValueError`` naming ``frame``."""
    fr = parse_frame(frame, max_elements=max_elements)
    return codec_of(fr).decode_sparse_frame(fr)


def decode_many(frame, out=None, *, layout=None, max_elements=None, like=None):
    """Decode a many-tensor frame (:meth:`Codec.encode_many`) with nothing but the frame: a
    dict name -> array when the frame names its tensors, else a list; or fill ``out`` (a dict
    or list of arrays of the frame's dtypes and sizes) and return it.

    ``layout`` (a :class:`codec.Layout`, or the tensors to read it off) is required for a
    frame in the layout-hash form and checked against a frame's table otherwise;
    ``max_elements`` bounds the sum of the tensors' element counts.  Every section of every
    tensor is checked before any output is allocated.  ``like``: the new arrays are of its
    kind, as for :func:`decode` (CPU torch tensors; device arrays on its device)."""
    def parsed():
        mf = parse_many(frame, layout=layout, max_elements=max_elements, verify_payload="defer")  # checked as it is decoded
        return codec_of(mf), mf

    return replay.decode_many(frame, out, parsed, layout=layout, max_elements=max_elements, like=like)  # a header decoded before: replayed (codec.replay)


def decode_sparse_many(frame, *, layout=None, max_elements=None) -> list:
    """Per tensor of a many-tensor frame of a sparse codec, its ``(positions, values)`` as
    :func:`decode_sparse` gives them, in frame order (a list, also for a named frame)."""
    mf = parse_many(frame, layout=layout, max_elements=max_elements)
    return manydecode.decode_sparse(codec_of(mf), mf)


def decode_add_many(frame, out, *, layout=None, subtract: bool = False):
    """``out[i] += decoded[i]`` for every tensor of a many-tensor frame (``-=`` with
    ``subtract=True``); ``out`` a dict or list of arrays of any supported float dtype with
    the tensors' element counts.  Returns ``out``."""
    mf = parse_many(frame, layout=layout)
    return manydecode.decode_add(codec_of(mf), mf, out, subtract)
