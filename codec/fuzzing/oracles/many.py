"""The many-tensor frame oracle: an input is a trusted layout (what the receiver knows, as
the transport knows its step's layout) and a frame (format v2, either form).

``codec.inspect`` and ``codec.decode_many`` must agree on acceptance; an accepted frame's
tensors must have the layout's shapes and dtypes, ``decode_many(out=)`` must equal
``decode_many``, ``decode_add_many`` into zeros must equal it, and ``decode_sparse_many``
(a sparse codec) must agree with it."""

from __future__ import annotations

import numpy as np

import codec
from codec.errors import CodecError, CorruptFrameError
from codec.fuzzing.findings import MAX_ELEMENTS, MEMORY_FLOOR, Finding, Outcome, _Calls
from codec.fuzzing.formats import layout_of_prefix, split_many
from codec.fuzzing.oracles.common import _check_plain, _same_nan_aware, _same_values

#: what a refusal may raise: a CodecError (a damaged frame, a codec this installation lacks,
#: or a layout the frame does not match, named ``layout``); anything else is a finding
_EXPECT = (CodecError,)


def check_many(data, calls: _Calls) -> Outcome:
    parts = split_many(bytes(data))
    if parts is None:
        return Outcome("invalid", "short")
    prefix, frame = parts
    try:
        layout = layout_of_prefix(prefix)
    except CorruptFrameError:
        return Outcome("invalid", "layout")
    declared = min(sum(layout.sizes), MAX_ELEMENTS)
    bound = max(MEMORY_FLOOR, 4 * declared * 8 + 64 * len(frame))
    info, err = calls.call("inspect", codec.inspect, frame, layout=layout, expect=_EXPECT, mem_bound=bound)
    dec, derr = calls.call("decode_many", codec.decode_many, frame, layout=layout, max_elements=MAX_ELEMENTS, expect=_EXPECT, mem_bound=bound)
    if err is not None:
        if dec is not None:
            raise Finding("inspect refused a many-tensor frame that decode_many accepted", str(err)[:200])
        return Outcome("rejected", type(err).__name__)
    if dec is None:
        if isinstance(derr, CorruptFrameError) and "limit" in str(derr):
            return Outcome("rejected", "over-limit")
        return Outcome("rejected", type(derr).__name__)
    arrays = list(dec.values()) if isinstance(dec, dict) else dec
    # a dict carries the frame's names: the layout's when it names its tensors (a table-form
    # frame may name them where the given layout does not)
    if len(arrays) != len(layout) or (isinstance(dec, dict) and layout.names is not None and tuple(dec) != layout.names):
        raise Finding("decode_many returned another set of tensors than the layout's")
    for i, (a, shape, dt) in enumerate(zip(arrays, layout.shapes, layout.dtypes)):
        _check_plain(a, f"decode_many's tensor {i}", dtype=dt, shape=shape)
        if info["tensors"][i]["shape"] != list(shape):
            raise Finding("inspect's shape differs from decode_many's")
    out = [np.empty(a.shape, a.dtype) for a in arrays]
    res, oerr = calls.call("decode_many(out=)", codec.decode_many, frame, out=out, layout=layout, expect=_EXPECT, mem_bound=bound)
    if oerr is not None:
        raise Finding("decode_many(out=) refused a frame decode_many accepted", f"{type(oerr).__name__}: {oerr}"[:200])
    if res is not out or not all(_same_nan_aware(o, a) for o, a in zip(out, arrays)):
        raise Finding("decode_many(out=) differs from decode_many")
    acc = [np.zeros(a.shape, a.dtype) for a in arrays]
    res, aerr = calls.call("decode_add_many", codec.decode_add_many, frame, acc, layout=layout, expect=_EXPECT, mem_bound=bound)
    if aerr is not None:
        raise Finding("decode_add_many refused a frame decode_many accepted", f"{type(aerr).__name__}: {aerr}"[:200])
    if not all(_same_values(s, a) for s, a in zip(acc, arrays)):
        raise Finding("decode_add_many into zeros differs from decode_many", info["codec"])
    if codec.get_codec(info["codec"]).select is not None:
        pairs, serr = calls.call("decode_sparse_many", codec.decode_sparse_many, frame, layout=layout, expect=_EXPECT, mem_bound=bound)
        if serr is not None:
            raise Finding("decode_sparse_many refused a frame decode_many accepted", str(serr)[:200])
        for (pos, vals), a in zip(pairs, arrays):
            dense = np.zeros(a.size, a.dtype)
            dense[pos] = vals.astype(a.dtype)
            if not _same_values(dense.reshape(a.shape), a):
                raise Finding("decode_sparse_many disagrees with decode_many", info["codec"])
    return Outcome("ok", "ok")
