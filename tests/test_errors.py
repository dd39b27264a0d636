"""One error hierarchy: every exception class defined in codec/ and transport/ is a CodecError,
keeps the built-in bases callers catch it by, and the command line maps each to one exit
status (docs/api.md "Errors", docs/cli.md "Exit status")."""

from __future__ import annotations

import errno
import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import codec
import transport
from codec.errors import CodecError

#: exception classes that are deliberately NOT CodecErrors, each with the reason
NOT_CODEC_ERRORS = {
    # the fuzzing oracle's "this is a bug" signal: it must never be caught by the
    # `except CodecError` that files an input under "rejected as expected"
    "codec.fuzzing.Finding",
}

#: the built-in bases each public class is caught by (`except ValueError` code keeps working)
BUILTIN_BASES = {
    "codec.errors.CodecError": set(),
    "codec.errors.CorruptFrameError": {ValueError},
    "codec.errors.UnknownCodecError": {ValueError},
    "codec.spec.SpecError": {ValueError},
    "codec.io.common.UnsupportedFormatError": {ValueError},
    "codec.io.common.TensorFileError": {ValueError},
    "codec.io.common.TensorNameError": {ValueError},
    "codec.cli.errors.UsageError": set(),
    "codec.cli.errors.DataError": set(),
}


def _modules():
    out = [codec, transport]
    for pkg in (codec, transport):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.rsplit(".", 1)[-1] == "__main__":  # runs the program when imported
                continue
            out.append(importlib.import_module(info.name))
    return out


def _exception_classes():
    """{qualified name: class} of every exception class defined (not merely imported) in a
    module of codec/ or transport/, classes nested in classes included."""
    found = {}

    def visit(namespace, module_name):
        for obj in list(vars(namespace).values()):
            if inspect.isclass(obj) and obj.__module__ == module_name:
                if issubclass(obj, BaseException):
                    found[f"{module_name}.{obj.__qualname__}"] = obj
                if obj is not namespace:
                    visit(obj, module_name)

    for mod in _modules():
        visit(mod, mod.__name__)
    return found


EXCEPTIONS = _exception_classes()


def test_the_walk_finds_the_known_classes():
    for name in (*BUILTIN_BASES, *NOT_CODEC_ERRORS):
        assert name in EXCEPTIONS, name
    assert any(n.startswith("transport.") for n in EXCEPTIONS)


@pytest.mark.parametrize("name", sorted(EXCEPTIONS))
def test_every_exception_class_is_a_codec_error(name):
    cls = EXCEPTIONS[name]
    if name in NOT_CODEC_ERRORS:
        assert not issubclass(cls, CodecError), f"{name} is listed as deliberately not a CodecError"
        return
    assert issubclass(cls, CodecError), f"{name} ({', '.join(b.__name__ for b in cls.__mro__)}) does not derive from CodecError"


@pytest.mark.parametrize("name", sorted(BUILTIN_BASES))
def test_builtin_bases_are_kept(name):
    cls = EXCEPTIONS[name]
    builtins = {b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (Exception, BaseException, object)}
    assert builtins == BUILTIN_BASES[name]


def test_transport_errors_keep_their_bases():
    assert issubclass(transport.MismatchError, ValueError) and issubclass(transport.MismatchError, CodecError)
    assert issubclass(transport.RankError, ValueError) and issubclass(transport.RankError, CodecError)
    assert issubclass(transport.RankTypeError, transport.RankError) and issubclass(transport.RankTypeError, TypeError)


def test_public_names_are_the_same_classes():
    import codec.io
    import codec.spec

    assert codec.CodecError is CodecError
    assert codec.io.TensorFileError is EXCEPTIONS["codec.io.common.TensorFileError"]
    assert codec.io.TensorNameError is EXCEPTIONS["codec.io.common.TensorNameError"]
    assert codec.io.UnsupportedFormatError is EXCEPTIONS["codec.io.common.UnsupportedFormatError"]
    assert codec.spec.SpecError is EXCEPTIONS["codec.spec.SpecError"]


# ------------------------------------------------------------- still caught as ValueError
@pytest.mark.parametrize("spec", ["topk(", "fp16+", "", "zstd(level=1,level=2)"])
def test_spec_error_is_caught_as_value_error_and_codec_error(spec):
    from codec.spec import SpecError

    for catch in (ValueError, CodecError, SpecError):
        with pytest.raises(catch):
            try:
                codec.get_codec(spec)
            except ValueError as e:  # what callers wrote before the hierarchy was one
                assert isinstance(e, (SpecError, codec.UnknownCodecError)), type(e)
                raise


def test_io_errors_are_caught_as_value_error_and_codec_error(tmp_path):
    from codec import io

    bad = tmp_path / "x.npy"
    bad.write_bytes(b"not a numpy file")
    cases = [
        (io.UnsupportedFormatError, lambda: io.read_tensors(tmp_path / "x.pt")),
        (io.UnsupportedFormatError, lambda: io.write_tensors(tmp_path / "x.pt", {"a": np.ones(1)})),
        (io.TensorFileError, lambda: io.read_tensors(bad)),
        (io.TensorFileError, lambda: io.write_tensors(tmp_path / "i.npy", {"a": np.arange(3)})),
        (io.TensorNameError, lambda: io.write_tensors(tmp_path / "n.npz", {"a\x00": np.ones(1)})),
        (io.TensorNameError, lambda: io.check_names(tmp_path / "m.safetensors", ["__metadata__"])),
    ]
    for cls, call in cases:
        for catch in (ValueError, CodecError, cls):
            with pytest.raises(catch) as info:
                call()
            assert type(info.value) is cls
    # a missing file stays an OSError, not a CodecError
    with pytest.raises(FileNotFoundError) as info:
        io.read_tensors(tmp_path / "missing.npz")
    assert not isinstance(info.value, CodecError)


# ------------------------------------------------------------- the CLI's one table
def test_exit_status_table_is_ordered_most_specific_first():
    from codec.cli.errors import EXIT_STATUS

    classes = [row[0] for row in EXIT_STATUS]
    for i, earlier in enumerate(classes):
        for later in classes[i + 1 :]:
            assert not issubclass(later, earlier), f"{later.__name__} is shadowed by {earlier.__name__}"
    assert classes[-1] is Exception


def test_exit_status_of_each_kind_of_error():
    from codec.cli.errors import (
        EXIT_DATA, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, DataError, UsageError, exit_status, traceback_wanted,
    )
    from codec.io import TensorFileError
    from codec.spec import SpecError

    assert (EXIT_DATA, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED) == (1, 2, 3, 130)
    assert exit_status(UsageError("bad  spec\n 'x'")) == (2, "bad spec 'x'")
    assert exit_status(DataError("f.gcf: truncated")) == (1, "f.gcf: truncated")
    assert exit_status(KeyboardInterrupt()) == (130, None)
    assert exit_status(BrokenPipeError()) == (1, None)
    assert exit_status(MemoryError()) == (1, "not enough memory")
    assert exit_status(MemoryError("4 GiB")) == (1, "not enough memory: 4 GiB")
    assert exit_status(FileNotFoundError(errno.ENOENT, "No such file or directory", "a.gcf")) == (1, "a.gcf: No such file or directory")
    assert exit_status(PermissionError(errno.EACCES, "Permission denied")) == (1, "Permission denied")
    # an error gradcodec raises on purpose that no command wrapped: bad data, not a bug
    for e in (codec.CorruptFrameError("bad crc"), codec.UnknownCodecError("nope"), SpecError("bad spec"), TensorFileError("t"),
              transport.RankError("rank 1 failed"), CodecError("other")):
        assert exit_status(e) == (1, str(e)), type(e)
    # anything else is a bug: exit 3, one line
    status, line = exit_status(RuntimeError("boom"))
    assert status == 3 and line == "internal error: RuntimeError: boom (set GRADCODEC_DEBUG=1 for a traceback; please report it)"
    assert exit_status(ValueError(""))[0] == 3  # a plain ValueError (e.g. from NumPy) is not gradcodec's
    assert exit_status(UsageError("")) == (2, "unknown error")
    # GRADCODEC_DEBUG asks for the traceback of what reached main unwrapped, not of usage/data/OS errors
    assert [traceback_wanted(e) for e in (UsageError(), DataError(), OSError(), KeyboardInterrupt(), SpecError(), RuntimeError())] == [
        False, False, False, False, True, True]
