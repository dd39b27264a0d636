"""The base of the byte stages (``codec/stages/bytes/``)."""

from __future__ import annotations

import abc

from codec.stage.base import Stage

class Bytes(Stage, kind_base=True):
    """Base of the byte stages: they act on the stored bytes.  Required hook:
    :meth:`frame_options`."""

    kind = "bytes"
    devices = frozenset({"cpu", "cuda"})  # they act on the frame's bytes, on the host

    @abc.abstractmethod
    def frame_options(self) -> dict:
        """Options for ``codec.frame.build_frame``: ``compressor`` (a section compressor) or
        ``checksum`` (the payload checksum's name)."""
