"""The exceptions of gradcodec.

``CodecError`` is the root.  ``CorruptFrameError`` and ``UnknownCodecError`` are also
``ValueError`` subclasses, so code that only knows NumPy-style errors still catches them.
"""


class CodecError(Exception):
    """Base class of every error gradcodec raises on purpose."""


class CorruptFrameError(CodecError, ValueError):
    """A frame (or container) is truncated, damaged or forged; raised before any large allocation."""


class UnknownCodecError(CodecError, ValueError):
    """A spec, config or frame names a codec or stage that is not registered."""
