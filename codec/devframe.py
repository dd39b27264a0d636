"""Frames held in device memory: what reading a device frame is made of (docs/api.md, "Frames on the device").

``encode(x, out=device_bytes)`` writes a frame on the device (:func:`codec.payload.write_payload`
fills each section there; the header, a few hundred bytes made on the host, is copied up
once).  Reading one, the host copies only the header (:func:`head`): every check of
:func:`codec.frame.parse_frame` / :func:`codec.manyframe.parse_many` runs on it, the payload's
CRC-32C is formed on the device (``codec/kernels/cuda/_crc.py``), and the frame's sections are
then read where the stages read them (:class:`DevicePayload`): a decode into a device array
reads its codes on the device, and only the sections a stage reads on the host (a
quantizer's scales, seeds, a sparse frame's positions and values) cross.

A frame whose payload is zstd-compressed, or checksummed with the ``crc32`` stage's zlib
CRC32, is read on the host (zstd and zlib run there): it is copied to the host whole.
"""

from __future__ import annotations

import numpy as np

from codec.errors import CorruptFrameError

__all__ = ["DevicePayload", "check_payload", "device_frame", "head", "head_read", "on_host"]

#: the first header bytes a v2 parse copies (a v1 header's length is in its first 12 bytes);
#: a longer v2 header (a table of many named tensors: about 40 bytes a tensor) is copied again, 4x larger each time
FIRST_COPY = 256


class DevicePayload:
    """A device frame's bytes as the frame readers take them: ``payload[a:b]`` is a host
    copy of bytes ``a:b`` (a section a stage reads on the host), :meth:`device` the same
    bytes on the device (a section read there: :meth:`codec.frame.SectionReader.take` with
    ``device=True``)."""

    def __init__(self, data, start: int = 0):
        self.data = data  # the frame's uint8 device array
        self.start = start  # where the payload starts in it

    def __getitem__(self, part) -> memoryview:
        lo, hi = part.start or 0, part.stop
        out = np.empty(hi - lo, np.uint8)
        if hi > lo:
            self.data[self.start + lo : self.start + hi].copy_to_host(out)
        return memoryview(out)

    def device(self, lo: int, hi: int):
        """Bytes ``lo:hi`` of the payload, on the device (a view of the frame)."""
        return self.data[self.start + lo : self.start + hi]

    @property
    def nbytes(self) -> int:
        return self.data.size - self.start


def device_frame(buf):
    """``buf`` (a uint8 device array, or any CUDA byte buffer) as the flat Numba device array
    a device frame is read from (:func:`codec.device.as_device_bytes`)."""
    from codec.device import as_device_bytes

    return as_device_bytes(buf, "frame")


def head(data, size: int) -> memoryview:
    """The first ``size`` bytes of device frame ``data`` (fewer when it is shorter), copied to
    the host: what a parser reads of a device frame."""
    out = np.empty(min(size, data.size), np.uint8)
    if out.size:
        data[: out.size].copy_to_host(out)
    return memoryview(out)


def head_read(data, read):
    """``read(head)`` of device frame ``data``'s first bytes, copied :data:`FIRST_COPY` at a
    time and 4x more while ``read`` finds them too few (a v2 header has no length up front:
    ``read`` raises CorruptFrameError); the last error when the whole frame is copied.
    Returns ``(read's result, the host bytes it read)``."""
    want = FIRST_COPY
    while True:
        got = head(data, want)
        try:
            return read(got), got
        except CorruptFrameError:
            if got.nbytes == data.size:
                raise
            want *= 4


def check_payload(data, header_len: int, stored: int) -> None:
    """The CRC-32C of device frame ``data``'s payload (from ``header_len``), formed on the
    device, against the ``stored`` value (CorruptFrameError on a mismatch)."""
    from codec.device import crc32c

    if crc32c(data[header_len:], 0) != stored:
        raise CorruptFrameError("payload checksum mismatch: the section data is damaged")


def on_host(data):
    """Device frame ``data`` copied to the host whole: a frame with zstd sections or the
    ``crc32`` stage's zlib checksum is read there."""
    from codec.device import host_copy

    return host_copy(data)
