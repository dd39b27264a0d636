"""What a frame holds, section by section (docs/format.md): the role codes (:class:`SectionKind`),
how a section is stored (:class:`Encoding`), a section as a stage makes it (:class:`Section`,
or a many-tensor run's :class:`SectionRun`) and as a parser reads it (:class:`SectionInfo`).
Both frame formats (:mod:`codec.frame`, :mod:`codec.manyframe`) are made of them; they are
re-exported by :mod:`codec.frame`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Callable, NamedTuple

import numpy as np

from codec.dtypes import on_device
from codec.device import to_host

__all__ = ["Encoding", "Section", "SectionInfo", "SectionKind", "SectionRun", "raw_length"]


class SectionKind(IntEnum):
    """Role of a section (the "kind" byte of a section entry, docs/format.md).  Codes are part of the format: add new ones, never renumber."""

    VALUES = 1  #: coded values, one item per kept element
    INDEX_BITMAP = 2  #: one bit per element, set where kept
    INDEX_DELTA = 3  #: gaps between kept positions minus one, bit-packed
    SCALARS = 4  #: per-tensor or per-block float parameters (scales, norms)
    INTS = 5  #: per-frame integer parameters (seeds, steps, counts)
    FACTORS = 6  #: dense factor matrices (low rank)


class Encoding(IntEnum):
    RAW = 0
    ZSTD = 1


@dataclass
class Section:
    """A section as a stage produces it: ``count`` items of ``bits`` bits.

    Either ``data`` holds the raw bytes (any contiguous array or bytes-like, exactly
    ``ceil(count*bits/8)`` bytes, or a device array of them), or ``fill(out)`` writes them into ``out``, a uint8 view
    of the final frame: a dense stage then writes its codes once, straight into the frame.
    ``fill`` may raise (e.g. on a NaN); the half-built frame is discarded.

    ``fill_crc``: ``fill(out, crc)`` also takes the payload's CRC-32C so far and returns it
    continued over the bytes it wrote (its kernel checksums them while they are in cache, so
    the frame's checksum needs no second pass over them: :func:`write_payload`).

    ``late``: ``fill`` runs after every other section of the frame has been written, because
    a later section's fill finds these bytes (min-max's fused error-feedback step finds its
    buckets' bounds in the pass that writes the codes).  The count and width are known
    before, as always; only the bytes wait.

    ``device``: ``fill(out)`` writes ``out`` where it lives, host or device (a stage coding a
    device array: its kernel writes a device frame's section in place, or its codes cross
    once to a host frame).  Any other fill of a device frame writes a host buffer that is
    then copied up (:func:`codec.payload.write_payload`).
    """

    kind: int
    bits: int
    count: int
    data: object = None
    fill: Callable[..., int | None] | None = None
    fill_crc: bool = False
    late: bool = False
    device: bool = False

    def __post_init__(self):
        if (self.data is None) == (self.fill is None):
            raise AssertionError("a Section needs exactly one of data and fill")
        if self.late and (self.fill is None or self.fill_crc):
            raise AssertionError("a late Section is filled, and checksummed by write_payload")
        if self.data is None:
            return
        if on_device(self.data):  # codes a stage made on the device: moved once, to wherever the frame is written
            got = self.data.nbytes
            if got != self.raw_len:
                raise AssertionError(f"section {SectionKind(self.kind).name}: {got} device bytes for {self.count} x {self.bits} bits")
            return
        if isinstance(self.data, np.ndarray):  # any dtype (bfloat16 has no buffer format) as bytes
            self.data = self.data.reshape(-1).view(np.uint8)
        got = memoryview(self.data).nbytes
        if got != self.raw_len:
            raise AssertionError(f"section {SectionKind(self.kind).name}: {got} bytes for {self.count} x {self.bits} bits")

    @property
    def raw_len(self) -> int:
        return raw_length(self.count, self.bits)

    def materialize(self):
        """The raw bytes (running ``fill`` into a new buffer if needed)."""
        if self.data is None:
            buf = np.empty(self.raw_len, np.uint8)
            self.fill(buf)
            return memoryview(buf)
        if on_device(self.data):
            return memoryview(to_host(self.data, np.empty(self.raw_len, np.uint8)))
        return memoryview(self.data).cast("B")


@dataclass(frozen=True)
class SectionRun:
    """One section per tensor of a many-tensor run, all written into one buffer: tensor
    ``t``'s is ``data[offsets[t]:offsets[t+1]]``, of kind ``kinds[t]``, item width
    ``widths[t]`` and ``counts[t]`` items (``data``/``offsets`` arrays, the rest lists): a
    run's index sections (:func:`codec.pack.index_segments`), random-k's keys."""

    data: np.ndarray
    offsets: np.ndarray
    kinds: list
    widths: list
    counts: list

    def sections(self) -> list:
        """Each tensor's :class:`Section`, viewing ``data``."""
        o = self.offsets.tolist()
        return [Section(k, w, c, self.data[o[i] : o[i + 1]]) for i, (k, w, c) in enumerate(zip(self.kinds, self.widths, self.counts))]


class SectionInfo(NamedTuple):
    """A section as a parser read it: its kind, how it is stored, its item width and count,
    its raw and stored lengths and its offset in the payload (a named tuple: a many-tensor
    header makes one per section, and a frozen dataclass cost 2.3 µs each against 0.7)."""

    kind: int
    encoding: int
    bits: int
    count: int
    raw_len: int
    stored_len: int
    offset: int

    @property
    def kind_name(self) -> str:
        try:
            return SectionKind(self.kind).name.lower()
        except ValueError:
            return f"kind{self.kind}"


def raw_length(count: int, bits: int) -> int:
    return (count * bits + 7) // 8
