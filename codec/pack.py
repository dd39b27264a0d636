"""Packing shared by every codec: n-bit codes and index sets (kernels in ``codec.kernels.*.pack``).

* :func:`pack_bits` / :func:`unpack_bits`: codes of 1..64 bits, LSB-first, exactly
  ``ceil(n*bits/8)`` bytes.
* :func:`encode_indices` / :func:`decode_indices`: a sorted set of positions in ``range(n)``
  as whichever is smaller, a bitmap (``n`` bits) or gaps-minus-one bit-packed with the
  minimal width; the choice is the section's kind, recorded in the frame header.  Positions
  are int64 throughout, so any element count up to 2**40 works.
"""

from __future__ import annotations

import numpy as np

from codec.errors import CorruptFrameError
from codec.frame import Kind, Section, raw_length
from codec.kernels import backend


def _code_dtype(bits: int):
    return np.uint8 if bits <= 8 else np.uint16 if bits <= 16 else np.uint32 if bits <= 32 else np.uint64


def pack_bits(codes, bits: int) -> np.ndarray:
    """Pack unsigned integer ``codes`` (low ``bits`` of each, 1 <= bits <= 64) into uint8."""
    codes = np.ascontiguousarray(codes)
    if codes.dtype.kind != "u":
        raise TypeError(f"codes: expected an unsigned integer array, got {codes.dtype}")
    if not 1 <= int(bits) <= 64:
        raise ValueError(f"bits: must be within 1..64, got {bits}")
    codes = codes.reshape(-1)
    out = np.zeros(raw_length(codes.size, bits), np.uint8)
    if codes.size:
        backend("pack", codes).pack_codes(codes, int(bits), out)
    return out


def unpack_bits(data, bits: int, count: int, dtype=None) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``count`` codes (the narrowest unsigned dtype, or ``dtype``)."""
    if not 1 <= int(bits) <= 64:
        raise ValueError(f"bits: must be within 1..64, got {bits}")
    data = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
    if data.size < raw_length(count, bits):
        raise ValueError(f"data: {data.size} bytes cannot hold {count} codes of {bits} bits")
    out = np.empty(count, dtype or _code_dtype(bits))
    if count:
        backend("pack", data).unpack_codes(data, int(bits), out)
    return out


def encode_indices(idx, n: int) -> Section:
    """Code sorted unique positions ``idx`` (< n) as the smaller of a bitmap and packed gaps."""
    idx = np.ascontiguousarray(idx, dtype=np.int64).reshape(-1)
    k = idx.size
    if k and (idx[0] < 0 or idx[-1] >= n):
        raise ValueError(f"idx: positions must lie in [0, {n})")
    kern = backend("pack", idx)
    gaps = np.empty(k, np.uint64)
    big = kern.delta_encode(idx, gaps) if k else 0
    if big < 0:
        raise ValueError("idx: positions must be strictly increasing")
    width = max(1, int(big).bit_length())
    if raw_length(k, width) <= raw_length(n, 1):
        return Section(Kind.INDEX_DELTA, width, k, pack_bits(gaps, width))
    bitmap = np.zeros(raw_length(n, 1), np.uint8)
    kern.bitmap_encode(idx, bitmap)
    return Section(Kind.INDEX_BITMAP, 1, n, bitmap)


def decode_indices(info, raw: np.ndarray, n: int) -> np.ndarray:
    """Positions from an index section (``info`` from the frame header, ``raw`` its bytes)."""
    kern = backend("pack", raw)
    if info.kind == Kind.INDEX_DELTA:
        if info.count > n or info.bits > max(1, int(n).bit_length()):
            raise CorruptFrameError(f"index section: {info.count} gaps of {info.bits} bits cannot address {n} elements")
        gaps = unpack_bits(raw, info.bits, info.count, np.uint64)
        idx = np.empty(info.count, np.int64)
        if not kern.delta_decode(gaps, n, idx):
            raise CorruptFrameError(f"index section: a position lies beyond the {n} elements")
        return idx
    if info.kind == Kind.INDEX_BITMAP:
        if info.count != n:
            raise CorruptFrameError(f"index bitmap: {info.count} bits for {n} elements")
        if n % 8 and raw.size and raw[-1] >> (n % 8):
            raise CorruptFrameError("index bitmap: padding bits past the last element are set")
        counts = kern.bitmap_count(raw)
        starts = np.zeros(counts.size, np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        idx = np.empty(int(counts.sum()), np.int64)
        kern.bitmap_decode(raw, starts, idx)
        return idx
    raise CorruptFrameError(f"section kind {info.kind} is not an index set")
