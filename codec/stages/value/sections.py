"""The sections the quantizers write and read (codec/stages/value/quantizer.py's stages): codes
(bit-packed, on the host or the device), per-bucket scalars (float32 unless a value needs
float64), one scale, int16 exponents; and the small float helpers their encoders share.
Readers check what they read (a code field beyond what an encoder writes, a non-finite
scalar, an exponent out of range) and raise CorruptFrameError."""

from __future__ import annotations

import numpy as np

from codec.dtypes import on_device
from codec.errors import CodecValueError, CorruptFrameError
from codec.frame import Section, SectionKind
from codec.ops import readonly, round_to
from codec import device
from codec.kernels import backend
from codec.pack import _check_payload, pack_into, raw_length

#: float32's largest finite value (per-bucket scalars beyond it travel as float64)
F32_MAX = float(np.finfo(np.float32).max)

__all__ = ["F32_MAX", "magnitude_bits", "magnitude_values", "codes_section", "read_codes", "check_fields", "field_error", "scalars_section", "scalars_bytes", "scale_section", "read_scalars", "ints_section", "read_ints", "round_up_to", "sequential_sum"]


# ---------------------------------------------------------------------------- magnitudes
def magnitude_bits(x: np.ndarray):
    """The bit patterns of float32/float64 ``x`` (read-only uint32/uint64 view) and the mask that
    clears their sign: kernels take integer maxima of magnitudes (they vectorise)."""
    if x.dtype == np.float32:
        return readonly(x.view(np.uint32)), np.uint32(0x7FFFFFFF)
    return readonly(x.view(np.uint64)), np.uint64(0x7FFFFFFFFFFFFFFF)


def magnitude_values(top: np.ndarray, dtype) -> tuple[np.ndarray, bool]:
    """float64 values of magnitude bit patterns ``top`` (of float ``dtype``), and whether any
    is NaN or inf."""
    vals = top.view(np.float32 if np.dtype(dtype) == np.float32 else np.float64)
    finite = np.isfinite(vals)
    return np.where(finite, vals, 0).astype(np.float64), not finite.all()


# ---------------------------------------------------------------------------- sections
def codes_section(codes: np.ndarray, bits: int) -> Section:
    """``codes`` (uint8/uint16) as a values section of ``bits``-bit items: the bytes themselves
    at 8 or 16 bits, bit-packed otherwise, straight into the frame as it is written and
    checksummed as they are packed (``Section.fill_crc``).  Device codes are packed on the
    device and copied once to wherever the frame is written."""
    if on_device(codes):
        if bits in (8, 16):
            packed = codes.view(np.uint8)
        else:
            packed = device.empty(raw_length(codes.size, bits), np.uint8)
            if packed.size:
                backend("pack", codes).pack_codes(codes, bits, packed)
        return Section(SectionKind.VALUES, bits, codes.size, packed)
    if bits in (8, 16):
        return Section(SectionKind.VALUES, bits, codes.size, codes.astype(f"<u{bits // 8}", copy=False))
    return Section(SectionKind.VALUES, bits, codes.size, fill=lambda out, crc=None: pack_into(codes, bits, out, crc), fill_crc=True)


def read_codes(reader, bits: int, count: int, limit=None, device: bool = False) -> np.ndarray:
    """The raw bytes of a values section of ``count`` codes of ``bits`` bits (LSB-first).  Set
    padding bits, or with ``limit = (fmask, fshift, largest)`` a code whose field
    ``(code & fmask) >> fshift`` exceeds ``largest`` (no encoder writes it), raise
    CorruptFrameError.  ``device`` (``Context.codes_on_device``): a device frame's codes stay
    on the device, checked there."""
    _, raw = reader.take(SectionKind.VALUES, bits=bits, count=count, device=device)
    _check_payload(raw, count, bits, "values section")
    if limit is not None and count and limit[2] < (((1 << bits) - 1) & limit[0]) >> limit[1]:
        check_fields(raw, bits, count, limit)
    return raw


def check_fields(raw, bits: int, count: int, limit) -> None:
    """CorruptFrameError (:func:`field_error`) when a field ``(code & fmask) >> fshift`` of the
    ``count`` codes packed in ``raw`` exceeds ``largest`` (``limit``): ``fields_within``, the
    check alone, a quarter of ``max_field``'s time."""
    if not backend("dequant", raw).fields_within(readonly(raw), bits, count, *limit):
        raise CorruptFrameError(field_error(raw, bits, count, limit))


def field_error(raw, bits: int, count: int, limit) -> str:
    """What :func:`read_codes` says of codes ``raw`` a field of which exceeds ``limit``'s
    largest (it names the largest field; only on a refusal: a pass over the codes)."""
    fmask, fshift, largest = limit
    top = backend("dequant", raw).max_field(readonly(raw), bits, count, fmask, fshift)
    return f"values section: a code field of {top}, no encoder writes more than {largest}"


def scalars_section(values: np.ndarray) -> Section:
    """float64 ``values`` (already rounded to float32 where they fit) as a scalars section:
    float32 items when every value fits float32, float64 items otherwise."""
    values = np.asarray(values, np.float64).reshape(-1)
    _check_finite(values)
    if values.size and np.abs(values).max() > F32_MAX:
        return Section(SectionKind.SCALARS, 64, values.size, values.astype("<f8"))
    return Section(SectionKind.SCALARS, 32, values.size, values.astype("<f4"))


def scalars_bytes(count: int, most: float) -> int:
    """The most bytes of a :func:`scalars_section` of ``count`` values none of whose
    magnitudes exceeds ``most`` (``math.inf`` when nothing bounds them): float32 items when
    ``most`` fits float32, float64 items otherwise (the section's width is its largest value's)."""
    return count * (4 if most <= F32_MAX else 8)


def _check_finite(values) -> None:
    """An encoder writes no scalar its decoder would reject (:func:`read_scalars`): a scale
    or norm that overflows float64 (values near its maximum) is a ValueError naming x."""
    if not np.all(np.isfinite(values)):
        raise CodecValueError("x: a per-bucket scale (norm, mean or range) overflows float64: the values are too close to float64's maximum to quantize")


def scale_section(value: float) -> Section:
    """One per-tensor scale as a scalars section of one float64."""
    _check_finite(np.float64(value))
    return Section(SectionKind.SCALARS, 64, 1, np.array([value], "<f8"))


def read_scalars(reader, count: int, bits=(32, 64)) -> np.ndarray:
    """A scalars section of ``count`` float32 or float64 items as float64; all must be finite."""
    info, raw = reader.take(SectionKind.SCALARS, bits=bits, count=count)
    values = raw.view("<f4" if info.bits == 32 else "<f8").astype(np.float64)
    if not np.all(np.isfinite(values)):
        raise CorruptFrameError("scalars section: a non-finite value")
    return values


def ints_section(values) -> Section:
    """Small signed integers (exponents) as an ints section of int16 items."""
    return Section(SectionKind.INTS, 16, len(values), np.asarray(values, "<i2"))


def read_ints(reader, count: int, low: int, high: int, what: str) -> np.ndarray:
    _, raw = reader.take(SectionKind.INTS, bits=16, count=count)
    values = raw.view("<i2").astype(np.int64)
    if values.size and (values.min() < low or values.max() > high):
        raise CorruptFrameError(f"ints section: {what} outside [{low}, {high}]")
    return values


def round_up_to(v: float, dtype) -> float:
    """The smallest value of ``dtype`` that is >= ``v`` (finite ``v`` >= 0 below dtype's max)."""
    r = np.asarray(round_to(np.float64(v), dtype)).reshape(1)
    if float(r[0]) < v:
        width = np.dtype(dtype).itemsize
        r = (r.view(f"u{width}") + 1).view(dtype)
    return float(r[0])


def sequential_sum(parts: np.ndarray) -> float:
    """``parts`` added in order, in float64 (NumPy's own sum is pairwise)."""
    total = 0.0
    for v in np.asarray(parts, np.float64).tolist():
        total += v
    return total
