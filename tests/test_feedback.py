"""ErrorFeedback: residual arithmetic, per-key state, checkpoints, bad input losing nothing."""

import pickle

import numpy as np
import pytest

import codec


def test_residual_carries_what_was_not_sent():
    ef = codec.ErrorFeedback("threshold(value=1.0)")
    x = np.array([0.6, 0.3, -2.0], np.float32)
    d1 = codec.decode(ef.encode(x, key="w"))
    assert d1.tolist() == [0.0, 0.0, -2.0]
    assert ef.residual("w").tolist() == pytest.approx([0.6, 0.3, 0.0])
    d2 = codec.decode(ef.encode(x, key="w"))  # 1.2 crosses the threshold now
    assert d2.tolist() == pytest.approx([1.2, 0.0, -2.0])
    assert ef.residual("w").tolist() == pytest.approx([0.0, 0.6, 0.0])
    assert ef.step("w") == 2 and ef.step("other") == 0


def test_sum_of_decoded_tracks_sum_of_inputs():
    rng = np.random.default_rng(0)
    ef = codec.ErrorFeedback("threshold(value=0.5)+fp16")
    total_in = np.zeros(500)
    total_out = np.zeros(500)
    for _ in range(20):
        x = rng.standard_normal(500).astype(np.float32) * 0.2
        total_in += x
        total_out += codec.decode(ef.encode(x, key=0))
    assert np.allclose(total_out + ef.residual(0), total_in, atol=1e-4)


def test_keys_are_independent_and_checked():
    ef = codec.ErrorFeedback("fp16")
    ef.encode(np.ones(3, np.float32), key="a")
    ef.encode(np.ones((2, 2), np.float64), key="b")
    assert sorted(ef.keys()) == ["a", "b"]
    with pytest.raises(ValueError, match="'a'"):
        ef.encode(np.ones(4, np.float32), key="a")
    with pytest.raises(ValueError, match="'b'"):
        ef.encode(np.ones((2, 2), np.float32), key="b")
    ef.reset("a")
    ef.encode(np.ones(4, np.float32), key="a")
    ef.reset(all=True)
    assert ef.keys() == []


def test_bad_input_leaves_the_residual_alone():
    ef = codec.ErrorFeedback("threshold(value=1.0)")
    ef.encode(np.array([0.5, 0.25], np.float32), key="k")
    before = ef.residual("k").copy()
    with pytest.raises(ValueError, match="non-finite"):
        ef.encode(np.array([np.nan, 0.0], np.float32), key="k")
    assert np.array_equal(ef.residual("k"), before) and ef.step("k") == 1


def test_residual_view_is_read_only():
    ef = codec.ErrorFeedback("fp16")
    ef.encode(np.ones(3, np.float32) / 3, key=None)
    with pytest.raises(ValueError):
        ef.residual()[0] = 1.0


def test_state_dict_and_pickle_resume_identically():
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(64).astype(np.float32) for _ in range(6)]
    ref = codec.ErrorFeedback("threshold(value=0.8)+bf16")
    frames = [ref.encode(x, key="p") for x in xs]
    ef = codec.ErrorFeedback("threshold(value=0.8)+bf16")
    for x in xs[:3]:
        ef.encode(x, key="p")
    saved = pickle.dumps(ef.state_dict())
    restored = codec.ErrorFeedback("threshold(value=0.8)+bf16")
    restored.load_state_dict(pickle.loads(saved))
    clone = pickle.loads(pickle.dumps(ef))
    for x, want in zip(xs[3:], frames[3:]):
        assert restored.encode(x, key="p") == want
        assert clone.encode(x, key="p") == want
    assert restored.step("p") == 6


def test_load_state_dict_rejects_another_codec():
    ef = codec.ErrorFeedback("fp16")
    ef.encode(np.ones(2, np.float32), key=1)
    with pytest.raises(ValueError, match="saved for codec 'fp16'"):
        codec.ErrorFeedback("bf16").load_state_dict(ef.state_dict())
    with pytest.raises(ValueError, match="state"):
        codec.ErrorFeedback("bf16").load_state_dict({"nope": 1})


def test_state_reaches_the_stages():
    """ErrorFeedback hands every stage the slot's key, step count and one persistent state dict."""
    from codec.stages.value.floats import Fp16

    seen = []

    class Spy(Fp16):  # not registered: a Codec can be built from stage instances
        name = "fp16"

        def encode(self, values, ctx, sections):
            seen.append((ctx.key, ctx.step, ctx.state.get("calls", 0)))  # the state the key carried in
            ctx.state["calls"] = ctx.state.get("calls", 0) + 1
            return super().encode(values, ctx, sections)

        def encode_feedback(self, x, slot, ctx, sections):
            return None  # take the generic step, which calls encode

    ef = codec.ErrorFeedback(codec.Codec([Spy()]))
    for _ in range(3):
        ef.encode(np.ones(2, np.float32), key="q")
    assert [s[:2] for s in seen] == [("q", 0), ("q", 1), ("q", 2)]
    assert [s[2] for s in seen] == [0, 1, 2]  # each step sees what the last one kept
    assert ef.state_dict()["slots"][0]["state"] == {"calls": 3}


@pytest.mark.parametrize("spec", ["fp16", "bf16", "fp16(nonfinite=keep)"])
def test_fused_half_step_equals_the_generic_formula(spec):
    rng = np.random.default_rng(7)
    c = codec.get_codec(spec)
    ef = codec.ErrorFeedback(c)
    r = np.zeros(70_001, np.float32)
    for step in range(4):
        x = (rng.standard_t(2, r.size) * 10.0 ** rng.integers(-9, 2)).astype(np.float32)
        acc = x + r
        frame = ef.encode(x, key="w")
        assert frame == c.encode(acc), f"step {step}: fused frame differs from encode(x + residual)"
        r = acc - codec.decode(frame)
        assert np.array_equal(ef.residual("w"), r), f"step {step}: fused residual differs"


FUSED_QUANTIZERS = [
    "rangefloat(bits=8)", "rangefloat(bits=4)", "rangefloat(bits=16)", "rangefloat(bits=6,block=1000)",
    "rangefloat(bits=8,rounding=stochastic)", "rangefloat(bits=3,exp_bits=2)", "fp8", "fp8(format=e5m2,scale=true)",
    "fp8(rounding=stochastic)", "minmax", "minmax(bits=4)", "minmax(bits=1,bucket=7)", "minmax(bucket=100000)",
    "minmax(bits=3,rounding=stochastic,bucket=333)", "minmax+zstd", "qsgd", "qsgd(levels=4,bucket=7)", "qsgd(rounding=nearest)",
    "qsgd(coding=elias)", "qsgd(levels=1000,bucket=100000)",
]


@pytest.mark.parametrize("spec", FUSED_QUANTIZERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_quantizer_step_equals_the_generic_formula(spec, dtype):
    """The fused rangefloat/fp8(scale) step (two passes: acc with the block maxima, then codes
    with acc - decoded), fp8's (one, its windows fixed) and min-max and QSGD steps (one:
    bucket by bucket) give the frame of encode(x + residual) at the key's step and the
    residual acc - decoded (decode_add subtracting), bit for bit; the generic step is what
    they replace (a rangefloat window below 2**-1000 still takes it)."""
    rng = np.random.default_rng(11)
    c = codec.get_codec(spec)
    calls = []
    cls = type(c.value)
    real = cls.encode_feedback

    def spy(self, *a):
        got = real(self, *a)
        calls.append(got is not None)
        return got

    cls.encode_feedback = spy
    tiny_window = dtype == np.float64 and spec.startswith(("rangefloat", "fp8(format=e5m2,scale=true)"))
    try:
        for n in (1, 7, 70_001):
            ef = codec.ErrorFeedback(c)
            r = np.zeros(n, dtype)
            scales = [10.0 ** rng.integers(-6, 3) for _ in range(3)]
            if tiny_window:
                scales[0] = 2.0 ** -1040  # a window below 2**-1000 (the residual starts at 0): the generic step
            for step in range(3):
                x = (rng.standard_t(3, n) * scales[step]).astype(dtype)
                acc = (x + r).astype(dtype)
                frame = ef.encode(x, key="w")
                assert frame == c.encode(acc, key="w", step=step), (n, step)
                r = acc.copy()
                c.decode_add(frame, r, subtract=True)
                assert np.array_equal(ef.residual("w"), r), (n, step)
    finally:
        cls.encode_feedback = real
    assert any(calls) and all(calls) != tiny_window


@pytest.mark.parametrize("spec", ["rangefloat(bits=8)", "fp8", "minmax", "minmax(bits=4)", "qsgd"])
def test_fused_quantizer_step_keeps_the_residual_on_error(spec):
    ef = codec.ErrorFeedback(spec)
    ef.encode(np.full(5, 1 / 3, np.float32), key="k")
    before = ef.residual("k").copy()
    with pytest.raises(ValueError, match=r"position \(3,\)"):
        ef.encode(np.array([0, 0, 0, np.nan, 0], np.float32), key="k")
    assert np.array_equal(ef.residual("k"), before) and ef.step("k") == 1


@pytest.mark.parametrize("spec", ["minmax", "minmax(bits=4)", "rangefloat(bits=8)", "rangefloat(bits=4)", "fp8(format=e5m2,scale=true)", "qsgd", "qsgd(coding=elias,levels=4)"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_quantizer_step_saturates_as_its_decoder(spec, dtype):
    """Values whose codes decode beyond the dtype's maximum (a decoder clips them there): the
    fused step's frame and residual are the generic step's, and it is the fused step that
    gives them (the kernels clip as the decoder does)."""
    if spec.startswith("qsgd") and dtype == np.float64:
        pytest.skip("float64 values near the maximum overflow QSGD's norm itself: a ValueError of its own (test_quant)")
    c = codec.get_codec(spec)
    top = np.finfo(dtype).max
    cls, real, calls = type(c.value), type(c.value).encode_feedback, []

    def spy(self, *a):
        got = real(self, *a)
        calls.append(got is not None)
        return got

    cls.encode_feedback = spy
    try:
        ef = codec.ErrorFeedback(c)
        r = np.zeros(9, dtype)
        for step in range(3):
            x = np.array([top, -top, top * 0.99, 1.0, -0.5, top * 0.51, 0.0, -top * 0.97, 3.0], dtype) * dtype(0.5**step)
            if spec.startswith("minmax") and dtype == np.float64:
                x = np.abs(x)  # a float64 span of 2*top overflows (its own error, below)
            acc = (x + r).astype(dtype)
            frame = ef.encode(x, key="k")
            assert frame == c.encode(acc, key="k", step=step), step
            r = acc.copy()
            c.decode_add(frame, r, subtract=True)
            assert np.array_equal(ef.residual("k"), r, equal_nan=True), step
            assert np.all(np.isfinite(ef.residual("k")))
    finally:
        cls.encode_feedback = real
    assert all(calls) and calls


def test_fused_minmax_step_names_an_unrepresentable_span():
    with pytest.raises(ValueError, match="spans more than float64"):
        codec.ErrorFeedback("minmax").encode(np.array([1.7e308, -1.7e308]), key="k")


def test_fused_half_step_keeps_the_residual_on_error():
    ef = codec.ErrorFeedback("fp16")
    ef.encode(np.full(5, 1 / 3, np.float32), key="k")
    before = ef.residual("k").copy()
    with pytest.raises(ValueError, match=r"position \(3,\)"):
        ef.encode(np.array([0, 0, 0, np.inf, 0], np.float32), key="k")
    assert np.array_equal(ef.residual("k"), before) and ef.step("k") == 1
    ef.encode(np.zeros(5, np.float32), key="k")  # and it goes on afterwards
    assert ef.step("k") == 2


@pytest.mark.parametrize("dtype", [np.float16, codec.dtypes.bfloat16, np.float32, np.float64])
def test_add_residual_puts_undelivered_values_back(dtype):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((13, 7)).astype(dtype)
    ef = codec.ErrorFeedback("topk(ratio=0.1)")
    frame = ef.encode(x, key="w")
    before = ef.residual("w").astype(np.float64)
    pos, vals = codec.decode_sparse(frame)
    ef.add_residual("w", vals, pos)  # nothing delivered: the residual is the whole acc again
    want = before.reshape(-1).copy()
    want[pos] += vals.astype(np.float64)
    got = ef.residual("w").reshape(-1)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want.astype(dtype))  # each touched element rounded once
    np.testing.assert_array_equal(got, x.reshape(-1))  # top-k values are exact: back to x
    dense = rng.standard_normal(x.size).astype(np.float32)
    ef.add_residual("w", dense)
    np.testing.assert_array_equal(ef.residual("w").reshape(-1), codec.ops.round_to(x.reshape(-1).astype(np.float64) + dense, dtype))


def test_add_residual_rejects_bad_arguments():
    ef = codec.ErrorFeedback("topk(ratio=0.5)")
    with pytest.raises(KeyError, match="key"):
        ef.add_residual("nope", np.ones(1, np.float32), np.zeros(1, np.int64))
    ef.encode(np.ones(4, np.float32), key="a")
    before = ef.residual("a").copy()
    with pytest.raises(ValueError, match="positions"):
        ef.add_residual("a", np.ones(1, np.float32), np.array([4]))
    with pytest.raises(ValueError, match="positions"):
        ef.add_residual("a", np.ones(2, np.float32), np.array([0]))
    with pytest.raises(ValueError, match="positions"):
        ef.add_residual("a", np.ones(1, np.float32), np.array([0.5]))
    with pytest.raises(ValueError, match="values"):
        ef.add_residual("a", np.ones(3, np.float32))
    with pytest.raises(TypeError, match="values"):
        ef.add_residual("a", np.ones(4, np.int32))
    np.testing.assert_array_equal(ef.residual("a"), before)  # nothing changed


# ---------------------------------------------------------------------- residuals=False
@pytest.mark.parametrize("spec", ["qsgd(levels=4)", "randomk(ratio=0.3)", "topk(ratio=0.2)+fp16", "none+zstd"])
def test_without_residuals_a_frame_is_the_codecs_at_the_keys_step(spec):
    c = codec.get_codec(spec)
    ef = codec.ErrorFeedback(c, residuals=False)
    rng = np.random.default_rng(1)
    for step in range(3):
        x = rng.standard_normal((6, 7)).astype(np.float32)
        assert ef.encode(x, key="w") == c.encode(x, key="w", step=step)
        assert ef.step("w") == step + 1 and ef.residual("w") is None
    y = np.ones(4, np.float32)  # another key starts at step 0
    assert ef.encode(y, key="b") == c.encode(y, key="b", step=0)


def test_without_residuals_stage_state_is_kept_and_a_new_shape_keeps_the_step():
    from codec.stages.transform.powersgd import STATE_Q

    ef = codec.ErrorFeedback("powersgd(rank=2)", residuals=False)
    x = np.random.default_rng(2).standard_normal((30, 20)).astype(np.float32)
    ef.encode(x, key="w")
    assert ef._slots["w"].state[STATE_Q].shape == (20, 2)  # the warm start, as with residuals
    ef.encode(np.ones((10, 40), np.float32), key="w")  # a new shape: no error, nothing to feed back
    slot = ef._slots["w"]
    assert ef.step("w") == 2 and slot.shape == (10, 40) and slot.state[STATE_Q].shape == (40, 2)


def test_without_residuals_options_are_checked():
    with pytest.raises(ValueError, match="momentum"):
        codec.ErrorFeedback("topk(ratio=0.1)", momentum=0.9, residuals=False)
    with pytest.raises(TypeError, match="residuals"):
        codec.ErrorFeedback("topk(ratio=0.1)", residuals=1)
    ef = codec.ErrorFeedback("topk(ratio=0.5)", residuals=False)
    ef.encode(np.ones(4, np.float32), key="a")
    with pytest.raises(ValueError, match="residuals"):
        ef.add_residual("a", np.ones(4, np.float32))
    assert "residuals=False" in repr(ef)


# ---------------------------------------------------------------------- a step run by the caller
def test_slot_reads_and_keep_stores():
    ef = codec.ErrorFeedback("topk(ratio=0.5)")
    fresh = ef.slot("w", (3,), np.float32)
    assert ef.keys() == [] and fresh.step == 0 and np.array_equal(fresh.residual, np.zeros(3, np.float32))
    ef.encode(np.array([1.0, -2.0, 0.5], np.float32), key="w")
    stored = ef.slot("w", (3,), np.float32)
    assert stored is ef._slots["w"] and stored.step == 1
    # another shape or dtype: a new slot (not stored), the stored one untouched
    other = ef.slot("w", (4,), np.float32)
    assert other is not stored and other.step == 0 and other.residual.shape == (4,) and ef._slots["w"] is stored
    assert ef.slot("w", (3,), np.float64).residual.dtype == np.float64
    # the caller's step: commit a residual, advance, keep
    acc = other.take_spare()
    acc[...] = 0.25
    other.commit(acc)
    other.step += 1
    ef.keep(other)
    assert ef.step("w") == 1 and ef.residual("w").tolist() == [0.25] * 4
    with pytest.raises(ValueError, match="slot"):
        ef.keep(codec.ErrorFeedback("topk(ratio=0.5)", residuals=False).slot("v", (2,), np.float32))


def test_slot_without_residuals_carries_the_step():
    ef = codec.ErrorFeedback("qsgd(levels=4)", residuals=False)
    ef.encode(np.ones(5, np.float32), key="w")
    ef.encode(np.ones(5, np.float32), key="w")
    s = ef.slot("w", (2, 2), np.float32)
    assert s.residual is None and s.step == 2 and s.shape == (2, 2) and s is not ef._slots["w"]
    assert ef._slots["w"].shape == (5,)


@pytest.mark.parametrize("spec", ["topk(ratio=0.1)", "topk(ratio=0.1)+fp16", "topk(ratio=0.1)+bf16(nonfinite=keep)", "adacomp", "adacomp(bin=7)+fp16", "randomk(ratio=0.2,scale=true)", "threshold(value=0.5)+none", "gaussiank(ratio=0.05)"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, codec.dtypes.bfloat16])
def test_value_decoded_is_what_the_frame_decodes_to(spec, dtype):
    """Value.decoded, which error feedback subtracts instead of decoding its frame, gives the
    frame's decoded values bit for bit (and the step's residual is unchanged: the frozen
    hashes of test_frames_unchanged.py)."""
    from codec.stage import Context

    c = codec.get_codec(spec)
    rng = np.random.default_rng(21)
    x = (rng.standard_t(2, 997) * 10.0 ** rng.integers(-5, 3)).astype(dtype)
    ctx = Context(x.shape, x.dtype, key="k", step=1)
    sections = c.sections(x.reshape(-1), ctx)
    sent = c.value.decoded(ctx.kept, ctx)
    assert sent is not None, f"{c.value.name} has no decoded(): error feedback would decode its own frame"
    pos, vals = codec.decode_sparse(c.frame(sections, x.dtype, x.shape))
    assert np.array_equal(pos, ctx.positions)
    assert sent.dtype == vals.dtype and sent.tobytes() == vals.tobytes()


def test_fused_half_step_names_a_float32_overflow():
    """The fused step adds x and the residual in float32: a sum that overflows only there is
    the non-finite value its error names (a float64 sum would find none)."""
    from codec.dtypes import bfloat16
    from codec.errors import NonFiniteError

    ef = codec.ErrorFeedback("bf16")
    b = float(np.float32(3.0e38).astype(bfloat16))
    ef.encode(np.array([0.0, b + 0.4 * 2.0 ** (127 - 7)], np.float32), key="k")  # residual ~5e35
    assert ef.residual("k")[1] > 0
    with pytest.raises(NonFiniteError, match=r"x: non-finite value at position \(1,\)"):
        ef.encode(np.array([0.0, np.finfo(np.float32).max], np.float32), key="k")
