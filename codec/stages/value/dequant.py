"""A parsed quantizer payload (:class:`Dequant`) and its decode into arrays: one tensor's or
a run's codes through the ``dequant`` kernels, stored, added or subtracted, the frame's
payload check (CRC-32C and code fields) completed in the same pass where the decode is
given one (docs/api.md, "When the check runs").  What every quantizer's ``write`` and
``write_segments`` run (:class:`codec.stages.value.quantizer.Quantizer`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from codec.device import host_copy
from codec.dtypes import on_device
from codec.errors import CorruptFrameError
from codec.kernels import backend
from codec.modes import SET
from codec.ops import addresses, readonly, round_to, store
from codec.stages.value.sections import check_fields, field_error

__all__ = ["Dequant", "RUN_FIELD", "dequantize", "largest", "top_of", "write", "write_segments"]

#: what reading or decoding a run says of a code field beyond the largest an encoder writes
RUN_FIELD = "values section: a code field beyond {}, the most an encoder writes"

#: ``dequantize_segments``'s ``addrs`` when it writes one array (a run's concatenation)
_NO_ADDRS = np.empty(0, np.int64)
_NO_ADDRS.flags.writeable = False


@functools.lru_cache(maxsize=16)
def top_of(dtype) -> float:
    """The largest finite value of float ``dtype`` (kept per dtype: ``ml_dtypes.finfo`` costs
    ~1.5 µs, and a decode asks it per run)."""
    return float(ml_dtypes.finfo(dtype).max)


def largest(lut_top: float, scale, offset=()) -> float:
    """A bound on |value| over every code a decoder accepts: ``lut_top`` (the largest |lut|
    of those codes) times the largest |scale|, plus the largest |offset|.  A quantizer's value
    can exceed the largest finite value of its dtype (QSGD decodes ``norm * level / s`` and
    the norm of values near float32's maximum exceeds it); such a frame decodes saturated to
    that value, as an fp8 "satfinite" conversion does."""
    top = lut_top * float(np.abs(scale).max(initial=0.0))
    return top + float(np.abs(np.asarray(offset)).max()) if len(offset) else top


@dataclass
class Dequant:
    """A parsed quantizer payload: ``count`` codes of ``bits`` bits packed in ``data`` (raw
    section bytes), ``value_i = lut[code_i] * scale[i // block] (+ offset[...])``; with
    ``trits``, ``data`` holds five base-3 codes per byte instead."""

    data: np.ndarray
    bits: int
    count: int
    lut: np.ndarray
    block: int
    scale: np.ndarray
    offset: np.ndarray
    dtype: np.dtype
    trits: bool = False
    #: the largest |lut| over the codes a decoder accepts (qsgd's table has entries beyond
    #: its levels, which reading refuses), when the stage knows it: else ``max |lut|``
    lut_top: float | None = None
    #: a many-tensor run (:meth:`Quantizer.read_run`): tensor t's codes start at byte
    #: ``dstarts[t]`` of ``data`` and decode into values ``starts[t]:starts[t+1]`` with blocks
    #: of ``blocks[t]`` values and the factors ``scale``/``offset[sstarts[t]:sstarts[t+1]]``
    #: (``block`` then unused); None for one tensor
    starts: np.ndarray | None = None
    dstarts: np.ndarray | None = None
    blocks: np.ndarray | None = None
    sstarts: np.ndarray | None = None
    #: ``(lut, scale)`` of a second pass for the blocks whose factor is 0 in ``scale`` (a
    #: window below float64's normal range in a frame that also holds one near its top:
    #: rangefloat's ``_exact_factors``); None when one pass decodes every block
    rescue: tuple | None = None
    #: ``(field mask, shift, largest)`` of the code-field check :meth:`Quantizer.read_values_section`
    #: left to the decoding pass (``dequantize_checked``), None when the codes were checked
    limit: tuple | None = None
    #: :attr:`top` once computed
    _top: float | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @property
    def top(self) -> float:
        """:func:`largest` of this payload (0 for no codes); computed once (a pass over the
        scales: a run's write asks it for every tensor's array; a plain attribute, as
        ``functools.cached_property`` takes a lock on every read in Python 3.11)."""
        if self._top is None:
            self._top = 0.0 if not self.count else largest(self.lut_top if self.lut_top is not None else float(np.abs(self.lut).max(initial=0.0)), self.scale, self.offset)
        return self._top


def _direct(p: Dequant, dtype) -> bool:
    """Whether ``p``'s values decode straight into an array of ``dtype``: its own dtype, every
    value within its range, one pass (else :meth:`Quantizer.write` takes a float64 pass)."""
    return dtype == p.dtype and p.rescue is None and p.top <= top_of(p.dtype)


def _checked_unless(p: Dequant, check, mode) -> Dequant:
    """``p`` with its code fields checked now when the read left them to a decoding pass
    (``p.limit``) that will not check them (no payload check, or a decode that adds): a
    CorruptFrameError before anything is written, as reading would have raised."""
    if p.limit is None or (check is not None and mode == SET):
        return p
    if p.starts is None:
        check_fields(p.data, p.bits, p.count, p.limit)
    elif not backend("dequant", p.data).fields_within_segments(readonly(p.data), p.dstarts, p.bits, p.starts, *p.limit):
        raise CorruptFrameError(_field_refusal(p))
    return dataclasses.replace(p, limit=None)


def _field_refusal(p: Dequant) -> str:
    """What reading says of ``p``'s codes, a field of which is beyond ``p.limit``: of a run,
    what reading its first such tensor alone says (as the many-tensor reader does when a
    run refuses: ``codec.readruns``)."""
    if p.starts is None:
        return field_error(p.data, p.bits, p.count, p.limit)
    kern = backend("dequant", p.data)
    for d, n in zip(p.dstarts.tolist(), np.diff(p.starts).tolist()):
        raw = readonly(p.data[d : d + (n * p.bits + 7) // 8])
        if n and not kern.fields_within(raw, p.bits, n, *p.limit):
            return field_error(raw, p.bits, n, p.limit)
    return RUN_FIELD.format(p.limit[2])


def _every_code(p: Dequant) -> np.ndarray:
    """``p``'s table with a value (NaN) for every code of its width: a decode that checks
    the codes as it reads them (``dequantize_checked``) looks a code up before refusing it."""
    missing = (1 << p.bits) - p.lut.size
    return p.lut if missing <= 0 else np.append(p.lut, np.full(missing, np.nan))


def _noted(p: Dequant, check, within, crc) -> None:
    """What a checking decode of ``p`` found, told to the frame's payload check: the CRC-32C
    of the codes' bytes it read, and a code beyond ``p.limit`` (a refusal to raise)."""
    check.note(p.data, crc)
    if not within:
        check.reject(_field_refusal(p))


def write(payload: Dequant, out, mode, check=None) -> None:
    """``out (=|+=|-=)`` the values of ``payload`` (:meth:`Quantizer.write`): straight into
    ``out`` when its dtype is the frame's and every value fits it, else through float64,
    saturated and rounded once; ``check``: the frame's payload check, completed as the codes
    are decoded (:func:`dequantize`)."""
    payload = _checked_unless(payload, check, mode)
    if _direct(payload, out.dtype):
        dequantize(payload, out, mode, check=check)
        return
    wide = np.empty(out.size, np.float64)  # float64 values, rounded once to the frame's dtype
    dequantize(payload, wide, SET, check=check)
    if payload.top > top_of(payload.dtype):  # saturate: finite input never decodes to inf
        np.clip(wide, -top_of(payload.dtype), top_of(payload.dtype), out=wide)
    store(round_to(wide, payload.dtype), out, mode)


def write_segments(payload: Dequant, outs, mode, check=None, addrs=None) -> bool:
    """A run's codes (:meth:`Quantizer.read_run`) decoded into every tensor's own array in one
    parallel kernel call (``dequantize_segments``, each tensor's array by address): the
    values :func:`write` gives.  False when :func:`write` would take its float64 pass (a
    scale beyond the run's dtype, blocks to rescue, arrays of another dtype).  ``addrs``:
    the arrays' addresses, from a caller that has checked each is a C-contiguous array of
    the run's dtype (a replayed decode, ``codec.replayplan``), whose ``outs`` need not be
    flat; None: ``outs`` flat arrays, checked here."""
    p = payload
    if p.starts is None or (addrs is None and any(o.dtype != p.dtype for o in outs)) or not _direct(p, p.dtype):
        return False
    p = _checked_unless(p, check, mode)
    if outs:
        dequantize(p, outs[0].reshape(-1), mode, addresses(outs) if addrs is None else addrs, check)
    return True


def dequantize(p: Dequant, out, mode, addrs=None, check=None) -> None:
    """``out (=|+=|-=)`` the values of ``p`` (``out``'s dtype: :func:`write` rounds); a
    run's payload into one array, or with ``addrs`` into each tensor's own (``out`` then
    the first of them: :func:`write_segments`).  ``check``: the frame's payload check
    (SET into a host array), which one tensor's codes are checksummed for, and their
    fields tested (``p.limit``), as they are decoded."""
    kern = backend("dequant", out)
    if on_device(p.data) and not on_device(out):  # a device frame's codes decoded through a host buffer (a 16-bit frame's float64 values): they cross once

        p = dataclasses.replace(p, data=host_copy(p.data))
    if p.starts is not None:
        args = (readonly(p.blocks), readonly(p.scale), readonly(p.sstarts), readonly(p.offset), out, readonly(_NO_ADDRS if addrs is None else addrs))
        dstarts, starts = readonly(p.dstarts), readonly(p.starts)  # (every input read-only: one signature a dtype)
        if check is not None and mode == SET:
            within, crc = kern.dequantize_segments_checked(readonly(p.data), dstarts, p.bits, starts, readonly(_every_code(p)), *args, *(p.limit or (0, 0, 0)), 0)
            _noted(p, check, within, crc)
        else:
            kern.dequantize_segments(readonly(p.data), dstarts, p.bits, starts, readonly(p.lut), *args, mode)
    elif p.trits:
        kern.trits_dequantize(readonly(p.data), p.count, readonly(p.lut * p.scale[0]), out, mode)
    else:
        if check is not None and mode == SET:
            args = (readonly(_every_code(p)), max(1, p.block), readonly(p.scale), readonly(p.offset))
            within, crc = kern.dequantize_checked(readonly(p.data), p.bits, p.count, *args, out, *(p.limit or (0, 0, 0)), 0)
            _noted(p, check, within, crc)
        else:
            args = (readonly(p.lut), max(1, p.block), readonly(p.scale), readonly(p.offset))
            kern.dequantize(readonly(p.data), p.bits, p.count, *args, out, mode)
        if p.rescue is not None:  # (write() passes a float64 buffer and SET here) the rescued blocks' own pass
            lut, scale = p.rescue
            extra = np.empty(p.count, np.float64)
            kern.dequantize(readonly(p.data), p.bits, p.count, readonly(lut), max(1, p.block), readonly(scale), readonly(p.offset), extra, mode)
            mine = np.repeat(scale != 0, max(1, p.block))[: p.count]
            out[mine] = extra[mine]
