"""An Allreducer's state dict is untrusted input (issue 13): every field is checked before
anything is replaced, with a ValueError naming it; what is accepted is copied into plain
arrays, so the next step is the one the saved reducer would have made.  On COMM_SELF."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

from transport import Allreducer  # noqa: E402

X = [{"w": np.random.default_rng(s).standard_normal((12, 10)).astype(np.float32), "b": np.linspace(-1, 1, 7, dtype=np.float32)} for s in range(4)]


def reducer(spec, **kw):
    return Allreducer(spec, MPI.COMM_SELF, **kw)


def _trained(spec, **kw):
    red = reducer(spec, **kw)
    for x in X[:2]:
        red.reduce(x)
    return red


def _same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("spec", ["topk(ratio=0.1)+fp16", "gtopk(ratio=0.1)", "powersgd(rank=1,min_compression_rate=0)"])
def test_a_loaded_state_in_any_layout_continues_identically(spec):
    a = _trained(spec)
    saved = pickle.loads(pickle.dumps(a.state_dict()))
    fortran = copy.deepcopy(saved)  # every array Fortran-ordered and byte-swapped: copied, not trusted
    if "memory" in fortran["state"]:
        for mem in fortran["state"]["memory"].values():
            for f in ("residual", "q"):
                if mem[f] is not None:
                    mem[f] = np.asfortranarray(mem[f]).astype(mem[f].dtype.newbyteorder(">"))
    b, c = reducer(spec), reducer(spec)
    b.load_state_dict(saved)
    c.load_state_dict(fortran)
    for x in X[2:]:
        want = a.reduce(x)
        assert _same(b.reduce(x), want) and _same(c.reduce(x), want)


def _powersgd_state():
    return _trained("powersgd(rank=1,min_compression_rate=0)").state_dict()


def _framed_state():
    return _trained("topk(ratio=0.1)").state_dict()


def _set(path, value):
    def edit(state):
        node = state
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        return state

    return edit


BAD = [
    (_framed_state, _set(("state", "step"), -1), "step"),
    (_framed_state, _set(("state", "step"), 2.5), "step"),
    (_framed_state, _set(("state", "step"), 1 << 70), "step"),
    (_framed_state, _set(("state", "ef"), None), "error feedback"),
    (_framed_state, _set(("state", "extra"), 1), "state"),
    (_framed_state, _set(("state",), "nonsense"), "state"),
    (_framed_state, _set(("extra",), 1), "keys"),
    (_powersgd_state, _set(("state", "memory", "w", "q"), np.full((10, 1), np.nan, np.float32)), "q"),
    (_powersgd_state, _set(("state", "memory", "w", "q"), np.zeros((10, 1), np.int32)), "q"),
    (_powersgd_state, _set(("state", "memory", "w", "q"), np.zeros(10, np.float32)), "q"),
    (_powersgd_state, _set(("state", "memory", "w", "q"), [[0.0]] * 10), "q"),
    (_powersgd_state, _set(("state", "memory", "w", "residual"), np.full((12, 10), np.inf, np.float32)), "residual"),
    (_powersgd_state, _set(("state", "memory", "w", "residual"), None), "residual"),
    (_powersgd_state, _set(("state", "memory", "w", "residual"), np.zeros((12, 10), np.float16)), "residual"),
    (_powersgd_state, _set(("state", "memory", "w", "step"), -3), "step"),
    (_powersgd_state, _set(("state", "memory", "w", "extra"), 0), "memory"),
    (_powersgd_state, _set(("state", "memory", "w"), 7), "memory"),
    (_powersgd_state, _set(("state", "memory"), []), "memory"),
]


@pytest.mark.parametrize("make,edit,field", BAD, ids=[f"{i}-{f}" for i, (_, _, f) in enumerate(BAD)])
def test_a_bad_state_is_refused_and_changes_nothing(make, edit, field):
    """Before, powersgd deep-copied any memory it was given and Framed took int() of any step:
    a NaN Q or a negative step was accepted and failed (or misbehaved) later."""
    saved = make()
    target = _trained(saved["scheme"])
    before = pickle.dumps(target.state_dict())
    with pytest.raises(ValueError, match=field):
        target.load_state_dict(edit(copy.deepcopy(saved)))
    assert pickle.dumps(target.state_dict()) == before
