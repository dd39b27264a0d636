"""Writing a file so that a failure, an interrupt included, leaves no partial file."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path, write) -> None:
    """Create ``path`` through ``write(f)`` (``f`` a binary file) under a fresh temporary name in
    the same folder (created exclusively, never an existing file), then rename it into place:
    a failure, an interrupt included, leaves no partial file and ``path`` as it was.  The new
    file gets the usual permissions (0666 less the umask).  An existing ``path`` that is not a
    regular file or a folder (a pipe, ``/dev/null``, a terminal) is written in place instead:
    renaming over it would replace the device or pipe itself."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        with open(path, "wb") as f:
            write(f)
        return
    while True:
        # a short prefix of the name: the temporary name must fit NAME_MAX whenever the real one does
        tmp = path.with_name(f".{path.name[:32]}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
