"""Frames held in device memory: how a device frame is read (docs/api.md, "Frames on the device").

``encode(x, out=device_bytes)`` writes a frame on the device (:func:`codec.payload.write_payload`
fills each section there; the header, a few hundred bytes made on the host, is copied up
once).  Reading one, the host copies only the header (:func:`parse_device`): every check of
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

__all__ = ["DevicePayload", "parse_device"]

#: the first header bytes a v2 parse copies (a v1 header's length is in its first 12 bytes);
#: a longer v2 header (a table of many named tensors) is copied again, 4x larger each time
FIRST_COPY = 4096


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


def _head(data, size: int) -> memoryview:
    """The first ``size`` bytes of device array ``data`` on the host."""
    out = np.empty(min(size, data.size), np.uint8)
    if out.size:
        data[: out.size].copy_to_host(out)
    return memoryview(out)


def parse_device(buf, max_elements, verify_payload: bool, *, many: bool, layout=None):
    """:func:`codec.frame.parse_frame` (``many`` false) or :func:`codec.manyframe.parse_many` of
    the device frame ``buf`` (a uint8 device array, or any CUDA byte buffer), copying only its
    header to the host; the payload's CRC-32C is verified on the device.  The result's
    sections are read through a :class:`DevicePayload`."""
    from codec.device import as_device_bytes, crc32c, host_copy
    from codec.frame import _CRC, CHECKSUMS, MIN_FRAME, Encoding, fixed_header_length, parse_frame, parse_header
    from codec.manyframe.parse import parse_many, parse_many_header

    data = as_device_bytes(buf, "frame")
    size = data.size
    if many:
        mf = raw_total = None
        want = FIRST_COPY
        while mf is None:
            head = _head(data, want)
            try:
                mf, raw_total = parse_many_header(head, size, layout, max_elements)
            except CorruptFrameError:
                if head.nbytes == size:
                    raise
                want *= 4  # the header may reach past the bytes copied: copy more and read again
        flags, header_len, host = mf.flags, mf.header_len, raw_total is not None
    else:
        head = _head(data, MIN_FRAME)
        if size >= MIN_FRAME:
            head = _head(data, fixed_header_length(head))
        fr = parse_header(head, size, max_elements)
        flags, header_len, host = fr.flags, fr.header_len, any(s.encoding != Encoding.RAW for s in fr.sections)
    name = next((n for n, (bit, _) in CHECKSUMS.items() if flags & bit), None)
    if host or name == "crc32":  # zstd and zlib run on the host: the whole frame crosses once
        whole = host_copy(data)
        return parse_many(whole, layout=layout, max_elements=max_elements, verify_payload=verify_payload) if many else parse_frame(whole, max_elements=max_elements, verify_payload=verify_payload)
    if verify_payload and name == "crc32c":
        (stored,) = _CRC.unpack_from(head, header_len - 2 * _CRC.size)
        if crc32c(data[header_len:], 0) != stored:
            raise CorruptFrameError("payload checksum mismatch: the section data is damaged")
    if many:
        mf.payload = DevicePayload(data, header_len)
        return mf
    fr.buf = DevicePayload(data)
    return fr
