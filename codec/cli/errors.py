"""Exit statuses, and the one table that maps an exception to a status and a line (docs/cli.md).

The commands raise :class:`UsageError` (status 2) and :class:`DataError` (status 1), adding
what the user needs to know (the file, the tensor) to the error they caught; anything else
that reaches :func:`codec.cli.main` is sorted by :data:`EXIT_STATUS`.
"""

from __future__ import annotations

from codec.errors import CodecError, CodecTypeError

EXIT_OK = 0
EXIT_DATA = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130

PROG = "gradcodec"


class UsageError(CodecError):
    """Bad arguments, spec or codec name: exit status 2."""


class DataError(CodecError):
    """A missing, unreadable or corrupt file, or data a codec refuses: exit status 1."""


def os_message(e: OSError) -> str:
    what = e.strerror or str(e)
    return f"{e.filename}: {what}" if e.filename else what


def _memory(e: MemoryError) -> str:
    return f"not enough memory{': ' + str(e) if str(e) else ''}"


def _internal(e: BaseException) -> str:
    return f"internal error: {type(e).__name__}: {e} (set GRADCODEC_DEBUG=1 for a traceback; please report it)"


#: exception class -> (exit status, its line after 'gradcodec: error: ' (None: a quiet exit),
#: re-raised with its traceback when GRADCODEC_DEBUG is set).  The first row the exception
#: is an instance of wins, so a class comes before its bases.  CodecError (every error
#: gradcodec raises on purpose: a corrupt frame, a damaged tensor file, a refused name) is bad
#: data; anything below it is a bug.
EXIT_STATUS = (
    (UsageError,        EXIT_USAGE,       str,        False),
    (DataError,         EXIT_DATA,        str,        False),
    (KeyboardInterrupt, EXIT_INTERRUPTED, None,       False),
    (MemoryError,       EXIT_DATA,        _memory,    False),
    (BrokenPipeError,   EXIT_DATA,        None,       False),  # stdout went away ('| head'): stop quietly
    (OSError,           EXIT_DATA,        os_message, False),
    (CodecError,        EXIT_DATA,        str,        True),
    (Exception,         EXIT_INTERNAL,    _internal,  True),
)


def _row(e: BaseException):
    for row in EXIT_STATUS:
        if isinstance(e, row[0]):
            return row
    raise CodecTypeError(f"no exit status for {type(e).__name__}") from e  # a BaseException the table leaves to Python


def exit_status(e: BaseException) -> tuple[int, str | None]:
    """``(exit status, one-line message)`` for an exception that reached ``main``; the message
    is None for a quiet exit (an interrupt, a closed stdout)."""
    _, status, message, _ = _row(e)
    if message is None:
        return status, None
    return status, " ".join(str(message(e)).split()) or "unknown error"


def traceback_wanted(e: BaseException) -> bool:
    """True when ``e`` is one whose traceback GRADCODEC_DEBUG asks for (the table's last column)."""
    return _row(e)[3]
