"""Many-tensor frames (format v2, codec/manyframe/): one frame for all of a step's tensors.

Every codec's many-tensor frame holds, per tensor, exactly the sections its single-tensor
frame holds (the payload bytes are the same, in tensor order); decoding gives what each
single frame gives; ErrorFeedback.encode_many is ErrorFeedback.encode per tensor; a damaged
frame is a CorruptFrameError."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import codec
from codec import testing
from codec.dtypes import bfloat16
from codec.errors import NonFiniteError
from codec.frame import parse_frame
from codec.manyframe import Layout, parse_many, put_varint

SPECS = [c["id"] for c in codec.list_codecs() if c["kind"] != "bytes"] + list(testing.PIPELINES)


def model(seed=0, dtypes=(np.float32,)):
    """A small model's gradients: edge sizes (0, 1, odd, 0-d), a matrix, heavy tails."""
    rng = np.random.default_rng(seed)
    shapes = [(10,), (1,), (0,), (1000,), (333,), (7, 9), (), (3, 0, 2), (64, 3, 3)]
    out = {}
    for i, shape in enumerate(shapes):
        dt = dtypes[i % len(dtypes)]
        x = rng.standard_t(3, shape) * 10.0 ** rng.integers(-3, 2)
        out[f"layer{i}.w"] = np.asarray(x).astype(dt)
    return out


def payload_of(frame) -> bytes:
    fr = parse_frame(frame)
    return b"".join(bytes(fr.raw(i)) for i in range(len(fr.sections)))


@pytest.mark.parametrize("spec", SPECS)
def test_each_tensor_is_coded_as_if_alone(spec):
    c = codec.get_codec(spec)
    ts = model(1, (np.float32, np.float64, np.float16, bfloat16))
    keys = list(ts)
    many = c.encode_many(ts, keys=keys, step=3)
    singles = [c.encode(x, key=k, step=3) for k, x in ts.items()]
    mf = parse_many(many)
    assert mf.spec == c.spec and mf.layout.names == tuple(ts)
    assert bytes(mf.payload) == b"".join(payload_of(f) for f in singles) or c.post, "payload differs from the single frames'"
    got = codec.decode_many(many)
    assert list(got) == keys
    for k, f in zip(keys, singles):
        want = codec.decode(f)
        assert got[k].dtype == want.dtype and got[k].shape == want.shape
        assert np.array_equal(got[k], want, equal_nan=True), k
    assert c.decode_many(many).keys() == got.keys()


@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.1)", "qsgd", "powersgd", "adacomp", "fft+zstd"])
def test_out_add_and_lists(spec):
    c = codec.get_codec(spec)
    ts = model(2)
    arrays = list(ts.values())
    many = c.encode_many(arrays)  # a list: no names, decoded to a list
    dec = codec.decode_many(many)
    assert isinstance(dec, list) and len(dec) == len(arrays)
    out = [np.full_like(a, 7) for a in arrays]
    assert codec.decode_many(many, out=out) is out
    for o, d in zip(out, dec):
        assert np.array_equal(o, d)
    acc = [np.ones(a.shape, np.float64) for a in arrays]
    codec.decode_add_many(many, acc)
    for a, d in zip(acc, dec):
        assert np.array_equal(a, 1 + d.astype(np.float64))
    codec.decode_add_many(many, acc, subtract=True)
    for a in acc:
        assert np.array_equal(a, np.ones_like(a))
    named = c.encode_many(ts)
    outd = {k: np.empty_like(v) for k, v in reversed(ts.items())}  # matched by name, not order
    codec.decode_many(named, out=outd)
    for k, d in zip(ts, dec):
        assert np.array_equal(outd[k], d)


def test_layout_hash_form():
    c = codec.get_codec("topk(ratio=0.1)")
    ts = model(3)
    table, hashed = c.encode_many(ts), c.encode_many(ts, layout="hash")
    assert len(hashed) < len(table)
    with pytest.raises(ValueError, match="layout"):
        codec.decode_many(hashed)
    got = codec.decode_many(hashed, layout=Layout.of(ts))
    want = codec.decode_many(table)
    assert all(np.array_equal(got[k], want[k]) for k in ts)
    assert all(np.array_equal(a, b) for a, b in zip(codec.decode_many(hashed, layout=ts).values(), want.values()))
    other = dict(ts)
    other["layer0.w"] = np.zeros(11, np.float32)
    with pytest.raises(codec.CorruptFrameError, match="layout hash"):
        codec.decode_many(hashed, layout=other)
    renamed = {k + "x": v for k, v in ts.items()}
    with pytest.raises(codec.CorruptFrameError, match="layout hash"):
        codec.decode_many(hashed, layout=renamed)
    with pytest.raises(ValueError, match="layout"):  # a table frame checks a given layout
        codec.decode_many(table, layout=other)
    with pytest.raises(ValueError, match="layout"):
        c.encode_many(ts, layout="names")


def test_framing_is_a_few_bytes_per_tensor():
    """Beyond the sections' payload: one header (spec once), the layout table and a pattern id
    plus a varint count per section: a few bytes per tensor (docs/format.md)."""
    rng = np.random.default_rng(4)
    ts = [rng.standard_normal(int(n)).astype(np.float32) for n in rng.integers(1000, 10_001, 200)]
    for spec, most in [("fp16", 8), ("topk(ratio=0.01)", 7), ("adacomp", 8)]:  # derived counts: adacomp 10.2 -> 7.3, topk 7.2 -> 6.2
        c = codec.get_codec(spec)
        many = c.encode_many(ts)
        mf = parse_many(many)
        payload = len(many) - mf.header_len
        assert payload == sum(len(payload_of(c.encode(t))) for t in ts)
        assert (len(many) - payload - 60) / len(ts) <= most, spec
        hashed = c.encode_many(ts, layout="hash")
        assert (len(hashed) - payload - 60) / len(ts) <= most - 4, spec  # no shapes


def test_empty_and_mixed():
    c = codec.get_codec("fp16")
    f = c.encode_many([])
    assert codec.decode_many(f) == [] and codec.decode_many(c.encode_many({})) == {}
    with pytest.raises(TypeError, match="tensors"):
        c.encode_many(np.ones(3, np.float32))
    with pytest.raises(TypeError, match=r"tensors\['b'\]"):
        c.encode_many({"a": np.ones(3, np.float32), "b": np.ones(3, np.int32)})
    with pytest.raises(TypeError, match="names must be str"):
        c.encode_many({1: np.ones(3, np.float32)})
    with pytest.raises(ValueError, match="keys"):
        c.encode_many([np.ones(3, np.float32)], keys=[1, 2])
    ts = model(5)
    many = c.encode_many(ts)
    with pytest.raises(ValueError, match=r"out\['layer3.w'\]"):
        codec.decode_many(many, out={k: np.empty(v.size + (k == "layer3.w"), v.dtype) for k, v in ts.items()})
    with pytest.raises(ValueError, match="missing"):
        codec.decode_many(many, out={k: np.empty_like(v) for k, v in list(ts.items())[1:]})
    with pytest.raises(TypeError, match="out"):
        codec.decode_add_many(many, None)
    with pytest.raises(codec.CorruptFrameError, match="decode_many"):
        codec.decode(many)
    with pytest.raises(codec.CorruptFrameError, match="many-tensor"):
        codec.decode_many(c.encode(np.ones(3, np.float32)))
    with pytest.raises(codec.CodecError, match="not by this codec"):
        codec.get_codec("bf16").decode_many(many)


def test_max_elements_bounds_the_sum():
    c = codec.get_codec("none")
    many = c.encode_many([np.ones(600, np.float32), np.ones(600, np.float32)])
    codec.decode_many(many, max_elements=1200)
    with pytest.raises(codec.CorruptFrameError, match="more than the limit"):
        codec.decode_many(many, max_elements=1199)


@pytest.mark.parametrize("spec", ["topk(ratio=0.2)", "fp16", "qsgd+zstd", "none(checksum=False)"])
def test_every_damaged_byte_is_refused(spec):
    checksum = "checksum=False" not in spec
    c = codec.get_codec(spec.replace("(checksum=False)", ""), checksum=checksum)
    rng = np.random.default_rng(6)
    ts = {"a": rng.standard_normal(40).astype(np.float32), "b": rng.standard_normal((3, 5)).astype(np.float64)}
    many = c.encode_many(ts)
    want = codec.decode_many(many)
    mf = parse_many(many)
    for i in range(len(many)):
        bad = bytearray(many)
        bad[i] ^= 0x21
        if not checksum and i >= mf.header_len:  # no payload checksum: a value may change, nothing else
            try:
                codec.decode_many(bytes(bad))
            except codec.CorruptFrameError:
                pass
            continue
        with pytest.raises(codec.CorruptFrameError):
            codec.decode_many(bytes(bad))
    for cut in range(len(many)):
        with pytest.raises(codec.CorruptFrameError):
            codec.decode_many(many[:cut])
    assert all(np.array_equal(want[k], codec.decode_many(many)[k]) for k in ts)


def v(n: int) -> bytes:
    """``n`` as a varint (docs/format.md), for forged headers."""
    out = bytearray()
    put_varint(out, n)
    return bytes(out)


def _forge(body: bytes, flags=0) -> bytes:
    """A v2 header with a correct CRC around ``body`` (fields after the fixed 8 bytes)."""
    import struct
    import zlib

    head = b"\x89GCF" + bytes([2, flags, 0, 0]) + body
    return head + struct.pack("<I", zlib.crc32(head))


def test_forged_headers_fail_before_allocating():
    spec = b"none"

    huge_shape = v(len(spec)) + spec + v(1) + bytes([3, 1]) + v(1 << 40) + v(1) + bytes([1, 1, 32]) + v(0) + v(1 << 40)
    with pytest.raises(codec.CorruptFrameError, match="more than the limit"):
        codec.decode_many(_forge(huge_shape), max_elements=1 << 20)
    with pytest.raises(codec.CorruptFrameError, match="minimal varint"):
        codec.decode_many(_forge(b"\x84\x00" + spec))
    with pytest.raises(codec.CorruptFrameError, match="tensors"):
        codec.decode_many(_forge(v(len(spec)) + spec + v(1 << 50)))
    bad_count = v(len(spec)) + spec + v(1) + bytes([3, 1]) + v(4) + v(1) + bytes([1, 1, 32]) + v(0) + v(5)
    with pytest.raises(codec.CorruptFrameError, match="sections end"):
        codec.decode_many(_forge(bad_count))
    with pytest.raises(codec.CorruptFrameError, match="reserved"):
        codec.decode_many(_forge(b"", flags=0x80))


def test_a_step_reuses_the_header_only_when_it_is_the_same():
    """build_many keeps the headers it made lately (codec.manyframe.build._HEADS): a step with
    the same tensors and the same counts gets the same bytes, and one whose counts change with
    the data (Elias coding's bytes: the same kinds and widths) or whose layout changes gets
    its own header."""
    import codec.manyframe.build as build

    c = codec.get_codec("qsgd(coding=elias)")
    for seed in (0, 1, 0):  # the same layout, other counts
        ts = model(seed)
        f = c.encode_many(ts)
        got = codec.decode_many(f)
        assert all(np.array_equal(got[k], codec.decode(c.encode(x))) for k, x in ts.items())
        assert bytes(f) == bytes(c.encode_many(ts))
    before = dict(build._HEADS)
    renamed = {f"b{k}": v for k, v in ts.items()}
    assert list(codec.decode_many(c.encode_many(renamed))) == list(renamed)
    assert len(build._HEADS) == min(len(before) + 1, build._HEADS_MAX)


def test_derived_counts_are_written_once_and_checked(monkeypatch):
    """flags bit 6: a pattern entry's kind byte carries the section's count rule; a tensor writes
    only the counts its pattern does not derive (AdaComp's signs repeat its index count, its scale is
    one value); every tensor's counts and decodes are those of its own v1 frame (frames without
    the flag, as before 2026-11-28, are tests/fixtures/many/).  A rule no encoder writes is
    refused."""
    from codec.frame import Section
    from codec.manyframe.wire import FLAG_DERIVED, count_rules

    from codec.manyframe.wire import common_rules

    assert count_rules([5, 5, 1]) == (0, 2, 1) and count_rules([1, 1, 7]) == (1, 1, 0) and count_rules([6, 1, 6, 9, 9]) == (0, 1, 2, 0, 5)
    assert common_rules((0, 1, 2), (1, 1, 2)) == (0, 1, 2) and common_rules((1, 2), (1, 1)) == (1, 0)
    assert count_rules([]) == ()
    ts = model(5)
    for spec in ("adacomp", "topk(ratio=0.1)+fp16", "qsgd", "fp16"):
        c = codec.get_codec(spec)
        f = c.encode_many(ts)
        assert f[5] & FLAG_DERIVED
        mf = parse_many(f)
        got = codec.decode_many(f)
        for k, x in ts.items():
            assert np.array_equal(got[k], codec.decode(c.encode(x)))
        assert [[i.count for i in secs] for secs in mf.tensor_sections] == [[i.count for i in parse_frame(c.encode(x)).sections] for x in ts.values()]
    adacomp = codec.get_codec("adacomp").encode_many(ts)
    import codec.manyframe.build as build

    monkeypatch.setattr(build, "count_rules", lambda counts: (0,) * len(counts))  # every count written
    monkeypatch.setattr(build, "_HEADS", {})  # (not the header the same tensors had a moment ago,
    monkeypatch.setattr(build, "_TENSORS", {})  # nor their rules)
    every = codec.Codec("adacomp").encode_many(ts)  # (a new codec: no replayed step with the header it learned)
    monkeypatch.undo()
    secs = parse_many(adacomp).tensor_sections
    # every tensor of a (kind, bits) pattern gets the rules all of them share, so no pattern is
    # split: the frame is smaller by exactly the counts those rules derive
    shared: dict = {}
    for t in secs:
        key, mine = tuple((i.kind, i.bits) for i in t), count_rules([i.count for i in t])
        shared[key] = common_rules(shared[key], mine) if key in shared else mine
    saved = [i.count for t in secs for i, r in zip(t, shared[tuple((i.kind, i.bits) for i in t)]) if r != 0]
    assert len(saved) >= len(secs)  # the scale's count (1), at least, in every tensor
    assert len(every) - len(adacomp) == sum(len(v(c)) for c in saved)
    mixed = [Section(4, 8, c, data=bytes(c)) for c in [*range(2, 20), 19, 1, 2]]  # 21 sections: rules past section 13 are not written
    assert count_rules([s.count for s in mixed])[-3:] == (0, 1, 2)
    f = build.build_many("none", Layout.of([np.zeros(10, np.float32)]), [mixed])
    assert [i.count for i in parse_many(f).tensor_sections[0]] == [s.count for s in mixed]
    monkeypatch.setattr(build, "count_rules", lambda counts: (0,) * len(counts))
    monkeypatch.setattr(build, "_HEADS", {})
    every2 = codec.get_codec("qsgd").encode_many(ts)
    monkeypatch.undo()
    assert len(codec.get_codec("qsgd").encode_many(ts)) <= len(every2)  # never larger
    assert all(np.array_equal(a, b) for a, b in zip(codec.decode_many(every).values(), codec.decode_many(adacomp).values()))
    at = bytes(adacomp).index(bytes([1 | 2 << 4, 1]))  # the signs' entry: kind 1 and rule 2 (section 0's count), 1 bit
    from codec.fuzzing import fix_many_checksums

    for bad in (4, 15):  # its own count; a section that does not exist
        forged = bytearray(adacomp)
        forged[at] = 1 | bad << 4
        with pytest.raises(codec.CorruptFrameError, match="count rule"):
            codec.decode_many(fix_many_checksums(bytes(forged)))


@pytest.mark.parametrize("spec, momentum", [("topk(ratio=0.1)", 0), ("fp16", 0), ("qsgd", 0), ("powersgd", 0), ("randomk(ratio=0.3)", 0.9), ("adacomp", 0)])
def test_error_feedback_many_equals_per_tensor(spec, momentum):
    ts0 = model(7, (np.float32, np.float64))
    ef_many, ef_one = codec.ErrorFeedback(spec, momentum=momentum), codec.ErrorFeedback(spec, momentum=momentum)
    rng = np.random.default_rng(8)
    for step in range(3):
        ts = {k: (v * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in ts0.items()}
        many = ef_many.encode_many(ts)
        singles = {k: ef_one.encode(x, key=k) for k, x in ts.items()}
        got = codec.decode_many(many)
        for k in ts:
            assert np.array_equal(got[k], codec.decode(singles[k])), (step, k)
            assert np.array_equal(ef_many.residual(k), ef_one.residual(k)), (step, k)
            assert ef_many.step(k) == ef_one.step(k) == step + 1
    lst = codec.ErrorFeedback(spec, momentum=momentum)
    lst.encode_many(list(ts0.values()))
    assert lst.keys() == list(range(len(ts0)))


@pytest.mark.parametrize("spec, kw", [("fp16", {}), ("topk(ratio=0.1)", {}), ("qsgd", {}), ("powersgd", {}), ("adacomp+zstd", {}), ("none", {"residuals": False})])
@pytest.mark.parametrize("joint", [False, True])
def test_error_feedback_many_into_out(spec, kw, joint):
    """ErrorFeedback.encode_many(out=buf): the frame it would return, written at the start of
    one reused buffer, residuals identical step by step; a buffer too small for a step's frame
    raises ValueError naming out and changes no residual or step."""
    ts0 = model(3)
    ef, ef_out = codec.ErrorFeedback(spec, **kw), codec.ErrorFeedback(spec, **kw)
    buf = np.zeros(1 << 16, np.uint8)
    rng = np.random.default_rng(4)
    for step in range(3):
        ts = {k: (v * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in ts0.items()}
        want = ef.encode_many(ts, joint=joint)
        with pytest.raises(ValueError, match="out"):
            ef_out.encode_many(ts, joint=joint, out=bytearray(len(want) - 1))
        got = ef_out.encode_many(ts, joint=joint, out=buf)
        assert isinstance(got, memoryview) and bytes(got) == want, step
        for k in ef.keys():
            r, r_out = ef.residual(k), ef_out.residual(k)
            assert (r is None and r_out is None) or np.array_equal(r, r_out), (step, k)
            assert ef_out.step(k) == ef.step(k) == step + 1
    assert codec.decode_many(got).keys() == ts.keys()


@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.1)", "qsgd"])
def test_a_failing_step_changes_nothing(spec):
    ef = codec.ErrorFeedback(spec)
    ts = model(9)
    ef.encode_many(ts)
    before = {k: (ef.residual(k).copy(), ef.step(k)) for k in ts}
    bad = dict(ts)
    last = list(ts)[-1]
    bad[last] = bad[last].copy()
    bad[last].reshape(-1)[5] = np.nan
    with pytest.raises(NonFiniteError):
        ef.encode_many(bad)
    for k in ts:
        assert np.array_equal(ef.residual(k), before[k][0], equal_nan=True) and ef.step(k) == before[k][1], k
    with pytest.raises(ValueError, match="key appears twice"):
        ef.encode_many(list(ts.values())[:2], keys=["a", "a"])
    shape_changed = dict(ts)
    shape_changed["layer0.w"] = np.ones(11, np.float32)
    with pytest.raises(ValueError, match=r"tensors\['layer0.w'\]"):
        ef.encode_many(shape_changed)


def test_a_table_read_before_is_matched_by_its_bytes():
    """Tables read again (a training loop's every step) give the layout read the first time,
    found by their bytes; many layouts in rotation, more than the few kept, still decode
    exactly, and a table that differs in one byte is read afresh."""
    from codec.fuzzing import fix_many_checksums
    from codec.manyframe import table

    c = codec.get_codec("fp16")
    models = [{f"m{j}.w{i}": np.full((i + 1, j + 1), i + j, np.float32) for i in range(3)} for j in range(table._RECENT_MAX + 3)]
    frames = [c.encode_many(m) for m in models]
    for _ in range(2):
        for m, f in zip(models, frames):
            got = c.decode_many(f)
            assert list(got) == list(m) and all(np.array_equal(got[k], m[k]) for k in m)
    again = parse_many(frames[-1]).layout
    assert parse_many(frames[-1]).layout is again  # the same object: not read field by field
    assert len(table._RECENT) <= table._RECENT_MAX
    renamed = bytearray(frames[-1])
    at = bytes(renamed).index(b"m10.w2")
    renamed[at : at + 6] = b"m10.w9"  # one byte of the table differs (the header CRC redone)
    lay = parse_many(fix_many_checksums(renamed)).layout
    assert lay is not again and lay.names[-1] == "m10.w9" and lay.shapes == again.shapes


def test_a_header_parsed_before_is_matched_by_its_bytes():
    """A header parsed again (the same tensors and counts, another step's payload) gives the
    sections parsed the first time; a frame cut short, or whose counts differ, is still
    checked in full."""
    from codec.manyframe import parse

    c = codec.get_codec("qsgd")
    ts = [np.linspace(-1, 1, n).astype(np.float32) for n in (9, 300, 70)]
    one, two = c.encode_many(ts, step=1), c.encode_many(ts, step=2)
    assert one != two
    first = parse_many(one)
    again = parse_many(two)
    assert again.tensor_sections is first.tensor_sections and again.layout is first.layout
    for k, want in enumerate(codec.decode_many(two)):
        assert np.array_equal(want, codec.decode(c.encode(ts[k], step=2)))
    with pytest.raises(codec.CorruptFrameError):
        parse_many(two[: len(two) - 1])
    with pytest.raises(codec.CorruptFrameError):
        parse_many(two[: first.header_len - 1])
    other = c.encode_many([t[:-1] for t in ts])
    assert parse_many(other).tensor_sections is not first.tensor_sections
    assert len(parse._RECENT) <= parse._RECENT_MAX


def test_inspect_describes_a_many_frame():
    c = codec.get_codec("topk(ratio=0.1)")
    ts = model(10)
    info = codec.inspect(c.encode_many(ts))
    assert info["format_version"] == 2 and info["codec"] == c.spec
    assert [t["name"] for t in info["tensors"]] == list(ts)
    assert [t["shape"] for t in info["tensors"]] == [list(v.shape) for v in ts.values()]
    assert info["frame_bytes"] == info["header_bytes"] + info["payload_bytes"]


# ------------------------------------------------------------------ runs of an elementwise codec
def test_runs_group_small_consecutive_tensors_of_one_dtype():
    from codec.runs import RUN_ELEMENTS, runs

    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    big = RUN_ELEMENTS + 1
    sizes = [(3, f32), (0, f32), (5, f32), (big, f32), (4, f32), (4, f16), (4, f16), (RUN_ELEMENTS - 8, f16), (1, f16)]
    assert runs(sizes) == [[0, 1, 2], [3], [4], [5, 6, 7], [8]]
    assert runs([(RUN_ELEMENTS, f32), (0, f32)]) == [[0, 1]]
    assert runs([(5, f32), (9, f32), (20, f32), (3, f32), (4, f32)], total=30, each=10) == [[0, 1], [2], [3, 4]]
    assert runs([]) == []


@pytest.mark.parametrize("big", ["run", "where they lie"])
@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "fp16(nonfinite=keep)", "bf16+zstd", "none+crc32"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, bfloat16])
def test_runs_give_the_frame_of_one_call_per_tensor(spec, dtype, big):
    """A run coded at once gives exactly the bytes of per-tensor sections, and every decode
    of it equals the per-tensor decodes, bit for bit (accumulators of every dtype): runs of
    small tensors, and from SEGMENTED_MIN elements the whole model where its tensors lie
    (fp16/bf16 of float32/float64 tensors: ``encode_segments``, ``write_segments``)."""
    from codec.runs import RUN_ELEMENTS, SEGMENTED_MIN

    c = codec.get_codec(spec)
    assert c.elementwise
    rng = np.random.default_rng(11)
    sizes = [7, 0, 1, 300, (RUN_ELEMENTS if big == "run" else SEGMENTED_MIN) + 3, 64, 9]
    ts = {f"w{i}": (rng.standard_t(2, n) * 10.0 ** rng.integers(-6, 3)).astype(np.float32).astype(dtype) for i, n in enumerate(sizes)}
    ts["w3"] = ts["w3"].reshape(3, 100)
    many = c.encode_many(ts)
    lay = Layout.of(ts)
    sections = [c.sections(a.reshape(-1), codec.stage.Context(a.shape, a.dtype)) for a in ts.values()]
    assert many == c.frame_many(sections, lay)
    got = codec.decode_many(many)
    for k, x in ts.items():
        assert np.array_equal(got[k], codec.decode(c.encode(x)), equal_nan=True) and got[k].shape == x.shape
    for acc_dtype in (np.float32, np.float64, np.float16, bfloat16):
        acc = {k: (np.ones(x.shape) / 3).astype(acc_dtype) for k, x in ts.items()}
        want = {k: a.copy() for k, a in acc.items()}
        codec.decode_add_many(many, acc, subtract=acc_dtype == np.float64)
        for k, x in ts.items():
            c.decode_add(c.encode(x), want[k], subtract=acc_dtype == np.float64)
            assert acc[k].tobytes() == want[k].tobytes(), (acc_dtype, k)


def test_a_non_finite_value_in_a_run_names_its_tensor():
    c = codec.get_codec("fp16")
    ts = {"a": np.ones(5, np.float32), "b": np.ones((2, 3), np.float32), "c": np.ones(4, np.float32)}
    ts["b"][1, 2] = np.inf
    with pytest.raises(NonFiniteError, match=r"tensors\['b'\]: non-finite value at position \(1, 2\)"):
        c.encode_many(ts)
    with pytest.raises(NonFiniteError, match=r"tensors\[1\]: non-finite value at position \(1, 2\)"):
        c.encode_many(list(ts.values()))
    with pytest.raises(NonFiniteError, match=r"tensors\['b'\]"):
        codec.get_codec("topk(ratio=0.5)").encode_many(ts)
    with pytest.raises(NonFiniteError, match=r"tensors\['b'\]"):
        codec.ErrorFeedback("fp16").encode_many(ts)
    from codec.runs import SEGMENTED_MIN  # a whole model coded where its tensors lie

    ts["c"] = np.ones(SEGMENTED_MIN, np.float32)
    with pytest.raises(NonFiniteError, match=r"tensors\['b'\]: non-finite value at position \(1, 2\)"):
        c.encode_many(ts)


def test_counts_moved_between_run_tensors_are_refused():
    """A forged frame whose counts still add up over a run, but not per tensor, is refused."""
    from codec.frame import Section
    from codec.manyframe import Entry, build_many

    c = codec.get_codec("fp16")
    ts = [np.ones(4, np.float32), np.ones(6, np.float32)]
    codes = np.zeros(10, np.uint16)
    forged = build_many("fp16", Layout.of(ts), [[Entry(1, 16, 5)], [Entry(1, 16, 5)]], pieces=[Section(1, 16, 10, codes)])
    with pytest.raises(codec.CorruptFrameError, match="5 items, codec expects 4"):
        codec.decode_many(forged)
    with pytest.raises(codec.CorruptFrameError):
        codec.decode_add_many(forged, [np.zeros(4, np.float32), np.zeros(6, np.float32)])
    assert codec.decode_many(c.encode_many(ts))[1].shape == (6,)


# ------------------------------------------------------------------ runs of a segmented select stage
@pytest.mark.parametrize(
    "spec",
    [
        "topk(ratio=0.1)", "topk(k=3)", "topk(ratio=0.5)", "topk(ratio=0.05)+fp16+zstd", "topk(ratio=warmup(0.5,0.01,steps=4))",
        "dgc(ratio=0.01)", "dgc(ratio=0.3,sample=0.5)+fp16", "dgc(ratio=warmup(0.5,0.01,steps=4))+qsgd",
        "randomk(ratio=0.1)", "randomk(ratio=0.3,scale=True,seed=4)+fp16", "randomk(ratio=warmup(0.5,0.01,steps=4))+qsgd",
        "gaussiank(ratio=0.05)", "gaussiank(ratio=0.3)+bf16", "gaussiank(ratio=0.1,exact=True)", "gaussiank(ratio=warmup(0.5,0.01,steps=4))+qsgd",
        "adacomp", "adacomp(bin=7)", "adacomp+fp16", "adacomp(bin=1000)+zstd",
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segmented_selection_gives_the_frame_of_one_call_per_tensor(spec, dtype):
    c = codec.get_codec(spec)
    rng = np.random.default_rng(12)
    sizes = [7, 0, 1, 300, 64, 9, 2, 5000]
    ts = {f"w{i}": (rng.standard_t(2, n) * 10.0 ** rng.integers(-6, 3)).astype(dtype) for i, n in enumerate(sizes)}
    ts["w4"][:] = 0  # all ties
    ts["w6"][:] = [1.0, -1.0]
    ts["w3"] = ts["w3"].reshape(3, 100)
    for step in (0, 2, 5):
        many = c.encode_many(ts, step=step)
        lay = Layout.of(ts)
        sections = [c.sections(a.reshape(-1), codec.stage.Context(a.shape, a.dtype, step=step)) for a in ts.values()]
        assert many == c.frame_many(sections, lay), step
        got = codec.decode_many(many)
        for k, x in ts.items():
            assert np.array_equal(got[k], codec.decode(c.encode(x, step=step))), k


@pytest.mark.parametrize("spec", ["fft(block=16)", "fft(theta=0.5,block=7,keep=global)+none", "fft(theta=warmup(0.9,0.5,steps=4),block=0)+fp16", "fft(theta=0,block=8)+qsgd"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transform_runs_give_the_frame_of_one_call_per_tensor(spec, dtype, monkeypatch):
    """fft's runs (every block of a run transformed and selected at once, the value stage's
    codes of the run at once where it can): the frame of one call per tensor, at every step
    of a schedule, read back at once (one inverse for the run) into what each tensor's own
    frame decodes to, added into accumulators of every dtype as each adds; a NaN is raised
    by its tensor, as its own encode names it."""
    from codec import readruns
    from codec import runs

    c = codec.get_codec(spec)
    rng = np.random.default_rng(13)
    sizes = [7, 0, 1, 300, 64, 9, 2, 500]
    ts = {f"w{i}": (rng.standard_t(2, n) * 10.0 ** rng.integers(-6, 3)).astype(dtype) for i, n in enumerate(sizes)}
    ts["w4"][:] = 0  # all ties
    ts["w3"] = ts["w3"].reshape(3, 100)
    ran, kept = [], runs._kept
    monkeypatch.setattr(runs, "_kept", lambda c, g, *a: ran.append(len(g)) or kept(c, g, *a))
    for step in (0, 5):
        many = c.encode_many(ts, step=step)
        sections = [c.sections(a.reshape(-1), codec.stage.Context(a.shape, a.dtype, step=step)) for a in ts.values()]
        assert many == c.frame_many(sections, Layout.of(ts)), step
    assert ran == [len(ts), len(ts)]  # one run a call
    read = []
    job = readruns._transform_run_job
    monkeypatch.setattr(readruns, "_transform_run_job", lambda *a: read.append(job(*a)) or read[-1])
    singles = {k: c.encode(x, step=5) for k, x in ts.items()}
    got = codec.decode_many(many)
    outs = {k: np.full(x.shape, np.nan, x.dtype) for k, x in ts.items()}
    codec.decode_many(many, out=outs)
    for k, f in singles.items():
        assert got[k].tobytes() == codec.decode(f).tobytes() == outs[k].tobytes(), k
    for acc_dtype in (np.float32, np.float16, bfloat16):
        acc = {k: np.where(np.arange(x.size) % 3 == 0, -0.0, 1 / 3).astype(acc_dtype).reshape(x.shape) for k, x in ts.items()}
        want = {k: a.copy() for k, a in acc.items()}
        codec.decode_add_many(many, acc, subtract=True)
        for k, f in singles.items():
            c.decode_add(f, want[k], subtract=True)
            assert acc[k].tobytes() == want[k].tobytes(), (acc_dtype, k)
    # every decode read the run at once (but a float64 rangefloat run with an all-zero tensor: its exponent window needs the tensor's own table)
    assert len(read) == 5 and (all(j is not None for j in read) or (dtype == np.float64 and c.value.name == "rangefloat"))
    ts["w5"][4] = np.nan
    with pytest.raises(NonFiniteError) as alone:
        c.encode(ts["w5"], step=2)
    with pytest.raises(NonFiniteError) as many:
        c.encode_many(ts, step=2)
    assert str(many.value) == str(alone.value).replace("x:", "tensors['w5']:", 1)


@pytest.mark.parametrize(
    "spec",
    [
        "topk(ratio=0.1)", "topk(k=3)+fp16", "dgc(ratio=0.05)+bf16", "gaussiank(ratio=0.05)", "threshold(value=0.001)", "topk(ratio=0.05)+crc32",
        "randomk(ratio=0.2,scale=True)", "adacomp", "adacomp(bin=7)+crc32",
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_runs_decode_as_each_tensor_alone(spec, dtype, monkeypatch):
    """A sparse frame's run (positions read at once, an elementwise value stage) is read as
    one values section and scattered per tensor: decode_many (new arrays, or into out),
    decode_add_many (accumulators of every dtype, -0.0 entries included) and
    decode_sparse_many give bit for bit what each tensor's own frame gives."""
    from codec import readruns

    c = codec.get_codec(spec)
    ts = quant_model(dtype, seed=21)
    ts["w8"] = ts["w8"] / (1e300 if dtype == np.float64 else 1)  # (gaussiank's variance overflows there)
    frame = c.encode_many(ts)
    used = []
    real = readruns._sparse_run_job
    monkeypatch.setattr(readruns, "_sparse_run_job", lambda *a: used.append(1) or real(*a))
    singles = {k: c.encode(x) for k, x in ts.items()}
    got = codec.decode_many(frame)
    outs = {k: np.full(x.shape, np.nan, x.dtype) for k, x in ts.items()}
    codec.decode_many(frame, out=outs)
    for k, f in singles.items():
        assert got[k].tobytes() == codec.decode(f).tobytes() == outs[k].tobytes(), k
    for acc_dtype in (np.float32, np.float64, np.float16, bfloat16):
        acc = {k: np.where(np.arange(x.size) % 3 == 0, -0.0, 1 / 3).astype(acc_dtype).reshape(x.shape) for k, x in ts.items()}
        want = {k: a.copy() for k, a in acc.items()}
        codec.decode_add_many(frame, acc)
        for k, f in singles.items():
            c.decode_add(f, want[k])
            assert acc[k].tobytes() == want[k].tobytes(), (acc_dtype, k)
    for (pos, vals), f in zip(codec.decode_sparse_many(frame), singles.values()):
        wp, wv = codec.decode_sparse(f)
        assert np.array_equal(pos, wp) and vals.tobytes() == wv.tobytes()
    assert used  # the runs were read at once


@pytest.mark.parametrize("spec", ["topk(ratio=0.1)", "dgc(ratio=0.05)", "threshold(value=0.001)", "randomk(ratio=0.2,scale=True)"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sparse_frame_with_raw_values_decodes_at_once(spec, dtype, monkeypatch):
    """A sparse frame whose kept values are stored as they are, of one dtype, decodes with no
    per-tensor reading (every tensor's positions at once, one scatter into the arrays; the
    index coder's sections read and scattered by one kernel call): new
    arrays (named, or of a torch tensor's kind), a list of arrays or a dict given, each bit
    for bit what its tensor's own frame gives; a frame of two dtypes, or values coded by a
    value stage, is read tensor by tensor as before."""
    from codec import manydecode

    c = codec.get_codec(spec)
    ts = quant_model(dtype, seed=5)
    frame = c.encode_many(ts)
    singles = {k: codec.decode(c.encode(x)) for k, x in ts.items()}
    read = []
    real = manydecode.read_jobs
    monkeypatch.setattr(manydecode, "read_jobs", lambda *a, **k: read.append(1) or real(*a, **k))
    calls = count_kernel_calls(monkeypatch, scatter=("index_scatter_segments", "scatter_segments"))
    got = codec.decode_many(frame)
    if spec.startswith("randomk"):  # (its positions drawn from keys: a plan learned earlier in the process may decode it, codec.replay)
        assert calls["index_scatter_segments"] == 0
    else:  # (the index coder's sections and values read, checked and written by one kernel call)
        assert calls == {"index_scatter_segments": 1, "scatter_segments": 0}
    outs = {k: np.full(x.shape, np.nan, x.dtype) for k, x in ts.items()}
    listed = [np.full(x.shape, np.nan, x.dtype) for x in ts.values()]
    assert codec.decode_many(frame, out=outs) is outs and codec.decode_many(frame, out=listed) is listed
    assert not read
    for (k, want), a in zip(singles.items(), listed):
        assert got[k].shape == want.shape and got[k].tobytes() == outs[k].tobytes() == a.tobytes() == want.tobytes(), k
    mixed = dict(ts, w3=ts["w3"].astype(np.float32 if dtype == np.float64 else np.float64))
    for model, other in ((mixed, c.encode_many(mixed)), (ts, codec.get_codec(spec + "+fp16").encode_many(ts))):
        codec.decode_many(other, out={k: np.empty_like(x) for k, x in model.items()})
        assert read
        read.clear()
    torch = pytest.importorskip("torch")
    tensors = codec.decode_many(frame, like=torch.zeros(1))
    assert not read and all(type(v) is torch.Tensor and v.numpy().tobytes() == singles[k].tobytes() for k, v in tensors.items())


def test_a_sparse_run_names_its_non_finite_tensor():
    """topk+fp16 codes a run's kept values at once; an inf is raised by the tensor that
    holds it, as its own encode names it."""
    ts = {"a": np.ones(50, np.float32), "b": np.ones(60, np.float32), "c": np.ones(7, np.float32)}
    ts["b"][33] = np.inf
    c = codec.get_codec("topk(ratio=0.1)+fp16")
    with pytest.raises(NonFiniteError) as alone:
        c.encode(ts["b"], step=2)
    with pytest.raises(NonFiniteError) as many:
        c.encode_many(ts, step=2)
    assert str(many.value) == str(alone.value).replace("x:", "tensors['b']:", 1)


def test_segmented_topk_names_a_non_finite_tensor():
    ts = {"a": np.ones(5, np.float32), "b": np.ones(6, np.float32)}
    ts["b"][4] = np.nan
    with pytest.raises(NonFiniteError, match=r"tensors\['b'\]: non-finite value at position \(4,\)"):
        codec.get_codec("topk(k=2)").encode_many(ts)


# ------------------------------------------------------------------ runs of a quantizer value stage
QUANT_RUNS = [
    "qsgd", "qsgd(levels=3,bucket=100)", "qsgd(levels=127,bucket=7,rounding=nearest)", "minmax", "minmax(bits=3,bucket=33,rounding=stochastic)",
    "rangefloat(bits=8)", "rangefloat(bits=5,block=100,rounding=stochastic)", "rangefloat(bits=16)", "fp8", "fp8(format=e5m2,scale=True)",
    "qsgd+crc32", "minmax+zstd", "fp8(scale=True,rounding=stochastic)+zstd",
]


def quant_model(dtype, seed=13):
    """Small tensors of edge sizes, one past a run's limit, one huge-valued (float64: its
    norms and bounds travel as float64), an all-zero one."""
    from codec.runs import RUN_ELEMENTS

    rng = np.random.default_rng(seed)
    sizes = [7, 0, 1, 300, 64, 9, RUN_ELEMENTS + 3, 2, 5000, 513]
    ts = {f"w{i}": (rng.standard_t(2, n) * 10.0 ** rng.integers(-6, 3)).astype(dtype) for i, n in enumerate(sizes)}
    ts["w4"][:] = 0
    ts["w3"] = ts["w3"].reshape(3, 100)
    if dtype == np.float64:
        ts["w8"] *= 1e300
    return ts


@pytest.mark.parametrize("spec", QUANT_RUNS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quantizer_runs_give_the_frame_of_one_call_per_tensor(spec, dtype):
    """A quantizer codes a run of small tensors in one segmented kernel call per job
    (Value.encode_run / read_run): the frame holds exactly the bytes of per-tensor sections,
    keys and steps pick each tensor's own stream, and every decode equals the per-tensor one."""
    c = codec.get_codec(spec)
    ts = quant_model(dtype)
    lay = Layout.of(ts)
    for step, keys in ((0, None), (4, [f"k{i}" for i in range(len(ts))])):
        many = c.encode_many(ts, step=step, keys=keys)
        ctxs = [codec.stage.Context(a.shape, a.dtype, step=step, key=None if keys is None else keys[i]) for i, a in enumerate(ts.values())]
        assert many == c.frame_many([c.sections(a.reshape(-1), ctx) for a, ctx in zip(ts.values(), ctxs)], lay), step
        got = codec.decode_many(many)
        for i, (k, x) in enumerate(ts.items()):
            want = codec.decode(c.encode(x, step=step, key=None if keys is None else keys[i]))
            assert got[k].tobytes() == want.tobytes() and got[k].shape == x.shape, k
        for acc_dtype in (np.float32, np.float64, np.float16):
            acc = {k: (np.ones(x.shape) / 3).astype(acc_dtype) for k, x in ts.items()}
            want = {k: a.copy() for k, a in acc.items()}
            codec.decode_add_many(many, acc)
            for k, f in zip(ts, [c.encode(x, step=step, key=None if keys is None else keys[i]) for i, x in enumerate(ts.values())]):
                c.decode_add(f, want[k])
                assert acc[k].tobytes() == want[k].tobytes(), (acc_dtype, k)


def count_kernel_calls(monkeypatch, **families) -> dict:
    """Count the calls of the named CPU kernels (``family=(name, ...)``) for the rest of the
    test: the dict returned, by kernel name, starting at 0."""
    from codec.kernels import backend

    calls = {}
    for family, names in families.items():
        mod = backend(family)
        for name in names:
            calls[name] = 0
            real = getattr(mod, name)

            def counted(*a, _real=real, _name=name):
                calls[_name] += 1
                return _real(*a)

            monkeypatch.setattr(mod, name, counted)
    return calls


def test_quantizer_runs_are_segmented_kernel_calls(monkeypatch):
    """200 small tensors: one encode kernel call per run, not one per tensor, and one decode
    kernel call for them all (decoded into arrays given: every tensor of one dtype, each
    written where it lies); the per-tensor kernels are never called."""
    calls = count_kernel_calls(monkeypatch, bucket=("qsgd_encode", "qsgd_encode_segments"), dequant=("dequantize", "dequantize_segments"))
    rng = np.random.default_rng(3)
    ts = [rng.standard_normal(n).astype(np.float32) for n in rng.integers(1000, 10_001, 200)]
    frame = codec.get_codec("qsgd").encode_many(ts)
    codec.decode_many(frame, out=[np.empty_like(x) for x in ts])
    assert calls["qsgd_encode"] == calls["dequantize"] == 0
    assert 1 <= calls["qsgd_encode_segments"] <= 3 and calls["dequantize_segments"] == 1


#: a whole model's tensors for the one-call decodes: float32 then float64, large (past a run's
#: 65,536 elements) and small, empty and 0-d
WHOLE_MODEL = [(70_001, np.float32), ((3, 5), np.float32), (0, np.float32), (1, np.float32), (65_539, np.float32), (9, np.float64), (40_000, np.float64), ((), np.float64)]


def decodes_whole_model(c, calls, one: str, seed: int) -> tuple:
    """Encode :data:`WHOLE_MODEL` (Student-t(2) values) with the codec ``c``, then check that
    ``decode_many(out=)`` and ``decode_add_many`` each make one call of the kernel ``one`` per
    dtype (counted in ``calls``, every other kernel there never) and give the bytes of each
    tensor decoded on its own (``decode_many`` into new arrays; added in the array's dtype).
    Returns ``(tensors, arrays decoded into)``."""
    rng = np.random.default_rng(seed)
    ts = {f"t{i}": (rng.standard_t(2, shape) * 1e-2).astype(dt) for i, (shape, dt) in enumerate(WHOLE_MODEL)}
    frame = c.encode_many(ts)
    want = codec.decode_many(frame)  # runs and tensors each read on their own
    calls.update(dict.fromkeys(calls, 0))
    got = {k: np.full_like(x, np.nan) for k, x in ts.items()}
    assert codec.decode_many(frame, out=got) is got
    assert calls == {**dict.fromkeys(calls, 0), one: 2}  # one per dtype's run of tensors
    base = {k: rng.standard_normal(x.shape).astype(x.dtype) for k, x in ts.items()}
    added = {k: b.copy() for k, b in base.items()}
    codec.decode_add_many(frame, added)
    assert calls == {**dict.fromkeys(calls, 0), one: 4}
    for k in ts:
        assert got[k].tobytes() == want[k].tobytes(), k
        assert added[k].tobytes() == (base[k] + want[k].astype(base[k].dtype)).tobytes(), k
    return ts, got


@pytest.mark.parametrize("spec", ["qsgd(levels=16)", "minmax(bits=4)", "rangefloat(bits=8)", "fp8"])
def test_a_quantizers_whole_model_decodes_in_one_call_per_dtype(spec, monkeypatch):
    """Decoding into arrays given (``decode_many(out=)``, ``decode_add_many``) writes every
    tensor of one dtype, large and small, with one ``dequantize_segments`` call into each
    tensor's own array: the values the frame's runs and tensors decode to on their own
    (``decode_many`` into new arrays); a float32 tensor whose scale passes float32's range
    (qsgd's norm of near-maximal values) is decoded on its own path, with the same result."""
    c = codec.get_codec(spec)
    ts, got = decodes_whole_model(c, count_kernel_calls(monkeypatch, dequant=("dequantize", "dequantize_segments")), "dequantize_segments", 11)
    if spec.startswith("qsgd"):
        ts["t0"][:512] = np.float32(3e38)  # a bucket's norm beyond float32: saturated on decode
        frame = c.encode_many(ts)
        want = codec.decode_many(frame)
        codec.decode_many(frame, out=got)
        assert np.isfinite(got["t0"]).all() and all(got[k].tobytes() == want[k].tobytes() for k in ts)


@pytest.mark.parametrize("spec", ["topk(ratio=0.01)", "randomk(ratio=0.01)", "topk(ratio=0.05)+fp16", "adacomp"])
def test_a_sparse_whole_model_decodes_in_one_scatter_per_dtype(spec, monkeypatch):
    """A sparse frame decoded into arrays given (``decode_many(out=)``, ``decode_add_many``)
    reads every tensor's positions and kept values at once and scatters every tensor of one
    dtype, large and small, with one ``scatter_segments`` call into each tensor's own array
    (no tensor through the pipeline alone): the values each tensor decodes to on its own
    (``decode_many`` into new arrays), every other element zero."""
    calls = count_kernel_calls(monkeypatch, scatter=("scatter", "scatter_segments"))
    _, got = decodes_whole_model(codec.get_codec(spec), calls, "scatter_segments", 12)
    assert 0 < np.count_nonzero(got["t0"]) <= 0.05 * got["t0"].size + 1


def test_a_quantizer_run_names_a_non_finite_tensor():
    for spec in ("qsgd", "minmax"):
        ts = {"a": np.ones(5, np.float32), "b": np.ones((2, 3), np.float32), "c": np.ones(4, np.float32)}
        ts["b"][1, 2] = np.nan
        with pytest.raises(NonFiniteError, match=r"tensors\['b'\]: non-finite value at position \(1, 2\)"):
            codec.get_codec(spec).encode_many(ts)


def test_forged_quantizer_runs_are_refused():
    """What reading a tensor alone refuses, reading a run refuses: a negative norm, a code
    beyond the levels, set padding bits, a minimum above its maximum."""
    ts = [np.linspace(-1, 1, 9).astype(np.float32), np.linspace(0, 2, 13).astype(np.float32)]

    def forged(spec, edit):
        frame = bytearray(codec.get_codec(spec, checksum=False).encode_many(ts))
        mf = parse_many(bytes(frame))
        edit(frame, mf.header_len, mf.tensor_sections)
        return bytes(frame)

    def norm_negative(f, base, secs):
        at = base + secs[1][0].offset
        f[at : at + 4] = np.float32(-1.0).tobytes()

    def code_beyond_levels(f, base, secs):  # qsgd(levels=2): 3-bit codes, level 3 > 2
        at = base + secs[1][1].offset
        f[at] = (f[at] & ~0b111) | 0b110

    def padding_set(f, base, secs):
        info = secs[0][1]
        f[base + info.offset + info.raw_len - 1] |= 0x80

    def window_beyond_float32(f, base, secs):
        at = base + secs[1][0].offset
        f[at : at + 2] = np.int16(128).tobytes()  # float32's largest exponent is 127

    def low_above_high(f, base, secs):
        at = base + secs[1][0].offset
        f[at : at + 4] = np.float32(5.0).tobytes()  # the first bucket's minimum

    cases = [("qsgd", norm_negative, "negative norm"), ("qsgd(levels=2)", code_beyond_levels, "code field of 3"), ("qsgd", padding_set, "padding bits"), ("minmax", low_above_high, "minimum exceeds its maximum"), ("rangefloat", window_beyond_float32, "window exponent outside"), ("fp8(scale=True)", window_beyond_float32, "scale exponent outside"), ("rangefloat(bits=5)", padding_set, "padding bits")]
    for spec, edit, what in cases:
        f = forged(spec, edit)
        with pytest.raises(codec.CorruptFrameError, match=what):
            codec.decode_many(f)
        with pytest.raises(codec.CorruptFrameError, match=what):
            codec.decode_add_many(f, [np.zeros(9, np.float32), np.zeros(13, np.float32)])


def test_forged_randomk_runs_are_refused():
    """A run's keys are checked as each tensor's own: the seed, the step, the values' room."""
    ts = [np.linspace(-1, 1, 90).astype(np.float32), np.linspace(0, 2, 130).astype(np.float32)]

    def forged(word, value):
        frame = bytearray(codec.get_codec("randomk(ratio=0.1)", checksum=False).encode_many(ts, step=3))
        mf = parse_many(bytes(frame))
        at = mf.header_len + mf.tensor_sections[1][0].offset + 8 * word
        frame[at : at + 8] = np.uint64(value).tobytes()
        return bytes(frame)

    for word, value, what in ((0, 5, "records seed 5"), (1, 1 << 62, "impossible step")):
        with pytest.raises(codec.CorruptFrameError, match=what):
            codec.decode_many(forged(word, value))
    # (a step whose ratio keeps more than the values can hold: a warmup schedule at step 0)
    f = bytearray(codec.get_codec("randomk(ratio=warmup(0.9,0.01,steps=10))", checksum=False).encode_many(ts, step=9))
    mf = parse_many(bytes(f))
    at = mf.header_len + mf.tensor_sections[0][0].offset + 8
    f[at : at + 8] = np.uint64(0).tobytes()
    with pytest.raises(codec.CorruptFrameError, match=r"keeps 81 of 90 elements but its values sections hold 32 values at most"):
        codec.decode_many(bytes(f))


@pytest.mark.parametrize(
    "spec", ["qsgd", "minmax(bits=4,rounding=stochastic)", "rangefloat(bits=8)", "topk(ratio=0.05)", "topk(ratio=0.05)+fp16", "dgc(ratio=0.05)",
             "gaussiank(ratio=0.05)", "randomk(ratio=0.1,scale=True)", "adacomp", "topk(ratio=0.1)+qsgd", "qsgd+zstd",
             "fft(block=64)", "fft(theta=0.5,block=100,keep=global)+fp16", "adacomp(bin=7)+fp16"]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_error_feedback_runs_equal_each_tensors_step(spec, dtype, monkeypatch):
    """ErrorFeedback.encode_many codes a run's acc = x + residual at once and subtracts the
    run's decoded values at once (a quantizer's runs: at least 8 tensors of at most 16,384
    elements, codec.runs.FEEDBACK_RUNS; a select stage's: encode_many's runs), by decoding
    the frame or, when the value stage knows what it decodes to, by one scatter at the sent
    positions: frames and residuals are bit for bit those of each tensor's own step (fused
    or not), over several steps."""
    from codec import manydecode
    from codec.feedback.runstep import ManyFeedback

    ran, scattered = [], []
    real = manydecode.subtract
    monkeypatch.setattr(manydecode, "subtract", lambda c, mf, targets, shape, spans: ran.append(len(targets)) or real(c, mf, targets, shape, spans))
    sent = ManyFeedback._subtract_sent
    monkeypatch.setattr(ManyFeedback, "_subtract_sent", lambda self, c, g, ctxs: sent(self, c, g, ctxs) and not scattered.append(len(g)))
    together, alone = codec.ErrorFeedback(spec), codec.ErrorFeedback(spec)
    sizes = [7, 0, 1, 300, 64, 9, 2, 5000, 513, 16384, 20000, 3, 5, 11, 13, 17, 19, 23, 29, 70000]
    banks = []  # the buffer a run's residuals are slices of, step by step
    for step in range(3):
        rng = np.random.default_rng(30 + step)
        ts = {f"w{i}": (rng.standard_t(2, n) * 10.0 ** rng.integers(-6, 3)).astype(dtype) for i, n in enumerate(sizes)}
        ts["w4"][:] = 0
        ts["w3"] = ts["w3"].reshape(3, 100)
        frame = together.encode_many(ts)
        got = codec.decode_many(frame)
        for k, x in ts.items():
            assert got[k].tobytes() == codec.decode(alone.encode(x, key=k)).tobytes(), (step, k)
        assert pickle.dumps(together.state_dict()) == pickle.dumps(alone.state_dict()), step  # residuals, steps, stage state
        banks.append(id(together._slots["w0"].at[0]))
    c = together.codec
    if c.select is None or c.select.sees_gradient:  # per step two runs (10 tensors, 8 tensors)
        assert ran + scattered == [18, 18, 18] or ran + scattered == [10, 8] * 3
    else:  # one run of every tensor but the last (70,000 elements)
        assert ran + scattered == [19, 19, 19]
        assert bool(scattered) == (c.value.decoded(np.ones(1, dtype), codec.stage.Context((1,), dtype)) is not None), (ran, scattered)
    assert banks[2] == banks[0] != banks[1], banks  # the third step writes acc into the first step's buffer (now the spares'): nothing allocated


@pytest.mark.parametrize("spec, momentum", [("fp16", 0), ("bf16", 0), ("none", 0), ("fp16(nonfinite=keep)", 0.9), ("bf16", 0.9)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_elementwise_error_feedback_runs_equal_each_tensors_step(spec, momentum, dtype, monkeypatch):
    """On the host, a run of an elementwise codec (at most 65,536 elements together) of at
    least 8 tensors of at most 4,096 elements on average (codec.runs.HOST_ELEMENTWISE_RUNS)
    takes its error-feedback step together, as the device's runs do: frames, residuals and
    velocities bit for bit each tensor's own (fused) step's; the tensors of a shorter run, or
    of larger ones, take their own; a NaN that fp16 refuses is named by its tensor and
    changes nothing."""
    from codec import manydecode

    ran = []
    real = manydecode.subtract
    monkeypatch.setattr(manydecode, "subtract", lambda c, mf, targets, shape, spans: ran.append(len(targets)) or real(c, mf, targets, shape, spans))
    together, alone = codec.ErrorFeedback(spec, momentum=momentum), codec.ErrorFeedback(spec, momentum=momentum)
    sizes = [7, 0, 1, 300, 64, 9, 2, 5000, 513, 30000, 70000] + [6000] * 8 + [70001, 3, 5, 11, 13, 17, 19, 23]  # runs of 10 (35,896 values), 1, 8 (6,000 each), 1, 7
    for step in range(3):
        rng = np.random.default_rng(60 + step)
        ts = {f"w{i}": (rng.standard_t(2, n) * 10.0 ** rng.integers(-4, 2)).astype(dtype) for i, n in enumerate(sizes)}
        ts["w3"] = ts["w3"].reshape(3, 100)
        got = codec.decode_many(together.encode_many(ts))
        for k, x in ts.items():
            assert got[k].tobytes() == codec.decode(alone.encode(x, key=k)).tobytes(), (step, k)
        assert pickle.dumps(together.state_dict()) == pickle.dumps(alone.state_dict()), step
    assert ran == [10, 10, 10]
    before = pickle.dumps(together.state_dict())
    ts["w5"][4] = np.nan
    if "keep" in spec or spec == "none":
        return
    with pytest.raises(ValueError, match=r"tensors\['w5'\]"):
        together.encode_many(ts)
    assert pickle.dumps(together.state_dict()) == before


@pytest.mark.parametrize("spec", ["randomk(ratio=0.1)", "qsgd", "minmax(rounding=stochastic)", "fp8(rounding=stochastic)"])
def test_runs_give_keys_that_print_differently_their_own_streams(spec):
    """Keys equal in Python but of another text (0.0 and -0.0, (1, 2) and (1.0, 2)) draw their
    own streams in a run, as each tensor's own encode does (codec.streams.key_text)."""
    c = codec.get_codec(spec)
    ts = [np.arange(1, 101, dtype=np.float32) * (1 + i / 100) for i in range(8)]
    keys = [0.0, -0.0, (1, 2), (1.0, 2), (1,), (True,), "1", 1]
    for t, k, got in zip(ts, keys, codec.decode_many(c.encode_many(ts, keys=keys))):
        assert got.tobytes() == codec.decode(c.encode(t, key=k)).tobytes(), k


@pytest.mark.parametrize("spec", ["topk", "randomk", "adacomp", "dgc(ratio=0.1)"])
def test_an_empty_joint_sparse_frame_decodes(spec):
    c = codec.get_codec(spec)
    for layout in ("table", "hash"):
        f = c.encode_many([], joint=True, layout=layout)
        kw = {"layout": []} if layout == "hash" else {}
        assert codec.decode_sparse_many(f, **kw) == [] and codec.decode_many(f, out=[], **kw) == []
        assert codec.decode_add_many(f, [], **kw) == []


def test_gaussiank_runs_keep_the_stages_count_when_the_sums_overflow():
    """A float64 tensor whose sums overflow has no threshold (NaN): the stage keeps its
    candidates, clamped to 4k/3; the run keeps as many."""
    c = codec.get_codec("gaussiank(ratio=0.2)")
    a = np.full(100, 1e306)
    a[:10] = 1.5e308
    ts = [a, np.ones(100), np.zeros(50)]
    ts[2][:3] = 1e308
    with np.errstate(over="ignore", invalid="ignore"):
        got = codec.decode_sparse_many(c.encode_many(ts))
        for (pos, vals), t in zip(got, ts):
            want_pos, want_vals = codec.decode_sparse(c.encode(t))
            assert np.array_equal(pos, want_pos) and vals.tobytes() == want_vals.tobytes()


def test_a_forged_run_is_refused_as_its_tensor_alone_refuses_it():
    """A run the stage cannot read at once is read tensor by tensor, so the error names the
    codec and the section as a tensor's own read does."""
    from codec.frame import SectionKind
    from codec.fuzzing import fix_many_checksums

    c = codec.get_codec("topk(ratio=0.5)")
    f = bytearray(c.encode_many([np.arange(1, 9, dtype=np.float32)] * 2))
    at = bytes(f).index(bytes([SectionKind.VALUES, 32]))  # the pattern's values entry (kind, bits)
    f[at] = SectionKind.INTS
    with pytest.raises(codec.CorruptFrameError, match=r"section 1 \(ints\): codec 'topk\(ratio=0.5\)' expects a values section here"):
        codec.decode_many(fix_many_checksums(bytes(f)))


# ------------------------------------------------------------------ joint: the whole-model variant
@pytest.mark.parametrize("spec", ["topk(ratio=0.05)", "qsgd(bucket=100)", "fp16", "adacomp+zstd", "randomk(ratio=0.1)"])
def test_joint_codes_the_concatenation(spec):
    """joint=True is encode() of the flat concatenation, framed with every tensor's shape."""
    c = codec.get_codec(spec)
    ts = model(13)
    flat = np.concatenate([a.reshape(-1) for a in ts.values()])
    many = c.encode_many(ts, joint=True, keys="model", step=2)
    single = c.encode(flat, key="model", step=2)
    mf = parse_many(many)
    assert mf.joint
    assert c.post or bytes(mf.payload) == payload_of(single)  # (a byte stage codes the payload as a whole)
    want = codec.decode(single)
    got = codec.decode_many(many)
    at = 0
    for k, x in ts.items():
        assert got[k].shape == x.shape and np.array_equal(got[k].reshape(-1), want[at : at + x.size]), k
        at += x.size
    acc = {k: np.full(x.shape, 0.5, np.float64) for k, x in ts.items()}
    codec.decode_add_many(many, acc, subtract=True)
    at = 0
    for k, x in ts.items():
        assert np.array_equal(acc[k].reshape(-1), 0.5 - want[at : at + x.size].astype(np.float64)), k
        at += x.size
    out = [np.empty_like(x) for x in ts.values()]
    codec.decode_many(many, out=out)
    assert all(np.array_equal(o, g) for o, g in zip(out, got.values()))
    if c.select is not None:
        pairs = codec.decode_sparse_many(many)
        pos, vals = codec.decode_sparse(single)
        assert sum(p.size for p, _ in pairs) == pos.size
        for (p, v), (k, x) in zip(pairs, ts.items()):
            dense = np.zeros(x.size, np.float64)
            dense[p] = v
            assert np.array_equal(dense, got[k].reshape(-1).astype(np.float64)), k
    info = codec.inspect(many)
    assert [t["shape"] for t in info["tensors"]] == [list(x.shape) for x in ts.values()]


def test_joint_topk_is_the_global_top_k():
    c = codec.get_codec("topk(k=3)")
    ts = {"small": np.array([0.1, -5.0, 0.2], np.float32), "big": np.array([4.0, -0.3, 6.0, 0.0], np.float32)}
    got = codec.decode_many(c.encode_many(ts, joint=True))
    assert got["small"].tolist() == [0, -5.0, 0] and got["big"].tolist() == [4.0, 0, 6.0, 0]
    per_tensor = codec.decode_many(c.encode_many(ts))
    assert np.count_nonzero(per_tensor["small"]) == 3  # k per tensor without joint


def test_joint_error_feedback_is_one_key():
    ts = model(14)
    flat = np.concatenate([a.reshape(-1) for a in ts.values()])
    ef, ref = codec.ErrorFeedback("topk(ratio=0.05)"), codec.ErrorFeedback("topk(ratio=0.05)")
    for step in range(3):
        many = ef.encode_many(ts, "model", joint=True)
        want = codec.decode(ref.encode(flat, key="model"))
        got = codec.decode_many(many)
        assert np.array_equal(np.concatenate([g.reshape(-1) for g in got.values()]), want)
        assert np.array_equal(ef.residual("model"), ref.residual("model")) and ef.step("model") == step + 1
    assert ef.keys() == ["model"]
    with pytest.raises(ValueError, match="share a dtype"):
        ef.encode_many({"a": np.ones(3, np.float32), "b": np.ones(3, np.float64)}, joint=True)
    with pytest.raises(ValueError, match="share a dtype"):
        codec.get_codec("fp16").encode_many([np.ones(3, np.float32), np.ones(3, np.float64)], joint=True)
    assert codec.decode_many(codec.get_codec("topk").encode_many([], joint=True)) == []


def test_joint_frame_forgeries():
    """A joint flag on a frame of per-tensor entries, or mixed dtypes, is refused."""
    from codec.fuzzing import fix_many_checksums
    from codec.manyframe import FLAG_JOINT

    c = codec.get_codec("fp16")
    ts = [np.ones(4, np.float32), np.ones(6, np.float32)]
    per = bytearray(c.encode_many(ts))
    per[5] |= FLAG_JOINT
    with pytest.raises(codec.CorruptFrameError):
        codec.decode_many(fix_many_checksums(bytes(per)))
    mixed = bytearray(c.encode_many([np.ones(4, np.float32), np.ones(6, np.float64)]))
    mixed[5] |= FLAG_JOINT
    with pytest.raises(codec.CorruptFrameError):
        codec.decode_many(fix_many_checksums(bytes(mixed)))


@pytest.mark.parametrize("spec", ["fp16", "none+zstd", "topk(ratio=warmup(0.5,0.01,steps=4))", "qsgd", "randomk(ratio=0.2)"])
def test_error_feedback_without_residuals_uses_the_codecs_runs(spec):
    """residuals=False: each tensor's frame is the codec's at the key's step (its stream keyed
    by the key), through the runs of encode_many; steps advance per key."""
    ts = model(15)
    ef, ref = codec.ErrorFeedback(spec, residuals=False), codec.ErrorFeedback(spec, residuals=False)
    ref.encode(ts["layer0.w"], key="layer0.w")  # one key a step ahead
    ef.encode(ts["layer0.w"], key="layer0.w")
    for step in range(3):
        many = ef.encode_many(ts)
        got = codec.decode_many(many)
        for k, x in ts.items():
            assert np.array_equal(got[k], codec.decode(ref.encode(x, key=k)), equal_nan=True), (step, k)
            assert ef.step(k) == ref.step(k)


def test_joint_hash_form_of_many_tensors():
    """A joint frame in the hash form describes no tensor in its header: its count is bounded
    by the given layout, not by the frame's bytes."""
    ts = {f"w{i}": np.full(3, i, np.float32) for i in range(300)}
    c = codec.get_codec("topk(k=5)")
    frame = c.encode_many(ts, joint=True, layout="hash")
    assert len(frame) < 300
    got = codec.decode_many(frame, layout=ts)
    assert [float(got[f"w{i}"].max()) for i in (299, 298, 1)] == [299.0, 298.0, 0.0]
    with pytest.raises(codec.CorruptFrameError, match="layout hash"):
        codec.decode_many(frame, layout=dict(list(ts.items())[:299]))


@pytest.mark.parametrize("neighbour", [3, 131_072])  # in a run, or alone
def test_decode_add_is_the_same_in_a_run_and_alone(neighbour):
    """A run adds exactly what a tensor decoded alone adds: codes beyond the frame dtype's
    range (bf16 of a float16 tensor: 65536) and float64 values into a 16-bit accumulator,
    rounded once (1 + 2**-11 + 2**-30 -> float16 1.001)."""
    cases = [("bf16", np.array([65500], np.float16), np.float32), ("none", np.array([1 + 2.0**-11 + 2.0**-30]), np.float16)]
    for spec, x, acc_dtype in cases:
        c = codec.get_codec(spec)
        acc = [np.zeros(1, acc_dtype), np.zeros(neighbour, acc_dtype)]
        codec.decode_add_many(c.encode_many([x, np.zeros(neighbour, x.dtype)]), acc)
        alone = np.zeros(1, acc_dtype)
        c.decode_add(c.encode(x), alone)
        assert acc[0].tobytes() == alone.tobytes(), spec
    assert float(alone[0]) == float(np.float16(1.001))


@pytest.mark.parametrize("spec, kw", [("powersgd", {}), ("powersgd", {"residuals": False}), ("topk", {"momentum": 0.9}), ("fp16", {}), ("qsgd", {"residuals": False})])
def test_a_failing_step_keeps_every_stage_state(spec, kw):
    """Stage state (PowerSGD's warm-start Q) is installed with the step, once every tensor has
    finished: a NaN in the last tensor leaves the whole state as it was."""
    import pickle

    rng = np.random.default_rng(16)
    ef = codec.ErrorFeedback(spec, **kw)
    xs = [rng.standard_normal(s).astype(np.float32) for s in [(64, 32), (100,), (32, 16)]]
    ef.encode_many(xs)
    ef.encode_many(xs)
    before = pickle.dumps(ef.state_dict())
    bad = [x.copy() for x in xs]
    bad[2].reshape(-1)[5] = np.nan
    with pytest.raises(NonFiniteError, match=r"tensors\[2\]"):
        ef.encode_many(bad)
    assert pickle.dumps(ef.state_dict()) == before


def test_no_residual_changes_until_every_tensor_finished():
    """A step whose last tensor fails after the frame is built (here: a shape the frame format
    refuses to read back) installs nothing, though the first tensor had finished."""
    import pickle

    ef = codec.ErrorFeedback("fp16")  # float32: the fused step; float64: it decodes the frame
    a = np.arange(1, 9, dtype=np.float32) / 3
    ef.encode_many([a, np.zeros(3, np.float64)], keys=["a", "b"])
    before = pickle.dumps(ef.state_dict())
    with pytest.raises(codec.CorruptFrameError):
        ef.encode_many([a, np.zeros((0, 2**41), np.float64)], keys=["a", "b2"])
    assert pickle.dumps(ef.state_dict()) == before


def test_a_forged_zstd_count_is_refused_before_its_bytes_exist():
    """The payload of a zstd frame is decompressed as the stages read it: a section count
    forged far beyond what its stage expects is refused before the 256 MiB it declares are
    decompressed (the tensor's own 2**34 elements are a legal declaration)."""
    import io
    import tracemalloc

    import zstandard

    n, forged = 1 << 34, 1 << 26
    raw_total = 5 + 4 * forged  # a 34-bit gap (5 bytes), then `forged` float32 values
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=1, write_content_size=True).stream_writer(out, size=raw_total, closefd=False) as w:
        w.write(bytes(5))
        block = bytes(1 << 20)
        for _ in range(4 * forged // len(block)):
            w.write(block)
    spec = b"topk+zstd"
    header = (
        v(len(spec)) + spec + v(1) + bytes([3, 1]) + v(n)  # one float32 tensor of 2**34 elements
        + v(1) + bytes([2, 3, 34, 1, 32])  # one pattern: an index_delta of 34 bits, values of 32
        + v(0) + v(1) + v(forged)  # the tensor: 1 position, `forged` values
        + v(raw_total)
    )
    frame = _forge(header, flags=0x10) + out.getvalue()
    codec.decode_many(codec.get_codec("topk(k=1)+zstd").encode_many([np.ones(8, np.float32)]))  # kernels loaded
    tracemalloc.start()
    try:
        with pytest.raises(codec.CorruptFrameError, match=f"{forged} items, codec expects 1"):
            codec.decode_many(frame)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak


@pytest.mark.parametrize("spec", ["dgc(ratio=0.05)", "topk(ratio=0.05)+fp16", "qsgd", "randomk(ratio=0.1)"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_error_feedback_runs_with_momentum_equal_each_tensors_step(spec, dtype):
    """With DGC's momentum, a run forms u = m*u + x for all its tensors at once, codes u +
    residual, zeroes u where the frame sent values (everywhere for a dense quantizer) and keeps
    each key's velocity as its slice of one buffer (codec.feedback.runstep): frames,
    residuals and velocities are bit for bit each tensor's own step's, over several steps,
    and a tensor outside a run takes its own momentum step (a quantizer's runs take tensors of
    at most 16,384 elements, a select stage's encode_many's runs)."""
    together, alone = codec.ErrorFeedback(spec, momentum=0.9), codec.ErrorFeedback(spec, momentum=0.9)
    sizes = [7, 0, 1, 300, 64, 9, 2, 5000, 513, 16384, 20000, 3, 5, 11]
    for step in range(3):
        rng = np.random.default_rng(50 + step)
        ts = {f"w{i}": (rng.standard_t(2, n) * 10.0 ** rng.integers(-6, 3)).astype(dtype) for i, n in enumerate(sizes)}
        frame = together.encode_many(ts)
        got = codec.decode_many(frame)
        for k, x in ts.items():
            assert got[k].tobytes() == codec.decode(alone.encode(x, key=k)).tobytes(), (step, k)
        assert pickle.dumps(together.state_dict()) == pickle.dumps(alone.state_dict()), step  # residuals, velocities, steps
    runs = {id(together._slots[f"w{i}"].velocity_at[0]) for i in range(10) if together._slots[f"w{i}"].velocity_at is not None}
    assert len(runs) == 1  # one run's velocities in one buffer
    if together.codec.select is None:  # 20,000 values alone
        assert together._slots["w10"].velocity_at is None
    else:  # every tensor in the run
        assert id(together._slots["w10"].velocity_at[0]) in runs


@pytest.mark.parametrize("spec", ["powersgd(rank=2)", "powersgd(rank=1)+fp16", "powersgd(rank=2)+bf16+zstd"])
@pytest.mark.parametrize("dtypes", [(np.float32,), (np.float64, np.float16)])
def test_powersgd_pass_through_runs_are_each_tensors_bytes(spec, dtypes):
    """The tensors PowerSGD passes through (vectors, 0-d, small matrices) are coded and read
    in runs of one values section (codec.runs.passing_runs), broken by every compressed
    matrix and every change of dtype: the frame is the one per-tensor coding gives, and
    decode_many (new arrays and out=) and decode_add_many equal each tensor's own."""
    from codec.readruns import read_jobs
    from codec.runs import passing_runs

    rng = np.random.default_rng(4)
    shapes = [(10,), (1,), (0,), (), (5, 2), (64, 64), (7,), (3,), (2, 3), (128, 32), (9,)]
    ts = {f"t{i}": np.asarray(rng.standard_t(3, s) * 1e-2).astype(dtypes[i // 2 % len(dtypes)]) for i, s in enumerate(shapes)}
    c = codec.get_codec(spec)
    frame = c.encode_many(ts)
    lay = Layout.of(ts)
    groups = passing_runs(c, zip(lay.shapes, lay.sizes, lay.dtypes))
    assert groups and all(len(g) > 1 for g in groups)
    if len(dtypes) == 1:
        assert groups == [[0, 1, 2, 3, 4], [6, 7, 8]]
    mf = parse_many(frame)
    singles = {k: c.encode(x) for k, x in ts.items()}
    for i, k in enumerate(ts):  # each tensor's sections hold what its own frame's do
        fr = parse_frame(singles[k])
        assert b"".join(bytes(mf.tensor(i).raw(j)) for j in range(len(fr.sections))) == payload_of(singles[k]), k
    if "zstd" not in spec:
        assert sorted(tuple(j[0]) for j in read_jobs(c, parse_many(frame)) if len(j[0]) > 1) == [tuple(g) for g in groups]
    got = codec.decode_many(frame)
    outs = {k: np.zeros_like(x) for k, x in ts.items()}
    c.decode_many(frame, out=outs)
    adds = {k: np.ones_like(x) for k, x in ts.items()}
    codec.decode_add_many(frame, adds)
    for k in ts:
        want = codec.decode(singles[k])
        assert got[k].tobytes() == outs[k].tobytes() == want.tobytes(), k
        assert adds[k].tobytes() == c.decode_add(singles[k], np.ones_like(ts[k])).tobytes(), k


def test_powersgd_matrices_are_expanded_in_one_call_per_dtype(monkeypatch):
    """``decode_many(out=)`` forms every compressed matrix's ``P Q^T`` of one dtype with one
    ``expand_segments`` call (each into its own array), the bytes each tensor's own frame
    decodes to; a 16-bit matrix (its values rounded on the way) is written on its own."""
    calls = count_kernel_calls(monkeypatch, lowrank=("expand", "expand_segments"))
    rng = np.random.default_rng(8)
    shapes = [((64, 64), np.float32), ((10,), np.float32), ((33, 17), np.float32), ((3, 27), np.float32), ((40, 3, 3), np.float32),
              ((16, 16), np.float64), ((20, 5, 4), np.float64), ((24, 24), np.float16)]
    ts = {f"t{i}": (rng.standard_t(3, s) * 1e-2).astype(dt) for i, (s, dt) in enumerate(shapes)}
    c = codec.get_codec("powersgd(rank=3)")
    frame = c.encode_many(ts)
    outs = {k: np.full_like(x, np.nan) for k, x in ts.items()}
    calls.update(expand=0, expand_segments=0)
    c.decode_many(frame, out=outs)
    assert calls == {"expand": 1, "expand_segments": 2}
    for k, x in ts.items():
        assert outs[k].tobytes() == codec.decode(c.encode(x)).tobytes(), k


def test_a_pass_through_run_names_the_tensor_that_holds_a_nan():
    ts = [np.ones(4, np.float32), np.ones(3, np.float32), np.ones(5, np.float32)]
    ts[1][2] = np.nan
    with pytest.raises(ValueError, match=r"tensors\[1\]"):
        codec.get_codec("powersgd+fp16").encode_many(ts)
