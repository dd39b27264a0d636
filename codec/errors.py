"""The root of gradcodec's exceptions.

Every exception gradcodec raises on purpose is a :class:`CodecError`; most are also a
``ValueError`` (or ``TypeError``), so code that only knows NumPy-style errors still catches
them.  The classes live beside the code that raises them; docs/api.md ("Errors") lists them:

- here: ``CodecValueError``, ``CodecTypeError``, ``CodecKeyError`` and ``CodecIndexError``
  (what a bad argument raises: gradcodec never raises a plain ``ValueError``, ``TypeError``,
  ``KeyError`` or ``IndexError`` on purpose; tests/test_errors.py holds the code to that),
  ``CorruptFrameError``, ``UnknownCodecError``, ``NonFiniteError``
- ``codec.spec.SpecError``: a spec string that does not parse
- ``codec.io``: ``UnsupportedFormatError``, ``TensorFileError``, ``TensorNameError``
- ``transport``: ``MismatchError``, ``RankError``, ``RankTypeError``
- ``codec.cli``: ``UsageError``, ``DataError`` (never leave ``main``: they become exit 2 and 1)

tests/test_errors.py walks every module of codec/ and transport/ and holds every exception
class defined there to this.
"""


class CodecError(Exception):
    """Base class of every error gradcodec raises on purpose."""


class CodecValueError(CodecError, ValueError):
    """A bad value: a parameter out of its range, an array of the wrong shape or size, an
    option that contradicts another.  The message names the argument."""


class CodecTypeError(CodecError, TypeError):
    """An argument of the wrong type: an unsupported dtype, a non-array, an array type that
    cannot be read or written (a device array on a machine without CUDA).  The message names
    the argument."""


class CodecIndexError(CodecError, IndexError):
    """A position outside the array it indexes."""


class CodecKeyError(CodecError, KeyError):
    """A key that error feedback (or a layout) does not hold."""

    def __str__(self):  # KeyError's str() is the repr of its argument: keep the sentence
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class CorruptFrameError(CodecValueError):
    """A frame (or container) is truncated, damaged or forged; raised before any large allocation."""


class UnknownCodecError(CodecValueError):
    """A spec, config or frame names a codec or stage that is not registered."""


class NonFiniteError(CodecValueError):
    """NaN or inf where a codec needs finite values; the one builder of that message:
    ``"{where}: non-finite value at position {position}; {who} {why}"`` (``where`` names the
    argument, ``position`` is the array index of the first bad element, ``who`` the codec
    or stage that refuses it)."""

    def __init__(self, where: str, position, who: str, why: str = "needs finite input"):
        super().__init__(f"{where}: non-finite value at position {position}; {who} {why}")
        self.position = position
