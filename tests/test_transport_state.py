"""An Allreducer's state dict (issues 13 and 14): one shape for every scheme,
``{"scheme", "rank", "size", "feedback"}``, where ``feedback`` is the scheme's
``codec.ErrorFeedback`` state (None for ``none``); it is untrusted input: every field is
checked before anything is replaced, with a ValueError naming it; what is accepted is copied
into plain arrays, so the next step is the one the saved reducer would have made.  On
COMM_SELF."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import codec  # noqa: E402
from transport import Allreducer  # noqa: E402
from transport.schemes.powersgd import STATE_Q  # noqa: E402
from support.mpi import same_state  # noqa: E402

X = [{"w": np.random.default_rng(s).standard_normal((12, 10)).astype(np.float32), "b": np.linspace(-1, 1, 7, dtype=np.float32)} for s in range(4)]

#: (spec, options, residuals expected in the feedback state; None: no feedback at all)
SCHEMES = [
    ("none", {}, None),
    ("topk(ratio=0.1)+fp16", {}, True),
    ("qsgd(levels=16)", {"error_feedback": False}, False),  # stochastic: the steps matter
    ("none+zstd", {}, False),  # lossless: the allgather without residuals
    ("gtopk(ratio=0.1)", {}, True),
    ("gtopk(ratio=0.1)", {"error_feedback": False}, False),
    ("powersgd(rank=1,min_compression_rate=0)", {}, True),
    ("powersgd(rank=1,min_compression_rate=0)", {"error_feedback": False}, False),
    ("powersgd(rank=1,min_compression_rate=0,warm_start=false)", {}, True),
]
IDS = [f"{s}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for s, o, _ in SCHEMES]


def reducer(spec, **kw):
    return Allreducer(spec, MPI.COMM_SELF, **kw)


def _trained(spec, steps=2, **kw):
    red = reducer(spec, **kw)
    for x in X[:steps]:
        red.reduce(x)
    return red


def _same(a, b):
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def _recording(red):
    """The frames each later step of a frame-coding scheme makes (a list per step)."""
    frames = []
    if hasattr(red.scheme, "encode"):
        encode = red.scheme.encode

        def spy(arrays, keys, **kw):
            out = encode(arrays, keys, **kw)
            frames.append(list(out))  # copied now: the frame's buffer is reused by a later step
            return out

        red.scheme.encode = spy
    return frames


# ---------------------------------------------------------------------- the shape
@pytest.mark.parametrize("spec,opts,residuals", SCHEMES, ids=IDS)
def test_one_state_shape_for_every_scheme(spec, opts, residuals):
    red = _trained(spec, **opts)
    state = red.state_dict()
    assert list(state) == ["scheme", "rank", "size", "feedback"]
    assert (state["scheme"], state["rank"], state["size"]) == (red.spec, 0, 1)
    if residuals is None:
        assert state["feedback"] is None and red.scheme.ef is None
        return
    fb = state["feedback"]
    assert set(fb) == {"codec", "momentum", "residuals", "slots"} and fb["residuals"] is residuals
    assert codec.get_codec(fb["codec"]) == red.scheme.ef.codec
    keys = [s["key"] for s in fb["slots"]]
    framed = not spec.startswith("powersgd")
    assert keys == ([("w", 0), ("b", 0)] if framed else ["w", "b"])
    for s in fb["slots"]:
        assert s["step"] == 2  # every tensor went through both steps
        if residuals:
            assert isinstance(s["residual"], np.ndarray) and "shape" not in s
        else:
            assert s["residual"] is None and s["dtype"] in ("float32", "float64")
            assert tuple(s["shape"]) == X[0][s["key"][0] if framed else s["key"]].shape
    if spec.startswith("powersgd"):
        w = next(s for s in fb["slots"] if s["key"] == "w")
        warm = "warm_start=false" not in spec
        assert set(w["state"]) == ({STATE_Q} if warm else set())
        if warm:
            assert w["state"][STATE_Q].shape == (10, 1) and w["state"][STATE_Q].dtype == np.float32
        if residuals:
            assert w["residual"].dtype == np.float32 and w["residual"].shape == (12, 10)
    pickle.loads(pickle.dumps(state))  # no communicator inside


def test_state_q_is_the_codec_stages_field():
    from codec.stages.transform import powersgd

    assert STATE_Q == powersgd.STATE_Q


# ---------------------------------------------------------------------- round trips
@pytest.mark.parametrize("spec,opts,residuals", SCHEMES, ids=IDS)
def test_a_restored_state_continues_like_an_uninterrupted_twin(spec, opts, residuals):
    """Steps, residuals and warm-start Q restored: the next results, frames and states are
    those of the reducer that was never interrupted; a fresh reducer would differ."""
    a = _trained(spec, **opts)
    b = reducer(spec, **opts)
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    assert same_state(b.state_dict(), a.state_dict())
    fresh = reducer(spec, **opts)
    fa, fb = _recording(a), _recording(b)
    differs = False
    for x in X[2:]:
        want = a.reduce(x)
        assert _same(b.reduce(x), want)
        differs |= not _same(fresh.reduce(x), want)
        assert same_state(b.state_dict(), a.state_dict())
    assert fa == fb
    # the memory changes the results unless the codec is deterministic and nothing is fed back
    matters = residuals or spec.startswith(("qsgd", "powersgd"))
    assert differs == bool(matters), "a reducer without the state gives the same results: the test proves nothing"


@pytest.mark.parametrize("spec", ["topk(ratio=0.1)+fp16", "gtopk(ratio=0.1)", "powersgd(rank=1,min_compression_rate=0)"])
def test_a_loaded_state_in_any_layout_continues_identically(spec):
    a = _trained(spec)
    saved = pickle.loads(pickle.dumps(a.state_dict()))
    fortran = copy.deepcopy(saved)  # every array Fortran-ordered and byte-swapped: copied, not trusted
    arrays = 0
    for slot in fortran["feedback"]["slots"]:
        for holder, f in [(slot, "residual")] + [(slot["state"], k) for k in slot["state"]]:
            v = holder[f]
            if isinstance(v, np.ndarray):
                holder[f] = np.asfortranarray(v).astype(v.dtype.newbyteorder(">"))
                arrays += 1
    assert arrays >= 2 + spec.startswith("powersgd")
    b, c = reducer(spec), reducer(spec)
    b.load_state_dict(saved)
    c.load_state_dict(fortran)
    for x in X[2:]:
        want = a.reduce(x)
        assert _same(b.reduce(x), want) and _same(c.reduce(x), want)


def test_a_frames_step_is_its_tensors_step():
    """Without error feedback a frame's step is how many frames its tensor made before
    (docs/transport.md, "State"): a tensor absent from a step keeps its count."""
    spec = "qsgd(levels=16)"
    red = reducer(spec, error_feedback=False)
    c = codec.get_codec(spec, checksum=False)
    xs = [X[0], {"w": X[1]["w"]}, X[2]]
    for x in xs:
        got = red.reduce(x)
    assert np.array_equal(got["w"], codec.decode(c.encode(X[2]["w"], key=("w", 0), step=2)))
    assert np.array_equal(got["b"], codec.decode(c.encode(X[2]["b"], key=("b", 0), step=1)))
    assert {s["key"]: s["step"] for s in red.state_dict()["feedback"]["slots"]} == {("w", 0): 3, ("b", 0): 2}


def test_powersgd_tensor_changing_shape_starts_over():
    """A PowerSGD tensor whose shape changes gets a new slot (zero residual, step 0); without
    error feedback its step goes on."""
    spec = "powersgd(rank=1,min_compression_rate=0,warm_start=false)"
    for ef in (True, False):
        red = _trained(spec, error_feedback=ef)
        red.reduce({"w": np.ones((6, 20), np.float32), "b": X[2]["b"]})
        steps = {s["key"]: s["step"] for s in red.state_dict()["feedback"]["slots"]}
        assert steps == {"w": 1 if ef else 3, "b": 3}


# ---------------------------------------------------------------------- refused states
def _powersgd_state():
    return _trained("powersgd(rank=1,min_compression_rate=0)").state_dict()


def _powersgd_state_without_ef():
    return _trained("powersgd(rank=1,min_compression_rate=0)", error_feedback=False).state_dict()


def _framed_state():
    return _trained("topk(ratio=0.1)").state_dict()


def _dense_state():
    return _trained("none").state_dict()


def _at(state, path):
    """The node at ``path``; ``("slot", key)`` steps into the feedback slot of ``key``."""
    node = state
    for k in path:
        if isinstance(k, tuple) and k[:1] == ("slot",):
            node = next(s for s in node if s["key"] == k[1])
        else:
            node = node[k]
    return node


def _set(path, value):
    def edit(state):
        _at(state, path[:-1])[path[-1]] = value
        return state

    return edit


def _slot(key, *rest):
    return ("feedback", "slots", ("slot", key), *rest)


W = ("w", 0)
BAD = [
    (_framed_state, _set(_slot(W, "step"), -1), "step"),
    (_framed_state, _set(_slot(W, "step"), 2.5), "step"),
    (_framed_state, _set(_slot(W, "step"), 1 << 70), "step"),
    (_framed_state, _set(("feedback",), None), "feedback"),
    (_framed_state, _set(("feedback", "residuals"), False), "residuals"),
    (_framed_state, _set(("feedback", "codec"), "topk(ratio=0.2)"), "codec"),
    (_framed_state, _set(("feedback", "extra"), 1), "unknown field"),
    (_framed_state, _set(("feedback",), "nonsense"), "state"),
    (_framed_state, _set(("extra",), 1), "keys"),
    (_framed_state, _set(("scheme",), "topk(ratio=0.2)"), "saved for"),
    (_framed_state, _set(("rank",), 1), "rank"),
    (_framed_state, _set(("size",), 2), "rank"),
    (_framed_state, _set(_slot(W, "residual"), np.full((12, 10), np.nan, np.float32)), "non-finite"),
    (_framed_state, _set(_slot(W, "shape"), (12, 10)), "shape"),
    (_dense_state, _set(("feedback",), {"codec": "none", "slots": []}), "feedback"),
    (_dense_state, _set(("extra",), None), "keys"),
    (_powersgd_state, _set(_slot("w", "state", STATE_Q), np.full((10, 1), np.nan, np.float32)), "powersgd.q"),
    (_powersgd_state, _set(_slot("w", "state", STATE_Q), np.zeros((10, 1), np.int32)), "powersgd.q"),
    (_powersgd_state, _set(_slot("w", "state", STATE_Q), np.zeros(10, np.float32)), "powersgd.q"),
    (_powersgd_state, _set(_slot("w", "state", STATE_Q), np.zeros((12, 1), np.float32)), "powersgd.q"),
    (_powersgd_state, _set(_slot("w", "state", STATE_Q), [[0.0]] * 10), "powersgd.q"),
    (_powersgd_state, _set(_slot("b", "state", STATE_Q), np.zeros((1, 1), np.float32)), "powersgd.q"),  # b passes through
    (_powersgd_state, _set(_slot("w", "residual"), np.full((12, 10), np.inf, np.float32)), "residual"),
    (_powersgd_state, _set(_slot("b", "residual"), np.full(7, np.nan, np.float32)), "residual"),  # passes through: still sent
    (_powersgd_state, _set(_slot("w", "residual"), None), "residual"),
    (_powersgd_state, _set(_slot("w", "residual"), np.zeros((12, 10), np.float16)), "residual"),
    (_powersgd_state, _set(_slot("w", "step"), -3), "step"),
    (_powersgd_state, _set(_slot("w", "extra"), 0), "unknown field"),
    (_powersgd_state, _set(("feedback", "slots", 0), 7), "slot"),
    (_powersgd_state, _set(("feedback", "slots"), {}), "slots"),
    (_powersgd_state, _set(("feedback", "residuals"), False), "residuals"),
    (_powersgd_state_without_ef, _set(_slot("w", "dtype"), "float16"), "dtype"),
    (_powersgd_state_without_ef, _set(_slot("w", "dtype"), "int32"), "dtype"),
    (_powersgd_state_without_ef, _set(_slot("w", "shape"), (12, -10)), "shape"),
    (_powersgd_state_without_ef, _set(_slot("w", "residual"), np.zeros((12, 10), np.float32)), "residual"),
]


@pytest.mark.parametrize("make,edit,field", BAD, ids=[f"{i}-{f}" for i, (_, _, f) in enumerate(BAD)])
def test_a_bad_state_is_refused_and_changes_nothing(make, edit, field):
    """Before, powersgd deep-copied any memory it was given and Framed took int() of any step:
    a NaN Q or a negative step was accepted and failed (or misbehaved) later.  Now every
    scheme's memory is an ErrorFeedback state, checked whole before anything is replaced."""
    saved = make()
    target = _trained(saved["scheme"], error_feedback=make is not _powersgd_state_without_ef)
    before = pickle.dumps(target.state_dict())
    with pytest.raises(ValueError, match=field):
        target.load_state_dict(edit(copy.deepcopy(saved)))
    assert pickle.dumps(target.state_dict()) == before


@pytest.mark.parametrize("spec", ["topk(ratio=0.1)", "powersgd(rank=1,min_compression_rate=0)", "qsgd(levels=16)"])
def test_a_state_saved_with_other_options_is_refused(spec):
    """A checkpoint of a reducer with error feedback does not load into one without, and back."""
    for saved_ef in (True, False):
        saved = _trained(spec, error_feedback=saved_ef).state_dict()
        target = _trained(spec, error_feedback=not saved_ef)
        before = pickle.dumps(target.state_dict())
        with pytest.raises(ValueError, match="residuals"):
            target.load_state_dict(saved)
        assert pickle.dumps(target.state_dict()) == before


def test_powersgd_keeps_one_residual_buffer_per_tensor():
    """Two-round PowerSGD makes a fresh M every step and installs M - P Q^T in it, so a
    tensor's memory is one residual buffer (no spare), and a passed-through tensor's residual
    stays the zeros it has after one step."""
    red = Allreducer("powersgd(rank=2)", MPI.COMM_SELF)
    rng = np.random.default_rng(0)
    for _ in range(3):
        red.reduce({"w": rng.standard_normal((32, 48)).astype(np.float32), "b": np.ones(48, np.float32)})
    for key in ("w", "b"):
        slot = red.scheme.ef._slots[key]
        assert slot.spare is None and slot.residual.shape == slot.shape and slot.residual.flags.c_contiguous
    assert not red.scheme.ef.residual("b").any() and red.scheme.ef.residual("w").any()


@pytest.mark.parametrize("spec", ["topk(ratio=0.5)", "gtopk(ratio=0.5)", "randomk(ratio=0.5)"])
def test_a_key_out_of_steps_fails_before_the_collective(spec):
    """ErrorFeedback.check runs in the scheme's pre-collective check: a key that has used up
    its steps fails there (every rank raises, nothing changes), not after the first collective."""
    from codec.stage import MAX_STEP

    red = Allreducer(spec, MPI.COMM_SELF)
    x = {"w": np.arange(1, 9, dtype=np.float32)}
    red.reduce(x)
    slot = next(iter(red.scheme.ef._slots.values()))
    slot.step = MAX_STEP + 1
    before = copy.deepcopy(red.scheme.ef.state_dict()["slots"][0]["residual"])
    with pytest.raises(ValueError, match=r"failed checking its input.*2\*\*62 frames"):
        red.reduce(x)
    assert slot.step == MAX_STEP + 1 and np.array_equal(red.scheme.ef.residual(slot.key), before)
