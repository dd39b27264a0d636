"""codec/manyframe/parse.py: every refusal of the many-tensor parser reached by a frame made
for it (each matched by its own message), its header cache, and layouts whose names repeat
(issue 28: refused by ``Layout`` and by every parse path)."""

from __future__ import annotations

import pickle
import zlib

import numpy as np
import pytest

import codec
from codec.errors import CodecTypeError, CodecValueError, CorruptFrameError
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
    with pytest.raises(CodecTypeError, match=r"^names: a name must be a str, got list$"):
        Layout.of(list(TWO.values()), names=["w", ["v"]])


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
    c = codec.get_codec("none")
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
    table = c.encode_many(TWO)  # a table frame checks a given layout's names too
    with pytest.raises(CodecValueError, match=r"^layout: the tensor name 'w' appears twice") as e:
        codec.decode_many(table, layout=bad)
    assert not isinstance(e.value, CorruptFrameError)


def test_table_frame_with_repeated_names_is_corrupt():
    frame = codec.get_codec("none").encode_many({"wa": TWO["w"], "wb": TWO["v"]})
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


# ------------------------------------------------------------------ frames made field by field
from codec.frame import CHECKSUMS  # noqa: E402
from codec.manyframe import (  # noqa: E402
    FLAG_DERIVED,
    FLAG_JOINT,
    FLAG_LAYOUT_HASH,
    FLAG_NAMES,
    FLAG_ZSTD,
    is_many,
    put_varint,
)
from codec.manyframe import parse as parse_mod  # noqa: E402

CRC32, CRC32C = CHECKSUMS["crc32"][0], CHECKSUMS["crc32c"][0]
VALUES = 1  # the values section kind (codec.frame.Kind.VALUES)


def build(*, flags=0, spec=b"none", count=None, layout=b"", patterns=((( VALUES, 32),),), tensors=((0, (3,)),),
          raw_total=None, payload=bytes(12), reserved=0) -> bytes:
    """A v2 frame from its fields (docs/format.md), both CRCs right: ``layout`` is the table's
    or the hash's bytes, ``patterns`` per pattern its (kind byte, bits), ``tensors`` per entry
    (pattern id, written counts)."""
    out = bytearray(b"\x89GCF") + bytes([2, flags]) + reserved.to_bytes(2, "little")
    put_varint(out, len(spec))
    out += spec
    put_varint(out, len(tensors) if count is None else count)
    out += layout
    put_varint(out, len(patterns))
    for pat in patterns:
        out.append(len(pat))
        for kind, bits in pat:
            out += bytes([kind, bits])
    for pid, counts in tensors:
        put_varint(out, pid)
        for c in counts:
            put_varint(out, c)
    if raw_total is not None:
        put_varint(out, raw_total)
    for name, (bit, crc) in CHECKSUMS.items():
        if flags & bit:
            out += crc(payload).to_bytes(4, "little")
    out += zlib.crc32(out).to_bytes(4, "little")
    return bytes(out + payload)


def f32(*shapes, names=None) -> Layout:
    return Layout(tuple(shapes), (np.dtype(np.float32),) * len(shapes), names)


ONE = f32((3,))


def test_a_built_frame_is_what_the_encoder_writes():
    x = np.arange(3, dtype=np.float32)
    assert build(flags=CRC32C | FLAG_DERIVED, layout=ONE.table(), payload=x.tobytes()) == codec.get_codec("none").encode_many([x])
    mf = parse_many(build(layout=ONE.table()))
    assert (mf.spec, mf.flags, mf.checksum, mf.joint, len(mf), mf.stored_len) == ("none", 0, None, False, 1, 12)
    assert mf.tensor(0).shape == (3,) and mf.tensor(0).dtype == np.float32 and bytes(mf.payload) == bytes(12)


def _npat_frame(npat: int) -> bytes:
    """A frame of no tensors whose pattern count is ``npat`` (the patterns themselves absent)."""
    f = bytearray(build(layout=b"", patterns=(), tensors=(), payload=b""))
    at = len(f) - 5  # the pattern count: the byte before the header CRC
    assert f[at] == 0
    f[at : at + 1] = bytes([npat])
    return bytes(f)


HUGE = 2**41  # beyond the default element limit (2**40)
F64 = np.dtype(np.float64)

REFUSED = [  # (frame, parse_many's keywords, the error's message)
    (build(layout=ONE.table())[:11], {}, r"^frame is 11 bytes, shorter than the 12-byte minimum many-tensor header$"),
    (b"\x89GCF\x02\x00\x00\x00" + bytes(4), {}, r"^frame is 12 bytes, shorter than its 15-byte header$"),
    (b"\x89GCX" + build(layout=ONE.table())[4:], {}, r"^not a gradcodec frame \(magic b'\\x89GCX'"),
    (build(layout=ONE.table())[:4] + b"\x01" + build(layout=ONE.table())[5:], {}, r"^frame format version 1 is not a many-tensor frame \(version 2\)$"),
    (build(flags=0x80, layout=ONE.table()), {}, r"^reserved header bits are set \(flags=0x80, reserved=0x0000\)$"),
    (build(reserved=1, layout=ONE.table()), {}, r"^reserved header bits are set \(flags=0x00, reserved=0x0001\)$"),
    (build(flags=CRC32 | CRC32C, layout=ONE.table()), {}, r"^reserved header bits are set \(flags=0x03,"),
    (build(spec=b"x" * 4097, layout=ONE.table()), {}, r"^header declares a 4097-byte spec, beyond the format's 4096$"),
    (build(spec=b"x" * 4096, layout=ONE.table())[:200], {}, r"^many-tensor frame: the spec \(4096 bytes\) runs past the header$"),
    (build(count=6, layout=b"", patterns=(), tensors=(), payload=b""), {}, r"^header declares 6 tensors, more than its 19 bytes can describe$"),
    (build(flags=FLAG_LAYOUT_HASH, count=1000, layout=ONE.hash), {"layout": ONE}, r"^header declares 1000 tensors"),
    (build(flags=FLAG_JOINT, count=1000, layout=ONE.table()), {}, r"^header declares 1000 tensors"),
    (build(flags=FLAG_LAYOUT_HASH, layout=ONE.hash)[:21], {"layout": ONE}, r"^many-tensor frame: the layout hash \(8 bytes\) runs past the header$"),
    (_npat_frame(5), {}, r"^header declares 5 section patterns, more than its 19 bytes can describe$"),
    (build(layout=ONE.table())[:20], {}, r"^many-tensor frame: header ends inside a pattern$"),
    (build(layout=ONE.table(), patterns=(((VALUES, 0),),)), {}, r"^section pattern 0: item width 0 bits outside 1\.\.64$"),
    (build(layout=ONE.table(), patterns=(((VALUES, 32),), ((VALUES, 65),))), {}, r"^section pattern 1: item width 65 bits outside 1\.\.64$"),
    (build(flags=FLAG_DERIVED, layout=ONE.table(), patterns=(((VALUES | 0x20, 32),),), tensors=((0, ()),)), {},
     r"^section pattern 0, section 0: count rule 2 is not one an encoder writes$"),
    (build(flags=FLAG_DERIVED, layout=ONE.table(), patterns=(((VALUES, 8), (VALUES | 0x30, 8)),), tensors=((0, (1,)),)), {},
     r"^section pattern 0, section 1: count rule 3 is not one an encoder writes$"),
    (build(layout=ONE.table(), tensors=((1, (3,)),)), {}, r"^tensor 0: pattern 1, the frame has 1$"),
    (build(layout=ONE.table())[:-13], {}, r"^frame is 26 bytes, shorter than its 27-byte header$"),
    # after the header walk
    (build(layout=ONE.table())[:9] + b"X" + build(layout=ONE.table())[10:], {}, r"^header checksum mismatch: the header is damaged$"),
    (build(spec=b"\xff", layout=ONE.table()), {}, r"^spec text is not UTF-8$"),
    (build(flags=FLAG_LAYOUT_HASH, count=2, layout=ONE.hash, tensors=((0, (3,)), (0, (3,))), payload=bytes(24)), {"layout": ONE},
     rf"^many-tensor frame: its layout hash {ONE.hash.hex()} is not the given layout's {ONE.hash.hex()} \(1 tensors; the frame has 2\)$"),
    (build(flags=FLAG_LAYOUT_HASH, layout=ONE.hash), {"layout": f32((4,))}, rf"its layout hash {ONE.hash.hex()} is not the given layout's {f32((4,)).hash.hex()}"),
    (build(flags=FLAG_LAYOUT_HASH | FLAG_JOINT, count=1000, layout=ONE.hash), {"layout": ONE}, r"\(1 tensors; the frame has 1000\)$"),
    (build(flags=FLAG_LAYOUT_HASH | FLAG_NAMES, layout=ONE.hash), {"layout": ONE}, r"^many-tensor frame: the names flag does not match the given layout$"),
    (build(flags=FLAG_LAYOUT_HASH, layout=f32((3,), names=("a",)).hash), {"layout": f32((3,), names=("a",))}, r"the names flag does not match"),
    (build(layout=f32((HUGE,)).table(), tensors=((0, (0,)),), payload=b""), {}, rf"^tensor 0: shape \({HUGE},\): its non-zero dimensions exceed {2**40} elements$"),
    (build(layout=f32((3,), (HUGE, 0)).table(), tensors=((0, (3,)), (0, (0,))), payload=bytes(12)), {}, rf"^tensor 1: shape \({HUGE}, 0\): its non-zero"),
    (build(layout=f32((3,), (3,)).table(), tensors=((0, (3,)), (0, (3,))), payload=bytes(24)), {"max_elements": 5}, r"^frame declares 6 elements, more than the limit of 5$"),
    (build(flags=FLAG_JOINT, count=2, layout=Layout(((3,), (3,)), (np.dtype(np.float32), F64)).table(), tensors=((0, (6,)),), payload=bytes(24)), {},
     r"^many-tensor frame: a joint frame's tensors must share a dtype$"),
    (build(layout=ONE.table(), patterns=(((VALUES, 8),),), tensors=((0, (1073,)),), payload=bytes(1073)), {}, r"^tensor 0, section 0: 1073 raw bytes is more than 3 elements can need$"),
    (build(layout=ONE.table(), patterns=(((VALUES, 8), (VALUES, 8)),), tensors=((0, (1, 1073)),), payload=bytes(1074)), {}, r"^tensor 0, section 1: 1073 raw bytes"),
    (build(layout=ONE.table(), payload=bytes(13)), {}, r"^frame is 40 bytes but its sections end at byte 39$"),
    (build(layout=ONE.table(), payload=bytes(11)), {}, r"^frame is 38 bytes but its sections end at byte 39$"),
    (build(flags=FLAG_ZSTD, layout=ONE.table(), raw_total=13, payload=b"\x28\xb5\x2f\xfd"), {}, r"^many-tensor frame: the sections add up to 12 bytes, the header says 13$"),
]


@pytest.mark.parametrize("frame, kw, message", REFUSED, ids=[m.strip("^$")[:40] for _, _, m in REFUSED])
def test_every_refusal_names_its_reason(frame, kw, message):
    with pytest.raises(CorruptFrameError, match=message):
        parse_many(frame, **kw)


def test_a_hash_frame_needs_its_layout():
    with pytest.raises(CodecValueError, match=r"^layout: this many-tensor frame gives its layout by hash; pass layout=") as e:
        parse_many(build(flags=FLAG_LAYOUT_HASH, layout=ONE.hash))
    assert not isinstance(e.value, CorruptFrameError)
    assert len(parse_many(build(flags=FLAG_LAYOUT_HASH, layout=ONE.hash), layout=ONE)) == 1
    named = f32((3,), names=("a",))
    mf = parse_many(build(flags=FLAG_LAYOUT_HASH | FLAG_NAMES, layout=named.hash), layout=named)
    assert mf.layout is named


def test_a_table_frame_checks_the_given_layout():
    frame = build(flags=FLAG_NAMES, layout=f32((3,), names=("a",)).table())
    for other in (f32((4,)), Layout(((3,),), (F64,))):
        with pytest.raises(CodecValueError, match=r"^layout: the frame's tensors \(dtype and shape\) are not the given layout's$"):
            parse_many(frame, layout=other)
    with pytest.raises(CodecValueError, match=r"^layout: the frame's tensor names are not the given layout's$"):
        parse_many(frame, layout=f32((3,), names=("b",)))
    for same in (ONE, f32((3,), names=("a",)), [np.zeros(3, np.float32)]):
        assert parse_many(frame, layout=same).layout.names == ("a",)


def test_the_edges_each_check_lets_through():
    """The largest value each check accepts is accepted (the refusals above are one past it)."""
    ok = [
        build(layout=ONE.table(), spec=b"x" * 4096),
        build(layout=ONE.table(), patterns=(((VALUES, 1),),), payload=bytes(1)),
        build(layout=ONE.table(), patterns=(((VALUES, 64),),), payload=bytes(24)),
        build(layout=ONE.table(), patterns=(((VALUES, 8),),), tensors=((0, (1072,)),), payload=bytes(1072)),
        build(layout=ONE.table(), patterns=(((VALUES, 8),), ((VALUES, 32),)), tensors=((1, (3,)),)),
        build(layout=f32((2**40,)).table(), tensors=((0, (0,)),), payload=b""),
        build(layout=b"", patterns=(), tensors=(), payload=b""),  # the header is the whole frame
    ]
    for frame in ok:
        assert len(parse_many(frame)) in (0, 1)
    assert len(parse_many(build(layout=f32((HUGE, 0)).table(), tensors=((0, (0,)),), payload=b""), max_elements=2**42)) == 1
    assert len(parse_many(build(layout=f32((3,), (3,)).table(), tensors=((0, (3,)), (0, (3,))), payload=bytes(24)), max_elements=6)) == 2
    for frame, what in ((build(count=5, layout=b"", patterns=(), tensors=(), payload=b""), "tensors"), (_npat_frame(4), "section patterns")):
        with pytest.raises(CorruptFrameError) as e:  # fits the bytes left: refused later, for another reason
            parse_many(frame)
        assert f"header declares" not in str(e.value), what


def test_payload_checksums():
    x = np.arange(3, dtype=np.float32).tobytes()
    for flag, name in ((CRC32, "crc32"), (CRC32C, "crc32c")):
        frame = build(flags=flag, layout=ONE.table(), payload=x)
        assert parse_many(frame).checksum == name and bytes(parse_many(frame).payload) == x
        damaged = frame[:-1] + b"\x01"
        with pytest.raises(CorruptFrameError, match=r"^payload checksum mismatch: the section data is damaged$"):
            parse_many(damaged)
        assert bytes(parse_many(damaged, verify_payload=False).payload)[-1] == 1


def test_count_rules_and_pattern_ids():
    """Without flags bit 6 a kind byte is the kind; with it, its high 4 bits are the count
    rule: 1 for one item, ``r`` for section ``r - 2``'s count."""
    plain = parse_many(build(layout=ONE.table(), patterns=(((0x21, 8),),), tensors=((0, (3,)),), payload=bytes(3)))
    assert [(s.kind, s.count) for s in plain.tensor_sections[0]] == [(0x21, 3)]
    pats = (((VALUES, 8),), ((4, 8), (VALUES, 16), (VALUES | 0x10, 32), (3 | 0x30, 8)))
    mf = parse_many(build(flags=FLAG_DERIVED, layout=f32((3,), (5,)).table(), patterns=pats, tensors=((0, (3,)), (1, (2, 5))), payload=bytes(3 + 2 + 10 + 4 + 5)))
    assert [[(s.kind, s.bits, s.count, s.offset) for s in t] for t in mf.tensor_sections] == [
        [(VALUES, 8, 3, 0)],
        [(4, 8, 2, 3), (VALUES, 16, 5, 5), (VALUES, 32, 1, 15), (3, 8, 5, 19)],
    ]
    t = mf.tensor(1)
    assert (t.shape, t.dtype, t.sections, t.header_len, t.spec) == ((5,), np.float32, mf.tensor_sections[1], 0, "none")


def test_joint_frames():
    two = f32((3,), (2,))
    mf = parse_many(build(flags=FLAG_JOINT, count=2, layout=two.table(), tensors=((0, (5,)),), payload=bytes(20)))
    assert mf.joint and len(mf) == 2 and len(mf.tensor_sections) == 1 and mf.tensor_sections[0][0].count == 5
    assert (mf.whole().shape, mf.whole().dtype, mf.whole().header_len) == ((5,), np.float32, 0)
    with pytest.raises(CodecValueError, match=r"^a joint many-tensor frame codes its tensors as one: read it with whole\(\)$"):
        mf.tensor(0)
    alone = parse_many(build(flags=FLAG_JOINT, layout=ONE.table())).whole()  # one tensor
    assert (alone.shape, alone.dtype) == ((3,), np.float32)
    wide = Layout(((2,), (1,)), (F64, F64))
    assert parse_many(build(flags=FLAG_JOINT, count=2, layout=wide.table(), patterns=(((VALUES, 64),),), payload=bytes(24))).whole().dtype == F64
    empty = parse_many(build(flags=FLAG_JOINT, count=0, layout=b"", tensors=((0, (0,)),), payload=b""))
    assert (empty.whole().shape, empty.whole().dtype, len(empty)) == ((0,), np.float32, 0)
    x = {"a": np.arange(3, dtype=np.float32), "b": np.ones(2, np.float32)}
    for form in ("table", "hash"):
        frame = codec.get_codec("none").encode_many(x, joint=True, layout=form)
        got = codec.decode_many(frame, layout=Layout.of(x))
        assert all(np.array_equal(got[k], x[k]) for k in x)


def test_a_zstd_payload():
    zstd = pytest.importorskip("zstandard")
    x = np.arange(3, dtype=np.float32).tobytes()
    mf = parse_many(build(flags=FLAG_ZSTD, layout=ONE.table(), raw_total=12, payload=zstd.compress(x)))
    assert bytes(mf.payload) == x and mf.finish() is None
    with pytest.raises(CorruptFrameError, match=r"^many-tensor frame: zstd declares 13 bytes, the header implies 12$"):
        parse_many(build(flags=FLAG_ZSTD, layout=ONE.table(), raw_total=12, payload=zstd.compress(x + b"\0")))
    longer = parse_many(build(flags=FLAG_ZSTD, layout=ONE.table(), raw_total=12, payload=zstd.compress(x) + zstd.compress(b"\0")))
    assert bytes(longer.payload[0:12]) == x
    with pytest.raises(CorruptFrameError, match=r"^many-tensor frame: zstd data holds more than the 12 bytes the header implies$"):
        longer.finish()
    assert parse_many(build(layout=ONE.table())).finish() is None  # a raw payload was checked whole


def test_is_many():
    frame = build(layout=ONE.table())
    assert is_many(frame) is True and is_many(frame[:5]) is True and is_many(np.frombuffer(frame, np.uint8)) is True
    for other in (frame[:4], b"\x89GCX\x02", b"\x89GCF\x01\x00", codec.get_codec("none").encode(np.zeros(3, np.float32)), object(), np.zeros((4, 4))[:, 0]):
        assert is_many(other) is False


# ------------------------------------------------------------------ the header cache
def test_the_header_cache_without_a_payload_checksum():
    """Issue 28: frames without a payload checksum end their remembered header at the header
    CRC, so a frame whose last count differs is parsed afresh (two threshold frames)."""
    c = codec.get_codec("threshold(value=0.5)", checksum=False)
    xs = [np.linspace(-1, 1, 9).astype(np.float32), np.linspace(-2, 2, 9).astype(np.float32)]
    frames = [c.encode_many({"a": x}) for x in xs]
    assert frames[0][5] & (CRC32 | CRC32C) == 0 and len(frames[0]) != len(frames[1])
    for _ in range(2):
        for x, frame in zip(xs, frames):
            assert np.array_equal(codec.decode_many(frame)["a"], codec.decode(c.encode(x)))
    first, again = parse_many(frames[0]), parse_many(frames[0])
    assert again.tensor_sections is first.tensor_sections and parse_many(frames[1]).tensor_sections is not first.tensor_sections


def test_the_header_cache_with_a_payload_checksum():
    """Two frames whose headers differ only in the payload checksum share the parsed sections;
    the header CRC and the limits are checked on every frame all the same."""
    one, two = (build(flags=CRC32C, layout=ONE.table(), payload=bytes([i]) * 12) for i in (1, 2))
    first = parse_many(one)
    assert parse_many(two).tensor_sections is first.tensor_sections and bytes(parse_many(two).payload) == bytes([2]) * 12
    with pytest.raises(CorruptFrameError, match=r"^frame declares 3 elements, more than the limit of 2$"):
        parse_many(two, max_elements=2)
    damaged = bytearray(two)
    damaged[27] ^= 1  # the header CRC (after the payload checksum)
    with pytest.raises(CorruptFrameError, match=r"^header checksum mismatch"):
        parse_many(bytes(damaged))
    empty = build(layout=f32((0,)).table(), tensors=((0, (0,)),), payload=b"")  # the header is the whole frame
    assert parse_many(empty).tensor_sections is parse_many(empty).tensor_sections


def test_the_header_cache_keeps_the_latest_few():
    frames = [build(layout=f32((n,)).table(), tensors=((0, (n,)),), payload=bytes(4 * n)) for n in range(1, parse_mod._RECENT_MAX + 3)]
    parsed = [parse_many(f) for f in frames]
    assert len(parse_mod._RECENT) == parse_mod._RECENT_MAX and parse_mod._RECENT[0][2] is parsed[-1].layout
    assert parse_many(frames[-1]).tensor_sections is parsed[-1].tensor_sections
    assert parse_many(frames[0]).tensor_sections is not parsed[0].tensor_sections  # forgotten


def test_a_header_seen_with_another_layout_object_is_parsed_afresh():
    frame = build(flags=FLAG_LAYOUT_HASH, layout=ONE.hash)
    first = parse_many(frame, layout=ONE)
    assert parse_many(frame, layout=ONE).tensor_sections is first.tensor_sections
    again = parse_many(frame, layout=f32((3,)))
    assert again.tensor_sections == first.tensor_sections and again.tensor_sections is not first.tensor_sections


# ------------------------------------------------------------------ the sparse header's kernel
def _pairs_read(frame: bytes, sizes, bits: int):
    """What the parser reads of a sparse frame's sections, as ``pairs.pair_sections`` gives
    it (the header's length, each index section's (kind, bits, count, offset, length), each
    tensor's values offset and count), or None where it raises or the frame is not that."""
    from codec.pack import INDEX_KINDS

    try:
        h = parse_mod.read_header(memoryview(frame))
        secs, off = parse_mod._sections(h, sizes)
    except CorruptFrameError:
        return None
    if h.flags & FLAG_ZSTD or off != len(frame) - h.header_len:
        return None
    if any(len(s) != 2 or s[0].kind not in INDEX_KINDS or s[1].kind != VALUES or s[1].bits != bits for s in secs):
        return None
    return h.header_len, [(s[0].kind, s[0].bits, s[0].count, s[0].offset, s[0].raw_len) for s in secs], [s[1].offset for s in secs], [s[1].count for s in secs]


def _kernel_read(frame: bytes, at: int, sizes, bits: int):
    from codec.kernels import module

    flags = frame[5]  # (the bytes before ``at`` are the frame's as it was made)
    n = len(sizes)
    table, values_at, counts = np.full((n, 5), -7, np.int64), np.full(n, -7, np.int64), np.full(n, -7, np.int64)
    data = np.frombuffer(frame, np.uint8)
    hl = module("pairs").pair_sections(data, at, np.array(sizes, np.int64), bool(flags & FLAG_DERIVED), bool(flags & 3), bits, table, values_at, counts)
    return None if hl < 0 else (hl, [tuple(r) for r in table.tolist()], values_at.tolist(), counts.tolist())


def test_the_sparse_header_kernel_reads_what_the_parser_reads():
    """``pairs.pair_sections`` against :func:`read_header` and ``_sections``: the same
    sections for sparse frames of every index kind and count rule (derived or written
    counts, a payload CRC or none, float32 and float64 values, an empty tensor), and on
    every byte after the layout changed to one of several values it reads exactly the frames the parser reads as such and refuses the
    others."""
    rng = np.random.default_rng(5)
    frames = []
    for spec, dtype, checksum in (("topk(ratio=0.2)", np.float32, True), ("dgc(ratio=0.05)", np.float64, True), ("gaussiank(ratio=0.3)", np.float32, False)):
        ts = {f"t{i}": np.asarray(rng.standard_t(3, n)).astype(dtype) for i, n in enumerate((333, 0, 1, 40, 7))}
        frames.append((codec.Codec(spec, checksum=checksum).encode_many(ts), [v.size for v in ts.values()], np.dtype(dtype).itemsize * 8))
    bitmap = 2
    pats = (((3, 4), (VALUES, 32)), ((bitmap, 1), (VALUES, 32)))  # written counts (no FLAG_DERIVED): gaps, then a bitmap
    payload = bytes([0x21]) + np.ones(2, np.float32).tobytes() + bytes([0x05]) + np.ones(2, np.float32).tobytes()
    frames.append((build(flags=CRC32C, layout=f32((9,), (3,)).table(), patterns=pats, tensors=((0, (2, 2)), (1, (3, 2))), payload=payload), [9, 3], 32))
    for frame, sizes, bits in frames:
        at = parse_mod.read_header(memoryview(frame)).table_end
        want = _pairs_read(frame, sizes, bits)
        assert want is not None and _kernel_read(frame, at, sizes, bits) == want
        assert _kernel_read(frame, at, sizes, 64 if bits == 32 else 32) is None  # (values of another width)
        hl = want[0]
        read = refused = 0
        for pos in range(at, hl - 4):
            for v in {0, 1, 2, 0x21, 0x7F, 0x80, 0xFF, frame[pos] ^ 1, frame[pos] + 1 & 0xFF}:
                changed = bytearray(frame)
                changed[pos] = v
                changed = bytes(changed)  # (neither reads the CRCs)
                got, ref = _kernel_read(changed, at, sizes, bits), _pairs_read(changed, sizes, bits)
                assert got == ref, (pos, v)
                read, refused = read + (got is not None), refused + (got is None)
        assert read and refused
