"""The spec mutator: structure-aware edits of spec text (parameters set to huge, negative,
non-finite or wrong-typed values, stages swapped, added, dropped or repeated) and character edits.
"""

from __future__ import annotations

import math
import random


INT_LITERALS = (
    "0", "1", "-1", "2", "3", "7", "255", "256", "65535", "65536", "2147483647", "2147483648", "4294967296",
    "9007199254740993", "4611686018427387904", "9223372036854775807", "9223372036854775808",
    "18446744073709551616", "-9223372036854775809", "1" + "0" * 30, "1" + "0" * 400, "-" + "9" * 40,
)
FLOAT_LITERALS = (
    "0.0", "-0.0", "0.5", "1.0", "1.5", "2.5", "1e-30", "1e-308", "5e-324", "1e308", "1.7976931348623157e308",
    "-1e308", "-0.5", "nan", "inf", "-inf", "1e400", "9007199254740992.0", "4.611686018427388e18",
)
WORD_LITERALS = ("auto", "none", "true", "false", "x", "''", "'" + "a" * 300 + "'", "e4m3", "e5m2", "l1", "global", "stochastic")
CALL_LITERALS = (
    "warmup(0.25,0.001,steps=1000)", "warmup(0,0,steps=0)", "warmup(1e308,-1e308,steps=9223372036854775808)",
    "linear(0.5,0.01,steps=-1)", "exp(0.9,0.5,steps=3)", "exp(0,1e308,steps=1)", "step(0.5,0.1,every=0)",
    "step(1,2,every=4611686018427387904)", "warmup(warmup(1,2),3)", "nosuch(1)", "linear()",
    "linear(0.5,1" + "0" * 400 + ",steps=3)", "step(1" + "0" * 400 + ",0.1,every=2)", "exp(0.5,0.1,steps=1" + "0" * 400 + ")",
    "warmup(0.5,0.01,steps=2,every=-1)", "step(every=1)", "step(0.5,every=1e308)",
)


def _registry():
    from codec.stage import registered

    return registered()


def _param_names(stage: str) -> list[str]:
    cls = _registry().get(stage)
    return [p.name for p in cls.params] if cls is not None else []


def _value_literal(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.4:
        return rng.choice(INT_LITERALS)
    if r < 0.75:
        return rng.choice(FLOAT_LITERALS)
    if r < 0.9:
        return rng.choice(WORD_LITERALS)
    return rng.choice(CALL_LITERALS)


def _nearby_literal(rng: random.Random, cur, stage: str, key: str) -> str:
    """A value near the current one (or the default): in range, but another meaning for the
    same sections (another width, bucket, block, level count, seed...)."""
    base = cur
    if base is None:
        cls = _registry().get(stage)
        p = next((p for p in cls.params if p.name == key), None) if cls is not None else None
        if p is None or p.default is None:
            return rng.choice(("1", "2", "3", "4", "7", "8", "16"))
        if p.choices:
            return str(rng.choice(p.choices))
        base = str(p.default).lower()
    try:
        v = float(base)
    except ValueError:
        return rng.choice(("1", "2", "3", "true", "false", base))
    if not math.isfinite(v):
        return _value_literal(rng)
    is_int = "." not in base and "e" not in base.lower()
    cands = [v + 1, v - 1, v * 2, v / 2, v + 0.5, 1, 2, 3, 5, 8, 0]
    out = rng.choice(cands)
    return str(int(out)) if is_int and out == int(out) else repr(float(out))


def _split_stages(text: str):
    """``[[name, [[key, value text], ...]], ...]`` of a spec, or None when it does not parse."""
    from codec.spec import format_value, parse

    try:
        return [[n, [[k, format_value(v)] for k, v in p.items()]] for n, p in parse(text)]
    except Exception:  # noqa: BLE001 - any unparsable text: fall back to character edits
        return None


def _join_stages(stages) -> str:
    return "+".join(n + ("(" + ",".join(f"{k}={v}" for k, v in ps) + ")" if ps else "") for n, ps in stages)


_CHARS = "()+=,.-_eE0123456789abcxyzkr'\" \t\n\x00é\x7f"


def mutate_spec_text(rng: random.Random, text: str) -> str:
    """A structure-aware edit of a spec string: parameters set to huge, negative, non-finite
    or wrong-typed values, stages swapped, added, dropped or repeated, or character edits."""
    stages = _split_stages(text)
    names = list(_registry())
    for _ in range(1 + (rng.random() < 0.3)):
        if stages and rng.random() < 0.85:
            op = rng.randrange(7)
            i = rng.randrange(len(stages))
            name, ps = stages[i]
            if op <= 2:  # set a parameter (a declared one mostly) to an interesting value
                declared = _param_names(name)
                key = rng.choice(declared) if declared and rng.random() < 0.9 else rng.choice(["k", "bits", "x", "seed", "steps"])
                cur = next((p[1] for p in ps if p[0] == key), None)
                val = _nearby_literal(rng, cur, name, key) if rng.random() < 0.4 else _value_literal(rng)
                for p in ps:
                    if p[0] == key:
                        p[1] = val
                        break
                else:
                    ps.append([key, val])
            elif op == 3 and rng.random() < 0.15:  # a value nested in calls, deeper than any schedule
                depth = rng.choice((2, 3, 7, 8, 9, 10, 100, 400, 1300))
                key = rng.choice(_param_names(name) or ["ratio"])
                ps.append([key, rng.choice(("warmup(", "f(", "linear(1,")) * depth + "1" + ")" * depth])
            elif op == 3:  # another stage name
                stages[i][0] = rng.choice(names) if rng.random() < 0.9 else rng.choice(["nosuch", "Topk", "fp16_", "_"])
            elif op == 4:  # add a stage
                stages.insert(rng.randrange(len(stages) + 1), [rng.choice(names), []])
            elif op == 5 and len(stages) > 1:  # drop one
                del stages[i]
            else:  # repeat one, or drop a parameter
                if ps and rng.random() < 0.5:
                    del ps[rng.randrange(len(ps))]
                else:
                    stages.insert(i, [name, [list(p) for p in ps]])
            text = _join_stages(stages)
        else:
            text = _char_edit(rng, text)
            stages = _split_stages(text)
    return text


def _char_edit(rng: random.Random, text: str) -> str:
    op = rng.randrange(5)
    pos = rng.randrange(len(text) + 1)
    if op == 0:
        return text[:pos] + rng.choice(_CHARS) + text[pos:]
    if op == 1:
        return text[:pos] + text[pos + 1 :]
    if op == 2 and text:
        return text[:pos] + rng.choice(_CHARS) + text[pos + 1 :]
    if op == 3:
        return text[:pos] + text[pos:] * rng.choice((2, 3, 50))  # long texts
    return text[:pos]


def mutate_spec(rng: random.Random, data: bytes, other: bytes | None = None) -> bytes:
    text = data.decode("utf-8", "replace")
    if other is not None and rng.random() < 0.1:  # splice two specs
        o = other.decode("utf-8", "replace")
        text = text[: rng.randrange(len(text) + 1)] + o[rng.randrange(len(o) + 1) :]
    else:
        text = mutate_spec_text(rng, text)
    out = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.03:
        b = bytearray(out)
        b.insert(rng.randrange(len(b) + 1), rng.choice((0xFF, 0xC3, 0x80)))
        out = bytes(b)
    return out
