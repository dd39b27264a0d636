"""Replayed steps (codec/replay.py): a many-tensor step of a layout framed before.

A replayed ``encode_many`` gives the general path's bytes, a replayed ``decode_many`` its
arrays, and whatever a plan does not match (another layout, a non-contiguous or read-only
array, a NaN under nonfinite=raise, a damaged frame, another codec's frame) runs the general
path with its errors.  Each test checks the replay ran by making the general path fail."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import codec
from codec import many, manydecode, replay
from codec.errors import CodecError, CorruptFrameError, NonFiniteError
from codec.runs import RUN_ELEMENTS

#: edge sizes: 0-d, empty, one value, odd, a matrix, a 4-d kernel
SHAPES = [(), (0,), (1,), (333,), (7, 9), (3, 0, 2), (8, 1, 3, 3)]


def tensors(dtype=np.float32, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return {f"t{i}": np.asarray(rng.standard_t(3, s) * 10.0 ** rng.integers(-3, 3)).astype(dtype) for i, s in enumerate(shapes)}


def general(spec, ts, **kw) -> bytes:
    """The frame of the general path: a new codec has learned nothing."""
    return codec.Codec(spec, **kw).encode_many(ts)


@pytest.fixture
def no_general(monkeypatch):
    """Make the general path of encode_many and decode_many fail."""

    def refuse(*a, **k):
        raise AssertionError("the general path ran")

    def off():
        monkeypatch.setattr(many, "prepared", refuse)
        monkeypatch.setattr(manydecode, "decode", refuse)

    return off


@pytest.mark.parametrize("spec,dtype,checksum", [("fp16", np.float32, True), ("bf16", np.float64, True), ("fp16(nonfinite=keep)", np.float32, False)])
def test_a_replayed_step_gives_the_general_paths_bytes_and_arrays(spec, dtype, checksum, no_general):
    c = codec.Codec(spec, checksum=checksum)
    first, second = tensors(dtype, 0), tensors(dtype, 1)
    if "keep" in spec:
        second["t3"][[0, 5]] = [np.nan, -np.inf]
    frame = c.encode_many(first)  # learned
    assert frame == general(spec, first, checksum=checksum)
    out = {k: np.empty_like(v) for k, v in first.items()}
    c.decode_many(frame, out=out)  # learned
    expect = general(spec, second, checksum=checksum)
    listed = general(spec, list(second.values()), checksum=checksum)
    ref = codec.Codec(spec).decode_many(expect)
    c.encode_many(list(first.values()))
    no_general()
    assert c.encode_many(second) == expect
    assert c.encode_many(second, step=3, skip_missing=True) == expect  # (an elementwise codec's frame has no step)
    assert c.encode_many(list(second.values())) == listed
    assert c.decode_many(expect, out=out) is out
    for k in second:
        np.testing.assert_array_equal(out[k], ref[k])
    got = codec.decode_many(bytearray(expect))  # new arrays; any entry point, any codec object
    assert list(got) == list(second) and all(got[k].shape == second[k].shape and got[k].dtype == dtype for k in got)
    for k in second:
        np.testing.assert_array_equal(got[k], ref[k])
    outs = [np.empty_like(v) for v in second.values()]
    assert c.decode_many(expect, out=outs) is outs
    for a, k in zip(outs, second):
        np.testing.assert_array_equal(a, ref[k])


def test_what_a_plan_does_not_match_runs_the_general_path():
    c = codec.Codec("fp16")
    ts = tensors()
    c.encode_many(ts)
    calls = []
    real = many.prepared

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    many.prepared, saved = counted, many.prepared
    try:
        c.encode_many(ts)
        assert not calls  # replayed
        cases = [
            {**ts, "t4": np.asfortranarray(ts["t4"])},  # not C-contiguous
            {**ts, "t3": ts["t3"].astype(np.float64)},  # another dtype
            {**ts, "t3": np.ones(2, ts["t3"].dtype)},  # another shape under the same name
            {**ts, "t4": ts["t4"].view(np.matrix)},  # a subclass
            {k: ts[k] for k in reversed(ts)},  # another order
        ]
        for case in cases:
            calls.clear()
            assert c.encode_many(case) == general("fp16", case)
            assert calls
        for case in (cases[4], ts):  # each order its own plan; under the same names, the latest layout
            expect = general("fp16", case)
            calls.clear()
            assert c.encode_many(case) == expect
            assert not calls
        calls.clear()
        c.encode_many(ts, keys=list(range(len(ts))))  # keys, joint, out: not replayed
        assert calls
    finally:
        many.prepared = saved


def test_a_list_of_pairs_and_a_list_of_arrays_keep_their_own_frames():
    c = codec.Codec("fp16")
    ts = tensors()
    pairs, arrays = list(ts.items()), list(ts.values())
    for _ in range(2):
        assert c.encode_many(pairs) == general("fp16", ts)  # named
        assert c.encode_many(arrays) == general("fp16", arrays)  # not named


def test_a_refused_value_is_named_by_the_general_path():
    c = codec.Codec("fp16")
    ts = tensors()
    c.encode_many(ts)
    ts["t4"][1, 2] = np.inf
    with pytest.raises(NonFiniteError, match=r"tensors\['t4'\]: non-finite value at position \(1, 2\)"):
        c.encode_many(ts)


def test_a_damaged_frame_is_refused_as_before():
    c = codec.Codec("fp16")
    ts = tensors()
    frame = c.encode_many(ts)
    out = {k: np.empty_like(v) for k, v in ts.items()}
    c.decode_many(frame, out=out)
    damaged = bytearray(frame)
    damaged[-3] ^= 0x10  # a payload byte: the header (and its plan) hold, the payload CRC-32C does not
    with pytest.raises(CorruptFrameError, match="payload checksum"):
        c.decode_many(bytes(damaged), out=out)
    assert np.isnan(out["t3"]).all()  # the outputs written are not left behind as values
    header_len = codec.manyframe.parse_many(frame).header_len
    for at in (0, 10, header_len - 5, header_len - 1):  # the magic, the table, the payload CRC, the header CRC
        bad = bytearray(frame)
        bad[at] ^= 0x01
        with pytest.raises(CorruptFrameError) as e:  # the plan missed: parsing the header refused it
            c.decode_many(bytes(bad), out=out)
        assert "payload checksum" not in str(e.value)


def test_the_same_arrays_again_are_checked_again_and_kept_alive_by_no_plan():
    c = codec.Codec("fp16")
    ts = tensors()
    frame = c.encode_many(ts)
    out = {k: np.empty_like(v) for k, v in ts.items()}
    for _ in range(2):  # learned, then replayed: the arrays' addresses remembered
        c.decode_many(frame, out=out)
    for k in ts:  # new values in the same arrays: a new frame
        ts[k] += 1
    assert c.encode_many(ts) == general("fp16", ts)
    frame = c.encode_many(ts)
    ref = codec.Codec("fp16").decode_many(frame)
    out["t4"].flags.writeable = False  # each array changed in place is checked again
    with pytest.raises(ValueError, match=r"out\['t4'\]: must be a writeable"):
        c.decode_many(frame, out=out)
    out["t4"].flags.writeable = True
    out["t4"].shape = (9, 7)  # any shape of the size, as the general path takes it
    c.decode_many(frame, out=out)
    np.testing.assert_array_equal(out["t4"], ref["t4"].reshape(9, 7))
    out["t3"].dtype = np.int32
    with pytest.raises(ValueError, match=r"out\['t3'\]: dtype int32"):
        c.decode_many(frame, out=out)
    ts["t3"].dtype = np.int32
    with pytest.raises(CodecError, match=r"t3"):
        c.encode_many(ts)
    ts["t3"].dtype = np.float32
    gone = weakref.ref(out["t6"])
    del out
    gc.collect()
    assert gone() is None


def test_the_general_paths_checks_of_out_and_the_codec_still_hold():
    c = codec.Codec("fp16")
    ts = tensors()
    frame = c.encode_many(ts)
    c.decode_many(frame)
    out = {k: np.empty_like(v) for k, v in ts.items()}
    ro = {**out, "t3": out["t3"].copy()}
    ro["t3"].flags.writeable = False
    with pytest.raises(ValueError, match=r"out\['t3'\]: must be a writeable"):
        c.decode_many(frame, out=ro)
    with pytest.raises(ValueError, match=r"out\['t3'\]: dtype float64"):
        c.decode_many(frame, out={**out, "t3": out["t3"].astype(np.float64)})
    with pytest.raises(ValueError, match="missing"):
        c.decode_many(frame, out={k: v for k, v in out.items() if k != "t0"})
    with pytest.raises(ValueError, match="more than the limit of 10"):
        c.decode_many(frame, max_elements=10)
    with pytest.raises(CodecError, match="not by this codec"):
        codec.Codec("bf16").decode_many(frame)
    fixed = {**out, "t4": out["t4"].reshape(-1)}  # any shape of the size, as the general path takes it
    c.decode_many(frame, out=fixed)
    np.testing.assert_array_equal(fixed["t4"], codec.decode_many(frame)["t4"].reshape(-1))


def test_only_one_run_of_codes_is_learned():
    mixed = {"a": np.ones(3, np.float32), "b": np.ones(4, np.float64)}
    for spec, ts in [("fp16", mixed), ("topk(ratio=0.5)+zstd", tensors()), ("fp16+zstd", tensors()), ("fp16", {})]:
        c = codec.Codec(spec)
        frame = c.encode_many(ts)
        c.decode_many(frame)
        assert all(plan is None for _, plan in c.__dict__.get("_replays", {}).values())
        assert not any(p.prefix == frame[: len(p.prefix)] for ps in replay._DECODES.values() for p in ps)
    hashed = codec.Codec("fp16")
    ts = tensors()
    frame = hashed.encode_many(ts, layout="hash")
    assert not hashed.__dict__.get("_replays")
    np.testing.assert_array_equal(hashed.decode_many(frame, layout=codec.Layout.of(list(ts.values()), list(ts)))["t3"], codec.decode_many(hashed.encode_many(ts))["t3"])


def test_cpu_torch_tensors_are_replayed_through_their_numpy_views(no_general):
    torch = pytest.importorskip("torch")
    c = codec.Codec("bf16")
    first, second = tensors(seed=2), tensors(seed=3)
    c.encode_many({k: torch.from_numpy(v) for k, v in first.items()})  # learned from torch tensors
    frame = c.encode_many(first)
    c.decode_many(frame, out={k: torch.from_numpy(np.empty_like(v)) for k, v in first.items()})
    expect = general("bf16", second)
    ref = codec.decode_many(expect)
    no_general()
    grads = {k: torch.from_numpy(v).requires_grad_(v.size > 0) for k, v in second.items()}
    assert c.encode_many(grads) == expect
    out = {k: torch.empty(v.shape, dtype=torch.float32) for k, v in second.items()}
    assert c.decode_many(expect, out=out) is out
    for k in second:
        np.testing.assert_array_equal(out[k].numpy(), ref[k])


@pytest.mark.parametrize(
    "spec",
    ["qsgd(levels=16)", "minmax(bits=4)", "fp8", "rangefloat", "powersgd(rank=4)", "powersgd(rank=2,min_compression_rate=0)", "powersgd(rank=5,warm_start=false)"],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_frame_whose_header_is_its_layouts_is_replayed_on_decode(spec, dtype, no_general):
    """A quantizer's frame decodes as one run (read_run, then write_segments into each
    array), PowerSGD's as one ``expand_segments`` call for every matrix and a copy of every
    tensor passed through: bit for bit the general path's, into new arrays and into arrays
    given; a damaged payload goes back to the general path, which refuses it."""
    shapes = [*SHAPES, (64, 48), (16, 3, 3, 3)]  # (matrices PowerSGD compresses at rank 4)
    c = codec.Codec(spec)
    c.decode_many(c.encode_many(tensors(dtype, 4, shapes)))  # learned
    frame = general(spec, tensors(dtype, 5, shapes))
    ref = codec.Codec(spec).decode_many(frame)
    if c.transform is not None:
        assert {bool(c.transform.matrix(v.shape)) for v in ref.values()} == {True, False}
    _replayed_as_general(c, frame, ref, no_general)


@pytest.mark.parametrize("spec", ["randomk(ratio=0.3)", "randomk(ratio=0.5,seed=9,scale=true)"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_keyed_sparse_frame_is_replayed_on_decode(spec, dtype, no_general, monkeypatch):
    """Random-k's frame (a key and the values per tensor: its header the layout's) decodes as
    one draw of every tensor's positions from its key (another step draws others) and one
    scatter into each array, the values the general path gives; a damaged payload, or a key
    the stage refuses, goes back to the general path, which names it, also after other
    keys were checked and kept."""
    c = codec.Codec(spec)
    c.decode_many(c.encode_many(tensors(dtype, 4)))  # learned at step 0
    frame = codec.Codec(spec).encode_many(tensors(dtype, 5), step=7)
    ref = codec.Codec(spec).decode_many(frame)
    mf = codec.manyframe.parse_many(frame)
    key = mf.header_len + mf.tensor_sections[3][0].offset  # tensor t3's (seed, step, khash)
    wrong = bytearray(frame)
    wrong[key + 8 : key + 16] = (1 << 63).to_bytes(8, "little")  # an impossible step
    _rechecksum(wrong, mf.header_len)
    with pytest.raises(CorruptFrameError, match="impossible step"):
        codec.decode_many(bytes(wrong))
    later = codec.Codec(spec).encode_many(tensors(dtype, 6), step=8)
    ref_later = codec.Codec(spec).decode_many(later)
    checked = []
    stage = type(c.select)
    real = stage.keys_at
    monkeypatch.setattr(stage, "keys_at", lambda self, *a: checked.append(1) or real(self, *a))
    _replayed_as_general(c, frame, ref, no_general)  # (its keys checked once, then kept: the second decode reads them from the plan)
    assert any(np.count_nonzero(v) for v in ref.values())
    assert len(checked) == 1, "the same keys again are read from the plan"
    got = c.decode_many(later)  # (other keys: checked, then kept in their place)
    assert all(got[k].tobytes() == ref_later[k].tobytes() for k in ref_later) and len(checked) == 2
    with pytest.raises(AssertionError, match="general path"):  # (keys other than the kept ones are checked: refused)
        c.decode_many(bytes(wrong))


@pytest.mark.parametrize("spec", ["topk(ratio=warmup(0.5,0.1,steps=4))", "gaussiank(ratio=0.2)", "dgc(ratio=0.2)", "topk(k=3)"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sparse_frame_is_replayed_on_decode(spec, dtype, no_general, monkeypatch):
    """A sparse frame of index sections and raw values, whose header's sections (their
    kinds, widths and counts) change with each step, decodes through the plan learned from
    another step's frame: its sections read after the layout with one ``pair_sections``
    call and every pair written with one ``index_scatter_segments`` call, the general path's
    arrays bit for bit; a damaged payload, a header whose sections do not add up and an
    index section past its tensor go back to the general path, which refuses them."""
    from codec.kernels import module
    from codec.manyframe import parse_many

    c = codec.Codec(spec)
    c.decode_many(c.encode_many(tensors(dtype, 4), step=6))  # learned
    frames = [codec.Codec(spec).encode_many(tensors(dtype, seed), step=step) for seed, step in ((5, 1), (6, 9))]
    refs = [manydecode.decode(c, parse_many(f), None) for f in frames]
    assert all(any(np.count_nonzero(v) for v in ref.values()) for ref in refs)
    if "ratio" in spec:  # (the two steps keep other counts: other frame lengths, one plan)
        assert len({len(f) for f in frames}) == 2
    mf = parse_many(frames[0])
    wide = bytearray(frames[0])  # the last tensor's count one more: its sections end past the frame
    at = mf.header_len - 9  # (its one-byte count, then the payload CRC and the header's)
    assert wide[at] == mf.tensor_sections[-1][0].count < 0x7F
    wide[at] += 1
    _rechecksum(wide, mf.header_len)
    gaps = bytearray(frames[0])  # t3's first gap made large: a position past its tensor
    gaps[mf.header_len + mf.tensor_sections[3][0].offset] |= 0xF0
    _rechecksum(gaps, mf.header_len)
    for damaged in (wide, gaps):
        with pytest.raises(CorruptFrameError):
            codec.decode_many(bytes(damaged))
    with pytest.raises(ValueError, match=r"max_elements: must be an integer in \[0, 2\*\*60\]"):  # (a plan matches: the limit is still checked)
        c.decode_many(frames[0], max_elements=2**61)
    assert c.decode_many(frames[0], max_elements=10**6) is not None
    with pytest.raises(CorruptFrameError, match="more than the limit"):
        c.decode_many(frames[0], max_elements=5)
    calls = []
    for family, name in (("pairs", "pair_sections"), ("scatter", "index_scatter_segments")):
        real = getattr(module(family), name)
        monkeypatch.setattr(module(family), name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    for frame, ref in zip(frames, refs):
        _replayed_as_general(c, frame, ref, no_general)
    assert calls.count("index_scatter_segments") == 4 and calls.count("pair_sections") == 6  # (each frame decoded into new arrays and arrays given, and damaged once)
    with pytest.raises(CorruptFrameError, match="sections end at byte"):  # (refused by the general path's parse)
        c.decode_many(bytes(wide))
    with pytest.raises(AssertionError, match="general path"):
        c.decode_many(bytes(gaps))


def test_a_sparse_frame_of_coded_values_is_not_learned_on_decode(monkeypatch):
    """A sparse codec whose values are coded (``+fp16``) has no decoding plan: its frames
    decode through the general path, which does not try to learn one each time."""
    c = codec.Codec("topk(ratio=0.2)+fp16")
    frame = c.encode_many(tensors(np.float32, 4))
    learned = []
    real = replay.learned
    monkeypatch.setattr(replay, "learned", lambda *a: learned.append(1) or real(*a))
    for _ in range(2):
        c.decode_many(frame)
    assert not learned and not any(p.codec is c for p in replay._PAIRS)


def _replayed_as_general(c, frame, ref, no_general) -> None:
    """``frame`` with a damaged payload is refused by the general path; with the general
    path off, ``c`` decodes ``frame`` (new arrays, and arrays given) to ``ref``, bit for bit."""
    damaged = bytearray(frame)
    damaged[-1] ^= 0x01
    with pytest.raises(CorruptFrameError, match="payload checksum"):
        c.decode_many(bytes(damaged))
    no_general()
    got = c.decode_many(frame)
    out = [np.full_like(v, np.nan) for v in ref.values()]
    assert codec.decode_many(frame, out=out) is out
    for k, a in zip(ref, out):
        assert got[k].tobytes() == ref[k].tobytes() == a.tobytes(), k


def _rechecksum(frame: bytearray, header_len: int) -> None:
    """Write the payload CRC-32C of ``frame`` again (and so the header's), as a frame
    crafted with a valid checksum would carry it."""
    from codec.checksum import crc32c
    from codec.frame import _CRC

    _CRC.pack_into(frame, header_len - 2 * _CRC.size, crc32c(bytes(frame[header_len:])))
    import zlib

    _CRC.pack_into(frame, header_len - _CRC.size, zlib.crc32(bytes(frame[: header_len - _CRC.size])))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_random_k_step_is_replayed_on_encode(dtype, no_general):
    """random-k's ``encode_many`` (values as they are, unscaled) replays from the step before:
    the learned header, each tensor's key and its values at the positions the key draws,
    bit for bit the general path's frame at any step; a step whose schedule keeps other
    counts, a NaN, a scaled codec and keys go to the general path."""
    spec = "randomk(ratio=warmup(0.5,0.1,steps=4))"
    c = codec.Codec(spec)
    first, second = tensors(dtype, 0), tensors(dtype, 1)
    c.encode_many(first, step=6)  # learned (the warm-up over: the ratio is 0.1 from step 4)
    want = {step: codec.Codec(spec).encode_many(second, step=step) for step in (4, 9, 2**40)}
    early = codec.Codec(spec).encode_many(second, step=1)
    nan = {**second, "t3": np.full_like(second["t3"], np.nan)}  # (a kept value among them)
    scaled = codec.Codec("randomk(ratio=0.3,scale=true)")
    scaled_want = codec.Codec("randomk(ratio=0.3,scale=true)").encode_many(second, step=2)
    scaled.encode_many(first, step=1)
    keyed_want = codec.Codec(spec).encode_many(second, keys=list(range(len(second))), step=5)
    no_general()
    for step, frame in want.items():
        assert c.encode_many(second, step=step) == frame
    with pytest.raises(AssertionError, match="general path"):  # (other counts at step 1)
        c.encode_many(second, step=1)
    with pytest.raises(AssertionError, match="general path"):
        c.encode_many(nan, step=5)
    with pytest.raises(AssertionError, match="general path"):
        scaled.encode_many(second, step=2)
    with pytest.raises(AssertionError, match="general path"):
        c.encode_many(second, keys=list(range(len(second))), step=5)
    assert early and scaled_want and keyed_want  # (made by the general path before it was turned off)


SPARSE = ["topk(ratio=warmup(0.5,0.1,steps=4))", "topk(k=3)", "topk(ratio=0.2)+fp16", "gaussiank(ratio=0.2)", "dgc(ratio=0.2)", "adacomp", "adacomp+none"]


@pytest.mark.parametrize("spec", SPARSE)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sparse_step_is_replayed_on_encode(spec, dtype, no_general, monkeypatch):
    """A sparse codec's ``encode_many`` (a select stage other than random-k's) replays from
    the step before: every tensor selected at once, its index section (whose kind and width
    change with the data: the header is made for them, and kept) and its values coded at
    once (values as they are: the frame written from the finds by ``pairs.pair_payload``
    and ``pair_head``), bit for bit the general path's frame at any step of a schedule, on heavy-tailed
    data and on ties; a NaN and keys go to the general path, and neither a byte stage nor a
    tensor beyond a run's size is ever learned."""
    from codec.manyframe import build

    monkeypatch.setattr(build, "_HEADS_MAX", 2)  # (the kept headers dropped as the widths change)
    c = codec.Codec(spec)
    c.encode_many(tensors(dtype, 0), step=6)  # learned
    steps = (1, 4, 9, 2**40)
    ties = {k: np.asarray(np.round(v), dtype) for k, v in tensors(dtype, 3).items()}  # (many equal magnitudes: ties to the lower index)
    data = [tensors(dtype, 1), tensors(dtype, 2), ties]
    want = [[codec.Codec(spec).encode_many(d, step=st) for st in steps] for d in data]
    nan = {**data[0], "t3": np.full_like(data[0]["t3"], np.nan)}
    packed = codec.Codec(spec + "+zstd")
    packed.encode_many(tensors(dtype, 0))
    big = codec.Codec(spec)
    ts = {"big": np.ones(RUN_ELEMENTS + 1, dtype), "small": np.ones(3, dtype)}
    big.encode_many(ts)
    from codec.kernels import module

    written = []
    real = module("pairs").pair_payload
    monkeypatch.setattr(module("pairs"), "pair_payload", lambda *a: written.append(1) or real(*a))
    no_general()
    for d, per_step in zip(data, want):
        for st, frame in zip(steps, per_step):
            assert c.encode_many(d, step=st) == frame
    pairs = "+" not in spec and spec != "adacomp"  # (values as they are: the frame written from the finds, pairs.pair_payload; AdaComp's finds carry their values)
    assert len(written) == (len(data) * len(steps) if pairs else 0)
    for call in (lambda: c.encode_many(nan, step=5), lambda: c.encode_many(data[0], keys=list(range(len(data[0])))), lambda: packed.encode_many(data[0]), lambda: big.encode_many(ts)):
        with pytest.raises(AssertionError, match="general path"):
            call()


@pytest.mark.parametrize("spec", ["powersgd(rank=4)", "powersgd(rank=2,min_compression_rate=0)", "powersgd(rank=5,warm_start=false,seed=3)"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_powersgd_step_is_replayed_on_encode(spec, dtype, no_general):
    """PowerSGD's ``encode_many`` replays from the step before: every matrix's power
    iteration in one kernel call, the tensors it passes through copied (a NaN among them
    too, as the general path sends it), bit for bit the general path's frame at any step
    (warm starts or a cold ``Q`` drawn per step) on heavy-tailed data, a matrix beyond a
    run's size too (its rows and columns in several parallel runs); a NaN in a matrix and
    keys go to the general path."""
    shapes = [*SHAPES, (64, 48), (16, 3, 3, 3)]  # (matrices PowerSGD compresses at rank 4)
    c = codec.Codec(spec)
    c.encode_many(tensors(dtype, 0, shapes), step=3)  # learned
    steps = (0, 1, 7, 2**40)
    data = [tensors(dtype, 1, shapes), tensors(dtype, 2, shapes)]
    data.append({**data[0], "t2": np.full_like(data[0]["t2"], np.nan)})  # (passed through: NaN sent as it is)
    want = [[codec.Codec(spec).encode_many(d, step=st) for st in steps] for d in data]
    nan = {**data[0], "t7": np.full_like(data[0]["t7"], np.nan)}  # (a matrix)
    assert c.transform.matrix(nan["t7"].shape) is not None and c.transform.matrix(data[2]["t2"].shape) is None
    big = codec.Codec(spec)
    rng = np.random.default_rng(5)
    ts = {"big": np.ones((8, RUN_ELEMENTS // 8 + 1), dtype), "small": np.ones((16, 16), dtype)}
    big.encode_many(ts)
    wide = [{"big": rng.standard_t(2, (8, RUN_ELEMENTS // 8 + 1)).astype(dtype), "tall": rng.standard_t(2, (RUN_ELEMENTS // 16 + 3, 16)).astype(dtype), "small": rng.standard_t(2, (16, 16)).astype(dtype)} for _ in range(2)]
    big.encode_many(wide[0], step=1)
    wants = [codec.Codec(spec).encode_many(w, step=st) for w in wide for st in steps]
    no_general()
    for d, per_step in zip(data, want):
        for st, frame in zip(steps, per_step):
            assert c.encode_many(d, step=st) == frame
    assert [big.encode_many(w, step=st) for w in wide for st in steps] == wants
    for call in (lambda: c.encode_many(nan, step=5), lambda: c.encode_many(data[0], keys=list(range(len(data[0]))))):
        with pytest.raises(AssertionError, match="general path"):
            call()


@pytest.mark.parametrize("spec", ["powersgd(rank=4)", "powersgd(rank=2,min_compression_rate=0)", "powersgd(rank=5,warm_start=false,seed=3)"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_powersgd_error_feedback_step_is_replayed(spec, dtype, monkeypatch):
    """``ErrorFeedback(powersgd).encode_many`` replays from its second step (the plan learned
    from the first frame): ``acc`` formed, every matrix's power iteration from its key's warm
    (or drawn) ``Q`` in one kernel call, ``acc -= decoded``; frames, residuals, warm ``Q``s and
    steps bit for bit each tensor's own step's, over steps with heavy tails, keys, an
    all-zero gradient, a NaN in a tensor passed
    through (sent as it is) and a matrix beyond a run's size.  A NaN in a matrix goes to the
    general path, which names it and changes nothing; momentum and an ``out=`` buffer are
    not replayed."""
    import pickle

    from codec import replaydecode

    calls = []
    real = replaydecode.feedback_lowrank
    monkeypatch.setattr(replaydecode, "feedback_lowrank", lambda *a: calls.append(1) or real(*a))
    shapes = [*SHAPES, (64, 48), (16, 3, 3, 3), (8, RUN_ELEMENTS // 8 + 1)]
    given = "rank=4" not in spec  # (keys given, or the names)
    keys = [f"k{i}" if given else f"t{i}" for i in range(len(shapes))]
    together, alone = codec.ErrorFeedback(spec), codec.ErrorFeedback(spec)
    for step in range(5):
        ts = tensors(dtype, step, shapes)
        if step == 2:
            ts["t7"] = np.zeros_like(ts["t7"])  # (acc is its residual alone)
        if step < 2:  # (acc all zero: its Q too, so the next step's warm Q has zero columns and is drawn)
            ts["t8"] = np.zeros_like(ts["t8"])
        if step == 3:
            ts["t3"] = np.full_like(ts["t3"], np.nan)  # (passed through: its NaN sent as it is)
        got = codec.decode_many(together.encode_many(ts, keys=keys if given else None))
        for k, key, x in zip(ts, keys, ts.values()):
            assert got[k].tobytes() == codec.decode(alone.encode(x, key=key)).tobytes(), (step, k)
        assert pickle.dumps(together.state_dict()) == pickle.dumps(alone.state_dict()), step
    assert len(calls) == 4  # (the first step learned the plan)
    before = pickle.dumps(together.state_dict())
    nan = {**ts, "t8": np.full_like(ts["t8"], np.nan)}
    with pytest.raises(NonFiniteError, match="t8"):
        together.encode_many(nan, keys=keys)
    assert pickle.dumps(together.state_dict()) == before
    calls.clear()
    others = [codec.ErrorFeedback(spec, momentum=0.9), codec.ErrorFeedback(spec)]
    for ef, kw in zip(others, [{}, {"out": bytearray(1 << 22)}]):
        for step in range(3):
            ef.encode_many(tensors(dtype, step, shapes), **kw)
    assert not calls


@pytest.mark.parametrize("spec", ["topk(ratio=warmup(0.5,0.1,steps=3))", "topk(k=3)", "gaussiank(ratio=0.2)", "dgc(ratio=0.2)", "topk(ratio=0.2)+fp16"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_error_feedback_step_is_replayed(spec, dtype, monkeypatch):
    """``ErrorFeedback.encode_many`` of a codec whose frames are pairs, every tensor one run,
    replays its coding from the second step (learned and checked on the first): the frame
    written from the finds in ``acc`` and ``acc`` set to +0.0 at the sent positions; frames,
    residuals and steps bit for bit each tensor's own step's over a schedule, heavy tails,
    ties and keys at different steps.  Not replayed: coded values (``+fp16``), momentum, an
    ``out=`` buffer, a tensor beyond a run's size; a NaN goes to the general path, which
    names it and changes nothing."""
    import pickle

    from codec import replaydecode

    calls = []
    real = replaydecode.feedback_pairs
    monkeypatch.setattr(replaydecode, "feedback_pairs", lambda *a: calls.append(1) or real(*a))
    together, alone = codec.ErrorFeedback(spec), codec.ErrorFeedback(spec)
    first = tensors(dtype, 7)["t3"]
    for ef in (together, alone):  # (one key a step ahead: each tensor's context has its own step)
        ef.encode(first, key="t3")
    for step in range(4):
        ts = tensors(dtype, step) if step != 2 else {k: np.asarray(np.round(v), dtype) for k, v in tensors(dtype, 9).items()}  # (ties)
        got = codec.decode_many(together.encode_many(ts))
        for k, x in ts.items():
            assert got[k].tobytes() == codec.decode(alone.encode(x, key=k)).tobytes(), (step, k)
        assert pickle.dumps(together.state_dict()) == pickle.dumps(alone.state_dict()), step
    replayed = "+" not in spec
    assert len(calls) == (4 if replayed else 0)  # (the first step's check, then three replayed steps)
    before = pickle.dumps(together.state_dict())
    nan = {**ts, "t3": np.full_like(ts["t3"], np.nan)}
    with pytest.raises(NonFiniteError, match="t3"):
        together.encode_many(nan)
    assert pickle.dumps(together.state_dict()) == before
    calls.clear()
    others = [codec.ErrorFeedback(spec, momentum=0.9), codec.ErrorFeedback(spec)]
    for ef, kw in zip(others, [{}, {"out": bytearray(1 << 16)}]):
        for step in range(3):
            ef.encode_many(tensors(dtype, step), **kw)
    big = codec.ErrorFeedback(spec)
    for step in range(3):
        big.encode_many({"big": np.full(RUN_ELEMENTS + 1, step + 1.0, dtype), **tensors(dtype, step)})
    assert not calls
