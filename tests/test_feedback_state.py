"""ErrorFeedback state dicts are untrusted input (issue 13, defect 2).

``load_state_dict`` / unpickling validate the whole state before replacing anything: a
state is either accepted and copied into plain C-contiguous owned arrays (so the next step
equals the step without the round trip, bit for bit), or refused with a ValueError naming
the slot's key and the field.  Never accepted and failing later, never accepted and wrong.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import codec
from codec.dtypes import bfloat16
from codec.feedback import ErrorFeedback
from codec.stages.transform import powersgd as psgd

#: the largest step + 1 a state may hold: randomk frames record the step, and decoders refuse one >= 2**62
STEP_LIMIT = 1 << 62

pytestmark = pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")

SHAPE = (40, 30)  # compressible by powersgd (rank 2), large enough for every sparsifier
IDS = [c["id"] for c in codec.list_codecs()]


def grads(shape=SHAPE, dtype=np.float32, count=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(count)]


def trained(spec, *, shape=SHAPE, dtype=np.float32, momentum=0.0, key="w", steps=2):
    """An ErrorFeedback after ``steps`` encodes of ``key``, and the gradients that follow."""
    ef = ErrorFeedback(spec, momentum=momentum)
    xs = grads(shape, dtype, steps + 2)
    for x in xs[:steps]:
        ef.encode(x, key=key)
    return ef, xs[steps:]


def assert_continues_like(ef, restored, xs, key="w"):
    """``restored`` produces the same frames, residuals and velocities as ``ef`` on ``xs``."""
    for i, x in enumerate(xs):
        assert restored.encode(x, key=key) == ef.encode(x, key=key), f"frame {i} differs after the round trip"
        want, got = ef._slots[key], restored._slots[key]
        assert np.array_equal(want.residual, got.residual, equal_nan=True), f"residual {i} differs"
        if want.velocity is None:
            assert got.velocity is None
        else:
            assert np.array_equal(want.velocity, got.velocity, equal_nan=True), f"velocity {i} differs"
        assert restored.step(key) == ef.step(key)
        assert_plain(got)


def assert_plain(slot):
    for name in ("residual", "velocity", "spare"):
        a = getattr(slot, name)
        if a is None:
            continue
        assert type(a) is np.ndarray, f"{name} is a {type(a).__name__}"
        assert a.flags.c_contiguous and a.flags.owndata and a.flags.writeable, f"{name}: {a.flags}"


def refused(ef, state, match, *, setstate=True):
    """``state`` is refused with a ValueError matching ``match``; ``ef`` keeps what it had.
    With ``setstate``, unpickling (which takes codec and momentum from the state) refuses it too."""
    before = ef.state_dict()
    with pytest.raises(ValueError, match=match):
        ef.load_state_dict(state)
    after = ef.state_dict()
    assert after["codec"] == before["codec"] and len(after["slots"]) == len(before["slots"])
    for a, b in zip(after["slots"], before["slots"]):
        assert a["key"] == b["key"] and a["step"] == b["step"]
        if b["residual"] is None:  # an ErrorFeedback without residuals
            assert a["residual"] is None and a["shape"] == b["shape"] and a["dtype"] == b["dtype"]
        else:
            assert np.array_equal(a["residual"], b["residual"], equal_nan=True)
    if not setstate:
        return
    blank = ErrorFeedback.__new__(ErrorFeedback)  # unpickling validates the same way
    with pytest.raises(ValueError, match=match):
        blank.__setstate__(state)


def with_slot(base, **fields):
    s = copy.deepcopy(base)
    for k, v in fields.items():
        if v is DELETE:
            del s["slots"][0][k]
        else:
            s["slots"][0][k] = v
    return s


DELETE = object()


# ------------------------------------------------------------------ the reported defect
@pytest.mark.parametrize("spec", IDS)
def test_fortran_residual_gives_the_same_next_step(spec):
    ef, xs = trained(spec)
    state = ef.state_dict()
    state["slots"][0]["residual"] = np.asfortranarray(state["slots"][0]["residual"])
    assert not state["slots"][0]["residual"].flags.c_contiguous
    restored = ErrorFeedback(spec)
    restored.load_state_dict(state)
    assert_continues_like(ef, restored, xs)


@pytest.mark.parametrize("spec", IDS)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("route", ["load", "pickle-state", "pickle-ef", "fortran", "matrix", "readonly", "byteswapped"])
def test_round_trip_of_every_codec(spec, momentum, route):
    ef, xs = trained(spec, momentum=momentum)
    if route == "pickle-ef":
        restored = pickle.loads(pickle.dumps(ef))
    else:
        state = ef.state_dict()
        if route == "pickle-state":
            state = pickle.loads(pickle.dumps(state))
        for s in state["slots"]:
            for name in ("residual", "velocity"):
                a = s[name]
                if a is None:
                    continue
                if route == "fortran":
                    a = np.asfortranarray(a)
                elif route == "matrix":
                    a = np.asmatrix(a)
                elif route == "readonly":
                    a = a.copy()
                    a.flags.writeable = False
                elif route == "byteswapped":
                    a = a.astype(a.dtype.newbyteorder(">" if a.dtype.byteorder != ">" else "<"))
                s[name] = a
        restored = ErrorFeedback(spec, momentum=momentum)
        restored.load_state_dict(state)
    assert_plain(restored._slots["w"])
    assert_continues_like(ef, restored, xs)


@pytest.mark.parametrize("dtype", [np.float16, bfloat16, np.float64])
@pytest.mark.parametrize("spec", ["topk(ratio=0.05)", "fp16", "powersgd", "randomk(ratio=0.1)", "qsgd"])
def test_round_trip_other_dtypes(spec, dtype):
    ef, xs = trained(spec, dtype=dtype, momentum=0.5)
    state = ef.state_dict()
    state["slots"][0]["residual"] = np.asfortranarray(state["slots"][0]["residual"])
    restored = ErrorFeedback(spec, momentum=0.5)
    restored.load_state_dict(state)
    assert_continues_like(ef, restored, xs)


layouts = st.sampled_from(["C", "F", "T", "strided", "negative", "matrix", "readonly"])


@settings(max_examples=40, deadline=None)
@given(
    spec=st.sampled_from(["topk(ratio=0.1)", "fp16", "powersgd(rank=1)", "none", "qsgd", "adacomp"]),
    rows=st.integers(1, 9),
    cols=st.integers(1, 9),
    layout=layouts,
    seed=st.integers(0, 2**32 - 1),
)
def test_any_layout_is_copied_into_a_plain_array(spec, rows, cols, layout, seed):
    rng = np.random.default_rng(seed)
    ef = ErrorFeedback(spec)
    xs = [rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(3)]
    ef.encode(xs[0], key="w")
    state = ef.state_dict()
    r = state["slots"][0]["residual"]
    if layout == "F":
        r = np.asfortranarray(r)
    elif layout == "T":
        r = np.ascontiguousarray(r.T).T
    elif layout == "strided":
        big = np.zeros((rows, 2 * cols), r.dtype)
        big[:, ::2] = r
        r = big[:, ::2]
    elif layout == "negative":
        r = np.ascontiguousarray(r[::-1, ::-1])[::-1, ::-1]
    elif layout == "matrix":
        r = np.asmatrix(r)
    elif layout == "readonly":
        r = r.copy()
        r.flags.writeable = False
    state["slots"][0]["residual"] = r
    restored = ErrorFeedback(spec)
    restored.load_state_dict(state)
    assert_continues_like(ef, restored, xs[1:])


def test_loaded_arrays_are_copies():
    ef, xs = trained("topk(ratio=0.05)", momentum=0.9)
    state = ef.state_dict()
    restored = ErrorFeedback("topk(ratio=0.05)", momentum=0.9)
    restored.load_state_dict(state)
    saved = copy.deepcopy(state)
    restored.encode(xs[0], key="w")
    for name in ("residual", "velocity"):
        assert np.array_equal(state["slots"][0][name], saved["slots"][0][name]), f"{name} was written through"


# ------------------------------------------------------------------ refusals
@pytest.fixture
def topk_state():
    ef, _ = trained("topk(ratio=0.05)")
    return ef.state_dict()


@pytest.fixture
def target():
    ef, _ = trained("topk(ratio=0.05)", key="other")
    return ef


@pytest.mark.parametrize(
    "value, match",
    [
        (np.zeros(SHAPE, np.int32), "residual: dtype int32"),
        (np.zeros(SHAPE, np.int64), "residual: dtype int64"),
        (np.zeros(SHAPE, np.complex64), "residual: dtype complex64"),
        (np.zeros(SHAPE, np.complex128), "residual: dtype complex128"),
        (np.zeros(SHAPE, bool), "residual: dtype bool"),
        (np.zeros(SHAPE, object), "residual: dtype object"),
        (np.zeros(SHAPE, np.longdouble), "residual: dtype"),
        (np.zeros(SHAPE, [("a", np.float32)]), "residual: dtype"),
        (np.zeros(SHAPE, np.float32).tolist(), "residual: expected a NumPy array, got list"),
        (None, "residual: expected a NumPy array, got NoneType"),
        (1.5, "residual: expected a NumPy array, got float"),
        (np.ma.masked_array(np.zeros(SHAPE, np.float32)), "residual: .*masked"),
    ],
)
def test_bad_residual_is_refused(target, topk_state, value, match):
    refused(target, with_slot(topk_state, residual=value), "state: slot 'w': " + match)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_residual_follows_the_codec(bad):
    # topk raises on NaN/inf input, so a residual holding one would fail the next step
    ef, _ = trained("topk(ratio=0.05)")
    state = ef.state_dict()
    state["slots"][0]["residual"][3, 4] = bad
    refused(ErrorFeedback("topk(ratio=0.05)"), state, r"state: slot 'w': residual: non-finite value at position \(3, 4\)")
    # a codec that carries NaN/inf makes such residuals itself, and resumes from them
    for spec in ("none", "fp16(nonfinite=keep)", "none+zstd"):
        ef, xs = trained(spec)
        x = np.zeros(SHAPE, np.float32)
        x[3, 4] = bad
        ef.encode(x, key="w")
        state = ef.state_dict()
        assert not np.isfinite(state["slots"][0]["residual"]).all()
        restored = ErrorFeedback(spec)
        restored.load_state_dict(state)
        assert_continues_like(ef, restored, xs)


def test_nonfinite_rule_matches_what_encode_does():
    """``Codec.passes_nonfinite`` is the rule load uses; check it against encode itself."""

    def passes_nonfinite(c, shape):
        return c.passes_nonfinite(shape)

    specs = IDS + ["fp16(nonfinite=keep)", "bf16(nonfinite=keep)", "powersgd+fp16(nonfinite=keep)", "topk+fp16"]
    for spec in specs:
        c = codec.get_codec(spec)
        for shape in [SHAPE, (7,), ()]:
            x = np.full(shape, np.nan, np.float32)
            try:
                c.encode(x)
                took = True
            except ValueError:
                took = False
            assert passes_nonfinite(c, shape) == took, f"{spec} {shape}: rule says {not took}, encode {took}"


@pytest.mark.parametrize(
    "step, match",
    [
        (-1, "step: must be an integer in"),
        (True, "step: must be an integer"),
        (False, "step: must be an integer"),
        (2**70, "step: must be an integer in"),
        (STEP_LIMIT, "step: must be an integer in"),
        (3.0, "step: must be an integer"),
        ("3", "step: must be an integer"),
        (None, "step: must be an integer"),
        (np.float64(2), "step: must be an integer"),
    ],
)
def test_bad_step_is_refused(target, topk_state, step, match):
    refused(target, with_slot(topk_state, step=step), "state: slot 'w': " + match)


@pytest.mark.parametrize("step", [0, 7, np.int64(5), np.uint32(9), STEP_LIMIT - 1])
def test_good_steps_are_ints(topk_state, step):
    ef = ErrorFeedback("topk(ratio=0.05)")
    ef.load_state_dict(with_slot(topk_state, step=step))
    assert type(ef.step("w")) is int and ef.step("w") == int(step)


def test_the_largest_step_still_encodes_with_randomk():
    ef, xs = trained("randomk(ratio=0.1)")
    ef.load_state_dict(with_slot(ef.state_dict(), step=STEP_LIMIT - 1))
    frame = ef.encode(xs[0], key="w")
    codec.decode(frame)
    assert ef.step("w") == STEP_LIMIT
    before = ef.residual("w").copy()
    with pytest.raises(ValueError, match="call reset"):  # not a frame its decoder refuses
        ef.encode(xs[1], key="w")
    assert np.array_equal(ef.residual("w"), before) and ef.step("w") == STEP_LIMIT


def test_a_residual_of_another_shape_fails_at_the_next_encode(topk_state):
    ef = ErrorFeedback("topk(ratio=0.05)")
    ef.load_state_dict(with_slot(topk_state, residual=np.zeros((30, 40), np.float32)))
    with pytest.raises(ValueError, match=r"x: key 'w' was float32\[30, 40\], now float32\[40, 30\]; call reset"):
        ef.encode(np.zeros(SHAPE, np.float32), key="w")
    assert ef.step("w") == topk_state["slots"][0]["step"]


@pytest.fixture
def psgd_state():
    ef, _ = trained("powersgd")
    state = ef.state_dict()
    assert state["slots"][0]["state"][psgd.STATE_Q].shape == (30, 2)
    return state


def with_q(state, q):
    s = copy.deepcopy(state)
    s["slots"][0]["state"][psgd.STATE_Q] = q
    return s


@pytest.mark.parametrize(
    "q, match",
    [
        (np.ones((2, 30), np.float32), r"expected .*float32\[30, 2\].* got float32\[2, 30\]"),
        (np.ones((30, 3), np.float32), r"float32\[30, 2\]"),
        (np.ones(60, np.float32), r"float32\[30, 2\]"),
        (np.ones((30, 2), np.float64), r"got float64\[30, 2\]"),
        (np.ones((30, 2), np.float16), r"got float16\[30, 2\]"),
        (np.ones((30, 2), np.int32), r"got int32"),
        (np.ones((30, 2), object), r"got object"),
        (np.full((30, 2), np.nan, np.float32), r"non-finite"),
        (np.full((30, 2), np.inf, np.float32), r"non-finite"),
        (np.ones((30, 2)).tolist(), r"expected a NumPy array, got list"),
        (None, r"expected a NumPy array, got NoneType"),
        (np.ma.masked_array(np.ones((30, 2), np.float32)), r"masked"),
    ],
)
def test_bad_powersgd_q_is_refused(psgd_state, q, match):
    ef, _ = trained("powersgd", key="other")
    refused(ef, with_q(psgd_state, q), rf"state: slot 'w': state: {psgd.STATE_Q}: .*" + match)


def test_powersgd_q_in_any_layout_is_used_as_saved(psgd_state):
    ef = ErrorFeedback("powersgd")
    ef.load_state_dict(psgd_state)
    xs = grads(count=2, seed=5)
    for layout in ("F", "matrix", "readonly"):
        q = psgd_state["slots"][0]["state"][psgd.STATE_Q]
        q = {"F": np.asfortranarray, "matrix": np.asmatrix, "readonly": lambda a: a.copy()}[layout](q)
        if layout == "readonly":
            q.flags.writeable = False
        other = ErrorFeedback("powersgd")
        other.load_state_dict(with_q(psgd_state, q))
        got = other._slots["w"].state[psgd.STATE_Q]
        assert type(got) is np.ndarray and got.flags.c_contiguous and got.flags.writeable
        assert_continues_like(copy.deepcopy(ef), other, xs)


def test_powersgd_q_where_it_has_none(psgd_state):
    q = psgd_state["slots"][0]["state"][psgd.STATE_Q]
    cold = copy.deepcopy(psgd_state)
    cold["codec"] = codec.get_codec("powersgd(warm_start=false)").get_config()
    refused(ErrorFeedback("powersgd(warm_start=false)"), cold, rf"state: slot 'w': state: {psgd.STATE_Q}: .*warm_start")
    ef, _ = trained("powersgd", shape=(7,), key="v")  # a 1-D tensor passes through: no Q
    state = ef.state_dict()
    assert state["slots"][0]["state"] == {}
    state["slots"][0]["state"][psgd.STATE_Q] = q
    refused(ErrorFeedback("powersgd"), state, rf"state: slot 'v': state: {psgd.STATE_Q}: .*uncompressed")


@pytest.mark.parametrize(
    "spec, field",
    [
        ("powersgd", "powersgd.p"),
        ("powersgd", "powersgd"),
        ("powersgd", "topk.q"),
        ("powersgd", "calls"),
        ("topk(ratio=0.05)", "topk.counter"),
        ("topk(ratio=0.05)", psgd.STATE_Q),
        ("fp16", "fp16.x"),
    ],
)
def test_unknown_state_fields_are_refused(spec, field):
    ef, _ = trained(spec)
    state = ef.state_dict()
    state["slots"][0]["state"][field] = np.ones(3, np.float32)
    refused(ErrorFeedback(spec), state, rf"state: slot 'w': state: .*{field}")


@pytest.mark.parametrize("value", [[], None, "q", 3, (("powersgd.q", 1),)])
def test_state_that_is_not_a_dict_is_refused(psgd_state, value):
    refused(ErrorFeedback("powersgd"), with_slot(psgd_state, state=value), r"state: slot 'w': state: expected a dict")


def test_state_field_names_must_be_strings(psgd_state):
    s = copy.deepcopy(psgd_state)
    s["slots"][0]["state"][1] = 2
    refused(ErrorFeedback("powersgd"), s, r"state: slot 'w': state: field 1")


@pytest.mark.parametrize("field", ["key", "residual", "step"])
def test_missing_slot_fields_are_refused(target, topk_state, field):
    where = "slot 0" if field == "key" else "slot 'w'"
    refused(target, with_slot(topk_state, **{field: DELETE}), rf"state: {where}: {field}: missing")


def test_optional_slot_fields_default(topk_state):
    ef = ErrorFeedback("topk(ratio=0.05)")
    ef.load_state_dict(with_slot(topk_state, state=DELETE, velocity=DELETE))
    assert ef._slots["w"].state == {} and ef._slots["w"].velocity is None


def test_unknown_slot_field_is_refused(target, topk_state):
    refused(target, with_slot(topk_state, spare=np.zeros(SHAPE, np.float32)), r"state: slot 'w': unknown field 'spare'")


@pytest.mark.parametrize("slot", [None, [], "w", ("w", 1)])
def test_slot_that_is_not_a_dict_is_refused(target, topk_state, slot):
    s = copy.deepcopy(topk_state)
    s["slots"].append(slot)
    refused(target, s, r"state: slot 1: expected a dict")


@pytest.mark.parametrize("slots", [None, {}, "slots", 3, {"w": 1}, iter([])])
def test_slots_not_a_list_are_refused(target, topk_state, slots):
    refused(target, {**topk_state, "slots": slots}, r"state: slots: expected a list")


def test_duplicate_keys_are_refused(target, topk_state):
    s = copy.deepcopy(topk_state)
    s["slots"].append(copy.deepcopy(s["slots"][0]))
    refused(target, s, r"state: slot 'w': key: appears twice")
    s = copy.deepcopy(topk_state)
    s["slots"][0]["key"] = 1
    s["slots"].append({**copy.deepcopy(s["slots"][0]), "key": 1.0})
    refused(target, s, r"state: slot 1.0: key: appears twice")


@pytest.mark.parametrize("key", [["w"], {"a": 1}, np.zeros(2)])
def test_unhashable_keys_are_refused(target, topk_state, key):
    refused(target, with_slot(topk_state, key=key), r"state: slot 0: key: .*hashable")


def test_hashable_keys_round_trip(topk_state):
    for key in (None, 3, ("layer", 1), "w"):
        ef = ErrorFeedback("topk(ratio=0.05)")
        ef.load_state_dict(with_slot(topk_state, key=key))
        assert ef.keys() == [key]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"codec": 3}, r"state: codec: "),
        ({"codec": "topk(ratio="}, r"state: codec: "),
        ({"codec": {"id": "nosuch"}}, r"state: codec: "),
        ({"codec": "fp16"}, r"saved for codec 'fp16'"),
        ({"momentum": 0.5}, r"state: momentum: saved with 0.5"),
        ({"momentum": "0"}, r"state: momentum: must be a number"),
        ({"momentum": True}, r"state: momentum: must be a number"),
        ({"momentum": [0]}, r"state: momentum: must be a number"),
        ({"extra": 1}, r"state: unknown field 'extra'"),
    ],
)
def test_bad_top_level_fields_are_refused(target, topk_state, change, match):
    mismatch = "saved" in match  # unpickling takes codec and momentum from the state itself
    refused(target, {**topk_state, **change}, match, setstate=not mismatch)


@pytest.mark.parametrize("field", ["codec", "slots"])
def test_missing_top_level_fields_are_refused(target, topk_state, field):
    s = dict(topk_state)
    del s[field]
    refused(target, s, rf"state: {field}: missing")


@pytest.mark.parametrize("value", [None, [], "state", 3])
def test_state_that_is_not_a_dict_at_all(target, value):
    refused(target, value, r"state: expected the dict ErrorFeedback.state_dict\(\) returns")


def test_velocity_rules():
    ef, xs = trained("topk(ratio=0.05)", momentum=0.9)
    state = ef.state_dict()
    v = state["slots"][0]["velocity"]
    plain = ErrorFeedback("topk(ratio=0.05)", momentum=0.9)
    for bad, match in [
        (v.astype(np.float64), r"velocity: expected float32\[40, 30\]"),
        (v.reshape(30, 40), r"velocity: expected float32\[40, 30\]"),
        # larger than the residual: today's main accepted it, broadcast x into it and let the
        # fused top-k kernel write 12,000 elements into the 1,200-element acc (a segfault)
        (np.ones((400, 30), np.float32), r"velocity: expected float32\[40, 30\]"),
        (v.astype(np.int32), r"velocity: dtype int32"),
        (v.tolist(), r"velocity: expected a NumPy array"),
        (np.full_like(v, np.nan), r"velocity: non-finite value at position \(0, 0\)"),
    ]:
        refused(plain, with_slot(state, velocity=bad), "state: slot 'w': " + match)
    # momentum off: a saved velocity would be silently dropped, so it is refused
    off, _ = trained("topk(ratio=0.05)")
    s = with_slot(off.state_dict(), velocity=np.zeros(SHAPE, np.float32))
    refused(ErrorFeedback("topk(ratio=0.05)"), s, r"state: slot 'w': velocity: .*momentum")
    # momentum on, no velocity yet: the same as zeros
    s = with_slot(state, velocity=None)
    a = ErrorFeedback("topk(ratio=0.05)", momentum=0.9)
    a.load_state_dict(s)
    b = ErrorFeedback("topk(ratio=0.05)", momentum=0.9)
    b.load_state_dict(with_slot(state, velocity=np.zeros(SHAPE, np.float32)))
    assert_continues_like(a, b, xs)


def test_a_failed_load_keeps_the_previous_state():
    ef, xs = trained("powersgd", momentum=0.5)
    good = ef.state_dict()
    twin = ErrorFeedback("powersgd", momentum=0.5)
    twin.load_state_dict(good)
    bad = copy.deepcopy(good)
    bad["slots"].append({**copy.deepcopy(good["slots"][0]), "key": "second", "step": -1})
    with pytest.raises(ValueError, match="state: slot 'second': step"):
        twin.load_state_dict(bad)
    assert_continues_like(ef, twin, xs)


def test_setstate_refuses_what_load_refuses(topk_state):
    blank = ErrorFeedback.__new__(ErrorFeedback)
    with pytest.raises(ValueError, match="state: slot 'w': residual: dtype int32"):
        blank.__setstate__(with_slot(topk_state, residual=np.zeros(SHAPE, np.int32)))
    with pytest.raises(ValueError, match="state: momentum"):
        blank.__setstate__({**topk_state, "momentum": 1.5})
    with pytest.raises(ValueError, match="state: expected the dict"):
        blank.__setstate__(None)
    ok = ErrorFeedback.__new__(ErrorFeedback)
    ok.__setstate__(with_slot(topk_state, residual=np.asfortranarray(topk_state["slots"][0]["residual"])))
    assert_plain(ok._slots["w"])


# ------------------------------------------------------------------ encode-side layouts
@pytest.mark.parametrize("spec", ["topk(ratio=0.1)", "fp16", "randomk(ratio=0.1)", "powersgd", "qsgd"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_matrix_input_encodes_like_an_array(spec, momentum):
    a, b = ErrorFeedback(spec, momentum=momentum), ErrorFeedback(spec, momentum=momentum)
    for x in grads(count=3):
        assert b.encode(np.asmatrix(x), key="w") == a.encode(x, key="w")
        assert np.array_equal(a.residual("w"), b.residual("w"))
        assert_plain(b._slots["w"])


def test_step_limit_is_what_randomk_frames_allow():
    from codec.stage import MAX_STEP

    assert MAX_STEP + 1 == STEP_LIMIT
    x = np.ones(16, np.float32)
    assert codec.decode(codec.get_codec("randomk(ratio=0.5)").encode(x, step=STEP_LIMIT - 1)).shape == (16,)


def test_add_residual_and_masked_input():
    a, b = ErrorFeedback("topk(ratio=0.05)"), ErrorFeedback("topk(ratio=0.05)")
    x = grads(count=1)[0]
    a.encode(x, key="w")
    b.encode(x, key="w")
    a.add_residual("w", np.ones(SHAPE, np.float32))
    b.add_residual("w", np.asmatrix(np.ones(SHAPE, np.float32)))
    a.add_residual("w", np.full(2, 3, np.float32), [5, 700])
    b.add_residual("w", np.asmatrix(np.full(2, 3, np.float32)), [5, 700])
    assert np.array_equal(a.residual("w"), b.residual("w"))
    assert_plain(b._slots["w"])
    with pytest.raises(TypeError, match="x: masked"):
        a.encode(np.ma.masked_array(x, mask=x > 0), key="w")
    assert a.step("w") == 1


# ------------------------------------------------------------------ fuzzing
with warnings.catch_warnings():  # np.asmatrix warns that matrices are discouraged
    warnings.simplefilter("ignore", PendingDeprecationWarning)
    MATRIX = np.asmatrix(np.ones(SHAPE, np.float32))
HOSTILE = [
    -1, 0, 2**62, 2**70, True, 3.0, float("nan"), None, "x", b"x", [], {}, (), [1.0], {"a": 1},
    np.float32(1), np.array(3.0, np.float32), np.zeros(3, np.float32), np.zeros(SHAPE, np.float64),
    np.zeros(SHAPE, np.int16), np.zeros(SHAPE, np.complex64), np.zeros(SHAPE, object),
    np.full(SHAPE, np.nan, np.float32), np.full(SHAPE, np.inf, np.float32), np.zeros((30, 40), np.float32),
    np.asfortranarray(np.ones(SHAPE, np.float32)), MATRIX,
    np.ones((30, 2), np.float32), np.ones((30, 2), np.float64), np.full((30, 2), np.nan, np.float32),
    np.zeros(SHAPE, ">f4"), np.ma.masked_array(np.zeros(SHAPE, np.float32)),
]


def _mutate(state, data):
    s = copy.deepcopy(state)
    value = data.draw(st.sampled_from(HOSTILE), label="value")
    where = data.draw(st.sampled_from(["top", "slot", "state", "delete-top", "delete-slot", "add-top", "add-slot", "add-state"]), label="where")
    slot = s["slots"][0]
    if where == "top":
        s[data.draw(st.sampled_from(["codec", "momentum", "slots"]), label="field")] = value
    elif where == "slot":
        slot[data.draw(st.sampled_from(["key", "residual", "step", "state", "velocity"]), label="field")] = value
    elif where == "state":
        slot["state"][psgd.STATE_Q] = value
    elif where == "delete-top":
        del s[data.draw(st.sampled_from(sorted(s)), label="field")]
    elif where == "delete-slot":
        del slot[data.draw(st.sampled_from(sorted(slot)), label="field")]
    elif where == "add-top":
        s[data.draw(st.sampled_from(["extra", 0, None]), label="field")] = value
    elif where == "add-slot":
        slot[data.draw(st.sampled_from(["extra", "spare", 0]), label="field")] = value
    else:
        slot["state"][data.draw(st.sampled_from(["powersgd.p", "topk.q", "x", 1]), label="field")] = value
    return s


@settings(max_examples=300, deadline=None)
@given(spec=st.sampled_from(["topk(ratio=0.05)", "powersgd", "fp16", "none"]), data=st.data())
def test_fuzzed_states_are_refused_or_resume_correctly(spec, data):
    """A mutated state is refused with ValueError, or accepted and the next step is the step
    a clean copy of what was accepted gives: never another error, never a different result."""
    ef, xs = trained(spec, momentum=0.5)
    bad = _mutate(ef.state_dict(), data)
    loaded = ErrorFeedback(spec, momentum=0.5)
    try:
        loaded.load_state_dict(bad)
    except ValueError as e:
        assert str(e).startswith("state: "), e
        return
    # accepted: everything it holds is plain, and equals the clean reading of the state
    for s in loaded._slots.values():
        assert_plain(s)
    clean = {
        "codec": loaded.codec.get_config(),
        "momentum": 0.5,
        "slots": [
            {"key": s.key, "residual": np.array(s.residual), "step": s.step, "state": copy.deepcopy(s.state),
             "velocity": None if s.velocity is None else np.array(s.velocity)}
            for s in loaded._slots.values()
        ],
    }
    twin = ErrorFeedback(spec, momentum=0.5)
    twin.load_state_dict(clean)
    for key in loaded.keys():
        r = loaded._slots[key].residual
        x = grads(r.shape, r.dtype, 1, seed=9)[0]
        try:
            frame = loaded.encode(x, key=key)
        except ValueError as e:
            assert "call reset(key)" in str(e), e  # a residual of another shape: the documented error
            continue
        assert twin.encode(x, key=key) == frame
        assert np.array_equal(loaded.residual(key), twin.residual(key), equal_nan=True)
        assert_plain(loaded._slots[key])


# ---------------------------------------------------------------------- residuals=False
def _residual_less(spec="powersgd(rank=2)"):
    ef = ErrorFeedback(spec, residuals=False)
    xs = grads(SHAPE, np.float32, 4)
    for x in xs[:2]:
        ef.encode(x, key="w")
    return ef, xs[2:]


def test_a_state_without_residuals_round_trips():
    ef, xs = _residual_less()
    state = ef.state_dict()
    assert state["residuals"] is False
    (slot,) = state["slots"]
    assert slot["residual"] is None and tuple(slot["shape"]) == SHAPE and slot["dtype"] == "float32"
    assert slot["step"] == 2 and slot["state"][psgd.STATE_Q].shape == (30, 2)
    loaded = ErrorFeedback("powersgd(rank=2)", residuals=False)
    loaded.load_state_dict(pickle.loads(pickle.dumps(state)))
    for restored in (loaded, pickle.loads(pickle.dumps(ef))):  # unpickling takes residuals from the state
        twin, xs = _residual_less()
        assert restored.residuals is False
        for x in xs:
            assert restored.encode(x, key="w") == twin.encode(x, key="w")
            assert restored.step("w") == twin.step("w")


def test_a_state_without_residuals_is_checked():
    ef, _ = _residual_less()
    state = ef.state_dict()
    target, _ = _residual_less()
    refused(target, with_slot(state, residual=np.zeros(SHAPE, np.float32)), "residual: saved")
    refused(target, with_slot(state, shape=DELETE), "shape: missing")
    refused(target, with_slot(state, dtype=DELETE), "dtype: missing")
    refused(target, with_slot(state, dtype="int32"), "dtype")
    refused(target, with_slot(state, dtype=np.float32), "dtype")
    refused(target, with_slot(state, shape=(40, 1.5)), "shape")
    refused(target, with_slot(state, shape="40x30"), "shape")
    refused(target, with_slot(state, shape=(True, 30)), "shape")
    refused(target, with_slot(state, shape=(30, 40)), "powersgd.q")  # the Q no longer fits the matrix
    refused(target, with_slot(state, velocity=np.zeros(SHAPE, np.float32)), "velocity")
    refused(target, {**state, "residuals": "no"}, "residuals")
    refused(target, {**state, "momentum": 0.5}, "momentum")
    # a state with residuals does not load into an ErrorFeedback without them, and back
    with_res, _ = trained("powersgd(rank=2)")
    refused(target, with_res.state_dict(), "residuals", setstate=False)
    refused(with_res, state, "residuals", setstate=False)
    refused(with_res, with_slot(with_res.state_dict(), shape=SHAPE), "shape")


def test_check_slot_can_refuse_and_the_state_is_kept():
    class Strict(ErrorFeedback):
        def check_slot(self, slot, where):
            if slot.dtype != np.float64:
                raise ValueError(f"{where}: dtype: only float64 here")

    ef, _ = trained("topk(ratio=0.1)")
    target = Strict("topk(ratio=0.1)")
    target.encode(np.ones(SHAPE, np.float64), key="w")
    refused(target, ef.state_dict(), "only float64", setstate=False)
    blank = Strict.__new__(Strict)
    with pytest.raises(ValueError, match="only float64"):
        blank.__setstate__(ef.state_dict())


def test_broadcast_arrays_are_refused_before_the_copy():
    """A residual of np.broadcast_to(0, (2**40,)) made load_state_dict allocate 4 TiB (a
    MemoryError; 2**30 elements were accepted as a 4 GiB copy): a state's arrays get encode's
    rule (no zero stride over an extent > 1), checked before anything of their size exists;
    a velocity's shape and dtype are checked against the residual before it is copied."""
    ef, _ = trained("topk(ratio=0.05)", momentum=0.9)
    state = ef.state_dict()
    plain = ErrorFeedback("topk(ratio=0.05)", momentum=0.9)
    huge = np.broadcast_to(np.float32(0), (1 << 40,))
    refused(plain, with_slot(state, residual=huge), r"state: slot 'w': residual: a broadcast array \(zero stride, shape \(1099511627776,\)\)")
    refused(plain, with_slot(state, residual=np.broadcast_to(np.float32(1), SHAPE)), r"state: slot 'w': residual: a broadcast array")
    refused(plain, with_slot(state, velocity=np.broadcast_to(np.float32(1), SHAPE)), r"state: slot 'w': velocity: a broadcast array")
    refused(plain, with_slot(state, velocity=huge), r"state: slot 'w': velocity: expected float32\[40, 30\] like the residual, got float32\[1099511627776\]")
    # one element broadcast to one element is an ordinary array: it loads
    one = ErrorFeedback("topk(ratio=0.05)")
    one.load_state_dict({"codec": one.codec.get_config(), "slots": [{"key": "s", "residual": np.broadcast_to(np.float32(0.5), (1, 1)), "step": 1}]})
    assert one.state_dict()["slots"][0]["residual"].tolist() == [[0.5]]


def test_an_empty_residual_with_zero_strides_loads():
    """np.empty((3, 0)) may have a zero stride over its extent of 3: no elements, no broadcast
    (the broadcast rule first refused every state holding one)."""
    ef = ErrorFeedback("topk(ratio=0.5)")
    empty = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (3, 0), (0, 4))
    ef.load_state_dict({"codec": ef.codec.get_config(), "slots": [{"key": "e", "residual": empty, "step": 1}]})
    assert ef.state_dict()["slots"][0]["residual"].shape == (3, 0)
