"""The ``message`` fuzz target: one rank's transport message (transport/message.py), as the
receiver reads it.

An input is a little-endian u32, the frame count the receiver expects (trusted: every rank
knows it from the config check), then the message.  :func:`check_message` runs
``transport.message.unpack`` on it, as the transport does (on a slice of its receive buffer),
and every frame it returns through codec.fuzzing's frame target.  The machinery (loop,
oracle, supervision) is codec.fuzzing's; this module registers the target with it, because
codec never imports transport (``python -m transport.fuzzing --child`` is the supervised
child for this target).
"""

from __future__ import annotations

import random
import struct
import sys

import numpy as np

from codec.fuzzing import Finding, Outcome, byte_mutation, check_frame, child_main, mutate_frame, register_target, weighted
from transport import message
from transport.message import MAGIC as MESSAGE_MAGIC

__all__ = ["check_message", "join_message", "message_seeds", "mutate_message", "split_message"]


def split_message(buf):
    """``(count, magic, declared count, lengths, frames, trailing)`` of a message target input
    (u32 receiver count, then the message), or None."""
    b = bytes(buf)
    if len(b) < 12:
        return None
    (count,) = struct.unpack_from("<I", b, 0)
    msg = b[4:]
    magic = msg[:4]
    (declared,) = struct.unpack_from("<I", msg, 4)
    if 8 + 8 * declared > len(msg):
        return None
    lengths = list(struct.unpack_from(f"<{declared}Q", msg, 8))
    off = 8 + 8 * declared
    frames = []
    for n in lengths:
        take = min(n, max(0, len(msg) - off))
        frames.append(msg[off : off + take])
        off += take
    return [count, magic, declared, lengths, frames, msg[off:]]


def join_message(count, magic, declared, lengths, frames, trailing=b"") -> bytes:
    out = bytearray(struct.pack("<I", count % (1 << 32)))
    out += magic[:4].ljust(4, b"\0") + struct.pack("<I", declared % (1 << 32))
    for n in lengths:
        out += struct.pack("<Q", n % (1 << 64))
    for f in frames:
        out += f
    return bytes(out + trailing)


def mutate_message(rng: random.Random, data: bytes, other: bytes | None = None) -> bytes:
    m = split_message(data) if rng.random() < 0.85 else None
    if m is None:
        return byte_mutation(rng, data, other, lambda x: x)
    count, magic, declared, lengths, frames, trailing = m
    op = weighted(rng, ((40, "frame"), (6, "count"), (6, "declared"), (3, "magic"), (14, "length"), (8, "struct"), (4, "trailing")))
    if op == "frame" and frames:
        k = rng.randrange(len(frames))
        frames[k] = mutate_frame(rng, frames[k], frames[rng.randrange(len(frames))])
        lengths[k] = len(frames[k])
    elif op == "count":
        count = rng.choice((0, max(0, count - 1), count + 1, 0xFFFFFFFF, 1 << 28, (1 << 61) // 8))
    elif op == "declared":
        declared = rng.choice((0, max(0, declared - 1), declared + 1, 0xFFFFFFFF))
    elif op == "magic":
        magic = rng.choice((b"GCM2", b"\x89GCF", b"\0\0\0\0"))
    elif op == "length" and lengths:
        k = rng.randrange(len(lengths))
        total = sum(lengths)
        r = rng.random()
        if r < 0.4:
            lengths[k] = rng.choice((0, lengths[k] + 1, max(0, lengths[k] - 1), (1 << 64) - 1, 1 << 63))
        elif r < 0.7 and len(lengths) > 1:  # wrap the u64 sum back to the real total
            j = (k + 1) % len(lengths)
            lengths[k] = (lengths[k] + (1 << 63)) % (1 << 64)
            lengths[j] = (lengths[j] + (1 << 63)) % (1 << 64)
        elif r < 0.85 and len(lengths) > 1:  # move bytes between two frames: total unchanged
            j = (k + 1) % len(lengths)
            d = rng.randrange(1, 40)
            lengths[k] += d
            lengths[j] = (lengths[j] - d) % (1 << 64)
        else:
            lengths[k] = (lengths[k] - total + (len(data) - 12 - 8 * len(lengths))) % (1 << 64)
    elif op == "struct":
        r = rng.randrange(3)
        if r == 0 and frames:
            k = rng.randrange(len(frames))
            del frames[k], lengths[k]
            declared = count = len(frames) if rng.random() < 0.7 else count
        elif r == 1 and frames:
            k = rng.randrange(len(frames))
            frames.insert(k, frames[k])
            lengths.insert(k, lengths[k])
            declared = count = len(frames) if rng.random() < 0.7 else count
        elif other is not None:
            o = split_message(other)
            if o is not None and o[4] and frames:
                k = rng.randrange(len(frames))
                frames[k] = o[4][rng.randrange(len(o[4]))]
                lengths[k] = len(frames[k])
    elif op == "trailing":
        trailing = trailing + rng.randbytes(rng.choice((1, 8)))
    return join_message(count, magic, declared, lengths, frames, trailing)


def check_message(data, calls) -> Outcome:
    if len(data) < 4:
        return Outcome("invalid", "short")
    (count,) = struct.unpack_from("<I", data, 0)
    msg = np.frombuffer(bytes(data), np.uint8)[4:]  # what the transport passes: a slice of its receive buffer
    frames, err = calls.call("message.unpack", message.unpack, msg, count, 0)
    if err is not None:
        return Outcome("rejected", type(err).__name__)
    if len(frames) != count:
        raise Finding("message.unpack returned another frame count", f"{len(frames)} != {count}")
    total = 0
    for f in frames:
        total += len(f)
        check_frame(f, calls, extras=False)
    if total + 8 + 8 * count != len(data) - 4:
        raise Finding("message.unpack's frames do not tile the message")
    return Outcome("ok", "ok")


def message_seeds(frames_by_spec: dict, rng: random.Random) -> list:
    """Messages of 1, 2 and 4 frames of each codec, and an empty one."""
    out = []
    for spec, fs in frames_by_spec.items():
        for k in (1, 2, 4):
            pick = [rng.choice(fs) for _ in range(k)]
            out.append((spec, join_message(k, MESSAGE_MAGIC, k, [len(f) for f in pick], pick)))
    out.append(("-", join_message(0, MESSAGE_MAGIC, 0, [], [])))
    return out


register_target("message", mutate=mutate_message, check=check_message, seeds=message_seeds, module="transport.fuzzing")

if __name__ == "__main__":
    sys.exit(child_main())
