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

__all__ = ["materialized", "write_payload"]


def write_payload(out: np.ndarray, pieces, crc32c: bool = False) -> int | None:
    """Write ``pieces`` (:class:`Section`) end to end into ``out`` (a uint8 array of exactly
    their raw lengths); with ``crc32c`` true, return the CRC-32C of everything written, else None.

    The checksum is formed as the bytes are written: a piece that can (``fill_crc``) continues
    it inside its kernel, while its codes are in cache; the bytes of the pieces between such
    pieces are checksummed in one call each.  ``late`` pieces are filled last, once every
    other piece is written; the checksum then runs in stretches between them, joined with
    :func:`codec.checksum.combine`.  Both frame formats write their payload here."""
    from codec.checksum import combine, crc32c as crc_of

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


def materialized(sections) -> list:
    """Each section's raw bytes (:meth:`Section.materialize`), the late ones filled last."""
    got = {i: s.materialize() for i, s in enumerate(sections) if not s.late}
    got.update({i: s.materialize() for i, s in enumerate(sections) if s.late})
    return [got[i] for i in range(len(sections))]
