"""Frame format v2: many tensors in one frame (docs/format.md, "Many-tensor frames").

A v2 frame holds every tensor of a step (a model's gradients) coded by one codec: the spec
once, then a compact table, then one payload.  Per tensor the frame carries its dtype and
shape (or nothing, in the layout-hash form) and, per section, only its item count as a
varint: the kind and item width of a tensor's sections are named once per distinct
*pattern* in a small pattern table.  Every section's raw bytes follow in tensor order; a
``zstd`` stage compresses the whole payload as one zstd frame.

Two forms:

* **table** (the default): the layout (dtype and shape of every tensor, and their names when
  the frame was encoded from a dict) is written in the frame; the frame decodes alone.
* **hash**: the layout is replaced by its 8-byte BLAKE2b hash (:attr:`Layout.hash`); for
  peers that already agreed on the layout (the transport checks it every step), decoding
  needs the layout and refuses a frame whose hash differs.

``parse_many`` validates the whole header, in the documented order and before allocating
anything in proportion to a declared size, and raises :class:`CorruptFrameError` with a
one-line reason at the first failure.  The same magic starts v1 and v2 frames; the version
byte tells them apart.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from codec import dtypes
from codec.errors import CorruptFrameError
from codec.frame import (
    CHECKSUMS,
    MAGIC,
    MAX_ELEMENTS,
    MAX_ELEMENTS_LIMIT,
    MAX_NDIM,
    MAX_SPEC,
    SECTION_BYTES_PER_ELEMENT,
    Encoding,
    Frame,
    SectionInfo,
    _new_bytes,
    raw_length,
)

VERSION = 2
#: flags bits 0 and 1: the payload checksum, exactly as in format v1
FLAG_PAYLOAD_CRC = 0x01
FLAG_PAYLOAD_CRC32C = 0x02
#: flags bit 2: the layout is given by its 8-byte hash instead of the table
FLAG_LAYOUT_HASH = 0x04
#: flags bit 3: the layout names its tensors (a frame encoded from a dict)
FLAG_NAMES = 0x08
#: flags bit 4: the payload is stored as one zstd frame
FLAG_ZSTD = 0x10
#: flags bit 5: the tensors are coded as one, their concatenation (one entry of sections)
FLAG_JOINT = 0x20
_CHECKSUM_FLAGS = FLAG_PAYLOAD_CRC | FLAG_PAYLOAD_CRC32C
_KNOWN_FLAGS = 0x3F
#: the most sections one tensor may have (a pattern's count is one byte)
MAX_SECTIONS = 255
HASH_SIZE = 8

_FIXED = struct.Struct("<4sBBH")  # magic, version, flags, reserved
_CRC = struct.Struct("<I")
FIXED_SIZE = _FIXED.size  # 8


# ------------------------------------------------------------------------ varints
def put_varint(out: bytearray, v: int) -> None:
    """Append ``v`` (0 <= v < 2**64) as an unsigned LEB128 varint: 7 bits per byte, low
    groups first, the high bit set on every byte but the last."""
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


class _Cursor:
    """Reads a header field by field, never past ``end`` (CorruptFrameError instead)."""

    __slots__ = ("mv", "pos", "end")

    def __init__(self, mv, pos: int, end: int):
        self.mv, self.pos, self.end = mv, pos, end

    def byte(self, what: str) -> int:
        if self.pos >= self.end:
            raise CorruptFrameError(f"many-tensor frame: header ends inside {what}")
        b = self.mv[self.pos]
        self.pos += 1
        return b

    def varint(self, what: str) -> int:
        mv, pos, end = self.mv, self.pos, self.end
        if pos < end and mv[pos] < 0x80:  # one byte: most counts and every small field
            self.pos = pos + 1
            return mv[pos]
        v = shift = 0
        while True:
            if pos >= end:
                raise CorruptFrameError(f"many-tensor frame: header ends inside {what}")
            b = mv[pos]
            pos += 1
            v |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 63:
                raise CorruptFrameError(f"many-tensor frame: {what} is a varint longer than 10 bytes")
        if (b == 0 and shift) or v >> 64:
            raise CorruptFrameError(f"many-tensor frame: {what} is not a minimal varint below 2**64")
        self.pos = pos
        return v

    def take(self, size: int, what: str):
        if size > self.end - self.pos:
            raise CorruptFrameError(f"many-tensor frame: {what} ({size} bytes) runs past the header")
        start = self.pos
        self.pos += size
        return self.mv[start : self.pos]


# ------------------------------------------------------------------------ layout
@dataclass(frozen=True)
class Layout:
    """The dtype and shape of every tensor of a many-tensor frame, in order, and their names
    (None for a frame encoded from a list).  ``Layout.of(tensors)`` reads it off arrays;
    :attr:`hash` is what the layout-hash form stores."""

    shapes: tuple
    dtypes: tuple
    names: tuple | None = None
    sizes: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if len(self.shapes) != len(self.dtypes) or (self.names is not None and len(self.names) != len(self.shapes)):
            raise ValueError("layout: shapes, dtypes and names must have one entry per tensor")
        object.__setattr__(self, "sizes", tuple(math.prod(s) for s in self.shapes))  # elements per tensor

    @classmethod
    def of(cls, tensors) -> "Layout":
        """The layout of ``tensors``: a dict name -> array (names kept) or a sequence of arrays;
        anything with ``shape`` and ``dtype``."""
        if isinstance(tensors, dict):
            names, arrays = tuple(tensors), tuple(tensors.values())
        else:
            names, arrays = None, tuple(tensors)
        return cls(tuple(tuple(int(d) for d in a.shape) for a in arrays), tuple(np.dtype(a.dtype) for a in arrays), names)

    def __len__(self) -> int:
        return len(self.shapes)

    def table(self) -> bytes:
        """The layout's bytes as the table form writes them (docs/format.md)."""
        out = bytearray()
        for i, (shape, dt) in enumerate(zip(self.shapes, self.dtypes)):
            out.append(dtypes.code_of(dt))
            if len(shape) > MAX_NDIM:
                raise ValueError(f"tensors[{i}]: {len(shape)} dimensions; the frame format allows {MAX_NDIM}")
            out.append(len(shape))
            for d in shape:
                put_varint(out, d)
            if self.names is not None:
                name = self.names[i]
                if not isinstance(name, str):
                    raise TypeError(f"tensors: a name must be a str, got {type(name).__name__}")
                b = name.encode("utf-8")
                put_varint(out, len(b))
                out += b
        return bytes(out)

    @property
    def hash(self) -> bytes:
        """BLAKE2b-64 of :meth:`table`, prefixed by the tensor count (as a varint)."""
        head = bytearray()
        put_varint(head, len(self))
        return hashlib.blake2b(bytes(head) + self.table(), digest_size=HASH_SIZE).digest()


def as_layout(layout) -> Layout:
    """``layout`` as a :class:`Layout`: one already, or tensors to read it off."""
    if isinstance(layout, Layout):
        return layout
    if isinstance(layout, (dict, list, tuple)):
        return Layout.of(layout)
    raise TypeError(f"layout: expected a codec.Layout or the tensors (dict or list), got {type(layout).__name__}")


# ------------------------------------------------------------------------ building
@dataclass(frozen=True)
class Entry:
    """A section as the table describes it (kind, item width, count), without its bytes:
    what :func:`build_many` takes for a tensor whose bytes another piece holds."""

    kind: int
    bits: int
    count: int

    @property
    def raw_len(self) -> int:
        return raw_length(self.count, self.bits)


def build_many(spec: str, layout: Layout, sections, *, form: str = "table", compressor=None, checksum: str | None = None, pieces=None, joint: bool = False) -> bytes:
    """A v2 frame of ``layout``'s tensors, ``sections[i]`` being tensor i's list of
    :class:`codec.frame.Section`.  ``form``: "table" or "hash"; ``compressor``/``checksum``
    as for :func:`codec.frame.build_frame` (the compressor sees the whole payload).

    ``pieces``: the payload's bytes in order, when they are not the sections' own: a list of
    Sections whose raw lengths add up to the sections', such as one section coding a run of
    consecutive tensors at once (an elementwise value stage); then ``sections`` only
    describe the table (their kinds, widths and counts).

    ``joint``: the tensors were coded as one, their concatenation: ``sections`` holds one
    list, that of the concatenation (the layout's tensors must share a dtype)."""
    if form not in ("table", "hash"):
        raise ValueError(f"layout: expected 'table' or 'hash', got {form!r}")
    spec_b = spec.encode("utf-8")
    if len(spec_b) > MAX_SPEC:
        raise ValueError(f"spec is {len(spec_b)} bytes; the frame format allows {MAX_SPEC}")
    flags = FLAG_LAYOUT_HASH if form == "hash" else 0
    if layout.names is not None:
        flags |= FLAG_NAMES
    if joint:
        if len(sections) != 1 or len(set(layout.dtypes)) > 1:
            raise AssertionError("build_many: a joint frame has one list of sections and one dtype")
        flags |= FLAG_JOINT
    elif len(sections) != len(layout):
        raise AssertionError("build_many: one list of sections per tensor")
    head = bytearray(FIXED_SIZE)
    put_varint(head, len(spec_b))
    head += spec_b
    put_varint(head, len(layout))
    head += layout.hash if form == "hash" else layout.table()
    patterns: dict = {}
    body = bytearray()  # per tensor: pattern id and counts
    payload_len = 0
    for secs in sections:
        if len(secs) > MAX_SECTIONS:
            raise ValueError(f"a tensor's codec made {len(secs)} sections; a many-tensor frame allows {MAX_SECTIONS}")
        pattern = tuple((s.kind, s.bits) for s in secs)
        put_varint(body, patterns.setdefault(pattern, len(patterns)))
        for s in secs:
            put_varint(body, s.count)
            payload_len += s.raw_len
    if pieces is None:
        pieces = [s for secs in sections for s in secs]
    elif sum(p.raw_len for p in pieces) != payload_len:
        raise AssertionError("build_many: the pieces do not hold the sections' bytes")
    put_varint(head, len(patterns))
    for pattern in patterns:
        head.append(len(pattern))
        for kind, bits in pattern:
            head.append(kind)
            head.append(bits)
    head += body
    stored = None
    if compressor is not None and payload_len:
        raw = np.empty(payload_len, np.uint8)
        _fill(raw, pieces)
        enc, data = compressor(memoryview(raw))
        if enc == Encoding.ZSTD:
            flags |= FLAG_ZSTD
            put_varint(head, payload_len)
            stored = np.frombuffer(data, np.uint8)
        else:
            stored = raw
    flag, payload_crc = CHECKSUMS[checksum] if checksum is not None else (0, None)
    flags |= flag
    header_len = len(head) + _CRC.size * (2 if flag else 1)
    size = header_len + (payload_len if stored is None else stored.size)
    frame, out = _new_bytes(size)
    if stored is None:
        _fill(out[header_len:], pieces)
    else:
        out[header_len:] = stored
    _FIXED.pack_into(head, 0, MAGIC, VERSION, flags, 0)
    if flag:
        head += _CRC.pack(payload_crc(out[header_len:]))
    head += _CRC.pack(zlib.crc32(head))
    out[:header_len] = np.frombuffer(head, np.uint8)
    return frame


def _fill(out: np.ndarray, pieces) -> None:
    pos = 0
    for s in pieces:
        size = s.raw_len
        if s.data is None:
            s.fill(out[pos : pos + size])
        else:
            out[pos : pos + size] = np.frombuffer(s.data, np.uint8, size)
        pos += size


# ------------------------------------------------------------------------ parsing
@dataclass
class ManyFrame:
    """A validated v2 frame: the spec, the layout, and per tensor a v1-shaped
    :class:`codec.frame.Frame` view (:meth:`tensor`) over the (decompressed) payload."""

    spec: str
    flags: int
    layout: Layout
    header_len: int
    payload: object  # a memoryview, or a ZstdPayload
    stored_len: int
    tensor_sections: list

    @property
    def checksum(self) -> str | None:
        return next((name for name, (bit, _) in CHECKSUMS.items() if self.flags & bit), None)

    @property
    def joint(self) -> bool:
        """The tensors were coded as one (their concatenation): read it with :meth:`whole`."""
        return bool(self.flags & FLAG_JOINT)

    def tensor(self, i: int) -> Frame:
        """Tensor ``i`` as a frame the pipeline reads like any v1 frame."""
        if self.joint:
            raise ValueError("a joint many-tensor frame codes its tensors as one: read it with whole()")
        lay = self.layout
        return Frame(self.payload, VERSION, self.flags, lay.dtypes[i], lay.shapes[i], self.spec, self.tensor_sections[i], 0)

    def whole(self) -> Frame:
        """A joint frame's concatenation as one flat tensor, a frame the pipeline reads."""
        lay = self.layout
        dtype = lay.dtypes[0] if len(lay) else np.dtype(np.float32)
        return Frame(self.payload, VERSION, self.flags, dtype, (sum(lay.sizes),), self.spec, self.tensor_sections[0], 0)

    def __len__(self) -> int:
        return len(self.layout)

    def finish(self) -> None:
        """After every section was read: a compressed payload held exactly its declared
        bytes (a raw payload was checked when the frame was parsed)."""
        if isinstance(self.payload, ZstdPayload):
            self.payload.finish()


def is_many(buf) -> bool:
    """Whether ``buf`` starts like a v2 (many-tensor) frame; nothing else is checked."""
    try:
        mv = memoryview(buf).cast("B")
    except (TypeError, ValueError):
        return False
    return mv.nbytes > 4 and mv[:4] == MAGIC and mv[4] == VERSION


@dataclass
class Header:
    """The fields of a v2 header as :func:`read_header` walks them (nothing checked beyond
    the buffer's bounds and the varints' form; the CRC sits at ``crc_at``)."""

    flags: int
    spec_raw: bytes
    count: int
    named: bool
    stored_hash: bytes | None
    shapes: list | None
    dtypes: list | None
    names: list | None
    per_tensor: list
    raw_total: int | None
    crc_at: int
    header_len: int


def read_header(mv) -> Header:
    """Walk a v2 header field by field, each bounded by the buffer: CorruptFrameError at the
    first field that does not fit.  The fixed 8 bytes must already have been checked."""
    size = mv.nbytes
    flags = mv[5]
    cur = _Cursor(mv, FIXED_SIZE, size)
    spec_len = cur.varint("the spec length")
    if spec_len > MAX_SPEC:
        raise CorruptFrameError(f"header declares a {spec_len}-byte spec, beyond the format's {MAX_SPEC}")
    spec_raw = bytes(cur.take(spec_len, "the spec"))
    count = cur.varint("the tensor count")
    described = not (flags & FLAG_LAYOUT_HASH and flags & FLAG_JOINT)  # else the caller's layout bounds it
    if described and count > size - cur.pos:  # every tensor takes at least one header byte
        raise CorruptFrameError(f"header declares {count} tensors, more than its {size} bytes can describe")
    named = bool(flags & FLAG_NAMES)
    stored_hash = shapes = dts = names = None
    if flags & FLAG_LAYOUT_HASH:
        stored_hash = bytes(cur.take(HASH_SIZE, "the layout hash"))
    else:
        shapes, dts, names = read_table(cur, count, named)
    npat = cur.varint("the pattern count")
    if npat > size - cur.pos:
        raise CorruptFrameError(f"header declares {npat} section patterns, more than its {size} bytes can describe")
    patterns = []
    for _ in range(npat):
        nsec = cur.byte("a pattern")
        pat = []
        for _ in range(nsec):
            kind, bits = cur.byte("a pattern"), cur.byte("a pattern")
            if not 1 <= bits <= 64:
                raise CorruptFrameError(f"section pattern {len(patterns)}: item width {bits} bits outside 1..64")
            pat.append((kind, bits))
        patterns.append(pat)
    per_tensor = []  # (pattern, counts): one per tensor, or one for the concatenation (joint)
    for i in range(1 if flags & FLAG_JOINT else count):
        pid = cur.varint("a pattern id")
        if pid >= npat:
            raise CorruptFrameError(f"tensor {i}: pattern {pid}, the frame has {npat}")
        per_tensor.append((patterns[pid], [cur.varint("a section count") for _ in patterns[pid]]))
    raw_total = cur.varint("the payload length") if flags & FLAG_ZSTD else None
    crc_at = cur.pos + (_CRC.size if flags & _CHECKSUM_FLAGS else 0)
    header_len = crc_at + _CRC.size
    if header_len > size:
        raise CorruptFrameError(f"frame is {size} bytes, shorter than its {header_len}-byte header")
    return Header(flags, spec_raw, count, named, stored_hash, shapes, dts, names, per_tensor, raw_total, crc_at, header_len)


def read_table(cur: _Cursor, count: int, named: bool):
    """``(shapes, dtypes, names)`` of ``count`` tensors from a layout table at ``cur``."""
    shapes, dts, names = [], [], [] if named else None
    for i in range(count):
        code = cur.byte("a tensor's dtype")
        ndim = cur.byte("a tensor's ndim")
        if code not in dtypes.CODES or ndim > MAX_NDIM:
            raise CorruptFrameError(f"tensor {i}: unknown dtype code {code} or ndim {ndim} beyond {MAX_NDIM}")
        dts.append(dtypes.CODES[code])
        shapes.append(tuple(cur.varint("a dimension") for _ in range(ndim)))
        if named:
            raw_name = bytes(cur.take(cur.varint("a name length"), "a name"))
            try:
                names.append(raw_name.decode("utf-8"))
            except UnicodeDecodeError:
                raise CorruptFrameError(f"tensor {i}: name is not UTF-8") from None
    return shapes, dts, names


def parse_many(buf, *, layout=None, max_elements: int | None = None, verify_payload: bool = True) -> ManyFrame:
    """Validate ``buf`` as a v2 frame; ``layout`` (a :class:`Layout`, or the tensors) is
    required for the layout-hash form and checked against the table form."""
    from codec.frame import _as_buffer

    mv = _as_buffer(buf)
    size = mv.nbytes
    if size < FIXED_SIZE + _CRC.size:
        raise CorruptFrameError(f"frame is {size} bytes, shorter than the {FIXED_SIZE + _CRC.size}-byte minimum many-tensor header")
    magic, version, flags, reserved = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise CorruptFrameError(f"not a gradcodec frame (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise CorruptFrameError(f"frame format version {version} is not a many-tensor frame (version {VERSION})")
    if flags & ~_KNOWN_FLAGS or reserved or flags & _CHECKSUM_FLAGS == _CHECKSUM_FLAGS:
        raise CorruptFrameError(f"reserved header bits are set (flags={flags:#04x}, reserved={reserved:#06x})")
    limit = MAX_ELEMENTS if max_elements is None else max_elements
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or not 0 <= limit <= MAX_ELEMENTS_LIMIT:
        raise ValueError(f"max_elements: must be an integer in [0, 2**60], got {max_elements!r}")
    h = read_header(mv)
    (crc,) = _CRC.unpack_from(mv, h.crc_at)
    if zlib.crc32(mv[: h.crc_at]) != crc:
        raise CorruptFrameError("header checksum mismatch: the header is damaged")
    try:
        spec = h.spec_raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptFrameError("spec text is not UTF-8") from None
    # the layout: from the table, or the caller's, matched by hash
    if h.shapes is None:
        if layout is None:
            raise ValueError("layout: this many-tensor frame gives its layout by hash; pass layout= (a codec.Layout or the tensors)")
        lay = as_layout(layout)
        if len(lay) != h.count or lay.hash != h.stored_hash:
            raise CorruptFrameError(
                f"many-tensor frame: its layout hash {h.stored_hash.hex()} is not the given layout's "
                f"{lay.hash.hex()} ({len(lay)} tensors; the frame has {h.count})"
            )
        if (lay.names is not None) != h.named:
            raise CorruptFrameError("many-tensor frame: the names flag does not match the given layout")
    else:
        if len(set(h.names or ())) != len(h.names or ()):
            raise CorruptFrameError("many-tensor frame: a tensor name appears twice")
        lay = Layout(tuple(h.shapes), tuple(h.dtypes), None if h.names is None else tuple(h.names))
        if layout is not None:
            want = as_layout(layout)
            if (want.shapes, want.dtypes) != (lay.shapes, lay.dtypes):
                raise ValueError("layout: the frame's tensors (dtype and shape) are not the given layout's")
            if want.names is not None and want.names != lay.names:
                raise ValueError("layout: the frame's tensor names are not the given layout's")
    # element counts, then every section against its tensor's size and the payload
    sizes = []
    for i, shape in enumerate(lay.shapes):
        n = math.prod(shape)
        if math.prod(d for d in shape if d) > max(limit, MAX_ELEMENTS):
            raise CorruptFrameError(f"tensor {i}: shape {shape}: its non-zero dimensions exceed {max(limit, MAX_ELEMENTS)} elements")
        sizes.append(n)
    total = sum(sizes)
    if total > limit:
        raise CorruptFrameError(f"frame declares {total} elements, more than the limit of {limit}")
    if flags & FLAG_JOINT:
        if len(set(lay.dtypes)) > 1:
            raise CorruptFrameError("many-tensor frame: a joint frame's tensors must share a dtype")
        sizes = [total]  # the one entry codes the concatenation
    stored_len = size - h.header_len
    tensor_sections = []
    off = 0
    for i, ((pat, counts), n) in enumerate(zip(h.per_tensor, sizes)):
        infos = []
        for j, ((kind, bits), c) in enumerate(zip(pat, counts)):
            rl = raw_length(c, bits)
            if rl > SECTION_BYTES_PER_ELEMENT * n + 1024:
                raise CorruptFrameError(f"tensor {i}, section {j}: {rl} raw bytes is more than {n} elements can need")
            infos.append(SectionInfo(kind, Encoding.RAW, bits, c, rl, rl, off))
            off += rl
        tensor_sections.append(infos)
    if h.raw_total is None:
        if off != stored_len:
            raise CorruptFrameError(f"frame is {size} bytes but its sections end at byte {h.header_len + off}")
    elif off != h.raw_total:
        raise CorruptFrameError(f"many-tensor frame: the sections add up to {off} bytes, the header says {h.raw_total}")
    if flags & _CHECKSUM_FLAGS and verify_payload:
        (pcrc,) = _CRC.unpack_from(mv, h.crc_at - _CRC.size)
        fn = CHECKSUMS["crc32c" if flags & FLAG_PAYLOAD_CRC32C else "crc32"][1]
        if fn(mv[h.header_len:]) != pcrc:
            raise CorruptFrameError("payload checksum mismatch: the section data is damaged")
    payload = mv[h.header_len:]
    if h.raw_total is not None:  # decompressed section by section as the stages read them
        payload = ZstdPayload(payload, h.raw_total)
    return ManyFrame(spec, flags, lay, h.header_len, payload, stored_len, tensor_sections)


class ZstdPayload:
    """A zstd-compressed payload, decompressed only as far as the sections read so far reach.

    ``payload[a:b]`` (what a section's bytes are) decompresses up to byte ``b`` and no further,
    so each stage checks a section's kind, width and count (``SectionReader.take``) before
    any of its bytes exist: a forged count is refused before its declared size is
    allocated, as format v1 does with its per-section zstd.  :meth:`finish` then requires the
    stream to hold exactly the declared raw length."""

    def __init__(self, stored, raw_total: int):
        import zstandard

        try:
            params = zstandard.get_frame_parameters(stored)
        except zstandard.ZstdError as e:
            raise CorruptFrameError(f"many-tensor frame: bad zstd header: {e}") from None
        if params.content_size != raw_total:
            raise CorruptFrameError(f"many-tensor frame: zstd declares {params.content_size} bytes, the header implies {raw_total}")
        self.raw_total = raw_total
        self._reader = zstandard.ZstdDecompressor().stream_reader(bytes(stored), read_across_frames=True)
        self._chunks: list = []
        self._starts: list = []
        self._have = 0

    def _read(self, size: int) -> bytes:
        import zstandard

        try:
            return self._reader.read(size)
        except zstandard.ZstdError as e:
            raise CorruptFrameError(f"many-tensor frame: zstd data is damaged: {e}") from None

    def _ensure(self, end: int) -> None:
        while self._have < end:
            data = self._read(end - self._have)
            if not data:
                raise CorruptFrameError(f"many-tensor frame: zstd gave {self._have} bytes, the header says {self.raw_total}")
            self._starts.append(self._have)
            self._chunks.append(data)
            self._have += len(data)

    def __getitem__(self, part):
        lo, hi = part.start or 0, part.stop
        if hi > self.raw_total or lo > hi:
            raise CorruptFrameError("many-tensor frame: a section lies beyond the payload")
        self._ensure(hi)
        i = bisect.bisect_right(self._starts, lo) - 1 if self._starts else 0
        if lo == hi:
            return memoryview(b"")
        start, chunk = self._starts[i], self._chunks[i]
        if hi <= start + len(chunk):
            return memoryview(chunk)[lo - start : hi - start]
        pieces = []
        while lo < hi:  # a section across chunks: its bytes joined
            start, chunk = self._starts[i], self._chunks[i]
            take = min(hi, start + len(chunk))
            pieces.append(memoryview(chunk)[lo - start : take - start])
            lo, i = take, i + 1
        return memoryview(b"".join(pieces))

    def finish(self) -> None:
        """Every declared byte is there and nothing decodes beyond it (CorruptFrameError)."""
        self._ensure(self.raw_total)
        if self._read(1):
            raise CorruptFrameError(f"many-tensor frame: zstd data holds more than the {self.raw_total} bytes the header implies")

    def __bytes__(self) -> bytes:
        self._ensure(self.raw_total)
        return b"".join(self._chunks)
