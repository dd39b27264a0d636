"""``zstd``: per-section compression (a section is kept raw when zstd does not shrink it)."""

from __future__ import annotations

import functools

from codec.frame import Encoding
from codec.params import Param
from codec.stage import Bytes, register


@functools.lru_cache(maxsize=32)
def _compressor(level: int):
    import zstandard

    return zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)


@register
class Zstd(Bytes):
    """zstd on every section; a section is kept raw when zstd does not make it smaller."""

    name = "zstd"
    params = (Param("level", int, 3, "zstd compression level (negative levels are faster)", low=-7, high=22),)

    def compress(self, raw):
        packed = _compressor(self.level).compress(raw)
        if len(packed) < raw.nbytes:
            return Encoding.ZSTD, packed
        return Encoding.RAW, raw

    def frame_options(self) -> dict:
        return {"compressor": self.compress}
