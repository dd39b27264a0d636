"""The fuzzers of docs/robustness.md: the regression corpus, a bounded mutation run, and
checks that the mutators and the oracle do their job.

GRADCODEC_FUZZ_SECONDS sets the bounded run's budget over all targets (default 30 s; 0 skips it).
"""

from __future__ import annotations

import os
import random
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

import codec
from codec import fuzzing
from codec.errors import CorruptFrameError

CORPUS = Path(__file__).parent / "fuzz_corpus"
BUDGET = float(os.environ.get("GRADCODEC_FUZZ_SECONDS", "30"))
#: share of the bounded run per target (the frame parser is the one most exposed)
SHARES = {"frame": 0.4, "container": 0.15, "many": 0.15, "spec": 0.15, "state": 0.15}


def _corpus_files():
    out = []
    for t in fuzzing.TARGETS:
        d = CORPUS / t
        if d.is_dir():
            out += [(t, p) for p in sorted(d.iterdir()) if p.is_file() and not p.name.startswith(".") and p.suffix != ".md"]
    return out


# ----------------------------------------------------------------------------- (a) regression corpus
@pytest.mark.parametrize("target,path", _corpus_files(), ids=lambda v: v.name if isinstance(v, Path) else v)
def test_regression_corpus(target, path):
    """Every input that once fell outside the promise stays inside it."""
    out = fuzzing.check(target, path.read_bytes())
    assert not out.finding, f"{target}/{path.name}: {out.label}: {out.detail}"


def test_regression_corpus_is_not_empty():
    files = _corpus_files()
    assert {t for t, _ in files} >= {"frame", "spec"}, f"regression corpus: {sorted({t for t, _ in files})}"


# ----------------------------------------------------------------------------- (b) bounded run
@pytest.mark.skipif(BUDGET <= 0, reason="GRADCODEC_FUZZ_SECONDS=0")
@pytest.mark.parametrize("target", fuzzing.TARGETS)
def test_bounded_fuzz(target, tmp_path):
    """A short mutation run per target in a child process (a crash fails the test and leaves
    its input in tests/fuzz_corpus/<target>/crash-<hash>); no outcome outside the promise."""
    st = fuzzing.supervise(target, seconds=max(3.0, BUDGET * SHARES[target]), seed=int(os.environ.get("GRADCODEC_FUZZ_SEED", "0")),
                           corpus_dir=CORPUS, findings_dir=tmp_path, hang_seconds=30, full_seeds=False, log=None)
    assert st.inputs > 0, f"{target}: the fuzz loop ran no input"
    assert not st.findings and not st.crashes, fuzzing.format_stats(st)


# ----------------------------------------------------------------------------- (c) the machinery
def _frame(spec="fp16", arr=None):
    arr = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4) if arr is None else arr
    return codec.get_codec(spec).encode(arr)


def _error(buf) -> str:
    try:
        codec.decode(buf, max_elements=fuzzing.MAX_ELEMENTS)
    except codec.CodecError as e:
        return str(e)
    return ""


@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.3)+fp16+zstd", "bf16+crc32", "qsgd(levels=3,bucket=7,rounding=nearest)+crc32"])
def test_split_join_is_exact(spec):
    f = _frame(spec)
    assert fuzzing.split_frame(f).join() == f
    assert fuzzing.fix_frame_checksums(f) == f


def test_field_edit_reaches_past_the_header_crc():
    """A shape edit with the checksum recomputed fails where the shape is checked, not at the CRC."""
    f = fuzzing.split_frame(_frame())
    f.shape = [3, 5]
    raw, fixed = f.join(fix=False), f.join()
    assert "checksum" in _error(raw)
    err = _error(fixed)
    assert err and "checksum" not in err, err  # 15 elements, 12 fp16 values: the pipeline's count check


def test_payload_edit_reaches_past_the_payload_crc():
    """flags bit 0 (zlib CRC32): a section byte edit with both checksums recomputed decodes."""
    f = fuzzing.split_frame(_frame("fp16+crc32"))
    assert f.flags & fuzzing.FLAG_CRC32
    f.payloads[0] = b"\x00\x3c" + f.payloads[0][2:]  # first value 1.0
    assert "checksum" in _error(f.join(fix=False))
    assert codec.decode(f.join())[0, 0] == 1.0


def test_crc32c_flag_is_recomputed():
    """flags bit 1 (payload CRC-32C) puts crc32c(sections) just before the header CRC."""
    f = fuzzing.split_frame(_frame())
    f.flags = fuzzing.FLAG_CRC32C
    buf = f.join()
    hl = fuzzing.frame_header_len(buf)
    assert struct.unpack_from("<I", buf, hl - 8)[0] == fuzzing.crc32c(buf[hl:])
    assert struct.unpack_from("<I", buf, hl - 4)[0] == zlib.crc32(buf[: hl - 4])
    assert fuzzing.crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C


def test_container_edit_reaches_past_the_table_crc():
    c = codec.container.pack_frames([("a", _frame()), ("b", _frame("topk(k=2)"))])
    parts = fuzzing.split_container(c)
    assert parts.join() == c
    parts.entries[1][0] = b"a"  # a repeated name: found after the CRC
    with pytest.raises(CorruptFrameError, match="twice"):
        codec.container.unpack_frames(parts.join())
    parts.flags = fuzzing.CFLAG_CRC32C
    buf = parts.join()
    t = 12 + sum(10 + len(e[0]) for e in parts.entries)
    assert struct.unpack_from("<I", buf, t)[0] == fuzzing.crc32c(buf[t + 8 :])
    assert struct.unpack_from("<I", buf, t + 4)[0] == zlib.crc32(buf[: t + 4])


def test_mutators_are_deterministic_and_reach_deep():
    seeds = fuzzing.seed_corpus(full=False)
    for target in fuzzing.TARGETS:
        data = seeds.of(target)[len(seeds.of(target)) // 2][1]
        a = [fuzzing.mutate(target, random.Random(i), data, data) for i in range(20)]
        b = [fuzzing.mutate(target, random.Random(i), data, data) for i in range(20)]
        assert a == b, target
        assert len(set(a)) > 10, f"{target}: mutations repeat themselves"
    frames = seeds.of("frame")
    past_crc = 0
    for i in range(400):
        rng = random.Random(i)
        buf = fuzzing.mutate_frame(rng, frames[rng.randrange(len(frames))][1], frames[rng.randrange(len(frames))][1])
        err = _error(buf)
        past_crc += "checksum" not in err and "shorter than" not in err and "magic" not in err
    assert past_crc > 300, f"only {past_crc} of 400 mutated frames got past the header checks"
    many = seeds.of("many")
    past_crc = accepted = 0
    for i in range(400):
        rng = random.Random(i)
        buf = fuzzing.mutate("many", rng, many[rng.randrange(len(many))][1], many[rng.randrange(len(many))][1])
        out = fuzzing.check("many", buf)
        assert not out.finding, out
        past_crc += "checksum" not in out.label and out.kind != "invalid"
        accepted += out.kind == "ok"
    assert past_crc > 250 and accepted > 20, f"many: {past_crc} of 400 got past the CRCs, {accepted} decoded"


def test_seed_corpus_covers_every_codec():
    from codec.testing import PIPELINES

    SPECS = [c["id"] for c in codec.list_codecs()] + list(PIPELINES)  # what tests/test_conformance.py runs
    seeds = fuzzing.seed_corpus(full=False)
    specs = fuzzing.seed_specs()
    assert set(SPECS) <= set(specs), sorted(set(SPECS) - set(specs))
    assert {c["id"] for c in codec.list_codecs()} <= {s for s, _ in seeds.of("frame")}
    assert set(specs) == {s for s, _ in seeds.of("frame")}, sorted(set(specs) - {s for s, _ in seeds.of("frame")})
    names = {codec.inspect(f)["dtype"] for _, f in seeds.of("frame")}
    assert names == {"float16", "bfloat16", "float32", "float64"}
    for target in fuzzing.TARGETS:
        assert seeds.of(target), target


def test_seeds_are_inside_the_promise():
    seeds = fuzzing.seed_corpus(full=False)
    for target in fuzzing.TARGETS:
        for label, data in seeds.of(target)[::7]:
            out = fuzzing.check(target, data)
            assert out.kind == "ok", f"{target} seed of {label}: {out}"


def test_oracle_flags_an_unexpected_exception(monkeypatch):
    f = _frame()
    assert fuzzing.check("frame", f).kind == "ok"

    def bad(*a, **k):
        raise IndexError("index 7 is out of bounds")

    monkeypatch.setattr(codec, "decode", bad)
    out = fuzzing.check("frame", f)
    assert out.finding and "IndexError" in out.label


def test_oracle_accepts_the_documented_errors():
    f = fuzzing.split_frame(_frame())
    f.spec = b"nosuch"
    out = fuzzing.check("frame", f.join())
    assert out.kind == "rejected" and out.label == "UnknownCodecError"
    assert fuzzing.check("frame", _frame()[:-1]) == fuzzing.Outcome("rejected", "CorruptFrameError")
    assert fuzzing.check("spec", b"topk(ratio=") .label == "SpecError"


def test_oracle_flags_shape_dtype_and_decode_add(monkeypatch):
    f = _frame()
    real_inspect, real_get = codec.inspect, codec.get_codec
    monkeypatch.setattr(codec, "inspect", lambda fr: {**real_inspect(fr), "shape": [12]})
    assert fuzzing.check("frame", f).label == "decode's shape or dtype differs from inspect's"
    monkeypatch.setattr(codec, "inspect", real_inspect)

    class Off:
        def __init__(self, c):
            self.c = c

        def decode_add(self, frame, out):
            self.c.decode_add(frame, out)
            out.reshape(-1)[0] += 1
            return out

    monkeypatch.setattr(codec, "get_codec", lambda spec: Off(real_get(spec)))
    assert fuzzing.check("frame", f, extras=False).label == "decode_add into zeros differs from decode"


def test_oracle_flags_memory_and_time(monkeypatch):
    f = _frame()
    real = codec.decode

    def hungry(*a, **k):
        waste = np.ones(80 << 20, np.uint8)  # 80 MiB: over the 64 MiB floor for a 24-byte output
        del waste
        return real(*a, **k)

    monkeypatch.setattr(codec, "decode", hungry)
    out = fuzzing.check("frame", f)
    assert out.finding and "above the bound" in out.label
    monkeypatch.setattr(codec, "decode", real)
    monkeypatch.setattr(fuzzing.findings, "TIME_BOUND", 0.0)  # read where it is defined (codec/fuzzing/findings.py)
    out = fuzzing.check("frame", f)
    assert out.finding and "slower than" in out.label


def test_oracle_flags_a_bad_state():
    ef = codec.ErrorFeedback("fp16")
    ef.encode(np.ones((3, 4), np.float32), key="w")
    state = ef.state_dict()
    good = fuzzing.dumps_state({"codec": "fp16", "momentum": 0.0, "state": state})
    assert fuzzing.check("state", good).kind == "ok"
    state["slots"][0]["step"] = "three"
    out = fuzzing.check("state", fuzzing.dumps_state({"codec": "fp16", "momentum": 0.0, "state": state}))
    assert out.kind in ("rejected", "finding") and out.label != "ok"
    with pytest.raises(Exception, match="not allowed"):
        fuzzing.loads_state(b"\x80\x04cos\nsystem\n.")  # a corpus file cannot run code


def test_supervise_saves_crashing_and_hanging_inputs(monkeypatch, tmp_path):
    """A child that aborts at input 3 and hangs at input 7: both inputs are saved, the loop
    goes on after each (12 inputs in all: 10 run, the crashing and the hanging one)."""
    monkeypatch.setenv("GRADCODEC_FUZZ_SELFTEST_CRASH", "3")
    monkeypatch.setenv("GRADCODEC_FUZZ_SELFTEST_HANG", "7")
    st = fuzzing.supervise("spec", seconds=90, iterations=12, corpus_dir=tmp_path, full_seeds=False, hang_seconds=2, log=None)
    assert [(c["kind"], c["iteration"]) for c in st.crashes] == [("crash", 3), ("hang", 7)]
    seeds = fuzzing.seed_corpus(full=False).of("spec")
    for c, i in zip(st.crashes, (3, 7)):
        saved = Path(c["file"])
        assert saved.parent == tmp_path / "spec" and saved.name.startswith(f"{c['kind']}-")
        assert saved.read_bytes() == seeds[i][1]
    assert st.crashes[0]["signal"] == 6 and "Aborted" in st.crashes[0]["stderr_tail"]
    # outcomes of inputs run after a child's last report (it reports once a second) are unknown
    assert st.inputs == 12 and st.outcomes.get("ok", 0) + st.outcomes.get("unreported (child died)", 0) == 10, st.outcomes


# ----------------------------------------------------------------------------- issue 28's additions
def test_oracle_flags_a_plain_builtin_error(monkeypatch):
    """Every refusal is a CodecError now: a plain ValueError from a parser is a finding."""
    f = _frame()

    def plain(*a, **k):
        raise ValueError("from somewhere inside")

    monkeypatch.setattr(codec, "decode", plain)
    out = fuzzing.check("frame", f)
    assert out.finding and out.label.startswith("ValueError at")


def test_state_pickles_carry_broadcast_views_without_copying():
    from codec.fuzzing.formats import Broadcast

    huge = np.broadcast_to(np.float32(0.5), (1 << 40,))
    data = fuzzing.dumps_state({"a": [huge, Broadcast(np.zeros((), np.float16), (3, 1 << 30))]})
    assert len(data) < 1000  # written as broadcast_to(value, shape), not element by element
    a, b = fuzzing.loads_state(data)["a"]
    assert a.shape == (1 << 40,) and a.strides == (0,) and a[123] == 0.5 and b.shape == (3, 1 << 30) and b.dtype == np.float16
    # a state whose residual is one: refused naming the field, nothing allocated
    ef = codec.ErrorFeedback("topk")
    ef.encode(np.ones(10, np.float32), key="w")
    st = ef.state_dict()
    st["slots"][0]["residual"] = huge
    out = fuzzing.check("state", fuzzing.dumps_state({"codec": "topk", "momentum": 0.0, "state": st}))
    assert out == fuzzing.Outcome("rejected", "CodecValueError")


def test_many_layouts_are_edited_as_a_caller_gets_them_wrong():
    """The many target's layout edits reach the parser's own checks: a repeated name (a
    Layout the constructor refuses, built another way), dropped names, other shapes."""
    from codec.fuzzing.formats import join_many, layout_fields, layout_prefix, raw_layout, split_many

    tensors = {f"t{i}": np.ones(i + 1, np.float32) for i in range(3)}
    frame = codec.get_codec("fp16").encode_many(tensors, layout="hash")
    seed = join_many(layout_prefix(codec.Layout.of(tensors)), frame)
    assert fuzzing.check("many", seed).kind == "ok"
    edits = set()
    for i in range(300):
        parts = split_many(fuzzing.mutate("many", random.Random(i), seed, seed))
        fields = None if parts is None else layout_fields(parts[0])
        if fields is None:
            continue
        shapes, _, names = fields
        if names is not None and len(set(names)) < len(names):
            edits.add("repeat")
        elif names is None:
            edits.add("names")
        elif shapes != [[1], [2], [3]]:
            edits.add("shape")
    assert {"repeat", "names", "shape"} <= edits, edits
    # the repeated name, with a frame whose hash matches it: refused, never fewer tensors
    lay = raw_layout([(1,), (2,), (3,)], [np.dtype(np.float32)] * 3, ("t0", "t1", "t0"))
    with pytest.raises(codec.CodecError, match="t0"):
        codec.decode_many(frame, layout=lay)


def test_spec_seeds_hold_every_select_value_pair():
    from codec.fuzzing.seeds import select_value_pairs

    pairs = select_value_pairs()
    assert "randomk+qsgd(coding=elias)" in pairs and len(pairs) >= 6 * 11
    spec_seeds = {d.decode() for _, d in fuzzing.seed_corpus(full=False).of("spec")}
    assert set(pairs) <= spec_seeds
