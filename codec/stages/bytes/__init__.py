"""Byte stages: act on the stored bytes of every section (``zstd``) or of the frame (``crc32``)."""

from codec.stages.bytes import crc32, zstd  # noqa: F401  (register)
