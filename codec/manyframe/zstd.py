"""A many-tensor frame's zstd payload, decompressed only as far as the stages have read."""

from __future__ import annotations

import bisect

from codec.errors import CorruptFrameError


class ZstdPayload:
    """A zstd-compressed payload, decompressed only as far as the sections read so far reach.

    ``payload[a:b]`` (what a section's bytes are) decompresses up to byte ``b`` and no further,
    so each stage checks a section's kind, width and count (``SectionReader.take``) before
    any of its bytes exist: a forged count is refused before its declared size is
    allocated, as format v1 does with its per-section zstd.  :meth:`finish` then requires the
    stream to hold exactly the declared raw length."""

    def __init__(self, stored, raw_total: int):
        import zstandard

        try:
            params = zstandard.get_frame_parameters(stored)
        except zstandard.ZstdError as e:
            raise CorruptFrameError(f"many-tensor frame: bad zstd header: {e}") from None
        if params.content_size != raw_total:
            raise CorruptFrameError(f"many-tensor frame: zstd declares {params.content_size} bytes, the header implies {raw_total}")
        self.raw_total = raw_total
        self._reader = zstandard.ZstdDecompressor().stream_reader(stored, read_across_frames=True)
        self._chunks: list = []
        self._starts: list = []
        self._have = 0

    def _read(self, size: int) -> bytes:
        import zstandard

        try:
            return self._reader.read(size)
        except zstandard.ZstdError as e:
            raise CorruptFrameError(f"many-tensor frame: zstd data is damaged: {e}") from None

    def _ensure(self, end: int) -> None:
        while self._have < end:
            data = self._read(end - self._have)
            if not data:
                raise CorruptFrameError(f"many-tensor frame: zstd gave {self._have} bytes, the header says {self.raw_total}")
            self._starts.append(self._have)
            self._chunks.append(data)
            self._have += len(data)

    def __getitem__(self, part):
        lo, hi = part.start or 0, part.stop
        if hi > self.raw_total or lo > hi:
            raise CorruptFrameError("many-tensor frame: a section lies beyond the payload")
        self._ensure(hi)
        i = bisect.bisect_right(self._starts, lo) - 1 if self._starts else 0
        if lo == hi:
            return memoryview(b"")
        start, chunk = self._starts[i], self._chunks[i]
        if hi <= start + len(chunk):
            return memoryview(chunk)[lo - start : hi - start]
        pieces = []
        while lo < hi:  # a section across chunks: its bytes joined
            start, chunk = self._starts[i], self._chunks[i]
            take = min(hi, start + len(chunk))
            pieces.append(memoryview(chunk)[lo - start : take - start])
            lo, i = take, i + 1
        return memoryview(b"".join(pieces))

    def finish(self) -> None:
        """Every declared byte is there and nothing decodes beyond it (CorruptFrameError)."""
        self._ensure(self.raw_total)
        if self._read(1):
            raise CorruptFrameError(f"many-tensor frame: zstd data holds more than the {self.raw_total} bytes the header implies")

    def __bytes__(self) -> bytes:
        self._ensure(self.raw_total)
        return b"".join(self._chunks)
