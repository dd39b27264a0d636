"""The frame mutator: field edits with the checksums recomputed, sections kept
self-consistent, byte-level edits, splices, and fresh frames of codecs with mutated parameters.
"""

from __future__ import annotations

import random
import struct
import warnings

import numpy as np

import codec
from codec.fuzzing.checksums import fix_frame_checksums, frame_header_len
from codec.fuzzing.formats import FrameFields, split_frame
from codec.fuzzing.mutators.byte_level import weighted
from codec.fuzzing.mutators.spec import mutate_spec_text
from codec.fuzzing.seeds import DTYPES


U64 = (
    0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 1023, 1024, 4095, 4096, 65535, 65536,
    (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, 1 << 40, (1 << 40) + 1, 1 << 53,
    1 << 61, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 64) - 2,
)
BITS = (0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 128, 255, 256, 65535)


def _resize(data: bytes, size: int, rng: random.Random) -> bytes:
    if size <= len(data):
        return data[:size]
    fill = rng.choice((b"\0", b"\xff", None))
    extra = size - len(data)
    return data + (fill * extra if fill else rng.randbytes(extra))


_MAX_GROW = 1 << 16  # a consistent edit grows a section's bytes to at most 64 KiB


def _raw_of(fields: FrameFields, i: int) -> bytes | None:
    s, p = fields.sections[i], fields.payloads[i]
    if s[1] == 0:
        return p
    try:
        import zstandard

        return zstandard.ZstdDecompressor().decompress(p, max_output_size=1 << 20)
    except Exception:  # noqa: BLE001
        return None


def _set_section(fields: FrameFields, i: int, rng: random.Random, *, count=None, bits=None, raw=None, zstd=None) -> None:
    """Change section ``i`` keeping it self-consistent: raw_len = ceil(count*bits/8), stored
    bytes of that length (grown or cut), recompressed when zstd."""
    s = fields.sections[i]
    data = _raw_of(fields, i) if raw is None else raw
    if data is None:
        data = b""
    if bits is not None:
        s[2] = bits
    if count is not None:
        s[3] = count
    raw_len = (s[3] * s[2] + 7) // 8
    s[4] = raw_len
    if raw_len > _MAX_GROW and raw_len > len(data):
        s[5] = raw_len if s[1] == 0 else s[5]  # a lie the buffer cannot back: the length checks see it
        return
    data = _resize(data, raw_len, rng)
    enc = s[1] if zstd is None else int(zstd)
    if enc == 1:
        import zstandard

        packed = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(data)
        s[1], s[5] = 1, len(packed)
        fields.payloads[i] = packed
    else:
        s[1], s[5] = 0, raw_len
        fields.payloads[i] = data


def _interesting_dim(rng: random.Random, n: int) -> int:
    r = rng.random()
    if r < 0.5:
        return rng.choice(U64)
    if r < 0.8:
        return max(0, n + rng.choice((-1, 1, 2, -2)))
    return rng.randrange(0, 300)


def _factor(rng: random.Random, n: int) -> list:
    """A random shape with ``n`` elements (1-4 dimensions)."""
    dims = []
    rest = n
    for _ in range(rng.randrange(0, 3)):
        divs = [d for d in range(1, min(rest, 64) + 1) if rest % d == 0] or [1]
        d = rng.choice(divs)
        dims.append(d)
        rest //= d if d else 1
    dims.append(rest)
    rng.shuffle(dims)
    return dims


def _mutate_fields(rng: random.Random, f: FrameFields, other: FrameFields | None) -> None:
    """One structure-aware edit of a frame's fields (in place)."""
    n = f.n
    op = weighted(rng, (
        (3, "version"), (6, "flags"), (4, "dtype"), (2, "reserved"), (3, "ndim_raw"), (2, "nsec_raw"), (2, "speclen_raw"),
        (14, "dim"), (6, "reshape"), (4, "add_dim"), (3, "drop_dim"), (8, "resize_consistent"),
        (16, "spec"), (3, "spec_bytes"),
        (10, "sec_field"), (12, "sec_consistent"), (4, "sec_struct"), (10, "payload_bytes"), (4, "zstd"),
        (6, "splice"),
    ))
    secs = f.sections
    if op == "version":
        f.version = rng.choice((0, 2, 255, rng.randrange(256)))
    elif op == "flags":
        f.flags = rng.choice((0, 1, 2, 3, 4, 0x80, 0xFF, f.flags ^ 1, f.flags ^ 2, rng.randrange(256)))
    elif op == "dtype":
        f.dtype = rng.choice((0, 1, 2, 3, 4, 5, 255))
    elif op == "reserved":
        f.reserved = rng.choice((1, 0x80, 255))
    elif op == "ndim_raw":
        f.ndim = max(0, min(255, len(f.shape) + rng.choice((-1, 1, 33 - len(f.shape), 255))))
    elif op == "nsec_raw":
        f.nsec = max(0, min(255, len(secs) + rng.choice((-1, 1, 255))))
    elif op == "speclen_raw":
        f.spec_len = rng.choice((0, len(f.spec) + 1, max(0, len(f.spec) - 1), 4096, 4097, 65535))
    elif op == "dim":
        if f.shape:
            f.shape[rng.randrange(len(f.shape))] = _interesting_dim(rng, n)
        else:
            f.shape.append(_interesting_dim(rng, n))
        if rng.random() < 0.3 and f.shape:  # a zero dimension beside a huge one: n = 0
            f.shape[rng.randrange(len(f.shape))] = 0
    elif op == "reshape":
        f.shape = _factor(rng, n) if n else [rng.choice((0, 1 << 62, (1 << 64) - 1)), 0]
        if rng.random() < 0.2:
            rng.shuffle(f.shape)
    elif op == "add_dim":
        f.shape.insert(rng.randrange(len(f.shape) + 1), rng.choice((1, 1, 0, 2, 1 << 62, (1 << 64) - 1)))
    elif op == "drop_dim":
        if f.shape:
            del f.shape[rng.randrange(len(f.shape))]
    elif op == "resize_consistent":
        # a new element count, and every section whose count was n follows it (dense codecs
        # then stay consistent and the new n reaches the value stage)
        new = rng.choice((0, 1, 2, 3, 5, 8, 64, 65, 4095, 4097, n + 1, max(0, n - 1), 2 * n, rng.randrange(1, 5000)))
        for i, s in enumerate(secs):
            if s[3] == n or (n and s[3] * 8 == -(-n // 8) * 8 and s[2] == 1):
                _set_section(f, i, rng, count=new)
        f.shape = _factor(rng, new)
    elif op == "spec":
        try:
            text = f.spec.decode("utf-8")
        except UnicodeDecodeError:
            text = f.spec.decode("latin-1")
        f.spec = mutate_spec_text(rng, text).encode("utf-8", "surrogatepass")
    elif op == "spec_bytes":
        b = bytearray(f.spec)
        pos = rng.randrange(len(b) + 1)
        b[pos:pos] = rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\0", b"\xe9"))
        f.spec = bytes(b)
    elif op == "sec_field" and secs:
        s = secs[rng.randrange(len(secs))]
        j = rng.randrange(6)
        if j == 0:
            s[0] = rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 255))
        elif j == 1:
            s[1] = rng.choice((0, 1, 2, 255))
        elif j == 2:
            s[2] = rng.choice(BITS)
        else:
            s[j] = rng.choice(U64) if rng.random() < 0.6 else max(0, s[j] + rng.choice((-1, 1, 8, -8)))
    elif op == "sec_consistent" and secs:
        i = rng.randrange(len(secs))
        s = secs[i]
        r = rng.random()
        if r < 0.45:
            c = s[3]
            _set_section(f, i, rng, count=rng.choice((0, 1, 2, 3, max(0, c - 1), c + 1, 2 * c, c // 2, n, n + 1, max(0, n - 1), rng.randrange(0, 300), *U64[:20])))
        elif r < 0.8:
            b = rng.choice(BITS[1:-2])
            if rng.random() < 0.5:  # same bytes, another width: count follows
                data = _raw_of(f, i) or b""
                _set_section(f, i, rng, bits=b, count=(len(data) * 8) // b if b else 0)
            else:
                _set_section(f, i, rng, bits=b)
        else:
            _set_section(f, i, rng, count=s[3])  # re-store (raw <-> zstd below) unchanged
    elif op == "sec_struct" and secs is not None:
        r = rng.randrange(5)
        if r == 0 and secs:
            i = rng.randrange(len(secs))
            del secs[i], f.payloads[i]
        elif r == 1 and secs:
            i = rng.randrange(len(secs))
            secs.insert(i, list(secs[i]))
            f.payloads.insert(i, f.payloads[i])
        elif r == 2 and len(secs) > 1:
            i, j = rng.sample(range(len(secs)), 2)
            secs[i], secs[j] = secs[j], secs[i]
            f.payloads[i], f.payloads[j] = f.payloads[j], f.payloads[i]
        else:  # a new section of some kind
            bits = rng.choice((1, 8, 16, 32, 64, rng.randrange(1, 65)))
            count = rng.choice((0, 1, 2, n, rng.randrange(0, 100)))
            i = rng.randrange(len(secs) + 1)
            secs.insert(i, [rng.choice((1, 2, 3, 4, 5, 6, 9)), 0, bits, count, 0, 0])
            f.payloads.insert(i, b"")
            _set_section(f, i, rng, count=count, raw=rng.randbytes(min(_MAX_GROW, (count * bits + 7) // 8)))
    elif op == "payload_bytes" and secs:
        i = rng.randrange(len(secs))
        data = bytearray(_raw_of(f, i) or b"")
        if data:
            r = rng.random()
            if r < 0.3:
                for _ in range(rng.randrange(1, 4)):
                    data[rng.randrange(len(data))] = rng.choice((0, 0xFF, 0x7F, 0x80, 0x01, 0xFE, 0x7C, 0xFC, rng.randrange(256)))
            elif r < 0.5:
                data = bytearray(rng.choice((b"\xff", b"\0", b"\x7f")) * len(data))
            elif r < 0.7:  # NaN / inf / huge values where floats live
                for w, pats in ((4, (b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\xff\xff\x7f\x7f", b"\x00\x00\x80\xff")),
                                (2, (b"\x00\x7e", b"\x00\x7c", b"\xff\x7b", b"\xc0\x7f")),
                                (8, (b"\x00" * 6 + b"\xf8\x7f", b"\xff" * 7 + b"\x7f"))):
                    if len(data) >= w and rng.random() < 0.5:
                        k = rng.randrange(len(data) // w) * w
                        data[k : k + w] = rng.choice(pats)
                        break
            else:
                k = rng.randrange(len(data))
                data[k] ^= 1 << rng.randrange(8)
        _set_section(f, i, rng, raw=bytes(data), count=secs[i][3])
    elif op == "zstd" and secs:
        i = rng.randrange(len(secs))
        s = secs[i]
        r = rng.random()
        if r < 0.5:
            _set_section(f, i, rng, zstd=not s[1], count=s[3])
        elif r < 0.75:  # a zstd frame that lies about its content size
            forged = bytes([0x28, 0xB5, 0x2F, 0xFD, 0xC0, 0x58]) + struct.pack("<Q", rng.choice((s[4], s[4] + 1, 1 << 40)) % (1 << 64)) + b"\x01\x00\x00"
            s[1], s[5] = 1, len(forged)
            f.payloads[i] = forged
        else:  # damaged zstd bytes
            if s[1] == 1 and f.payloads[i]:
                p = bytearray(f.payloads[i])
                p[rng.randrange(len(p))] ^= 1 << rng.randrange(8)
                f.payloads[i] = bytes(p)
    elif op == "splice" and other is not None:
        r = rng.randrange(4)
        if r == 0:  # this header, the other's sections
            f.sections = [list(s) for s in other.sections]
            f.payloads = list(other.payloads)
        elif r == 1:
            f.spec = other.spec
        elif r == 2 and secs and other.sections:
            i, j = rng.randrange(len(secs)), rng.randrange(len(other.sections))
            secs[i] = list(other.sections[j])
            f.payloads[i] = other.payloads[j]
        else:
            f.shape = list(other.shape)
            f.dtype = other.dtype


def _fresh_frame(rng: random.Random, data: bytes) -> bytes | None:
    """A valid frame of a codec whose spec is a mutation of ``data``'s (unusual parameter
    combinations), encoding a small random array; None when no such codec or encode exists."""
    f = split_frame(data)
    if f is None:
        return None
    try:
        text = mutate_spec_text(rng, f.spec.decode("utf-8"))
        c = codec.get_codec(text)
    except Exception:  # noqa: BLE001 - most mutated specs are refused: then no fresh frame
        return None
    shape = rng.choice(((rng.randrange(0, 300),), (rng.randrange(1, 20), rng.randrange(1, 20)), (), (2, 3, rng.randrange(1, 9))))
    gen = np.random.default_rng(rng.randrange(1 << 32))
    arr = (gen.standard_t(2, size=shape) * rng.choice((1e-3, 1.0, 1e4))).astype(DTYPES[rng.randrange(4)])
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            return c.encode(arr, key="k", step=rng.choice((0, 1, 7, 1000)))
    except (ValueError, TypeError):
        return None


def mutate_frame(rng: random.Random, data: bytes, other: bytes | None = None) -> bytes:
    """A mutated frame: mostly field edits with checksums recomputed; else bit flips,
    byte edits, truncations and splices (checksums recomputed most of the time); one in 20
    a fresh frame of a codec with mutated (but accepted) parameters, edited or not."""
    if rng.random() < 0.05:
        fresh = _fresh_frame(rng, data)
        if fresh is not None:
            return fresh if rng.random() < 0.5 else mutate_frame(rng, fresh, other)
    r = rng.random()
    f = split_frame(data) if r < 0.72 else None
    if f is not None:
        o = split_frame(other) if other is not None else None
        for _ in range(1 + (rng.random() < 0.35) + (rng.random() < 0.1)):
            _mutate_fields(rng, f, o)
        out = f.join(fix=rng.random() < 0.97)
        return out
    b = bytearray(data)
    r = rng.random()
    if r < 0.4 and b:  # bit flips, biased to the header
        hl = min(len(b), frame_header_len(b) or len(b))
        for _ in range(rng.randrange(1, 4)):
            k = rng.randrange(hl) if rng.random() < 0.7 or hl == len(b) else rng.randrange(len(b))
            b[k] ^= 1 << rng.randrange(8)
    elif r < 0.6 and b:  # interesting bytes
        for _ in range(rng.randrange(1, 3)):
            k = rng.randrange(len(b))
            b[k] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
    elif r < 0.8:  # truncation or extension
        if rng.random() < 0.7 and b:
            del b[rng.randrange(len(b)) :]
        else:
            b += rng.randbytes(rng.choice((1, 4, 8, 28, 100)))
    elif other is not None:  # byte splice of two frames
        i, j = rng.randrange(len(b) + 1), rng.randrange(len(other) + 1)
        b = b[:i] + other[j:]
    out = bytes(b)
    return fix_frame_checksums(out) if rng.random() < 0.8 else out
