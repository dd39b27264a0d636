"""The many-tensor frame mutator: byte edits of the frame with its checksums recomputed (so
they reach the header walk, the section table and the stages), edits of the trusted layout
(another shape, dtype, name or count: what a hash-form frame is then decoded against), and
splices of two inputs' frames and layouts."""

from __future__ import annotations

import random

from codec.fuzzing.checksums import fix_many_checksums
from codec.fuzzing.formats import join_many, layout_fields, layout_prefix, raw_layout, split_many
from codec.fuzzing.mutators.byte_level import byte_mutation, weighted


def mutate_many(rng: random.Random, data: bytes, other: bytes | None = None) -> bytes:
    parts = split_many(data)
    if parts is None:
        return byte_mutation(rng, data, other, lambda x: x)
    prefix, frame = parts
    op = weighted(rng, ((60, "frame"), (12, "field"), (10, "layout"), (8, "splice"), (10, "raw")))
    if op == "frame":
        frame = byte_mutation(rng, frame, None if other is None else (split_many(other) or (b"", b""))[1], fix_many_checksums)
    elif op == "field" and len(frame) > 12:  # a header byte past the fixed 8, resealed
        b = bytearray(frame)
        at = rng.randrange(8, min(len(b), 64))
        b[at] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, b[at] ^ 1, b[at] + 1 & 0xFF))
        frame = fix_many_checksums(bytes(b))
    elif op == "layout" and prefix:
        prefix = _hostile_layout(rng, prefix)
    elif op == "splice" and other is not None:
        o = split_many(other)
        if o is not None:
            prefix, frame = (o[0], frame) if rng.random() < 0.5 else (prefix, o[1])
    else:
        return byte_mutation(rng, data, other, lambda x: x)
    return join_many(prefix, frame)


def _hostile_layout(rng: random.Random, prefix: bytes) -> bytes:
    """The trusted layout edited as a caller might get it wrong: a name repeated (a Layout the
    constructor refuses, reaching the parser by another route), names dropped or added, a
    tensor's shape or dtype changed, two tensors swapped, one dropped or added; or a bit of
    the prefix flipped."""
    import numpy as np

    fields = layout_fields(prefix)
    if fields is None or rng.random() < 0.25:
        b = bytearray(prefix)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    shapes, dts, names = fields
    n = len(shapes)
    edit = rng.choice(("repeat", "names", "shape", "dtype", "swap", "drop", "add"))
    if edit == "repeat" and names is not None and n > 1:
        i, j = rng.sample(range(n), 2)
        names[j] = names[i]
    elif edit == "names":
        names = [f"t{i}" for i in range(n)] if names is None else None
    elif edit == "shape" and n:
        i = rng.randrange(n)
        shapes[i] = rng.choice(([], [0], [1], shapes[i] + [1], [max(1, int(np.prod(shapes[i], dtype=np.int64))) + 1], shapes[i][::-1]))
    elif edit == "dtype" and n:
        dts[rng.randrange(n)] = rng.choice((np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)))
    elif edit == "swap" and n > 1:
        i, j = rng.sample(range(n), 2)
        shapes[i], shapes[j] = shapes[j], shapes[i]
    elif edit == "drop" and n:
        i = rng.randrange(n)
        del shapes[i], dts[i]
        if names is not None:
            del names[i]
    else:
        shapes.append([rng.choice((1, 3, 8))])
        dts.append(np.dtype(np.float32))
        if names is not None:
            names.append(rng.choice((names[0] if names else "x", "extra")))
    return layout_prefix(raw_layout(shapes, dts, names))
