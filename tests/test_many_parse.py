"""codec/manyframe/parse.py: every refusal of the many-tensor parser reached by a frame made
for it (each matched by its own message), its header cache, and layouts whose names repeat
(issue 28: refused by ``Layout`` and by every parse path)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import codec
from codec.errors import CodecValueError, CorruptFrameError
from codec.fuzzing import fix_many_checksums
from codec.manyframe import Layout, parse_many


def _forged(shapes, dtypes, names) -> Layout:
    """A Layout built without its constructor (as an unpickler or ``object.__new__`` does)."""
    lay = object.__new__(Layout)
    for k, v in (("shapes", shapes), ("dtypes", dtypes), ("names", names)):
        object.__setattr__(lay, k, v)
    return lay


TWO = {"w": np.arange(3, dtype=np.float32), "v": np.arange(3, dtype=np.float32)}
F32 = (np.dtype(np.float32),) * 2


def test_layout_refuses_repeated_names():
    with pytest.raises(CodecValueError, match=r"names: 'w' appears twice"):
        Layout(((3,), (3,)), F32, ("w", "w"))
    with pytest.raises(CodecValueError, match=r"names: 'w' appears twice"):
        Layout.of(list(TWO.values()), names=["w", "w"])
    assert Layout.of(list(TWO.values()), names=["w", "v"]).names == ("w", "v")


def test_unpickled_layout_with_repeated_names_is_refused():
    good = Layout(((3,), (3,)), F32, ("wa", "wb"))
    assert pickle.loads(pickle.dumps(good)) == good
    raw = pickle.dumps(good)
    assert raw.count(b"wb") == 1
    with pytest.raises(CodecValueError, match=r"names: 'wa' appears twice"):
        pickle.loads(raw.replace(b"wb", b"wa"))


def test_hash_frame_with_a_layout_whose_names_repeat_is_refused():
    """Issue 28 (a): the hash form used to decode such a layout into fewer tensors than the
    frame has, silently (a dict keeps one of two equal keys)."""
    c = codec.get_codec("fp16")
    frame = c.encode_many(TWO, layout="hash")
    bad = _forged(((3,), (3,)), F32, ("w", "w"))
    good = Layout.of(TWO)
    assert frame.count(good.hash) == 1
    forged = fix_many_checksums(frame.replace(good.hash, bad.hash))  # the hash of the bad layout
    for call in (codec.decode_many, codec.decode_sparse_many, c.decode_many, codec.inspect, parse_many):
        with pytest.raises(CodecValueError, match=r"layout: the tensor name 'w' appears twice") as e:
            call(forged, layout=bad)
        assert not isinstance(e.value, CorruptFrameError)  # the caller's layout, not the frame
    with pytest.raises(CodecValueError, match=r"layout: the tensor name 'w' appears twice"):
        codec.decode_add_many(forged, [np.zeros(3, np.float32)] * 2, layout=bad)


def test_table_frame_with_repeated_names_is_corrupt():
    frame = codec.get_codec("fp16").encode_many({"wa": TWO["w"], "wb": TWO["v"]})
    forged = fix_many_checksums(frame.replace(b"wb", b"wa"))
    with pytest.raises(CorruptFrameError, match=r"many-tensor frame: the tensor name 'wa' appears twice"):
        parse_many(forged)
    with pytest.raises(CorruptFrameError, match="header checksum mismatch"):  # the CRC comes first
        parse_many(frame.replace(b"wb", b"wa"))


def test_a_layout_pickled_with_its_cache_keeps_only_its_fields():
    """A pickle of a Layout made before it had ``__getstate__`` holds its ``__dict__``, the
    cached checks included: unpickling keeps the fields and checks them afresh."""
    lay = object.__new__(Layout)
    with pytest.raises(CodecValueError, match=r"names: 'w' appears twice"):
        lay.__setstate__({"shapes": ((3,), (3,)), "dtypes": F32, "names": ("w", "w"), "names_unique": True})
    lay = object.__new__(Layout)
    lay.__setstate__({"shapes": ((3,),), "dtypes": F32[:1], "names": None, "largest": 0})
    assert lay == Layout(((3,),), F32[:1]) and lay.largest == 3 and lay.names_unique
