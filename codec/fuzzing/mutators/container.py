"""The container mutator: table field edits (count, names, lengths), frames mutated as frames."""

from __future__ import annotations

import random

from codec.fuzzing.checksums import fix_container_checksums
from codec.fuzzing.formats import split_container
from codec.fuzzing.mutators.byte_level import byte_mutation, weighted
from codec.fuzzing.mutators.frame import mutate_frame


def mutate_container(rng: random.Random, data: bytes, other: bytes | None = None) -> bytes:
    c = split_container(data) if rng.random() < 0.85 else None
    if c is None:
        return byte_mutation(rng, data, other, fix_container_checksums)
    op = weighted(rng, ((30, "frame"), (5, "version"), (5, "flags"), (4, "reserved"), (6, "count"), (8, "name"),
                         (8, "name_len"), (10, "frame_len"), (6, "struct"), (6, "splice_frame")))
    e = c.entries
    if op == "frame" and e:
        k = rng.randrange(len(e))
        e[k][1] = mutate_frame(rng, e[k][1], e[rng.randrange(len(e))][1])
    elif op == "version":
        c.version = rng.choice((0, 2, 255))
    elif op == "flags":
        c.flags = rng.choice((1, 2, 0x80, 0xFF, c.flags ^ 1))
    elif op == "reserved":
        c.reserved = rng.choice((1, 0x100, 0xFFFF))
    elif op == "count":
        c.count = rng.choice((0, len(e) + 1, max(0, len(e) - 1), 0xFFFFFFFF, 1 << 31, 6553))
    elif op == "name" and e:
        k = rng.randrange(len(e))
        e[k][0] = rng.choice((b"", b"\xff\xfe", b"\xed\xa0\x80", b"a" * 300, e[rng.randrange(len(e))][0], b"\0", "é".encode() * 3))
    elif op == "name_len" and e:
        e[rng.randrange(len(e))][2] = rng.choice((0, 1, 0xFFFF, 0x8000, 9))
    elif op == "frame_len" and e:
        k = rng.randrange(len(e))
        e[k][3] = rng.choice((0, len(e[k][1]) + 1, max(0, len(e[k][1]) - 1), (1 << 64) - 1, 1 << 63, (1 << 64) - len(e[k][1])))
    elif op == "struct":
        r = rng.randrange(3)
        if r == 0 and e:
            del e[rng.randrange(len(e))]
        elif r == 1 and e:
            e.insert(rng.randrange(len(e) + 1), list(e[rng.randrange(len(e))]))
        elif len(e) > 1:
            i, j = rng.sample(range(len(e)), 2)
            e[i][1], e[j][1] = e[j][1], e[i][1]
    elif op == "splice_frame" and other is not None:
        o = split_container(other)
        if o is not None and o.entries and e:
            e[rng.randrange(len(e))][1] = o.entries[rng.randrange(len(o.entries))][1]
    return c.join(fix=rng.random() < 0.97)
