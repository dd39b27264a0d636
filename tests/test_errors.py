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
    "codec.errors.CodecValueError": {ValueError},
    "codec.errors.CodecTypeError": {TypeError},
    "codec.errors.CodecKeyError": {KeyError, LookupError},
    "codec.errors.CodecIndexError": {IndexError, LookupError},
    "codec.errors.NonFiniteError": {ValueError},
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


# ------------------------------------------------------------- raises, not only classes (issue 28)
#: built-in exceptions gradcodec never raises itself: each has a CodecError twin in codec.errors
PLAIN = {"ValueError", "TypeError", "KeyError", "IndexError"}


def test_no_plain_builtin_error_is_raised_on_purpose():
    """Every ``raise ValueError(...)`` (TypeError, KeyError, IndexError) in codec/ and transport/
    is a Codec*Error: ``except codec.CodecError`` catches whatever gradcodec refuses."""
    import ast
    from pathlib import Path

    root = Path(codec.__file__).resolve().parent.parent
    found = []
    for pkg in ("codec", "transport"):
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                exc = node.exc if isinstance(node, ast.Raise) else node.value if isinstance(node, ast.Return) else None
                if isinstance(exc, ast.Call):
                    exc = exc.func
                if isinstance(exc, ast.Name) and exc.id in PLAIN:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {exc.id}")
    assert not found, "plain built-in errors raised on purpose:\n" + "\n".join(found)


def _refused(call, match=None):
    """``call()`` raises a CodecError (whatever built-in base it keeps) whose message holds the
    text ``match``."""
    import re

    with pytest.raises(CodecError, match=None if match is None else re.escape(match)) as info:
        call()
    assert str(info.value).strip(), "an error without a message"
    return info.value


def _bad_values(p):
    """Values a parameter refuses: out of its bounds, of the wrong type, not a choice."""
    if p.choices:
        return ["nope", 1]
    if p.type is bool:
        return [2, "maybe"]
    out = ["x", "nan", "inf", "f(1)" if not p.schedule else "warmup(1,2)"]
    if p.low is not None:
        out.append(p.low if p.low_open else p.low - 1)
    if p.high is not None:
        out.append(p.high * 2 + 1)
    if p.type is int:
        out.append(1.5)
    return out


def _stage_params():
    from codec.stage import registered

    return [(name, p) for name, cls in sorted(registered().items()) for p in cls.params]


@pytest.mark.parametrize("stage,param", [(s, p.name) for s, p in _stage_params()])
def test_every_parameter_refuses_bad_values_with_a_codec_error(stage, param):
    """get_codec (a spec and a config dict) and the stage's constructor refuse a bad value of
    every parameter of every registered stage with a CodecError naming the parameter:
    ``get_codec("topk(ratio=-1)")`` was a plain ValueError."""
    from codec.stage import registered

    cls = registered()[stage]
    (p,) = [q for q in cls.params if q.name == param]
    for bad in _bad_values(p):
        _refused(lambda: codec.get_codec(f"{stage}({param}={bad})"), param)
        if not isinstance(bad, str):
            _refused(lambda: codec.get_codec({"id": stage, param: bad}), param)
            _refused(lambda: cls(**{param: bad}), param)
    _refused(lambda: codec.get_codec({"id": stage, "no_such_parameter": 1}), "no_such_parameter")


@pytest.mark.parametrize("spec", ["", "topk(", "topk(ratio=0.1", "topk)", "topk(ratio=0.1)+", "nosuch", "topk(ratio=0.1)+nosuch",
                                  "fp16+fp16", "zstd+fp16", "topk(ratio=0.1,ratio=0.2)", "topk(0.1)", "fp16(", "a" * 5000])
def test_the_spec_parser_refuses_with_a_codec_error(spec):
    _refused(lambda: codec.get_codec(spec))


@pytest.mark.parametrize("bad", [None, 3, 1.5, b"fp16", ["fp16"], {"id": 3}, {}])
def test_get_codec_refuses_what_is_not_a_spec(bad):
    _refused(lambda: codec.get_codec(bad))


def _bad_arrays():
    x = np.ones((4, 6), np.float32)
    return [
        (np.arange(10), "x: dtype int64"),
        (np.ones(3, np.complex64), "x: dtype complex64"),
        (np.array(["a"]), "x: dtype <U1"),
        (np.ma.masked_array(x), "x: masked arrays"),
        (np.broadcast_to(np.float32(1), (1 << 20,)), "x: a broadcast array"),
        ("not an array", "x: "),
        (object(), "x: expected an array-like"),
        (b"\x00\x00\x80\x3f", "x: a byte buffer has no float dtype"),
    ]


@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.25)", "qsgd", "powersgd(rank=1)"])
def test_encoders_refuse_bad_arrays_with_a_codec_error(spec):
    """encode, encode_many (as a dict and as a list) and ErrorFeedback refuse bad input with a
    CodecError naming the argument (``encode(np.arange(10))`` was a plain TypeError)."""
    c = codec.get_codec(spec)
    for bad, match in _bad_arrays():
        _refused(lambda: c.encode(bad), match)
        _refused(lambda: codec.ErrorFeedback(c).encode(bad, key="w"), match)
        name = match.replace("x: ", "tensors['w']: ", 1) if match != "x: " else "tensors"
        _refused(lambda: c.encode_many({"w": bad}), name.split(":")[0])
        _refused(lambda: codec.ErrorFeedback(c).encode_many({"w": bad}), name.split(":")[0])
    _refused(lambda: c.encode_many(42), "tensors")
    _refused(lambda: c.encode_many({"w": np.ones(3, np.float32)}, layout="nope"), "layout")
    _refused(lambda: c.encode(np.ones(3, np.float32), step=-1), "step")
    _refused(lambda: c.encode(np.ones(3, np.float32), step=1.5), "step")
    _refused(lambda: codec.ErrorFeedback(c).encode(np.ones(3, np.float32), key=["a"]), "key: must be hashable, got a list")
    _refused(lambda: codec.ErrorFeedback(c).residual({}), "key: must be hashable, got a dict")
    _refused(lambda: codec.ErrorFeedback(c).residual("never seen"), "key: no residual for 'never seen'")


def test_error_feedback_options_are_codec_errors():
    _refused(lambda: codec.ErrorFeedback("topk", momentum=1.5), "momentum")
    _refused(lambda: codec.ErrorFeedback("topk", momentum="a"), "momentum")
    _refused(lambda: codec.ErrorFeedback("fp16", residuals="yes"), "residuals")
    _refused(lambda: codec.ErrorFeedback(42))
    ef = codec.ErrorFeedback("topk(ratio=0.5)")
    ef.encode(np.ones(8, np.float32), key="w")
    _refused(lambda: ef.encode(np.ones(9, np.float32), key="w"), "x: key 'w' was float32[8], now float32[9]")
    for state, match in [(None, "state"), ({"codec": "fp16", "slots": []}, "codec"), ({"codec": "topk(ratio=0.5)"}, "slots"),
                         ({"codec": "topk(ratio=0.5)", "slots": [{"key": "w", "residual": np.arange(3), "step": 0}]}, "residual"),
                         ({"codec": "topk(ratio=0.5)", "slots": [{"key": "w", "residual": np.ones(3, np.float32), "step": -1}]}, "step")]:
        _refused(lambda: ef.load_state_dict(state), match)


def test_decoders_refuse_bad_outs_with_a_codec_error():
    x = np.ones((4, 6), np.float32)
    c = codec.get_codec("topk(ratio=0.5)")
    frame, many = c.encode(x), c.encode_many({"w": x})
    outs = [
        (np.zeros(5, np.float32), "out: has 5 elements"),
        (np.zeros(24, np.float64), "out: dtype float64"),
        (np.zeros(24, np.int32), "out: dtype int32"),
        (np.zeros((6, 4), np.float32).T, "out: must be a writeable"),
        ([0.0] * 24, "out: expected a NumPy array"),
        (np.ma.masked_array(np.zeros(24, np.float32)), "out: masked arrays"),
    ]
    for out, match in outs:
        _refused(lambda: codec.decode(frame, out=out), match)
    _refused(lambda: c.decode_add(frame, None), "out")
    _refused(lambda: c.decode_add(frame, np.zeros(24, np.int64)), "out: dtype int64 cannot accumulate")
    _refused(lambda: codec.decode_many(many, out={"w": np.zeros(5, np.float32)}), "out")
    _refused(lambda: codec.decode_many(many, out={"v": np.zeros(24, np.float32)}), "out")
    _refused(lambda: codec.decode_add_many(many, [np.zeros(24, np.int8)]), "out")
    for bad in (b"", b"GRAD" * 10, 42, None, "frame"):
        _refused(lambda: codec.decode(bad))
        _refused(lambda: codec.decode_many(bad))
        _refused(lambda: codec.inspect(bad))


def test_the_allreducer_refuses_with_codec_errors():
    pytest.importorskip("mpi4py")
    from mpi4py import MPI

    from transport import Allreducer

    self = MPI.COMM_SELF
    _refused(lambda: Allreducer("fp16", self, average="yes"), "average")
    _refused(lambda: Allreducer("fp16", self, bucket_bytes=-1), "bucket_bytes")
    _refused(lambda: Allreducer("topk(ratio=-1)", self), "ratio")
    _refused(lambda: Allreducer("fp16", self, vote=True), "vote")
    r = Allreducer("fp16", self)
    _refused(lambda: r.reduce({"w": np.arange(4)}), "dtype int64")
    _refused(lambda: r.reduce(42))
    _refused(lambda: r.reduce({"w": np.ones(4, np.float32)}, out={"w": np.ones(3, np.float32)}), "out")
    _refused(lambda: r.load_state_dict(None), "state")
    _refused(lambda: r.load_state_dict({"nope": 1}), "nope")
