"""The frame oracle: inspect, decode, decode(out=), decode_add into zeros, decode_sparse and
odd ``out`` arguments, each against the others.
"""

from __future__ import annotations

import math

import numpy as np

import codec
from codec.errors import CodecError, CorruptFrameError
from codec.fuzzing.findings import MAX_ELEMENTS, MEMORY_FLOOR, Finding, Outcome, _Calls
from codec.fuzzing.formats import split_frame
from codec.fuzzing.oracles.common import _check_plain, _same_nan_aware, _same_values


def _declared(data) -> tuple[int, int]:
    """(declared elements, total raw section bytes) read leniently from a frame's header."""
    f = split_frame(data) if len(data) < (1 << 24) else None
    if f is None:
        return 0, 0
    n = math.prod(f.shape) if len(f.shape) <= 32 else 0
    return n, sum(s[4] for s in f.sections)


def check_frame(data, calls: _Calls, *, extras: bool = True) -> Outcome:
    """The frame oracle (see the module docstring)."""
    n_decl, raw_total = _declared(data)
    sparse_bound = MEMORY_FLOOR + 128 * raw_total
    info, err = calls.call("inspect", codec.inspect, data)
    dec, derr = calls.call("decode", codec.decode, data, max_elements=MAX_ELEMENTS,
                           mem_bound=max(MEMORY_FLOOR, 4 * min(n_decl, MAX_ELEMENTS) * 8))
    if err is not None:  # parse_frame refused it: decode (the same parse) must refuse it too
        if dec is not None:
            raise Finding("inspect refused a frame that decode accepted", str(err)[:200])
        return Outcome("rejected", type(err).__name__)
    sp, serr = calls.call("decode_sparse", codec.decode_sparse, data, expect=(CodecError,), mem_bound=sparse_bound)
    if serr is not None and not isinstance(serr, CodecError) and "not sparse" not in str(serr):
        raise Finding("decode_sparse: ValueError that is not the documented 'not sparse' one", str(serr)[:200])
    if dec is None:
        if isinstance(derr, CorruptFrameError) and "limit" in str(derr) and info["elements"] > MAX_ELEMENTS:
            label = "over-limit"
            if sp is not None:
                _check_sparse(sp, info)
                label = "over-limit (sparse ok)"
            return Outcome("rejected", label)
        return Outcome("rejected", type(derr).__name__)
    _check_plain(dec, "decode's result")
    if list(dec.shape) != info["shape"] or dec.dtype.name != info["dtype"]:
        raise Finding("decode's shape or dtype differs from inspect's", f"{dec.dtype}{dec.shape} vs {info['dtype']}{info['shape']}")
    bound = max(MEMORY_FLOOR, 4 * dec.nbytes)
    out = np.empty(dec.shape, dec.dtype)
    res, oerr = calls.call("decode(out=)", codec.decode, data, out=out, mem_bound=bound)
    if oerr is not None:
        raise Finding("decode(out=) refused a frame decode accepted", f"{type(oerr).__name__}: {oerr}"[:200])
    if res is not out or not _same_nan_aware(out, dec):
        raise Finding("decode(out=) differs from decode")
    c, cerr = calls.call("get_codec", codec.get_codec, info["codec"], expect=(CodecError,))
    if cerr is not None:
        raise Finding("a decodable frame names a spec get_codec refuses", str(cerr)[:200])
    acc = np.zeros(dec.shape, dec.dtype)
    res, aerr = calls.call("decode_add", c.decode_add, data, acc, mem_bound=bound)
    if aerr is not None:
        raise Finding("decode_add refused a frame decode accepted", f"{type(aerr).__name__}: {aerr}"[:200])
    if res is not acc:
        raise Finding("decode_add did not return out")
    if not _same_values(acc, dec):
        bad = np.flatnonzero(acc.reshape(-1).astype(np.float64) != dec.reshape(-1).astype(np.float64))
        raise Finding("decode_add into zeros differs from decode", f"{bad.size} elements, first {bad[:3].tolist()} ({info['codec']})")
    if sp is not None:
        pos, vals = _check_sparse(sp, info)
        dense = np.zeros(dec.size, dec.dtype)
        dense[pos] = vals.astype(dec.dtype)
        if not _same_values(dense.reshape(dec.shape), dec):
            raise Finding("decode_sparse disagrees with decode", info["codec"])
    if extras:
        acc = np.zeros(dec.shape, dec.dtype)
        calls.call("decode_add(subtract=True)", c.decode_add, data, acc, subtract=True, mem_bound=bound)
        if not _same_values(acc, -dec):
            raise Finding("decode_add(subtract=True) into zeros differs from -decode", info["codec"])
        for kind in (bytearray, lambda b: np.frombuffer(bytes(b), np.uint8)):
            again, _ = calls.call("decode(other buffer type)", c.decode, kind(data), expect=(), mem_bound=bound)
            if not _same_nan_aware(again, dec):
                raise Finding("decode differs with the buffer type", info["codec"])
        _check_odd_outs(data, dec, calls)
    return Outcome("ok", "ok")


def _check_sparse(sp, info):
    pos, vals = sp
    if not isinstance(pos, np.ndarray) or not isinstance(vals, np.ndarray) or pos.dtype != np.int64 or pos.ndim != 1 or vals.shape != pos.shape:
        raise Finding("decode_sparse returned malformed arrays", f"{getattr(pos, 'dtype', pos)}, {getattr(vals, 'shape', vals)}")
    if pos.size and (pos[0] < 0 or pos[-1] >= info["elements"] or np.any(np.diff(pos) <= 0)):
        raise Finding("decode_sparse positions not sorted, unique and inside the array")
    want = np.float64 if info["dtype"] == "float64" else np.float32
    if vals.dtype != want:
        raise Finding("decode_sparse values have the wrong dtype", f"{vals.dtype}, expected {np.dtype(want)}")
    return pos, vals


_GUARD = 64


def _odd_outs(dec):
    """``(name, out, buffer, mask of out's elements in buffer)`` for out arguments a caller
    might pass by mistake: a strided view, an np.matrix, a Fortran-order view."""
    n = dec.size
    g = _GUARD
    buf = np.zeros(2 * n + 2 * g, dec.dtype)
    mask = np.zeros(buf.size, bool)
    mask[g : g + 2 * n : 2] = True
    yield "strided out", buf[g : g + 2 * n : 2].reshape(dec.shape), buf, mask
    buf = np.zeros(n + 2 * g, dec.dtype)
    mask = np.zeros(buf.size, bool)
    mask[g : g + n] = True
    yield "np.matrix out", buf[g : g + n].reshape(1, n).view(np.matrix), buf, mask
    if dec.ndim >= 2:
        yield "Fortran-order out", buf[g : g + n].reshape(dec.shape[::-1]).T, buf, mask


def _check_odd_outs(data, dec, calls: _Calls) -> None:
    """``out`` arguments a caller might pass by mistake (np.matrix, strided, Fortran order)
    either raise a CodecError or give decode's result, and never write outside ``out``."""
    if dec.size == 0:
        return
    c = codec.get_codec(codec.inspect(data)["codec"])
    ucode = f"u{dec.itemsize}"
    for name, out, buf, mask in _odd_outs(dec):
        for call, fn in (("decode", codec.decode), ("decode_add", c.decode_add)):
            buf[...] = 7
            out[...] = 0
            guard = buf.view(ucode).copy()
            res, err = calls.call(f"{call}({name})", fn, data, out, expect=(CodecError,))
            changed = buf.view(ucode) != guard
            if np.any(changed & ~mask):
                raise Finding(f"{call} into a {name} wrote outside it", f"{int(np.sum(changed & ~mask))} elements")
            if err is None and not _same_values(np.array(out).reshape(dec.shape), dec):
                raise Finding(f"{call} into a {name} gave a different result")
