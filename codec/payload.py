"""A frame's payload: its sections written end to end into the frame, with the payload's
CRC-32C formed as the bytes are written.  Both frame formats (``codec.frame``, format v1, and
``codec.manyframe``, format v2) write their payload here.

A section (:class:`codec.frame.Section`) holds its bytes (``data``) or writes them
(``fill``); one that can (``fill_crc``) continues the running CRC inside its kernel while its
codes are in cache, and a ``late`` one is filled after all the others, because a later
section's pass finds its bytes.
"""

from __future__ import annotations

import numpy as np

from codec.dtypes import on_device
from codec import device
from codec.checksum import combine, crc32c as crc_of
from codec.device import deliver

__all__ = ["materialized", "write_payload"]


def write_payload(out: np.ndarray, pieces, crc32c: bool = False) -> int | None:
    """Write ``pieces`` (:class:`Section`) end to end into ``out`` (a uint8 array of exactly
    their raw lengths); with ``crc32c`` true, return the CRC-32C of everything written, else None.

    The checksum is formed as the bytes are written: a piece that can (``fill_crc``) continues
    it inside its kernel, while its codes are in cache; the bytes of the pieces between such
    pieces are checksummed in one call each.  ``late`` pieces are filled last, once every
    other piece is written; the checksum then runs in stretches between them, joined with
    :func:`codec.checksum.combine`.  Both frame formats write their payload here."""
    if on_device(out):
        return _write_device(out, pieces, crc32c)
    stretches = []  # per late piece, the (crc, length) of the stretch before it
    late = []
    crc, start, pending, pos = 0, 0, 0, 0
    for s in pieces:
        size = s.raw_len
        dst = out[pos : pos + size]
        if s.late:
            if crc32c:
                stretches.append((crc_of(out[pending:pos], crc), pos - start))
            late.append((s, dst))
            crc, start = 0, pos + size
            pending = start
        elif s.data is not None:
            if on_device(s.data):
                deliver(s.data, dst)
            else:
                dst[:] = np.frombuffer(s.data, np.uint8, size)
        elif crc32c and s.fill_crc:
            if pending < pos:
                crc = crc_of(out[pending:pos], crc)
            crc = s.fill(dst, crc)
            pending = pos + size
        else:
            s.fill(dst)
        pos += size
    for s, dst in late:
        s.fill(dst)
    if not crc32c:
        return None
    crc = crc_of(out[pending:pos], crc) if pending < pos else crc
    if not late:
        return crc
    total = 0
    for (c, size), (_, dst) in zip(stretches, late):
        total = combine(combine(total, c, size), crc_of(dst), dst.size)
    return combine(total, crc, pos - start)


def _write_device(out, pieces, crc32c: bool) -> int | None:
    """:func:`write_payload` into a device frame's payload ``out`` (a uint8 device array).

    A piece made on the device (``Section.device``) fills its slice of ``out`` there; a
    piece of host bytes (scalars, seeds, a sparse run's small sections) is copied up, and a
    host fill writes a host buffer copied up once.  The checksum is then one parallel
    CRC-32C pass over the payload on the device (``codec/kernels/cuda/_crc.py``), so none of
    the payload crosses to the host."""
    late, pos = [], 0
    for s in pieces:
        dst = out[pos : pos + s.raw_len]
        pos += s.raw_len
        if s.late:
            late.append((s, dst))
        else:
            _fill_device(s, dst)
    for s, dst in late:
        _fill_device(s, dst)
    return device.crc32c(out, 0) if crc32c else None


def _fill_device(s, dst) -> None:
    """One piece's bytes into ``dst``, its slice of a device payload."""
    if s.data is not None:
        if on_device(s.data):
            device.deliver(s.data, dst)
        else:
            device.put_bytes(s.data, dst)
    elif s.device:
        s.fill(dst)
    else:
        host = np.empty(dst.size, np.uint8)
        s.fill(host)
        device.put_bytes(host, dst)


def materialized(sections) -> list:
    """Each section's raw bytes (:meth:`Section.materialize`), the late ones filled last."""
    got = {i: s.materialize() for i, s in enumerate(sections) if not s.late}
    got.update({i: s.materialize() for i, s in enumerate(sections) if s.late})
    return [got[i] for i in range(len(sections))]
