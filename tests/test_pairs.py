"""Every select stage behind every value stage: what an encoder writes, its decoder reads (issue
28: ``randomk+qsgd(coding=elias)`` wrote frames of zeros its own decoder refused, because the
decoder assumed one bit per kept value and Elias coding spends one bit per bucket of zeros).

Each pair codes zeros, a constant, random and heavy-tailed data, alone, as a many-tensor frame
(apart and joint) and through error feedback; the decoded array must have the input's shape
and dtype, and a lossless value stage must give back exactly the kept values."""

from __future__ import annotations

import numpy as np
import pytest

import codec
from codec.stage import registered

SELECTS = sorted(n for n, c in registered().items() if c.kind == "select")
#: every value stage, and the non-default codings that change what a section holds
VALUES = sorted(n for n, c in registered().items() if c.kind == "value") + ["qsgd(coding=elias)", "qsgd(coding=elias,bucket=4096)"]
DATA = ("zeros", "constant", "normal", "heavy")


def _data(kind: str, n: int, rng) -> np.ndarray:
    if kind == "zeros":
        return np.zeros(n, np.float32)
    if kind == "constant":
        return np.full(n, -0.375, np.float32)
    if kind == "normal":
        return rng.standard_normal(n).astype(np.float32)
    return (rng.standard_t(2, n) * 1e-3).astype(np.float32)


def _codec(select: str, value: str):
    """The pair's codec; ``None`` when the select stage takes no value stage after it (AdaComp
    codes its own sign bits): that refusal must be a CodecError that says so."""
    ratio = "" if select in ("adacomp", "threshold") else "(ratio=0.5)"
    spec = f"{select}{ratio}+{value}"
    try:
        return codec.get_codec(spec)
    except codec.CodecError as e:
        assert select == "adacomp" and "adacomp" in str(e), (spec, e)
        return None


def test_the_pairs_cover_every_stage():
    assert {"topk", "gaussiank", "dgc", "threshold", "randomk", "adacomp"} <= set(SELECTS)
    assert {"none", "fp16", "bf16", "fp8", "rangefloat", "minmax", "qsgd", "sign", "efsign", "onebit", "terngrad"} <= set(VALUES)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("select", SELECTS)
def test_every_frame_an_encoder_writes_decodes(select, value):
    c = _codec(select, value)
    if c is None:
        return
    rng = np.random.default_rng(28)
    for kind in DATA:
        x = _data(kind, 1000, rng).reshape(40, 25)
        y = codec.decode(c.encode(x))
        assert y.shape == x.shape and y.dtype == x.dtype, (c.spec, kind)
        if kind == "zeros" and not value.endswith(("sign", "onebit")):  # (sign bits decode 0 as +1: docs/codecs.md)
            assert not y.any(), (c.spec, kind)
        tensors = {"a": x, "b": _data(kind, 1, rng), "c": _data(kind, 77, rng)}
        for joint in (False, True):
            back = codec.decode_many(c.encode_many(tensors, joint=joint))
            assert [(v.shape, v.dtype) for v in back.values()] == [(v.shape, v.dtype) for v in tensors.values()], (c.spec, kind, joint)
        ef = codec.ErrorFeedback(c)
        for _ in range(2):
            assert codec.decode(ef.encode(x, key="w")).shape == x.shape
            assert list(codec.decode_many(ef.encode_many(tensors))) == list(tensors)


def test_randomk_elias_frames_of_zeros_decode():
    """The reported case: 500 kept zeros in 104 bits of Elias streams and norms."""
    c = codec.get_codec("randomk(ratio=0.5)+qsgd(coding=elias)")
    frame = c.encode(np.zeros(1000, np.float32))
    np.testing.assert_array_equal(codec.decode(frame), np.zeros(1000, np.float32))
    back = codec.decode_many(c.encode_many({"a": np.zeros(1000, np.float32), "b": np.zeros(9, np.float32)}))
    assert [v.size for v in back.values()] == [1000, 9] and not any(v.any() for v in back.values())


def test_randomk_still_bounds_k_by_what_the_values_can_hold():
    """The bound stays: a frame whose shape is forged to 2**40 elements (checksums recomputed)
    keeps its key, so it asks for 2**39 kept values, more than its value sections can code at
    one bit per packed code or per Elias bucket: refused before any position is drawn."""
    from codec.frame import parse_frame
    from codec.fuzzing.formats import split_frame

    for value, per_bit in (("qsgd", 1), ("qsgd(coding=elias,bucket=8)", 8), ("fp16", 1)):
        c = codec.get_codec(f"randomk(ratio=0.5)+{value}")
        frame = c.encode(np.zeros(64, np.float32))
        bits = 8 * sum(s.raw_len for s in parse_frame(frame).sections[1:])
        assert c.value.most_values(bits) == per_bit * bits
        f = split_frame(frame)
        f.shape = [1 << 40]
        with pytest.raises(codec.CorruptFrameError, match=rf"randomk frame keeps {1 << 39} of {1 << 40} elements but its values sections hold {per_bit * bits} values at most"):
            codec.decode(f.join(), max_elements=1 << 40)
