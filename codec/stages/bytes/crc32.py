"""``crc32``: the legacy payload checksum.

Every frame carries a payload CRC-32C unless its codec was built with ``checksum=False``;
``crc32`` replaces it by zlib's CRC32, which was the only payload checksum before it became
the default (frames made with it keep their bytes)."""

from __future__ import annotations

from codec.stage import Bytes, register


@register
class Crc32(Bytes):
    """A zlib CRC32 of all section bytes as the payload checksum (instead of the default CRC-32C)."""

    name = "crc32"

    def frame_options(self) -> dict:
        return {"checksum": "crc32"}
