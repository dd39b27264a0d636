"""The many-tensor frame mutator: byte edits of the frame with its checksums recomputed (so
they reach the header walk, the section table and the stages), edits of the trusted layout
(another shape, dtype, name or count: what a hash-form frame is then decoded against), and
splices of two inputs' frames and layouts."""

from __future__ import annotations

import random

from codec.fuzzing.checksums import fix_many_checksums
from codec.fuzzing.formats import join_many, split_many
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
        b = bytearray(prefix)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        prefix = bytes(b)
    elif op == "splice" and other is not None:
        o = split_many(other)
        if o is not None:
            prefix, frame = (o[0], frame) if rng.random() < 0.5 else (prefix, o[1])
    else:
        return byte_mutation(rng, data, other, lambda x: x)
    return join_many(prefix, frame)
