"""Array operations the stages share, dispatched to the kernel layer.

Kernels handle float32/float64 buffers; 16-bit floats (float16, bfloat16) are widened to
float32 exactly and narrowed with round-to-nearest-even (kernels ``half_decode``,
``narrow_codes``).  Every
result is the exact one rounded once to the output dtype (float64 and mixed-precision sums go
through round-to-odd, so there is no double rounding).
"""

from __future__ import annotations

import itertools
import threading

import numpy as np

from codec.dtypes import bfloat16, on_device, readonly  # noqa: F401  (readonly: re-exported, the kernels' callers take it from here)
from codec.errors import CodecIndexError, CodecTypeError, CodecValueError
from codec.kernels import backend
from codec.modes import SET
from codec.checksum import crc32c
from codec.device import add as device_add, empty, Memory, to_device, zeros

WIDE = (np.dtype(np.float32), np.dtype(np.float64))
HALF = np.dtype(np.float16)


_SCRATCH = threading.local()



def remember(table: dict, key, value, most: int) -> None:
    """``table[key] = value``, the oldest entry dropped first when ``table`` holds ``most``
    (a dict keeps its insertion order): the bounded caches of recent plans, headers and
    first ``Q``s.  Tolerates another thread's change of ``table`` meanwhile."""
    if key not in table and len(table) >= most:
        try:
            table.pop(next(iter(table)), None)
        except (StopIteration, RuntimeError):  # (another thread's change)
            pass
    table[key] = value

def scratch(n: int, dtype) -> np.ndarray:
    """A flat buffer of ``n`` elements of ``dtype`` owned by the calling thread and reused by
    its next call (contents undefined): for small temporaries made on every call, which a
    fresh allocation would page-fault each time.  Valid until the thread's next ``scratch``
    call for the same dtype."""
    dtype = np.dtype(dtype)
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    buf = bufs.get(dtype)
    if buf is None or buf.size < n:
        buf = bufs[dtype] = np.empty(max(n, 1024), dtype)
    return buf[:n]


def offsets(counts) -> np.ndarray:
    """Where each of ``counts`` starts in their concatenation, then the total: ``len + 1``
    int64 (a run's tensors, sections or finds laid end to end)."""
    if isinstance(counts, np.ndarray):
        out = np.zeros(len(counts) + 1, np.int64)
        np.add.accumulate(counts, out=out[1:], dtype=np.int64)
        return out
    return np.array([0, *itertools.accumulate(counts)], np.int64)  # (a list of a few counts: np.cumsum's wrapper cost more than the sums)


def addresses(arrays) -> np.ndarray:
    """The data address of each of ``arrays`` (host NumPy arrays) as int64: how one segmented
    kernel call finds many separate arrays (``_common.view_at``; the caller keeps them alive
    for the call)."""
    from codec.kernels.cpu._common import address_of

    return np.array([address_of(a) for a in arrays], np.int64)


def first_nonfinite(x: np.ndarray, block: int = 1 << 16) -> int:
    """The flat position of the first NaN/inf in ``x`` (any float dtype, any shape), or -1.

    float32/float64: one vectorised sum (any NaN or inf makes it non-finite; a finite sum
    proves every element finite), then an exact search only when the sum is not finite.
    16-bit floats: the exponent bits, in blocks (no full-size temporary)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    if flat.size == 0:
        return -1
    if flat.dtype.itemsize == 2:  # float16 (exponent 0x7C00) or bfloat16 (0x7F80): all ones is inf/NaN
        limit = 0x7C00 if flat.dtype == HALF else 0x7F80
        bits = flat.view(np.uint16)
        buf = np.empty(min(block, bits.size), np.uint16)
        for at in range(0, bits.size, block):
            part = bits[at : at + block]
            o = buf[: part.size]
            np.bitwise_and(part, 0x7FFF, out=o)
            if int(o.max()) >= limit:
                return at + int(np.argmax(o >= limit))
        return -1
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.add.reduce(flat)):
            return -1
    bad = np.flatnonzero(~np.isfinite(flat))
    return int(bad[0]) if bad.size else -1


def wide_dtype(dtype) -> np.dtype:
    """The dtype kernels compute in for ``dtype``: float64 for float64, else float32 (which
    holds every 16-bit value exactly)."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)


def widen(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 or float64 (16-bit input is widened exactly to float32; others as is),
    where ``x`` lives (a device array's on the device)."""
    if x.dtype in WIDE:
        return x
    if on_device(x):
        out = empty(x.size, np.float32).reshape(x.shape)
        codes = x.reshape(x.size).view(np.uint16)
    else:
        out = np.empty(x.shape, np.float32)
        codes = np.ascontiguousarray(x).reshape(-1).view(np.uint16)
    backend("convert", out).half_decode(readonly(codes), out.reshape(out.size), SET, x.dtype != HALF)
    return out


def narrow(x: np.ndarray, dtype, out: np.ndarray | None = None, crc: int | None = None) -> tuple[np.ndarray, int, int | None]:
    """16-bit codes (uint16) of float ``x`` in ``dtype`` (float16 or bfloat16), round to nearest even.

    Returns ``(codes, nonfinite_count, crc)``; ``codes`` is ``out`` when given (uint16, x's size),
    so a caller can write straight into a frame.  float64 input is rounded to odd first, so
    the result is correctly rounded (no double rounding).  ``crc``: the CRC-32C to continue
    over the codes' bytes (a frame's payload checksum, computed by the kernel while the codes
    are in cache where the CPU allows); the third result is then the continued CRC, else None.
    """
    dtype = np.dtype(dtype)
    flat = np.ascontiguousarray(x).reshape(-1)
    if out is None:
        out = np.empty(flat.size, np.uint16)
    elif out.dtype != np.uint16 or out.size != flat.size or not out.flags.c_contiguous:  # the kernel writes (and checksums) its memory
        raise CodecValueError(f"out: expected a C-contiguous uint16 array of {flat.size} codes, got {out.dtype} {out.shape}")
    if flat.dtype == dtype:  # the codes are the bits; NaN/inf have every exponent bit set
        out[:] = flat.view(np.uint16)
        exponent = np.uint16(0x7C00 if dtype == HALF else 0x7F80)
        return out, int(np.count_nonzero((out & exponent) == exponent)), continued(out, crc, -1)
    bad, got = backend("convert", flat).narrow_codes(readonly(widen(flat)), out, dtype != HALF, -1 if crc is None else crc)
    return out, int(bad), continued(out, crc, got)


def continued(out: np.ndarray, crc: int | None, got: int) -> int | None:
    """What a kernel asked to continue the CRC-32C ``crc`` over its output ``out`` gives back:
    its result ``got``, or (-1: it could not, e.g. no CRC instruction) one pass over ``out``;
    None when no CRC was asked."""
    if crc is None:
        return None
    if got >= 0:
        return int(got)

    return crc32c(out, crc)


def round_to(x, dtype) -> np.ndarray:
    """float ``x`` (any shape) rounded once, to nearest even, to ``dtype`` (NumPy's astype
    goes float64 -> float32 -> bfloat16, which can round twice)."""
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    if dtype in WIDE or x.dtype == dtype:
        return x.astype(dtype)
    return narrow(x, dtype)[0].view(dtype).reshape(x.shape)


def store(src: np.ndarray, out: np.ndarray, mode: int) -> None:
    """``out (=|+=|-=) src`` elementwise for any supported float dtypes (``out`` C-contiguous).

    The result is the exact ``out +- src`` (or ``src``) correctly rounded, once, to ``out``'s
    dtype: 16-bit outputs and float64 sources into float32 outputs sum in float64 rounded to
    odd (kernels ``half_combine``, ``combine_odd``), so no intermediate rounding can land on a
    tie of the output format.
    """
    if src.size != out.size:
        raise CodecValueError(f"src: {src.size} elements for an output of {out.size}")
    if on_device(out):  # a device output (codec.device.checked_out: contiguous): the source's one copy there

        flat = out.reshape(out.size)  # float16/float32/float64 (codec.device.DTYPES)
        if mode == SET and src.dtype == flat.dtype and not on_device(src):
            if src.size:  # one copy, no kernel (Numba refuses an empty one's strides)
                flat.copy_to_device(np.ascontiguousarray(src).reshape(-1))
            return
        src = to_device(src).reshape(src.size)
    elif not out.flags.c_contiguous:
        raise CodecValueError("out: must be C-contiguous")
    else:
        src = np.ascontiguousarray(src).reshape(-1)
        flat = out.reshape(-1)
    kern = backend("convert", flat)
    if flat.dtype in WIDE:
        if src.dtype not in WIDE:  # 16-bit source: converted and combined in one pass
            kern.half_decode(readonly(src.view(np.uint16)), flat, mode, src.dtype != HALF)
        elif mode != SET and flat.dtype == np.float32 and src.dtype == np.float64:
            kern.combine_odd(readonly(src), flat, mode)
        else:
            kern.combine(readonly(src), flat, mode)
        return
    codes = flat.view(np.uint16)
    if mode == SET:
        if src.dtype == flat.dtype:
            codes[...] = src.view(np.uint16)
        else:
            codes[...] = narrow(src, flat.dtype)[0]
        return
    kern.half_combine(readonly(widen(src)), codes, mode, flat.dtype != HALF)


def add(x, r, out):
    """``out = x + r`` elementwise in their dtype, host or device arrays alike (the
    error-feedback sum ``acc = x + residual``), in one parallel pass (the ``convert``
    family's ``add``; NumPy's ``np.add``, on one thread, for host arrays the kernel does not
    take: 16-bit, mixed dtypes, not C-contiguous); returns ``out``."""
    if on_device(out):
        device_add(x, r, out)
        return out
    if out.dtype not in WIDE or x.dtype != out.dtype or r.dtype != out.dtype or x.size != out.size or r.size != out.size or not all(type(a) is np.ndarray and a.flags.c_contiguous for a in (x, r, out)):
        return np.add(x, r, out=out)
    backend("convert", out).add(readonly(x.reshape(-1)), readonly(r.reshape(-1)), out.reshape(-1))
    return out


def momentum(u, m, x, out=None):
    """DGC's velocity step ``m * u + x`` in x's dtype, the product rounded before the sum, into
    ``out`` (x's size, where ``x`` lives) or a new array of x's shape (``u`` None: zeros, so
    the result is ``x``'s values; ``m`` a scalar of x's dtype): the ``convert`` family's
    ``momentum`` kernel for float32/float64 (and float16 device arrays, which its CUDA twin
    takes), NumPy's two operations for 16-bit host floats (which the CPU kernel does not
    take).  Returns the result."""
    mem = Memory(on_device(x))
    out = mem.empty(x.shape, x.dtype) if out is None else out
    if x.dtype not in WIDE and not mem.device:
        u = np.zeros_like(x) if u is None else u
        np.add(np.multiply(u, m, dtype=x.dtype), x, dtype=x.dtype, out=out.reshape(x.shape))
        return out
    u = mem.zeros(x.shape, x.dtype) if u is None else u
    if x.size:
        backend("convert", x).momentum(readonly(u.reshape(u.size)), m, readonly(x.reshape(x.size)), out.reshape(out.size))
    return out


def zero_at(a, idx) -> None:
    """``a.flat[idx] = 0`` (``idx`` None: every value), host or device (momentum-factor masking)."""
    flat = a.reshape(a.size)
    if not on_device(a):
        flat[slice(None) if idx is None else idx] = 0
        return

    kern = backend("scatter", flat)
    if idx is None:  # SET at no position: every value zeroed, on the device
        kern.scatter(empty(0, flat.dtype), empty(0, np.int64), flat, SET)
    elif len(idx):
        kern.put(zeros(len(idx), flat.dtype), to_device(_positions(idx)), flat)


def scatter(values: np.ndarray, idx: np.ndarray, out: np.ndarray, mode: int) -> None:
    """``out[idx] (=|+=|-=) values`` for unique ``idx``; with SET the rest of ``out`` becomes zero.

    Each updated element is rounded once, as in :func:`store`.  ``out`` is flat (or
    C-contiguous, indexed flat); ``idx`` holds integers in ``range(out.size)``, no repeats
    (repeats are not detected: with ADD/SUB they race).
    """
    values = np.asarray(values).reshape(-1)
    idx = np.asarray(idx).reshape(-1)
    if idx.dtype.kind not in "iu":
        raise CodecTypeError(f"idx: expected integer positions, got {idx.dtype}")
    if values.size != idx.size:
        raise CodecValueError(f"values: {values.size} values for {idx.size} positions")
    if not on_device(out) and not out.flags.c_contiguous:  # (device outputs: codec.device views, contiguous)
        raise CodecValueError("out: must be C-contiguous")
    flat = out.reshape(out.size)
    if idx.size and (idx.min() < 0 or idx.max() >= flat.size):
        raise CodecIndexError(f"idx: positions must lie in [0, {flat.size})")
    scatter_checked(values, idx, flat, mode)


def _positions(idx):
    """Positions as the scatter twin takes them: a device array as it is (int64, read on the
    device: :func:`codec.pack.decode_indices`), else contiguous int64."""
    return idx if on_device(idx) else np.ascontiguousarray(idx, np.int64)


def gather(src: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``src[idx]`` of flat ``src`` (host or device) at positions in ``range(src.size)``, as a
    host array: on the device the positions go there and only the gathered values come back
    (:meth:`codec.device.Memory.gather`, the ``scatter`` family's ``gather``)."""
    mem = Memory(on_device(src))
    return mem.host(mem.gather(src, mem.put(_positions(idx)) if mem.device else idx))


def scatter_segments(values: np.ndarray, idx: np.ndarray, starts: np.ndarray, outs: list, mode: int, kstarts=None) -> bool:
    """:func:`scatter_checked` of the sorted pairs of a run of tensors (tensor ``t`` holds the
    run's elements ``[starts[t], starts[t+1])``, its array ``outs[t]``, flat; ``idx`` sorted
    run positions, checked; ``kstarts``: where each tensor's pairs start, when the caller
    knows it) in one kernel call, when every array is a host float32/float64 array of one
    dtype that takes ``values`` as :func:`scatter` does (``mode`` SET, the same dtype, or
    float64).  Returns False, having written nothing, otherwise."""
    if len(outs) < 2 or on_device(*outs):
        return False
    dt = outs[0].dtype
    values = widen(values)
    if dt not in WIDE or any(o.dtype != dt for o in outs) or not (mode == SET or values.dtype == dt or dt == np.float64):
        return False
    idx = np.ascontiguousarray(idx, np.int64)
    kstarts = np.searchsorted(idx, starts) if kstarts is None else kstarts
    addrs = addresses(outs)
    starts = np.ascontiguousarray(starts, np.int64)
    backend("scatter", outs[0]).scatter_segments(readonly(np.ascontiguousarray(values)), readonly(idx), readonly(kstarts), readonly(addrs), readonly(starts), outs[0], mode)
    return True


def scatter_checked(values: np.ndarray, idx: np.ndarray, flat: np.ndarray, mode: int) -> None:
    """:func:`scatter` of positions already known to be unique and in ``range(flat.size)``
    (a select stage's ``positions()`` checks them as it reads them), ``values`` and ``idx``
    1-D of one length, ``flat`` a flat C-contiguous float array: no second check per call."""
    values = widen(values)  # 16-bit values -> float32, exact
    if on_device(flat):  # host values (and positions, unless read on the device) moved once, then the twin

        kern = backend("scatter", flat)
        dev_idx = to_device(_positions(idx))
        if values.dtype == flat.dtype:
            kern.scatter(to_device(values), dev_idx, flat, mode)
        else:  # float64 values added into float32: the touched values gathered, combined once rounded on the host, put back
            picked = gather(flat, dev_idx)  # (the positions already on the device)
            store(values, picked, mode)
            if mode == SET:
                kern.scatter(to_device(picked), dev_idx, flat, SET)
            else:
                kern.put(to_device(picked), dev_idx, flat)
        return
    if flat.dtype in WIDE and (mode == SET or values.dtype == flat.dtype or flat.dtype == np.float64):
        idx = readonly(np.ascontiguousarray(idx, np.int64))
        backend("scatter", flat).scatter(readonly(np.ascontiguousarray(values)), idx, flat, mode)
        return
    # 16-bit outputs, and float64 values added into float32: gather, combine, put back
    picked = flat[idx]
    store(values, picked, mode)
    if mode == SET:
        flat[...] = 0
    flat[idx] = picked


__all__ = ["offsets", "readonly", "scratch", "first_nonfinite", "wide_dtype", "widen", "narrow", "round_to", "store", "scatter", "gather", "add", "momentum", "zero_at", "bfloat16"]
