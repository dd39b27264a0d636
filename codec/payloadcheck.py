"""A frame's payload CRC-32C verified while decoding reads it (:class:`PayloadCheck`), instead
of one more pass over the payload before decoding (docs/api.md, "When the check runs").

It joins what the decoding kernels checksummed (``codec/kernels/cpu/_crc.py``) with what they
did not (:func:`codec.checksum.crc32c`), so it sits above both.
"""

from __future__ import annotations

import contextlib
import functools
import types

import numpy as np

from codec.checksum import crc32c
from codec.errors import CorruptFrameError

__all__ = ["PayloadCheck", "reading", "refuse"]


class PayloadCheck:
    """A frame's payload CRC-32C verified while decoding reads it, instead of one more pass
    over the payload before decoding (docs/robustness.md, "Decoding into out").

    A decoding kernel that reads a stretch of the payload anyway (the fp16/bf16 codes, a
    quantizer's) checksums each chunk of it while it is in cache and reports it with :meth:`note`;
    :meth:`verify`, once decoding is done, checksums every byte nobody noted in one pass
    each, joins the pieces in payload order (the CRC algebra of :func:`combine`, compiled)
    and compares the result with the frame's stored CRC-32C.  The check is exact whatever
    was noted: a stretch noted twice counts once, and a buffer outside the payload (a
    decompressed section) is ignored.

    The price of reading the frame once is that the output is written before the verdict:
    :meth:`verify` is given the arrays decoding wrote, and fills them with NaN before it
    raises :class:`~codec.errors.CorruptFrameError`, so a damaged frame's values are never
    left where a caller might use them.  A decoder that checks its codes in the same pass
    (a quantizer's code fields) reports a refusal with :meth:`reject`, which :meth:`verify`
    turns into the same NaN and error."""

    def __init__(self, payload, expected: int):
        if type(payload) is not np.ndarray or payload.dtype != np.uint8:  # (a replayed decode's payload is its uint8 view already)
            payload = np.frombuffer(payload, np.uint8) if len(payload) else np.empty(0, np.uint8)
        self.payload = payload
        self.base = _kernels().address_of(payload)
        self.expected = int(expected)
        self.pieces: list = []  # (byte offset, byte length, CRC-32C)
        self.rejected: str | None = None  # (the first refusal :meth:`reject` noted)

    def note(self, arr, crc: int) -> None:
        """The CRC-32C ``crc`` of ``arr``'s bytes (a view into the payload, which a kernel has
        just read); a negative ``crc`` (the kernel formed none) or an array elsewhere is
        ignored: :meth:`verify` checksums those bytes itself."""
        if crc < 0 or not arr.nbytes:
            return
        at = _kernels().address_of(arr) - self.base
        if 0 <= at and at + arr.nbytes <= self.payload.size:
            self.pieces.append((at, arr.nbytes, int(crc)))

    def reject(self, message: str) -> None:
        """A refusal found while decoding (codes no encoder writes, in a frame whose CRC may
        still hold: a forged one): :meth:`verify` raises it, once the output is written, as
        it raises a checksum mismatch.  The first one noted is kept."""
        if self.rejected is None:
            self.rejected = message

    def verify(self, written=()) -> None:
        """CorruptFrameError when the payload's CRC-32C is not the stored one, or a refusal
        was noted (:meth:`reject`), after filling every array of ``written`` (what decoding
        wrote) with NaN."""
        sums, lens, pos = [], [], 0
        for at, n, crc in sorted(self.pieces):
            if at < pos:  # (bytes noted twice: counted once)
                continue
            if at > pos:
                sums.append(crc32c(self.payload[pos:at]))
                lens.append(at - pos)
            sums.append(crc)
            lens.append(n)
            pos = at + n
        if pos < self.payload.size or not sums:
            sums.append(crc32c(self.payload[pos:]))
            lens.append(self.payload.size - pos)
        if len(sums) == 1:
            got = sums[0]
        else:
            got = int(_kernels().join(np.array(sums, np.uint32), 0, np.array(lens, np.int64)))
        if got != self.expected:
            refuse(written)
        if self.rejected is not None:
            refuse(written, self.rejected)


def reading(check):
    """The context of reading a frame whose payload check ``check`` (or None) is left to the
    decoding pass: a :class:`~codec.errors.CorruptFrameError` raised while reading (a damaged
    number, padding bits) becomes the checksum's own when the payload's CRC-32C fails too,
    so a damaged frame is named as such whatever its damage broke first.  (A class, not a
    generator: a decode's fixed cost.)"""
    return _NOTHING if check is None else _Reading(check)


class _Reading:
    __slots__ = ("check",)

    def __init__(self, check):
        self.check = check

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None and issubclass(kind, CorruptFrameError):
            self.check.verify()  # (raises the checksum's error when the CRC fails too)
        return False


_NOTHING = contextlib.nullcontext()


def refuse(written=(), message: str = "payload checksum mismatch: the section data is damaged") -> None:
    """The verdict on a payload whose CRC-32C is not the stored one (or on codes ``message``
    names), given after decoding wrote ``written`` (arrays; None skipped): each filled with
    NaN, then :class:`~codec.errors.CorruptFrameError`."""
    for a in written:
        if a is not None and a.size:
            a.fill(np.nan)
    raise CorruptFrameError(message)


@functools.cache
def _kernels():
    """What the check takes from the CPU kernels (``address_of``, the CRC's ``join``), imported
    at the first check, when a decoding kernel runs anyway (they import Numba, which ``import
    codec`` does not); looked up once (an import statement in a decode's path cost ~0.5 µs)."""
    from codec.kernels.cpu import _common, _crc

    return types.SimpleNamespace(address_of=_common.address_of, join=_crc.join)
