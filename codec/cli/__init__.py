"""The ``gradcodec`` command line (docs/cli.md).

    gradcodec list [--json]                        registered codecs and their parameters
    gradcodec encode SPEC INPUT -o OUT [--many]    tensors -> a frame (one), a container (several) or one v2 frame
    gradcodec decode FRAMEFILE -o OUT              frame or container -> .npy / .npz / .safetensors
    gradcodec info FRAMEFILE [--json]              the header(s), nothing decoded
    gradcodec roundtrip SPEC INPUT [--steps N]     ratio, error and speed per tensor; N steps under error feedback
    gradcodec demo [--json] [--codecs SPEC,...]    every codec on the bundled gradient sample, by family

Exit status: 0 success; 1 bad data (missing, unreadable or corrupt file, a tensor name the
output cannot hold, data a codec refuses, not enough memory); 2 usage (bad arguments, bad
spec, unknown codec, unsupported file extension, an output that is the input file); 3 an
internal error (a bug, never caused by a file's content or a name: one line, or a traceback
with GRADCODEC_DEBUG=1); 130 interrupted.  Every error is one line ``gradcodec: error: ...``
on stderr.  One table maps exceptions to these: :data:`codec.cli.errors.EXIT_STATUS`.

Outputs: a command never writes over its input (same file by any path, symlink or hard
link); OUT is written to a fresh temporary file and renamed into place; a tensor is never
renamed or dropped: a name the output format cannot hold (``codec.io.check_names``, a
container's UTF-8 and length limits) is refused before any work.

``gradcodec --help`` imports only the ``codec`` package itself (which loads NumPy but no
Numba kernel); rich, the codec stages' kernels and the file readers are imported by the
commands that need them.

Modules: ``parser`` (argparse), ``commands`` (one function per subcommand; ``demo`` the demo's), ``files``
(reading inputs, writing outputs, the checks before any work), ``measure`` (sizes, errors and
timings of a round trip), ``render`` (tables, JSON, progress bar), ``errors`` (exit statuses,
UsageError, DataError, the exception table); this one holds :func:`main`.
"""

from __future__ import annotations

import os
import sys

from codec.cli.demo import FAMILIES
from codec.cli.errors import (
    EXIT_DATA, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_STATUS, EXIT_USAGE, PROG, DataError, UsageError, exit_status,
    traceback_wanted,
)
from codec.cli.parser import build_parser

__all__ = [
    "EXIT_DATA", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_STATUS", "EXIT_USAGE", "PROG",
    "FAMILIES", "DataError", "UsageError", "build_parser", "exit_status", "main",
]


def main(argv=None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    for stream in (sys.stdout, sys.stderr):  # a name or path the terminal cannot encode is escaped, not a crash
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # --help, --version
            return e.code if isinstance(e.code, int) else EXIT_OK
        return args.func(args)
    except (KeyboardInterrupt, Exception) as e:  # noqa: BLE001  sorted by codec.cli.errors.EXIT_STATUS
        if traceback_wanted(e) and os.environ.get("GRADCODEC_DEBUG"):
            raise
        if isinstance(e, BrokenPipeError):
            _drop_stdout()
        status, message = exit_status(e)
        if message is not None:
            print(f"{PROG}: error: {message}", file=sys.stderr)
        return status


def _drop_stdout() -> None:
    """stdout went away (e.g. '| head'): send what is left to /dev/null, so that Python does
    not complain when it flushes stdout at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
