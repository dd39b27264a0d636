"""Frame size bounds known before encoding: :meth:`codec.Codec.max_frame_bytes` and
:meth:`codec.Codec.max_frame_bytes_many`.

A buffer of the bound's size, allocated once, holds every frame the codec makes of an array
of that shape and dtype (at that step: a scheduled ratio changes the bound), whatever its
values: a training loop, or a transport that needs equal sizes on every rank (an
``all_gather`` of frames, a device buffer for ``encode(out=)``), allocates from it.

The bound adds up what the stages declare (:meth:`codec.stage.Stage.bound`: each stage's most
sections and raw bytes, for a select or transform stage the most values it hands on) to the
header of the format:

* v1 (``encode``): the header length is exact for a section count
  (:func:`codec.frame.header_length`), the payload is the sections' raw bytes;
* v2 (``encode_many``): the layout's table or hash is exact; each tensor's entry (pattern
  id, its counts) and pattern are bounded by their most bytes as varints; a zstd payload
  adds at most its 10-byte raw length.

Byte stages never make a section larger: ``zstd`` keeps a section (v1) or the payload (v2)
raw unless compressing shrinks it, and ``crc32`` takes the payload checksum's 4 bytes.
docs/api.md ("Frame size bounds") says how tight the bounds are for each codec family.
"""

from __future__ import annotations

import numpy as np

from codec.context import Context, check_step
from codec.stage import Bound

__all__ = ["described", "described_many", "frame_bound", "many_bound", "varint_length"]

#: a v2 header's fixed part (magic, version, flags, reserved) and the CRCs (header, payload)
_V2_FIXED = 8
_CRCS = 8


def varint_length(v: int) -> int:
    """Bytes of ``v`` (>= 0) as an unsigned LEB128 varint (:func:`codec.manyframe.wire.put_varint`)."""
    return max(1, (int(v).bit_length() + 6) // 7)


def described(x, dtype=None, argname: str = "x") -> tuple:
    """``(shape, dtype)`` of ``x`` without reading its values: a NumPy or device array (CuPy,
    a Numba device array, a CUDA torch tensor) as it is, anything else as
    :func:`codec.dtypes.as_float_array` takes it (``dtype`` reinterprets raw buffers)."""
    from codec.dtypes import NAMES, as_float_array, on_device, resolve_dtype

    if dtype is None and (isinstance(x, np.ndarray) or on_device(x)) and hasattr(x, "shape"):
        name = str(x.dtype).removeprefix("torch.")  # (a torch dtype prints as torch.float32)
        return tuple(int(d) for d in x.shape), NAMES[name] if name in NAMES else resolve_dtype(x.dtype, argname)
    a = as_float_array(x, dtype, argname)
    return a.shape, a.dtype


def described_many(tensors, argname: str = "tensors", skip_missing: bool = False):
    """The :class:`codec.manyframe.Layout` of ``tensors`` (what ``encode_many`` takes:
    :func:`codec.many.many_items`; each through :func:`described`), or ``tensors`` itself
    when it is a Layout."""
    from codec.many import many_items
    from codec.manyframe import Layout

    if isinstance(tensors, Layout):
        return tensors
    names, values = many_items(tensors, argname, skip_missing)
    got = [described(v, None, f"{argname}[{k!r}]") for k, v in zip(names if names is not None else range(len(values)), values)]
    return Layout(tuple(s for s, _ in got), tuple(d for _, d in got), names)


def tensor_bound(c, shape: tuple, dtype, step: int) -> Bound:
    """The most sections and raw bytes ``c``'s stages make for one array of ``shape`` and
    ``dtype`` at ``step``."""
    ctx = Context(tuple(int(d) for d in shape), np.dtype(dtype), step=step)
    first = c.transform or c.select
    if first is None:
        return c.value.bound(ctx)
    own = first.bound(ctx)
    return own + c.value.bound(own.values)


def frame_bound(c, shape: tuple, dtype, step: int = 0) -> int:
    """The most bytes of a v1 frame ``c.encode`` makes of an array of ``shape`` and ``dtype``."""
    from codec.frame import header_length

    b = tensor_bound(c, shape, dtype, check_step(step))
    spec_len = len(c.spec.encode("utf-8"))
    return header_length(len(shape), spec_len, b.sections, c._frame_options.get("checksum") is not None) + b.nbytes


def many_bound(c, layout, step: int = 0, form: str = "table", joint: bool = False) -> int:
    """The most bytes of a v2 frame ``c.encode_many`` makes of tensors of ``layout`` (a
    :class:`codec.manyframe.Layout`); ``form`` and ``joint`` as ``encode_many`` takes them."""
    from codec.errors import CodecValueError

    if form not in ("table", "hash"):
        raise CodecValueError(f"layout: expected 'table' or 'hash', got {form!r}")
    step = check_step(step)
    if joint:
        if len(set(layout.dtypes)) > 1:
            raise CodecValueError("tensors: a joint frame's tensors must share one dtype")
        entries = [tensor_bound(c, (sum(layout.sizes),), layout.dtypes[0] if len(layout) else np.float32, step)]
    else:
        entries = [tensor_bound(c, shape, dtype, step) for shape, dtype in zip(layout.shapes, layout.dtypes)]
    spec_len = len(c.spec.encode("utf-8"))
    head = _V2_FIXED + varint_length(spec_len) + spec_len + varint_length(len(layout))
    head += 8 if form == "hash" else len(layout.table())
    pid = varint_length(max(len(entries) - 1, 0))  # a pattern id: fewer patterns than entries
    head += varint_length(len(entries))  # the pattern count, then each pattern: S and (kind, bits) per section
    payload = 0
    for b in entries:
        head += 1 + 2 * b.sections + pid + b.sections * varint_length(8 * b.nbytes)  # a count <= 8 x its raw bytes
        payload += b.nbytes
    if c._frame_options.get("compressor") is not None:  # a zstd payload writes its raw length
        head += varint_length(payload)
    return head + _CRCS + payload
