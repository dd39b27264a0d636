"""Byte-level mutation (bit flips, byte edits, truncations, extensions, splices) and the
weighted choice every mutator draws its edit with.
"""

from __future__ import annotations

import random


def weighted(rng: random.Random, table):
    total = sum(w for w, _ in table)
    x = rng.random() * total
    for w, f in table:
        x -= w
        if x < 0:
            return f
    return table[-1][1]


def byte_mutation(rng: random.Random, data: bytes, other, fixer) -> bytes:
    b = bytearray(data)
    r = rng.random()
    if r < 0.45 and b:
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif r < 0.7 and b:
        b[rng.randrange(len(b))] = rng.choice((0, 0xFF, 0x80, 0x7F, rng.randrange(256)))
    elif r < 0.9:
        if b and rng.random() < 0.7:
            del b[rng.randrange(len(b)) :]
        else:
            b += rng.randbytes(rng.choice((1, 8, 64)))
    elif other is not None:
        b = b[: rng.randrange(len(b) + 1)] + other[rng.randrange(len(other) + 1) :]
    out = bytes(b)
    return fixer(out) if rng.random() < 0.6 else out
