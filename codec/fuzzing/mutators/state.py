"""The state mutator: a pickled ``{"codec", "momentum", "state"}`` with wrong dtypes, shapes,
orders, types, steps, keys, extra or missing fields.
"""

from __future__ import annotations

import random

import numpy as np

import codec
from codec.dtypes import bfloat16
from codec.fuzzing.formats import Broadcast, dumps_state, loads_state
from codec.fuzzing.mutators.byte_level import byte_mutation, weighted
from codec.fuzzing.mutators.spec import mutate_spec_text
from codec.fuzzing.seeds import DTYPES, seed_specs


def _bad_array(rng: random.Random, a):
    """``a`` (an array) made wrong in one way: dtype, shape, layout, type or values."""
    try:
        return _bad_array_of(rng, a)
    except (TypeError, ValueError):  # an edit that does not apply to this (already odd) array
        return np.zeros((2, 3), np.float32).T


def _bad_array_of(rng: random.Random, a):
    a = np.asarray(a) if isinstance(a, np.ndarray) and a.size <= 1 << 20 else np.zeros(3, np.float32)
    r = rng.randrange(18)
    if r == 0:
        try:
            return a.astype(rng.choice((np.int32, np.int8, np.bool_, np.complex64, np.uint16, object, ">f4", ">f8", "V2")))
        except (TypeError, ValueError):  # no cast from this dtype (bfloat16 to V2, ...)
            return a.view(np.uint8) if a.ndim else np.zeros(3, np.int32)
    if r == 1:
        others = [d for d in DTYPES if d != a.dtype]
        return a.astype(rng.choice(others))
    if r == 2:  # Fortran order (2-D or more), or a transposed view
        b = a.reshape(-1, 1) if a.ndim < 2 else a
        return np.asfortranarray(b) if rng.random() < 0.5 else b.T
    if r == 3:  # non-contiguous views
        big = np.repeat(a.reshape(-1), 2)
        return big[::2].reshape(a.shape) if a.size else big
    if r == 4:
        return a[::-1] if a.ndim else a
    if r == 5:
        return np.asmatrix(a.reshape(1, -1) if a.ndim != 2 else a)
    if r == 6:
        return a.reshape(-1)[:-1] if a.size else np.zeros(1, a.dtype)
    if r == 7:
        return np.zeros(a.shape + (2,), a.dtype)
    if r == 8:
        return np.zeros((), a.dtype)
    if r == 9:
        return a.tolist()
    if r == 10:
        return rng.choice((None, 1.5, "residual", b"\0\0\0\0", {"a": 1}, (1.0, 2.0), float("nan")))
    if r == 11:  # a broadcast array (zero stride): huge, costing nothing until copied, or of the key's own shape
        shape = rng.choice(((1 << 40,), (1 << 20, 1 << 20), (1 << 59,), (1 << 30,), a.shape, a.shape + (1,)))
        return Broadcast(np.asarray(rng.choice((0.0, 1.5, np.nan)), a.dtype), shape)
    if r == 12:
        b = a.copy()
        if b.size:
            b.reshape(-1)[0] = rng.choice((np.nan, np.inf, -np.inf, 1e38))
        return b
    if r == 13:
        b = a.copy()
        b.flags.writeable = False
        return b
    if r == 14:
        return np.zeros(rng.choice(((0,), (1,), (3, 0), (2, 2, 2))), a.dtype)
    if r == 15:
        return np.zeros(a.shape, [("f", a.dtype)]) if a.dtype != bfloat16 else a.view(np.uint16)
    if r == 16:
        return a.reshape(-1) if a.ndim != 1 else a.reshape(1, -1)
    return np.zeros(a.shape, a.dtype)


_STEP_VALUES = (-1, 0, 1 << 31, (1 << 63) - 1, 1 << 63, 1 << 64, 1 << 200, 1.5, 2.0, float("nan"), float("inf"), "3", None, True,
                np.int64(5), np.float64(2.0), np.uint64(1 << 63), [1], b"1")
_MOMENTUM_VALUES = (0.0, 0.5, -0.5, 1.0, 2.0, float("nan"), float("inf"), "0.5", "x", None, True, [0.5], 1e308, np.float32(0.5))


def mutate_state(rng: random.Random, data: bytes, other: bytes | None = None) -> bytes:
    """Edit a pickled ``{"codec", "momentum", "state"}``: the state gets wrong dtypes, shapes,
    orders, types, steps, extra or missing keys (the codec and momentum are the receiver's)."""
    try:
        obj = loads_state(data)
    except Exception:  # noqa: BLE001
        return byte_mutation(rng, data, other, lambda x: x)
    if not isinstance(obj, dict) or "state" not in obj:
        return data
    st = obj["state"]
    for _ in range(1 + (rng.random() < 0.3)):
        st = _mutate_state_obj(rng, st, other)
    obj["state"] = st
    try:
        return dumps_state(obj)
    except Exception:  # noqa: BLE001 - e.g. an unpicklable edit
        return data


def _mutate_state_obj(rng: random.Random, st, other):
    if not isinstance(st, dict):
        return st if rng.random() < 0.5 else {"codec": None, "slots": []}
    st = dict(st)
    slots = st.get("slots")
    op = weighted(rng, ((30, "slot"), (5, "top_type"), (6, "top_keys"), (8, "codec"), (6, "momentum"), (8, "slots_type"), (6, "slots_struct"), (4, "splice")))
    if op == "slot" and isinstance(slots, list) and slots:
        slots = list(slots)
        k = rng.randrange(len(slots))
        s = slots[k]
        if not isinstance(s, dict):
            slots[k] = {"key": "k", "residual": np.zeros(3, np.float32), "step": 0, "state": {}, "velocity": None}
        else:
            s = dict(s)
            field_ = weighted(rng, ((20, "residual"), (8, "step"), (8, "key"), (10, "state"), (10, "velocity"), (6, "keys")))
            if field_ == "residual":
                s["residual"] = _bad_array(rng, s.get("residual"))
            elif field_ == "step":
                s["step"] = rng.choice(_STEP_VALUES)
            elif field_ == "key":
                s["key"] = rng.choice(([1, 2], {"a": 1}, None, "", "k" * 1000, ("t", 0), np.zeros(2), 1.5, b"k", slots[0].get("key") if isinstance(slots[0], dict) else None))
            elif field_ == "state":
                inner = s.get("state")
                if isinstance(inner, dict) and inner and rng.random() < 0.7:
                    inner = dict(inner)
                    kk = rng.choice(list(inner))
                    inner[kk] = _bad_array(rng, inner[kk]) if rng.random() < 0.8 else rng.choice((None, 1, "q"))
                else:
                    inner = rng.choice((None, [], "state", {"powersgd.q": np.ones((3, 1), np.float32)}, {"x": 1}, {1: 2}))
                s["state"] = inner
            elif field_ == "velocity":
                res = s.get("residual")
                s["velocity"] = _bad_array(rng, res) if rng.random() < 0.8 else (np.zeros_like(res) if isinstance(res, np.ndarray) and res.size <= 1 << 20 else 0.0)
            else:
                r = rng.randrange(3)
                if r == 0 and s:
                    del s[rng.choice(list(s))]
                elif r == 1:
                    s[rng.choice(("extra", "spare", "Residual", 7))] = rng.choice((1, None, np.zeros(2)))
                else:
                    s = rng.choice((None, [], "slot", 1))
            slots[k] = s
        st["slots"] = slots
    elif op == "top_type":
        return rng.choice((None, [], "state", 0, b"state", [("codec", 1)]))
    elif op == "top_keys":
        r = rng.randrange(3)
        if r == 0 and st:
            del st[rng.choice(list(st))]
        else:
            st[rng.choice(("extra", "Slots", 3, None))] = rng.choice((1, [], None))
    elif op == "codec":
        cfg = st.get("codec")
        r = rng.randrange(5)
        if r == 0:
            st["codec"] = rng.choice(("fp16", "nosuch", "", None, 3, [], {"id": 3}, {"id": "nosuch"}))
        elif r == 1 and isinstance(cfg, dict):
            cfg = dict(cfg)
            key = rng.choice(list(cfg) + ["extra", "id"])
            cfg[key] = rng.choice((None, -1, 1 << 63, 1e308, float("nan"), "auto", "x", [1], {"a": 1}))
            st["codec"] = cfg
        elif r == 2 and isinstance(cfg, dict):
            st["codec"] = codec.get_codec(rng.choice(seed_specs())).get_config()
        elif r == 3 and isinstance(cfg, dict):
            st["codec"] = {**cfg, "id": mutate_spec_text(rng, str(cfg.get("id")))}
        else:
            st["codec"] = mutate_spec_text(rng, codec.get_codec(cfg).spec if isinstance(cfg, dict) and _safe_codec(cfg) else "fp16")
    elif op == "momentum":
        st["momentum"] = rng.choice(_MOMENTUM_VALUES)
    elif op == "slots_type":
        st["slots"] = rng.choice((None, {}, {"k": 1}, "slots", 5, tuple(slots) if isinstance(slots, list) else (), [None], [[]]))
    elif op == "slots_struct" and isinstance(slots, list):
        slots = list(slots)
        r = rng.randrange(3)
        if r == 0 and slots:
            slots.insert(0, slots[rng.randrange(len(slots))])  # a repeated key
        elif r == 1 and slots:
            del slots[rng.randrange(len(slots))]
        else:
            slots = slots * rng.choice((2, 50))
        st["slots"] = slots
    elif op == "splice" and other is not None:
        try:
            o = loads_state(other)
            if isinstance(o, dict) and isinstance(o.get("state"), dict):
                ost = o["state"]
                key = rng.choice(("slots", "codec", "momentum"))
                if key in ost:
                    st[key] = ost[key]
        except Exception:  # noqa: BLE001
            pass
    return st


def _safe_codec(cfg) -> bool:
    try:
        codec.get_codec(cfg)
        return True
    except Exception:  # noqa: BLE001
        return False
