"""Byte stages: ``zstd`` (per-section compression) and ``crc32`` (the legacy payload checksum).

Every frame carries a payload CRC-32C unless its codec was built with ``checksum=False``;
``crc32`` replaces it by zlib's CRC32, which was the only payload checksum before it became
the default (frames made with it keep their bytes)."""

from __future__ import annotations

import functools

from codec.frame import Encoding
from codec.stage import Param, Stage, register


@functools.lru_cache(maxsize=32)
def _compressor(level: int):
    import zstandard

    return zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)


@register
class Zstd(Stage):
    """zstd on every section; a section is kept raw when zstd does not make it smaller."""

    name = "zstd"
    kind = "bytes"
    params = (Param("level", int, 3, "zstd compression level (negative levels are faster)", low=-7, high=22),)

    def compress(self, raw):
        packed = _compressor(self.level).compress(raw)
        if len(packed) < raw.nbytes:
            return Encoding.ZSTD, packed
        return Encoding.RAW, raw

    def frame_options(self) -> dict:
        return {"compressor": self.compress}


@register
class Crc32(Stage):
    """A zlib CRC32 of all section bytes as the payload checksum (instead of the default CRC-32C)."""

    name = "crc32"
    kind = "bytes"

    def frame_options(self) -> dict:
        return {"checksum": "crc32"}
