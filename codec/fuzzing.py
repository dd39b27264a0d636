"""Fuzzing gradcodec's parsers: seed corpus, structure-aware mutators, targets and the oracle.

Five parsers meet untrusted input (docs/robustness.md says what is promised for each):

==========  ===============================================  ==============================
target      input (bytes)                                    what is called
==========  ===============================================  ==============================
frame       a frame                                          codec.inspect, codec.decode,
                                                             decode(out=), Codec.decode_add
                                                             into zeros, codec.decode_sparse
container   a container (codec/container.py)                 unpack_frames, then every frame
                                                             as the frame target
message     u32 count (the receiver's, trusted), then one    transport.message.unpack, then
            rank's transport message (registered by          every frame as the frame target
            transport.fuzzing: codec never imports transport)
spec        spec text, UTF-8                                 codec.get_codec, then a small
                                                             encode / decode round trip
state       a pickle (restricted: numpy arrays and plain     ErrorFeedback.load_state_dict,
            containers) of {"codec", "momentum", "state"}    then one encode per key
==========  ===============================================  ==============================

The oracle (:func:`check`) runs one input through its target and classifies the outcome:
``ok``, an expected rejection (``CorruptFrameError``, ``UnknownCodecError``, ...), an
``invalid`` input (the harness could not even build the call, e.g. an unreadable pickle) or
a **finding**: any other exception, a decode whose shape or dtype differs from inspect's,
decode_add into zeros that differs from decode, decode_sparse inconsistent with decode, a
call above the memory bound (tracemalloc peak) or above the time bound, a state accepted
with an array that is not a plain C-contiguous float ndarray.  A crash (SIGSEGV, abort) or a
hang is caught one level up, by :func:`supervise`, which runs the loop in a child process.

The mutation loop (:func:`fuzz_loop`) takes a seed from :func:`seed_corpus` (every
registered codec and every pipeline of the conformance suite, over small arrays of every
dtype, with and without error feedback) and mutates it with the target's structure-aware
mutator: header field edits with the checksums recomputed (so the edit reaches the deep
parsers), section edits kept self-consistent, spec text edits (huge, negative, non-finite
parameters), bit flips, truncations and splices of two inputs.

``scripts/fuzz.py`` is the command line; tests/test_fuzz.py replays the regression corpus
(tests/fuzz_corpus/<target>/) and runs a bounded loop on every CI run.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import pickle
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import tracemalloc
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import codec
from codec import container as _container
from codec.dtypes import CODES, bfloat16
from codec.errors import CodecError, CorruptFrameError

__all__ = [
    "TARGETS",
    "EXTRA_PIPELINES",
    "seed_specs",
    "Outcome",
    "check",
    "seed_corpus",
    "seed_arrays",
    "mutate",
    "fuzz_loop",
    "supervise",
    "fix_frame_checksums",
    "fix_container_checksums",
    "FrameFields",
    "split_frame",
    "ContainerFields",
    "split_container",
    "dumps_state",
    "loads_state",
]

#: the targets: this module's four, then any another layer registers (:func:`register_target`;
#: ``transport.fuzzing`` adds ``message``: codec never imports transport)
TARGETS = ["frame", "container", "spec", "state"]


@dataclass
class ExtraTarget:
    """A target registered by another layer: its mutator and check (as this module's own),
    ``seeds(frames_by_spec, rng) -> [(label, bytes)]``, and the module whose ``-m`` runs a
    supervised child for it (it registers the target, then calls :func:`child_main`)."""

    mutate: object
    check: object
    seeds: object
    module: str


_EXTRA: dict = {}


def register_target(name: str, *, mutate, check, seeds, module: str) -> None:
    """Add a fuzz target of another layer (idempotent)."""
    _EXTRA[name] = ExtraTarget(mutate, check, seeds, module)
    MUTATORS[name] = mutate
    CHECKS[name] = check
    if name not in TARGETS:
        TARGETS.append(name)

#: pipelines the fuzzer seeds from besides the conformance suite's (``codec.testing.PIPELINES``)
#: and the registered stage ids: every byte stage on a sparse and a transform codec
EXTRA_PIPELINES = (
    "topk(ratio=0.2)+fp16+zstd+crc32",
    "fft(theta=0.5,block=8)+rangefloat(bits=4)+crc32",
    "powersgd(rank=2)+fp16+zstd",
)


def seed_specs() -> list[str]:
    """Every registered codec id, then the conformance suite's pipelines
    (``codec.testing.PIPELINES``), then :data:`EXTRA_PIPELINES` (no repeats, in that order)."""
    from codec.testing import PIPELINES

    out = [c["id"] for c in codec.list_codecs()]
    for s in (*PIPELINES, *EXTRA_PIPELINES):
        if s not in out:
            out.append(s)
    return out

# ----------------------------------------------------------------------------- checksums
FRAME_MAGIC = b"\x89GCF"
CONTAINER_MAGIC = b"\x89GCC"
#: frame flags: bit 0 = payload CRC32 (zlib), bit 1 = payload CRC-32C (Castagnoli)
FLAG_CRC32 = 0x01
FLAG_CRC32C = 0x02
#: container flags: bit 0 = CRC-32C of the frames area after the table
CFLAG_CRC32C = 0x01


def crc32c(data) -> int:
    """CRC-32C (Castagnoli) of ``data``: the ``crc32c`` package, or a table-driven fallback."""
    try:
        import crc32c as _c

        return _c.crc32c(bytes(data))
    except ImportError:  # pragma: no cover - the package is a dependency of the format
        return _crc32c_slow(bytes(data))


_C_TABLE = None


def _crc32c_slow(data: bytes) -> int:  # pragma: no cover
    global _C_TABLE
    if _C_TABLE is None:
        t = []
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            t.append(c)
        _C_TABLE = t
    c = 0xFFFFFFFF
    for b in data:
        c = _C_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _payload_crc(flags: int, data) -> int:
    return crc32c(data) if flags & FLAG_CRC32C and not flags & FLAG_CRC32 else zlib.crc32(data)


def frame_header_len(buf) -> int | None:
    """The header length ``parse_frame`` computes from ``buf``'s own fields (None if too short)."""
    if len(buf) < 12:
        return None
    flags, ndim, nsec = buf[5], buf[7], buf[8]
    spec_len = buf[10] | buf[11] << 8
    return 12 + 8 * ndim + spec_len + 28 * nsec + (4 if flags & (FLAG_CRC32 | FLAG_CRC32C) else 0) + 4


def fix_frame_checksums(buf) -> bytes:
    """``buf`` with its payload checksum (flags bit 0: zlib CRC32, bit 1: CRC-32C) and header
    CRC32 recomputed where ``parse_frame`` will look for them, whatever the other fields say:
    an edit anywhere then reaches the checks behind the CRCs."""
    b = bytearray(buf)
    hl = frame_header_len(b)
    if hl is None or len(b) < hl:
        return bytes(b)
    pos = hl - 4
    flags = b[5]
    if flags & (FLAG_CRC32 | FLAG_CRC32C):
        struct.pack_into("<I", b, pos - 4, _payload_crc(flags, memoryview(b)[hl:]))
    struct.pack_into("<I", b, pos, zlib.crc32(memoryview(b)[:pos]))
    return bytes(b)


def _container_table_end(b) -> int | None:
    """Where a container's table ends (walking ``count`` entries as unpack_frames does)."""
    if len(b) < 12:
        return None
    (count,) = struct.unpack_from("<I", b, 8)
    off = 12
    for _ in range(count):
        if off + 10 > len(b):
            return None
        (nl,) = struct.unpack_from("<H", b, off)
        off += 2 + nl + 8
    return off if off <= len(b) else None


def fix_container_checksums(buf) -> bytes:
    """``buf`` with the container's table CRC32 (and, with flags bit 0, the CRC-32C of the
    frames area, stored just before the table CRC, which covers it) recomputed."""
    b = bytearray(buf)
    t = _container_table_end(b)
    if t is None:
        return bytes(b)
    if b[5] & CFLAG_CRC32C:
        if t + 8 > len(b):
            return bytes(b)
        struct.pack_into("<I", b, t, crc32c(memoryview(b)[t + 8 :]))
        t += 4
    if t + 4 > len(b):
        return bytes(b)
    struct.pack_into("<I", b, t, zlib.crc32(memoryview(b)[:t]))
    return bytes(b)


# ----------------------------------------------------------------------------- frame fields
@dataclass
class FrameFields:
    """A frame's fields, split without validation (docs/format.md), to edit and rejoin.

    ``ndim``, ``nsec`` and ``spec_len`` are None when they follow ``shape``, ``sections`` and
    ``spec``; an int forces a (possibly inconsistent) value.  ``sections`` holds
    ``[kind, encoding, bits, count, raw_len, stored_len]`` lists; ``payloads`` their stored
    bytes; ``trailing`` anything after them."""

    magic: bytes = FRAME_MAGIC
    version: int = 1
    flags: int = 0
    dtype: int = 3
    reserved: int = 0
    shape: list = field(default_factory=list)
    spec: bytes = b""
    sections: list = field(default_factory=list)
    payloads: list = field(default_factory=list)
    trailing: bytes = b""
    ndim: int | None = None
    nsec: int | None = None
    spec_len: int | None = None

    def copy(self) -> "FrameFields":
        return FrameFields(
            self.magic, self.version, self.flags, self.dtype, self.reserved, list(self.shape), self.spec,
            [list(s) for s in self.sections], list(self.payloads), self.trailing, self.ndim, self.nsec, self.spec_len,
        )

    def join(self, fix: bool = True) -> bytes:
        """The frame bytes; checksums recomputed when ``fix`` (else left zero)."""
        ndim = len(self.shape) if self.ndim is None else self.ndim
        nsec = len(self.sections) if self.nsec is None else self.nsec
        spec_len = len(self.spec) if self.spec_len is None else self.spec_len
        out = bytearray(self.magic[:4].ljust(4, b"\0"))
        out += struct.pack("<BBBBBBH", self.version & 255, self.flags & 255, self.dtype & 255, ndim & 255, nsec & 255,
                           self.reserved & 255, spec_len & 0xFFFF)
        for d in self.shape:
            out += struct.pack("<Q", d % (1 << 64))
        out += self.spec
        for s in self.sections:
            out += struct.pack("<BBHQQQ", s[0] & 255, s[1] & 255, s[2] & 0xFFFF, s[3] % (1 << 64), s[4] % (1 << 64), s[5] % (1 << 64))
        if self.flags & (FLAG_CRC32 | FLAG_CRC32C):
            out += b"\0\0\0\0"
        out += b"\0\0\0\0"
        for p in self.payloads:
            out += p
        out += self.trailing
        return fix_frame_checksums(out) if fix else bytes(out)

    @property
    def n(self) -> int:
        return math.prod(self.shape)


def split_frame(buf) -> FrameFields | None:
    """Split a frame into :class:`FrameFields` (None when even the fixed header is missing)."""
    b = bytes(buf)
    if len(b) < 16:
        return None
    magic, version, flags, dt, ndim, nsec, reserved, spec_len = struct.unpack_from("<4sBBBBBBH", b, 0)
    off = 12
    if off + 8 * ndim + spec_len + 28 * nsec > len(b):
        return None
    shape = list(struct.unpack_from(f"<{ndim}Q", b, off))
    off += 8 * ndim
    spec = b[off : off + spec_len]
    off += spec_len
    sections = []
    for _ in range(nsec):
        sections.append(list(struct.unpack_from("<BBHQQQ", b, off)))
        off += 28
    off += 8 if flags & (FLAG_CRC32 | FLAG_CRC32C) else 4
    payloads = []
    for s in sections:
        take = min(s[5], max(0, len(b) - off))
        payloads.append(b[off : off + take])
        off += take
    return FrameFields(magic, version, flags, dt, reserved, shape, spec, sections, payloads, b[off:])


# ----------------------------------------------------------------------------- container fields
@dataclass
class ContainerFields:
    """A container split without validation: entries ``[name_bytes, frame]`` plus raw fields."""

    magic: bytes = CONTAINER_MAGIC
    version: int = 1
    flags: int = 0
    reserved: int = 0
    entries: list = field(default_factory=list)  # [name bytes, frame bytes, name_len override|None, frame_len override|None]
    count: int | None = None
    trailing: bytes = b""

    def join(self, fix: bool = True) -> bytes:
        count = len(self.entries) if self.count is None else self.count
        out = bytearray(self.magic[:4].ljust(4, b"\0"))
        out += struct.pack("<BBHI", self.version & 255, self.flags & 255, self.reserved & 0xFFFF, count % (1 << 32))
        for name, frame, nl, fl in self.entries:
            out += struct.pack("<H", (len(name) if nl is None else nl) & 0xFFFF) + name
            out += struct.pack("<Q", (len(frame) if fl is None else fl) % (1 << 64))
        if self.flags & CFLAG_CRC32C:
            out += b"\0\0\0\0"
        out += b"\0\0\0\0"
        for e in self.entries:
            out += e[1]
        out += self.trailing
        return fix_container_checksums(out) if fix else bytes(out)


def split_container(buf) -> ContainerFields | None:
    b = bytes(buf)
    if len(b) < 16:
        return None
    magic, version, flags, reserved, count = struct.unpack_from("<4sBBHI", b, 0)
    off, table = 12, []
    for _ in range(count):
        if off + 10 > len(b):
            return None
        (nl,) = struct.unpack_from("<H", b, off)
        if off + 10 + nl > len(b):
            return None
        name = b[off + 2 : off + 2 + nl]
        (fl,) = struct.unpack_from("<Q", b, off + 2 + nl)
        table.append((name, fl))
        off += 10 + nl
    off += 8 if flags & CFLAG_CRC32C else 4
    entries = []
    for name, fl in table:
        take = min(fl, max(0, len(b) - off))
        entries.append([name, b[off : off + take], None, None])
        off += take
    return ContainerFields(magic, version, flags, reserved, entries, None, b[off:])


# ----------------------------------------------------------------------------- state pickles
_STATE_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy", "matrix"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"),
    ("numpy.matrixlib.defmatrix", "matrix"), ("numpy._core.defchararray", "chararray"),
    ("builtins", "complex"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"),
    ("builtins", "slice"), ("builtins", "range"),
}


class _StateUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays, scalars and dtypes (any ``numpy.dtypes`` class, ml_dtypes types)
    and plain containers; nothing else (a corpus file must not run code)."""

    def find_class(self, module, name):
        if (module, name) in _STATE_GLOBALS or module == "numpy.dtypes" or (
            module == "ml_dtypes" and name.replace("_", "").isalnum()
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"state pickle: global {module}.{name} is not allowed")


def dumps_state(obj) -> bytes:
    return pickle.dumps(obj, protocol=4)


def loads_state(data: bytes):
    return _StateUnpickler(io.BytesIO(data)).load()


# ----------------------------------------------------------------------------- seeds
DTYPES = (np.dtype(np.float16), bfloat16, np.dtype(np.float32), np.dtype(np.float64))


def seed_arrays(seed: int = 0, full: bool = True) -> list[np.ndarray]:
    """Small arrays of every dtype: size 0, 0-d, one element, odd 1-D, 2-D, heavy-tailed, a
    zero-size 2-D; ``full=False`` keeps one of each shape with the dtypes spread over them."""
    rng = np.random.default_rng(seed)
    shapes = [
        ("empty", lambda: np.zeros(0)),
        ("0d", lambda: np.array(0.75)),
        ("one", lambda: np.array([-2.5])),
        ("odd", lambda: rng.standard_normal(77)),
        ("2d", lambda: rng.standard_normal((5, 7)) * 0.01),
        ("heavy", lambda: rng.standard_t(2, size=(9, 13)) * 1e-3),
        ("empty2d", lambda: np.zeros((3, 0))),
        ("4d", lambda: rng.standard_normal((2, 3, 2, 3))),
    ]
    out = []
    for i, (_, make) in enumerate(shapes):
        dts = DTYPES if full else (DTYPES[i % len(DTYPES)], np.dtype(np.float32))
        base = make()
        for dt in dict.fromkeys(dts):
            out.append(np.ascontiguousarray(base.astype(dt)))
    return out


@dataclass
class Seeds:
    """The seed corpus: per target a list of ``(label, input bytes)``; ``label`` is the spec
    of the codec that made it (what the per-codec counts of a run are keyed by)."""

    by_target: dict

    def of(self, target: str) -> list:
        return self.by_target[target]


def _encode_all(spec: str, arrays, feedback: bool):
    c = codec.get_codec(spec)
    frames = []
    for a in arrays:
        try:
            if feedback:
                ef = codec.ErrorFeedback(c)
                for step in range(2):
                    frames.append(ef.encode(a * (1 + step), key="k"))
            else:
                frames.append(c.encode(a, key="k", step=1))
        except (ValueError, TypeError):
            continue  # e.g. a codec that needs a 2-D array, or non-finite values refused
    return frames


_SEED_CACHE: dict = {}


def seed_corpus(full: bool = True, specs=None) -> Seeds:
    """The seed corpus of every target, generated from every codec (deterministic)."""
    key = (full, tuple(specs) if specs else None)
    if key in _SEED_CACHE:
        return _SEED_CACHE[key]
    specs = list(specs) if specs else seed_specs()
    arrays = seed_arrays(full=full)
    frames = []  # (spec, frame)
    states = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for spec in specs:
            for fb in (False, True):
                for f in _encode_all(spec, arrays, fb):
                    frames.append((spec, f))
            for momentum in (0.0, 0.5):
                ef = codec.ErrorFeedback(spec, momentum=momentum)
                for i, a in enumerate(arrays[:: 3 if full else 2]):
                    try:
                        ef.encode(a, key=("t", i) if i % 2 else f"k{i}")
                    except (ValueError, TypeError):
                        pass
                states.append((spec, dumps_state({"codec": spec, "momentum": momentum, "state": ef.state_dict()})))
    by_spec: dict = {}
    for spec, f in frames:
        by_spec.setdefault(spec, []).append(f)
    containers = []
    rng = random.Random(1)
    names = ["", "w", "layer1.weight", "é/ü", "x" * 40]
    for spec, fs in by_spec.items():
        for k in (1, 2, 4):
            pick = [rng.choice(fs) for _ in range(k)]
            containers.append((spec, _container.pack_frames([(f"{names[i % len(names)]}{i}", f) for i, f in enumerate(pick)])))
    containers.append(("-", _container.pack_frames([])))
    spec_seeds = [(s, s.encode()) for s in specs]
    for s in specs:  # canonical forms too (what frames carry)
        canon = codec.get_codec(s).spec
        if canon != s:
            spec_seeds.append((s, canon.encode()))
    out = Seeds({"frame": frames, "container": containers, "spec": spec_seeds, "state": states})
    for name, t in _EXTRA.items():  # targets another layer registered, seeded from the frames
        out.by_target[name] = t.seeds(by_spec, random.Random(1))
    _SEED_CACHE[key] = out
    return out


# ----------------------------------------------------------------------------- mutators
U64 = (
    0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 1023, 1024, 4095, 4096, 65535, 65536,
    (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, 1 << 40, (1 << 40) + 1, 1 << 53,
    1 << 61, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 64) - 2,
)
BITS = (0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 128, 255, 256, 65535)
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


def weighted(rng: random.Random, table):
    total = sum(w for w, _ in table)
    x = rng.random() * total
    for w, f in table:
        x -= w
        if x < 0:
            return f
    return table[-1][1]


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


# -- state dicts
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
    if r == 11:  # a huge array that costs nothing until copied
        return np.broadcast_to(np.zeros((), a.dtype), rng.choice(((1 << 40,), (1 << 20, 1 << 20), (1 << 59,))))
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


MUTATORS = {
    "frame": mutate_frame,
    "container": mutate_container,
    "spec": mutate_spec,
    "state": mutate_state,
}


def mutate(target: str, rng: random.Random, data: bytes, other: bytes | None = None) -> bytes:
    """One mutation of ``data`` (an input of ``target``); ``other`` is a second input to splice."""
    return MUTATORS[target](rng, data, other)


# ----------------------------------------------------------------------------- the oracle
#: per-call bounds (a finding when exceeded)
MEMORY_FLOOR = 64 << 20  #: tracemalloc peak allowed to any call
TIME_BOUND = 5.0  #: seconds any one call may take (inputs are small; generous for a shared machine)
#: the element cap the harness decodes with (codec.decode(max_elements=)): a receiver's way to
#: bound the dense output; decode_sparse runs without it (it allocates no dense output)
MAX_ELEMENTS = 1 << 20


class Finding(Exception):
    """An outcome outside the promise (raised by targets under atheris; returned by check)."""

    def __init__(self, label: str, detail: str = ""):
        super().__init__(f"{label}: {detail}" if detail else label)
        self.label = label
        self.detail = detail


@dataclass
class Outcome:
    """``kind`` is ok, rejected (an expected error; ``label`` names it), invalid (the harness
    could not build the input) or finding (``label`` is the finding class, ``detail`` says more)."""

    kind: str
    label: str
    detail: str = ""

    @property
    def finding(self) -> bool:
        return self.kind == "finding"


_ROOT = Path(__file__).resolve().parent.parent


def _site(tb) -> str:
    """``file:function`` of the innermost traceback frame in codec/ or transport/ (not this file)."""
    frames = traceback.extract_tb(tb)
    pick = None
    for fr in frames:
        p = Path(fr.filename)
        try:
            rel = p.resolve().relative_to(_ROOT)
        except ValueError:
            continue
        if rel.parts[0] in ("codec", "transport") and rel.name != "fuzzing.py":
            pick = f"{rel.as_posix()}:{fr.name}"
    if pick is None and frames:
        fr = frames[-1]
        pick = f"{Path(fr.filename).name}:{fr.name}"
    return pick or "?"


def _recursing(tb) -> str:
    """The function that appears most often in a traceback (the one recursing), as
    ``file:function`` (the path relative to the repository for gradcodec's own files)."""
    counts: dict = {}
    for fr in traceback.extract_tb(tb):
        try:
            name = Path(fr.filename).resolve().relative_to(_ROOT).as_posix()
        except ValueError:
            name = Path(fr.filename).name
        k = f"{name}:{fr.name}"
        counts[k] = counts.get(k, 0) + 1
    return max(counts, key=counts.get) if counts else "?"


def _exc_label(call: str, e: BaseException) -> str:
    if isinstance(e, RecursionError):  # where the limit hits is arbitrary: name what recursed
        inner = _recursing(e.__traceback__)
        site = _site(e.__traceback__)
        e.args = (f"{e} (innermost gradcodec frame: {site})",)
        return f"RecursionError in {inner}"
    return f"{type(e).__name__} at {_site(e.__traceback__)}"


class _Calls:
    """Runs API calls under the memory and time bounds; raises Finding for anything else."""

    def __init__(self, track_memory: bool):
        self.track = track_memory and tracemalloc.is_tracing()

    def call(self, name, fn, *args, expect=(CodecError,), mem_bound=MEMORY_FLOOR, **kw):
        """``(result, None)``, or ``(None, exception)`` for an expected exception type."""
        if self.track:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        err = None
        try:
            res = fn(*args, **kw)
        except expect as e:
            res, err = None, e
        except Finding:
            raise
        except BaseException as e:  # noqa: BLE001 - the point is to catch anything else
            if isinstance(e, KeyboardInterrupt):
                raise
            raise Finding(_exc_label(name, e), f"in {name}: {e}"[:300]) from None
        dt = time.perf_counter() - t0
        if dt > TIME_BOUND:
            raise Finding(f"{name}: slower than {TIME_BOUND:g} s", f"{dt:.2f} s")
        if self.track:
            peak = tracemalloc.get_traced_memory()[1] - base
            if peak > mem_bound:
                raise Finding(f"{name}: allocated above the bound", f"peak {peak} bytes > {mem_bound}")
        return res, err


def _same_nan_aware(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality, except that a NaN equals any NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.tobytes() == b.tobytes():
        return True
    wa, wb = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    na, nb = np.isnan(wa), np.isnan(wb)
    if not np.array_equal(na, nb):
        return False
    ua = a.reshape(-1)[~na]
    ub = b.reshape(-1)[~nb]
    return ua.tobytes() == ub.tobytes()


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values: bitwise except that NaNs are equal and +0.0 equals -0.0 (``0 + -0.0`` is
    ``+0.0`` in IEEE arithmetic, so adding into zeros may lose a zero's sign)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.tobytes() == b.tobytes():
        return True
    wa, wb = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return bool(np.all((wa == wb) | (np.isnan(wa) & np.isnan(wb))))


def _declared(data) -> tuple[int, int]:
    """(declared elements, total raw section bytes) read leniently from a frame's header."""
    f = split_frame(data) if len(data) < (1 << 24) else None
    if f is None:
        return 0, 0
    n = math.prod(f.shape) if len(f.shape) <= 32 else 0
    return n, sum(s[4] for s in f.sections)


def _check_plain(arr, what: str, *, dtype=None, shape=None) -> None:
    if type(arr) is not np.ndarray:
        raise Finding(f"{what} is a {type(arr).__name__}, not a plain ndarray")
    if not arr.flags.c_contiguous:
        raise Finding(f"{what} is not C-contiguous", f"strides {arr.strides} for shape {arr.shape}")
    if dtype is not None and arr.dtype != dtype:
        raise Finding(f"{what} has dtype {arr.dtype}", f"expected {dtype}")
    if shape is not None and arr.shape != tuple(shape):
        raise Finding(f"{what} has another shape", f"{arr.shape}, expected {tuple(shape)}")


def check_frame(data, calls: _Calls, *, extras: bool = True) -> Outcome:
    """The frame oracle (see the module docstring)."""
    n_decl, raw_total = _declared(data)
    sparse_bound = MEMORY_FLOOR + 128 * raw_total
    info, err = calls.call("inspect", codec.inspect, data)
    dec, derr = calls.call("decode", codec.decode, data, max_elements=MAX_ELEMENTS,
                           mem_bound=max(MEMORY_FLOOR, 4 * min(n_decl, MAX_ELEMENTS) * 8))
    if err is not None:  # parse_frame refused it: decode (the same parse) must refuse it too
        if dec is not None:
            raise Finding("inspect refused a frame that decode accepted", str(err)[:200])
        return Outcome("rejected", type(err).__name__)
    sp, serr = calls.call("decode_sparse", codec.decode_sparse, data, expect=(CodecError, ValueError), mem_bound=sparse_bound)
    if serr is not None and not isinstance(serr, CodecError) and "not sparse" not in str(serr):
        raise Finding("decode_sparse: ValueError that is not the documented 'not sparse' one", str(serr)[:200])
    if dec is None:
        if isinstance(derr, CorruptFrameError) and "limit" in str(derr) and info["elements"] > MAX_ELEMENTS:
            label = "over-limit"
            if sp is not None:
                _check_sparse(sp, info)
                label = "over-limit (sparse ok)"
            return Outcome("rejected", label)
        return Outcome("rejected", type(derr).__name__)
    _check_plain(dec, "decode's result")
    if list(dec.shape) != info["shape"] or dec.dtype.name != info["dtype"]:
        raise Finding("decode's shape or dtype differs from inspect's", f"{dec.dtype}{dec.shape} vs {info['dtype']}{info['shape']}")
    bound = max(MEMORY_FLOOR, 4 * dec.nbytes)
    out = np.empty(dec.shape, dec.dtype)
    res, oerr = calls.call("decode(out=)", codec.decode, data, out=out, mem_bound=bound)
    if oerr is not None:
        raise Finding("decode(out=) refused a frame decode accepted", f"{type(oerr).__name__}: {oerr}"[:200])
    if res is not out or not _same_nan_aware(out, dec):
        raise Finding("decode(out=) differs from decode")
    c, cerr = calls.call("get_codec", codec.get_codec, info["codec"], expect=(ValueError, TypeError))
    if cerr is not None:
        raise Finding("a decodable frame names a spec get_codec refuses", str(cerr)[:200])
    acc = np.zeros(dec.shape, dec.dtype)
    res, aerr = calls.call("decode_add", c.decode_add, data, acc, mem_bound=bound)
    if aerr is not None:
        raise Finding("decode_add refused a frame decode accepted", f"{type(aerr).__name__}: {aerr}"[:200])
    if res is not acc:
        raise Finding("decode_add did not return out")
    if not _same_values(acc, dec):
        bad = np.flatnonzero(acc.reshape(-1).astype(np.float64) != dec.reshape(-1).astype(np.float64))
        raise Finding("decode_add into zeros differs from decode", f"{bad.size} elements, first {bad[:3].tolist()} ({info['codec']})")
    if sp is not None:
        pos, vals = _check_sparse(sp, info)
        dense = np.zeros(dec.size, dec.dtype)
        dense[pos] = vals.astype(dec.dtype)
        if not _same_values(dense.reshape(dec.shape), dec):
            raise Finding("decode_sparse disagrees with decode", info["codec"])
    if extras:
        acc = np.zeros(dec.shape, dec.dtype)
        calls.call("decode_add(subtract=True)", c.decode_add, data, acc, subtract=True, mem_bound=bound)
        if not _same_values(acc, -dec):
            raise Finding("decode_add(subtract=True) into zeros differs from -decode", info["codec"])
        for kind in (bytearray, lambda b: np.frombuffer(bytes(b), np.uint8)):
            again, _ = calls.call("decode(other buffer type)", c.decode, kind(data), expect=(), mem_bound=bound)
            if not _same_nan_aware(again, dec):
                raise Finding("decode differs with the buffer type", info["codec"])
        _check_odd_outs(data, dec, calls)
    return Outcome("ok", "ok")


def _check_sparse(sp, info):
    pos, vals = sp
    if not isinstance(pos, np.ndarray) or not isinstance(vals, np.ndarray) or pos.dtype != np.int64 or pos.ndim != 1 or vals.shape != pos.shape:
        raise Finding("decode_sparse returned malformed arrays", f"{getattr(pos, 'dtype', pos)}, {getattr(vals, 'shape', vals)}")
    if pos.size and (pos[0] < 0 or pos[-1] >= info["elements"] or np.any(np.diff(pos) <= 0)):
        raise Finding("decode_sparse positions not sorted, unique and inside the array")
    want = np.float64 if info["dtype"] == "float64" else np.float32
    if vals.dtype != want:
        raise Finding("decode_sparse values have the wrong dtype", f"{vals.dtype}, expected {np.dtype(want)}")
    return pos, vals


_GUARD = 64


def _odd_outs(dec):
    """``(name, out, buffer, mask of out's elements in buffer)`` for out arguments a caller
    might pass by mistake: a strided view, an np.matrix, a Fortran-order view."""
    n = dec.size
    g = _GUARD
    buf = np.zeros(2 * n + 2 * g, dec.dtype)
    mask = np.zeros(buf.size, bool)
    mask[g : g + 2 * n : 2] = True
    yield "strided out", buf[g : g + 2 * n : 2].reshape(dec.shape), buf, mask
    buf = np.zeros(n + 2 * g, dec.dtype)
    mask = np.zeros(buf.size, bool)
    mask[g : g + n] = True
    yield "np.matrix out", buf[g : g + n].reshape(1, n).view(np.matrix), buf, mask
    if dec.ndim >= 2:
        yield "Fortran-order out", buf[g : g + n].reshape(dec.shape[::-1]).T, buf, mask


def _check_odd_outs(data, dec, calls: _Calls) -> None:
    """``out`` arguments a caller might pass by mistake (np.matrix, strided, Fortran order)
    either raise ValueError/TypeError or give decode's result, and never write outside ``out``."""
    if dec.size == 0:
        return
    c = codec.get_codec(codec.inspect(data)["codec"])
    ucode = f"u{dec.itemsize}"
    for name, out, buf, mask in _odd_outs(dec):
        for call, fn in (("decode", codec.decode), ("decode_add", c.decode_add)):
            buf[...] = 7
            out[...] = 0
            guard = buf.view(ucode).copy()
            res, err = calls.call(f"{call}({name})", fn, data, out, expect=(ValueError, TypeError))
            changed = buf.view(ucode) != guard
            if np.any(changed & ~mask):
                raise Finding(f"{call} into a {name} wrote outside it", f"{int(np.sum(changed & ~mask))} elements")
            if err is None and not _same_values(np.array(out).reshape(dec.shape), dec):
                raise Finding(f"{call} into a {name} gave a different result")


def check_container(data, calls: _Calls) -> Outcome:
    items, err = calls.call("unpack_frames", _container.unpack_frames, data)
    if err is not None:
        return Outcome("rejected", type(err).__name__)
    if not isinstance(items, list) or any(not isinstance(n, str) or not isinstance(f, memoryview) for n, f in items):
        raise Finding("unpack_frames returned something else than [(str, memoryview)]")
    flagged = bool(bytes(data[5:6]) and data[5] & CFLAG_CRC32C)
    again, _ = calls.call("pack_frames", _container.pack_frames, items, checksum=flagged, expect=())
    if again != bytes(data):
        raise Finding("an accepted container does not pack back to the same bytes")
    labels = []
    for _, f in items:
        labels.append(check_frame(f, calls, extras=False).label)
    return Outcome("ok", "ok" if not labels else "ok+" + "/".join(sorted(set(labels))))


_SPEC_ARRAYS = None


def _spec_arrays():
    global _SPEC_ARRAYS
    if _SPEC_ARRAYS is None:
        rng = np.random.default_rng(5)
        _SPEC_ARRAYS = [
            rng.standard_normal(37).astype(np.float32),
            (rng.standard_normal((5, 7)) * 0.1).astype(np.float16),
            rng.standard_normal((4, 6)).astype(bfloat16),
            np.array(1.5, np.float64),
        ]
    return _SPEC_ARRAYS


def _msg_ok(e: BaseException) -> bool:
    return bool(str(e).strip())


def check_spec(data, calls: _Calls) -> Outcome:
    text = bytes(data).decode("utf-8", "replace")
    c, err = calls.call("get_codec", codec.get_codec, text, expect=(ValueError, TypeError))
    if err is not None:
        if not _msg_ok(err):
            raise Finding(f"get_codec: {type(err).__name__} without a message")
        return Outcome("rejected", type(err).__name__)
    for what, again in (("spec", c.spec), ("config", c.get_config())):
        back, berr = calls.call(f"get_codec(codec.{what})", codec.get_codec, again, expect=(ValueError, TypeError))
        if berr is not None:
            raise Finding(f"a codec's canonical {what} does not parse back", f"{text!r} -> {again!r}: {berr}"[:300])
        if back != c:
            raise Finding(f"a codec's canonical {what} gives another codec", f"{text!r} -> {again!r}"[:300])
    ef = codec.ErrorFeedback(c)
    for arr in _spec_arrays()[:2]:  # the error-feedback path (fused kernels) too, two steps
        for _ in range(2):
            frame, eerr = calls.call("ErrorFeedback.encode", ef.encode, arr, "k", expect=(ValueError, TypeError))
            if eerr is not None:
                if not _msg_ok(eerr):
                    raise Finding(f"ErrorFeedback.encode: {type(eerr).__name__} without a message")
                break
            dec, _ = calls.call("decode", codec.decode, frame, expect=())
            _check_plain(dec, "decode's result", dtype=arr.dtype, shape=arr.shape)
        ef.reset(all=True)
    for arr in _spec_arrays():
        frame, eerr = calls.call("encode", c.encode, arr, expect=(ValueError, TypeError))
        if eerr is not None:
            if not _msg_ok(eerr):
                raise Finding(f"encode: {type(eerr).__name__} without a message")
            continue
        dec, derr = calls.call("decode", codec.decode, frame, expect=())
        _check_plain(dec, "decode's result", dtype=arr.dtype, shape=arr.shape)
        if c.lossless and not _same_nan_aware(dec, arr):
            raise Finding("a lossless codec changed the data", c.spec)
    return Outcome("ok", "ok")


_FIELDS = ("state", "slot", "residual", "step", "key", "velocity", "codec", "momentum")


def _prior_state(ef):
    """Give ``ef`` a key of its own before the load (None if its codec cannot encode it)."""
    try:
        ef.encode(np.linspace(-1, 1, 24).astype(np.float32).reshape(4, 6), key="__prior__")
        return ef.state_dict()
    except (ValueError, TypeError):
        return None


def _same_state(a, b) -> bool:
    if a["codec"] != b["codec"] or a["momentum"] != b["momentum"] or len(a["slots"]) != len(b["slots"]):
        return False
    for x, y in zip(a["slots"], b["slots"]):
        if x["key"] != y["key"] or x["step"] != y["step"] or not _same_nan_aware(x["residual"], y["residual"]):
            return False
    return True


def check_state(data, calls: _Calls) -> Outcome:
    try:
        obj = loads_state(bytes(data))
        spec, momentum, state = obj["codec"], obj["momentum"], obj["state"]
        ef = codec.ErrorFeedback(spec, momentum=momentum)
    except Exception:  # noqa: BLE001 - not an input the harness can use (a damaged pickle)
        return Outcome("invalid", "unreadable")
    before = _prior_state(ef)
    _, err = calls.call("load_state_dict", ef.load_state_dict, state, expect=(ValueError, TypeError))
    # unpickling an ErrorFeedback reads the same state through __setstate__ (codec and
    # momentum from the state): refused or accepted, with the same kinds of errors
    blank = codec.ErrorFeedback.__new__(codec.ErrorFeedback)
    _, perr = calls.call("ErrorFeedback.__setstate__", blank.__setstate__, state, expect=(ValueError, TypeError))
    for e, what in ((err, "load_state_dict"), (perr, "__setstate__")):
        if e is not None and not any(w in str(e) for w in _FIELDS):
            raise Finding(f"{what}: {type(e).__name__} that names no field", str(e)[:200])
    if err is not None:
        if before is not None and not _same_state(before, ef.state_dict()):
            raise Finding("a refused load_state_dict changed the ErrorFeedback", str(err)[:200])
        return Outcome("rejected", type(err).__name__)
    for key in ef.keys():
        slot = ef._slots[key]
        res = slot.residual
        _check_plain(res, "a loaded residual")
        if res.dtype not in CODES.values():
            raise Finding("a loaded residual has a non-float dtype", str(res.dtype))
        if not res.flags.writeable:
            raise Finding("a loaded residual is read-only")
        if type(slot.step) is not int or slot.step < 0:
            raise Finding("a loaded step is not an int >= 0", repr(slot.step)[:60])
        if slot.velocity is not None:
            _check_plain(slot.velocity, "a loaded velocity", dtype=res.dtype, shape=res.shape)
        x = np.linspace(-1, 1, res.size).astype(res.dtype).reshape(res.shape)
        frame, eerr = calls.call("ErrorFeedback.encode", ef.encode, x, key, expect=(ValueError, TypeError))
        if eerr is not None:
            if not _msg_ok(eerr):
                raise Finding(f"encode after load: {type(eerr).__name__} without a message")
            continue
        dec, _ = calls.call("decode", codec.decode, frame, expect=())
        _check_plain(dec, "decode's result", dtype=res.dtype, shape=res.shape)
        _check_plain(ef._slots[key].residual, "the residual after an encode", dtype=res.dtype, shape=res.shape)
    return Outcome("ok", "ok")


CHECKS = {
    "frame": lambda d, c: check_frame(d, c),
    "container": check_container,
    "spec": check_spec,
    "state": check_state,
}


def check(target: str, data: bytes, *, track_memory: bool = True, extras: bool = True) -> Outcome:
    """Run one input through ``target`` and classify the outcome (see :class:`Outcome`).

    Memory is measured with tracemalloc when ``track_memory`` (started and stopped here if
    it is not running); ``extras`` adds the frame target's checks of odd ``out`` arguments."""
    started = False
    if track_memory and not tracemalloc.is_tracing():
        tracemalloc.start()
        started = True
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            calls = _Calls(track_memory)
            if target == "frame":
                return check_frame(data, calls, extras=extras)
            return CHECKS[target](data, calls)
    except Finding as f:
        return Outcome("finding", f.label, f.detail)
    finally:
        if started:
            tracemalloc.stop()


def known_labels(corpus_dir, target: str) -> set:
    """The finding classes the regression corpus ``corpus_dir/<target>/`` still shows."""
    d = Path(corpus_dir) / target
    out = set()
    for p in sorted(d.iterdir()) if d.is_dir() else ():
        if p.is_file() and p.suffix != ".md":
            o = check(target, p.read_bytes())
            if o.finding:
                out.add(o.label)
    return out


def target_function(target: str, track_memory: bool = False, ignore=frozenset()):
    """``f(data: bytes)`` raising :class:`Finding` on an outcome outside the promise (for
    atheris); finding classes in ``ignore`` (known ones, see :func:`known_labels`) pass."""

    def one(data: bytes) -> None:
        out = check(target, bytes(data), track_memory=track_memory)
        if out.finding and out.label not in ignore:
            raise Finding(out.label, out.detail)

    return one


# ----------------------------------------------------------------------------- the loop
@dataclass
class Stats:
    """What one run did: inputs, outcomes by label, findings (label -> smallest input), time."""

    target: str
    inputs: int = 0
    seconds: float = 0.0
    outcomes: dict = field(default_factory=dict)
    findings: dict = field(default_factory=dict)  # label -> {"count", "detail", "size", "file"}
    per_codec: dict = field(default_factory=dict)
    crashes: list = field(default_factory=list)  # [{"kind", "file", "iteration"}]

    def add(self, other: "Stats") -> None:
        self.inputs += other.inputs
        self.seconds += other.seconds
        for k, v in other.outcomes.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v
        for k, v in other.per_codec.items():
            self.per_codec[k] = self.per_codec.get(k, 0) + v
        for k, v in other.findings.items():
            mine = self.findings.get(k)
            if mine is None:
                self.findings[k] = dict(v)
            else:
                mine["count"] += v["count"]
                if v["size"] < mine["size"]:
                    mine.update(size=v["size"], file=v["file"], detail=v["detail"])
        self.crashes += other.crashes

    def to_json(self) -> dict:
        return {"target": self.target, "inputs": self.inputs, "seconds": round(self.seconds, 2), "outcomes": self.outcomes,
                "findings": self.findings, "per_codec": self.per_codec, "crashes": self.crashes}

    @classmethod
    def from_json(cls, d: dict) -> "Stats":
        return cls(d["target"], d["inputs"], d["seconds"], d["outcomes"], d["findings"], d.get("per_codec", {}), d.get("crashes", []))

    @property
    def n_findings(self) -> int:
        return sum(v["count"] for v in self.findings.values()) + len(self.crashes)


def _outcome_key(o: Outcome) -> str:
    if o.kind == "finding":
        return "FINDING"
    if o.kind == "ok":
        return "ok"
    return f"{o.kind}:{o.label}"


def input_name(kind: str, data: bytes) -> str:
    return f"{kind}-{hashlib.sha1(data).hexdigest()[:16]}"


class _Beacon:
    """The input in flight, in a file the parent maps: iteration, length, bytes (so a crash or
    hang is attributed to its input even when the child dies without a word)."""

    HEAD = struct.Struct("<QQdI")  # iteration + 1 (0: idle), length, start time, state (1 in call)
    SIZE = 1 << 24

    def __init__(self, path):
        import mmap

        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self.fd, self.SIZE)
        self.mm = mmap.mmap(self.fd, self.SIZE)

    def begin(self, i: int, data: bytes) -> None:
        n = min(len(data), self.SIZE - self.HEAD.size)
        self.mm[self.HEAD.size : self.HEAD.size + n] = data[:n]
        self.HEAD.pack_into(self.mm, 0, i + 1, n, time.time(), 1)

    def end(self) -> None:
        struct.pack_into("<I", self.mm, 24, 0)

    @classmethod
    def read(cls, path):
        try:
            with open(path, "rb") as fh:
                head = fh.read(cls.HEAD.size)
                it, n, t, busy = cls.HEAD.unpack(head)
                return it - 1, fh.read(n), t, busy
        except (OSError, struct.error):
            return -1, b"", 0.0, 0


#: memory checks: "all" (tracemalloc on every input: ~3-5x slower), "sample" (tracemalloc on
#: one input in MEMORY_SAMPLE, the peak RSS of every input), "off"
MEMORY_MODES = ("all", "sample", "off")
MEMORY_SAMPLE = 16
#: the odd-out checks (np.matrix, strided, Fortran ``out``) run on one frame in EXTRAS_SAMPLE
EXTRAS_SAMPLE = 8
#: growth of the process's peak RSS during one input that is a finding
RSS_BOUND = 256 << 20


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fuzz_loop(target: str, *, seconds: float = 60.0, iterations: int | None = None, seed: int = 0, start: int = 0,
              memory: str = "sample", findings_dir=None, beacon=None, report=None, full_seeds: bool = True,
              report_every: float = 1.0, log=None, deadline: float | None = None) -> Stats:
    """The mutation loop: input ``i`` is a deterministic mutation (seed, i) of a seed input
    (the first ``len(seeds)`` inputs are the seeds themselves); runs until ``seconds`` pass
    or input ``iterations`` is reached (counting from 0; this run starts at ``start``)."""
    if memory not in MEMORY_MODES:
        raise ValueError(f"memory: one of {MEMORY_MODES}, got {memory!r}")
    seeds = seed_corpus(full=full_seeds).of(target)
    stats = Stats(target)
    if findings_dir is not None:
        findings_dir = Path(findings_dir)
        findings_dir.mkdir(parents=True, exist_ok=True)
    bc = _Beacon(beacon) if beacon else None
    if memory == "all" and not tracemalloc.is_tracing():
        tracemalloc.start()
    if deadline is not None:  # an absolute end (time.time()): the parent's budget includes our start-up
        seconds = min(seconds, deadline - time.time())
    t0 = time.perf_counter()  # seed corpus generation is not counted
    last = t0
    i = start
    mutator = MUTATORS[target]
    rss = _maxrss()
    # self-test hooks (tests/test_fuzz.py): die or hang at a given input, to test supervise()
    crash_at = int(os.environ.get("GRADCODEC_FUZZ_SELFTEST_CRASH", -1))
    hang_at = int(os.environ.get("GRADCODEC_FUZZ_SELFTEST_HANG", -1))
    while True:
        if iterations is not None and i >= iterations:
            break
        now = time.perf_counter()
        if now - t0 >= seconds:
            break
        rng = random.Random((seed << 40) ^ i)
        label, data = seeds[rng.randrange(len(seeds))] if i >= len(seeds) else seeds[i]
        if i >= len(seeds):
            try:
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")
                    for _ in range(1 + (rng.random() < 0.25)):
                        other = seeds[rng.randrange(len(seeds))][1]
                        data = mutator(rng, data, other)
            except Exception as e:  # noqa: BLE001 - a harness bug must not stop the run; it is counted
                k = f"invalid:mutator {type(e).__name__}"
                stats.outcomes[k] = stats.outcomes.get(k, 0) + 1
                if log is not None and stats.outcomes[k] == 1:
                    print(f"[{target}] mutator error at input {i}: {type(e).__name__}: {e}", file=log, flush=True)
                i += 1
                continue
        if bc:
            bc.begin(i, data)
        if i == crash_at:
            os.abort()
        if i == hang_at:
            time.sleep(3600)
        out = check(target, data, track_memory=memory == "all" or (memory == "sample" and i % MEMORY_SAMPLE == 0),
                    extras=i % EXTRAS_SAMPLE == 0)
        if memory != "off":
            grown = _maxrss()
            if grown - rss > RSS_BOUND and not out.finding:
                out = Outcome("finding", f"{target}: peak RSS grew by more than {RSS_BOUND >> 20} MiB in one input", f"{(grown - rss) >> 20} MiB")
            rss = grown
        if bc:
            bc.end()
        stats.inputs += 1
        k = _outcome_key(out)
        stats.outcomes[k] = stats.outcomes.get(k, 0) + 1
        stats.per_codec[label] = stats.per_codec.get(label, 0) + 1
        if out.finding:
            f = stats.findings.get(out.label)
            if f is None or len(data) < f["size"]:
                path = None
                if findings_dir is not None:
                    path = findings_dir / input_name("finding", data)
                    path.write_bytes(data)
                    if f is not None and f.get("file") and Path(f["file"]).exists() and f["file"] != str(path):
                        Path(f["file"]).unlink()
                if log is not None and f is None:
                    print(f"[{target}] finding: {out.label} ({out.detail[:120]})", file=log, flush=True)
                stats.findings[out.label] = {"count": (f or {"count": 0})["count"], "detail": out.detail, "size": len(data),
                                             "file": str(path) if path else None}
            stats.findings[out.label]["count"] += 1
        i += 1
        if report is not None and now - last > report_every:
            last = now
            stats.seconds = now - t0
            _write_json(report, {**stats.to_json(), "next": i})
    stats.seconds = time.perf_counter() - t0
    if report is not None:
        _write_json(report, {**stats.to_json(), "next": i, "done": True})
    return stats


def _write_json(path, obj) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- supervision
def _child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("NUMBA_NUM_THREADS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def supervise(target: str, *, seconds: float = 60.0, iterations: int | None = None, seed: int = 0,
              corpus_dir=None, findings_dir=None, memory: str = "sample", hang_seconds: float = 60.0,
              memory_limit: int | None = 3 << 30, full_seeds: bool = True, log=sys.stderr) -> Stats:
    """Run :func:`fuzz_loop` in a child process; when the child dies (SIGSEGV, abort, killed
    for a hang or for memory) save the input it was running to ``corpus_dir/<target>/crash-<hash>``
    (``hang-<hash>``) and start a new child at the next input, until the time or the
    iterations are used up.  Returns the merged :class:`Stats`."""
    total = Stats(target)
    corpus = Path(corpus_dir) / target if corpus_dir is not None else None
    start = 0
    deadline = time.monotonic() + seconds
    with tempfile.TemporaryDirectory(prefix="gcfuzz-") as tmp:
        beacon = os.path.join(tmp, "beacon")
        n_child = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0.5 or (iterations is not None and start >= iterations):
                break
            report = os.path.join(tmp, f"report{n_child}.json")
            n_child += 1
            module = _EXTRA[target].module if target in _EXTRA else "codec.fuzzing"
            args = [sys.executable, "-m", module, "--child", "--target", target, "--seconds", str(left),
                    "--deadline", repr(time.time() + left),
                    "--seed", str(seed), "--start", str(start), "--beacon", beacon, "--report", report]
            if iterations is not None:
                args += ["--iterations", str(iterations)]
            if findings_dir is not None:
                args += ["--findings-dir", str(Path(findings_dir) / target)]
            args += ["--memory", memory]
            if not full_seeds:
                args.append("--small-seeds")
            if memory_limit:
                args += ["--memory-limit", str(memory_limit)]
            errpath = os.path.join(tmp, f"stderr{n_child}")
            with open(errpath, "wb") as errfh:
                proc = subprocess.Popen(args, env=_child_env(), cwd=str(_ROOT), stderr=errfh)
            hung = None
            while proc.poll() is None:
                time.sleep(0.2)
                it, data, t, busy = _Beacon.read(beacon)
                if busy and it >= 0 and time.time() - t > hang_seconds:
                    hung = (it, data)
                    proc.kill()
                    proc.wait()
                    break
                if time.monotonic() > deadline + hang_seconds + 120:  # the child ignores its own clock
                    proc.kill()
                    proc.wait()
                    break
            rc = proc.returncode
            with open(errpath, "rb") as fh:
                err_text = fh.read().decode("utf-8", "replace")
            if log is not None and err_text.strip():
                print(err_text[-4000:], file=log, end="", flush=True)
            part, nxt = None, start
            if os.path.exists(report):
                with open(report) as fh:
                    d = json.load(fh)
                part, nxt = Stats.from_json(d), d.get("next", start)
                total.add(part)
            it, data, _, busy = _Beacon.read(beacon)
            if rc == 0 and hung is None:
                break
            if busy and it > nxt:  # inputs run after the child's last report: counted, outcomes unknown
                total.inputs += it - nxt
                total.outcomes["unreported (child died)"] = total.outcomes.get("unreported (child died)", 0) + it - nxt
            # the child died in a call: the beacon holds the input
            if hung is not None:
                kind, (it, data) = "hang", hung
            else:
                kind = "crash"
            if busy and it >= 0:
                entry = {"kind": kind, "signal": -rc if rc and rc < 0 else None, "rc": rc, "iteration": it, "file": None, "size": len(data),
                         "stderr_tail": err_text[-2000:]}
                if corpus is not None:
                    corpus.mkdir(parents=True, exist_ok=True)
                    path = corpus / input_name(kind, data)
                    path.write_bytes(data)
                    entry["file"] = str(path)
                total.crashes.append(entry)
                total.inputs += 1
                total.outcomes["FINDING"] = total.outcomes.get("FINDING", 0) + 1
                if log is not None:
                    print(f"[{target}] {kind} at input {it} (rc {rc}); saved {entry['file']}", file=log, flush=True)
                start = max(nxt, it + 1)
            else:
                if log is not None:
                    print(f"[{target}] child exited with rc {rc} outside a call", file=log, flush=True)
                total.crashes.append({"kind": "child-exit", "rc": rc, "iteration": nxt, "file": None, "size": 0, "stderr_tail": err_text[-2000:]})
                start = nxt + 1
            try:
                os.unlink(beacon)
            except OSError:
                pass
    return total


def format_stats(stats: Stats) -> str:
    lines = [f"target {stats.target}: {stats.inputs} inputs in {stats.seconds:.1f} s"
             f" ({stats.inputs / stats.seconds if stats.seconds else 0:.0f}/s)"]
    for k, v in sorted(stats.outcomes.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {v:>10}  {k}")
    if stats.findings or stats.crashes:
        lines.append(f"  findings ({len(stats.findings)} classes, {stats.n_findings} inputs):")
        for k, v in sorted(stats.findings.items()):
            lines.append(f"    {v['count']:>8} x {k}  [{v['size']} B{', ' + v['file'] if v['file'] else ''}]  {v['detail'][:100]}")
        for c in stats.crashes:
            lines.append(f"    {c['kind']} (rc {c['rc']}) at input {c['iteration']}: {c['file']}")
    else:
        lines.append("  no outcome outside the promise")
    return "\n".join(lines)


def child_main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m codec.fuzzing")
    p.add_argument("--child", action="store_true")
    p.add_argument("--target", choices=TARGETS, required=True)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--iterations", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--deadline", type=float)
    p.add_argument("--beacon")
    p.add_argument("--report")
    p.add_argument("--findings-dir")
    p.add_argument("--memory", choices=MEMORY_MODES, default="sample")
    p.add_argument("--small-seeds", action="store_true")
    p.add_argument("--memory-limit", type=int)
    a = p.parse_args(argv)
    if a.memory_limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (a.memory_limit, a.memory_limit))
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    import faulthandler

    faulthandler.enable()
    fuzz_loop(a.target, seconds=a.seconds, iterations=a.iterations, seed=a.seed, start=a.start, beacon=a.beacon,
              report=a.report, findings_dir=a.findings_dir, memory=a.memory, full_seeds=not a.small_seeds,
              log=sys.stderr, deadline=a.deadline)
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
