"""Reading a many-tensor frame: :func:`parse_many` validates the header (:func:`read_header`
walks it) and returns a :class:`ManyFrame`, whose tensors the pipeline reads like v1 frames."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from codec.dtypes import on_device
from codec.errors import CodecValueError, CorruptFrameError
from codec.frame import (
    _CRC,
    MAGIC,
    MAX_ELEMENTS,
    MAX_SPEC,
    SECTION_BYTES_PER_ELEMENT,
    Encoding,
    Frame,
    SectionInfo,
    _as_buffer,
    check_dims,
    check_payload,
    payload_check,
    checksum_name,
    element_limit,
)
from codec.manyframe.table import Layout, as_layout, read_layout
from codec.manyframe.wire import (
    CHECKSUM_FLAGS,
    COUNT_OF,
    COUNT_ONE,
    COUNT_WRITTEN,
    FIXED,
    FIXED_SIZE,
    FLAG_DERIVED,
    FLAG_JOINT,
    FLAG_LAYOUT_HASH,
    FLAG_NAMES,
    FLAG_ZSTD,
    HASH_SIZE,
    KNOWN_FLAGS,
    VERSION,
    Cursor,
)
from codec.manyframe.zstd import ZstdPayload


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
    tensor_sections: tuple  # per tensor, a tuple of frozen SectionInfo
    #: the payload check decoding completes, as :attr:`codec.frame.Frame.check`
    check: object = None

    @property
    def checksum(self) -> str | None:
        return checksum_name(self.flags)

    @property
    def joint(self) -> bool:
        """The tensors were coded as one (their concatenation): read it with :meth:`whole`."""
        return bool(self.flags & FLAG_JOINT)

    def tensor(self, i: int) -> Frame:
        """Tensor ``i`` as a frame the pipeline reads like any v1 frame."""
        if self.joint:
            raise CodecValueError("a joint many-tensor frame codes its tensors as one: read it with whole()")
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
    layout: Layout | None  # the table form's layout (None in the hash form)
    per_tensor: list
    raw_total: int | None
    crc_at: int
    header_len: int
    #: where the spec, count and layout (table or hash) end: the patterns start here
    table_end: int


def read_header(mv) -> Header:
    """Walk a v2 header field by field, each bounded by the buffer: CorruptFrameError at the
    first field that does not fit.  The fixed 8 bytes must already have been checked."""
    size = mv.nbytes
    flags = mv[5]
    cur = Cursor(mv, FIXED_SIZE, size)
    spec_len = cur.varint("the spec length")
    if spec_len > MAX_SPEC:
        raise CorruptFrameError(f"header declares a {spec_len}-byte spec, beyond the format's {MAX_SPEC}")
    spec_raw = bytes(cur.take(spec_len, "the spec"))
    count = cur.varint("the tensor count")
    described = not (flags & FLAG_LAYOUT_HASH and flags & FLAG_JOINT)  # else the caller's layout bounds it
    if described and count > size - cur.pos:  # every tensor takes at least one header byte
        raise CorruptFrameError(f"header declares {count} tensors, more than its {size} bytes can describe")
    named = bool(flags & FLAG_NAMES)
    stored_hash = table = None
    if flags & FLAG_LAYOUT_HASH:
        stored_hash = bytes(cur.take(HASH_SIZE, "the layout hash"))
    else:
        table = read_layout(cur, count, named)
    table_end = cur.pos
    npat = cur.varint("the pattern count")
    if npat > size - cur.pos:
        raise CorruptFrameError(f"header declares {npat} section patterns, more than its {size} bytes can describe")
    derived = bool(flags & FLAG_DERIVED)
    patterns = []  # (the (kind, bits) of each section, their count rules)
    for _ in range(npat):
        nsec = cur.byte("a pattern")
        if cur.pos + 2 * nsec > cur.end:
            raise CorruptFrameError("many-tensor frame: header ends inside a pattern")
        raw = bytes(cur.take(2 * nsec, "a pattern"))  # (kind, bits) per section, read at once
        pat, rules = [], []
        for j in range(nsec):
            kind, bits = raw[2 * j], raw[2 * j + 1]
            rule = COUNT_WRITTEN
            if derived:  # the kind byte's high 4 bits are the count rule
                kind, rule = kind & 0x0F, kind >> 4
            if not 1 <= bits <= 64:
                raise CorruptFrameError(f"section pattern {len(patterns)}: item width {bits} bits outside 1..64")
            if rule >= COUNT_OF + j:  # only an earlier section's count can be repeated
                raise CorruptFrameError(f"section pattern {len(patterns)}, section {j}: count rule {rule} is not one an encoder writes")
            pat.append((kind, bits))
            rules.append(rule)
        patterns.append((pat, rules))
    per_tensor = []  # (pattern, counts): one per tensor, or one for the concatenation (joint)
    for i in range(1 if flags & FLAG_JOINT else count):
        pid = cur.varint("a pattern id")
        if pid >= npat:
            raise CorruptFrameError(f"tensor {i}: pattern {pid}, the frame has {npat}")
        pat, rules = patterns[pid]
        counts: list = []
        for rule in rules:
            counts.append(cur.varint("a section count") if rule == COUNT_WRITTEN else 1 if rule == COUNT_ONE else counts[rule - COUNT_OF])
        per_tensor.append((pat, counts))
    raw_total = cur.varint("the payload length") if flags & FLAG_ZSTD else None
    crc_at = cur.pos + (_CRC.size if flags & CHECKSUM_FLAGS else 0)
    header_len = crc_at + _CRC.size
    if header_len > size:
        raise CorruptFrameError(f"frame is {size} bytes, shorter than its {header_len}-byte header")
    return Header(flags, spec_raw, count, named, stored_hash, table, per_tensor, raw_total, crc_at, header_len, table_end)


#: a SectionInfo of its fields in order, without the NamedTuple's keyword-taking ``__new__``
#: (0.6 -> 0.2 µs; a header has a few hundred)
_info = tuple.__new__


def _sections(h: Header, sizes) -> tuple[tuple, int]:
    """Every tensor's :class:`SectionInfo` tuple (offsets into the payload; frozen, as a
    remembered header shares them with every frame it parses), each section bounded by its
    tensor's size, and where the last one ends."""
    tensor_sections = []
    off = 0
    raw_enc = int(Encoding.RAW)
    for i, ((pat, counts), n) in enumerate(zip(h.per_tensor, sizes)):
        infos = []
        most = SECTION_BYTES_PER_ELEMENT * n + 1024
        for j, ((kind, bits), c) in enumerate(zip(pat, counts)):
            rl = (c * bits + 7) // 8  # (raw_length, inline: a header has a few hundred sections)
            if rl > most:
                raise CorruptFrameError(f"tensor {i}, section {j}: {rl} raw bytes is more than {n} elements can need")
            infos.append(_info(SectionInfo, (kind, raw_enc, bits, c, rl, rl, off)))
            off += rl
        tensor_sections.append(tuple(infos))
    return tuple(tensor_sections), off


#: the latest headers parsed, most recent first, as ``(header bytes before the payload
#: checksum, Header, Layout, tensor sections, payload length)``: a training loop decodes
#: frames whose headers are byte for byte those of the step before (the same tensors, and
#: the same counts for every dense codec and a fixed k), and the bytes that gave a header
#: once give it again; the header's CRC is still checked on every frame
_RECENT: tuple = ()
_RECENT_MAX = 4


def _seen_header(mv):
    """The remembered entry whose header bytes start ``mv`` (which holds the whole header),
    or None."""
    for entry in _RECENT:
        raw = entry[0]
        if mv.nbytes >= entry[1].header_len and mv[: len(raw)] == raw:
            return entry
    return None


def _remember_header(mv, h: Header, lay, tensor_sections, off) -> None:
    global _RECENT
    end = h.crc_at - (_CRC.size if h.flags & CHECKSUM_FLAGS else 0)
    _RECENT = ((bytes(mv[:end]), h, lay, tensor_sections, off),) + _RECENT[: _RECENT_MAX - 1]


def _names_checked(lay: Layout, *, frame: bool) -> Layout:
    """``lay``, refused if a name repeats: the one check of every layout the parser meets, the
    frame's table (corrupt) or the caller's ``layout=`` (a bad argument; a Layout built
    without its constructor reaches here unchecked).  A dict of the tensors would otherwise
    hold fewer than the frame (issue 28)."""
    if not lay.names_unique:
        if frame:
            raise CorruptFrameError(f"many-tensor frame: the tensor name {lay.repeated!r} appears twice")
        raise CodecValueError(f"layout: the tensor name {lay.repeated!r} appears twice; a layout's names must be unique")
    return lay


def parse_many(buf, *, layout=None, max_elements: int | None = None, verify_payload: bool | str = True) -> ManyFrame:
    """Validate ``buf`` as a v2 frame; ``layout`` (a :class:`Layout`, or the tensors) is
    required for the layout-hash form and checked against the table form;
    ``verify_payload`` as for :func:`codec.frame.parse_frame`.  ``buf`` may be a
    device frame (a uint8 device array): only its header crosses to the host
    (:mod:`codec.devframe`)."""
    if on_device(buf):
        return _parse_device(buf, layout, max_elements, verify_payload)
    mv = _as_buffer(buf)
    mf, raw_total = parse_many_header(mv, mv.nbytes, layout, max_elements)
    if verify_payload == "defer" and raw_total is None:  # (a zstd payload: checked now, as it is not what the kernels read)
        mf.check = payload_check(mv, mf.flags, mf.header_len - 2 * _CRC.size, mf.header_len)
    elif verify_payload:
        check_payload(mv, mf.flags, mf.header_len - 2 * _CRC.size, mf.header_len)
    payload = mv[mf.header_len :]
    mf.payload = payload if raw_total is None else ZstdPayload(payload, raw_total)  # a zstd payload is decompressed section by section as the stages read them
    return mf


def _parse_device(buf, layout, max_elements, verify_payload: bool) -> ManyFrame:
    """:func:`parse_many` of a device frame: its header copied to the host (again, larger,
    when it reaches past :data:`codec.devframe.FIRST_COPY` bytes) and parsed there, its
    CRC-32C verified on the device, its tensors read through a
    :class:`codec.devframe.DevicePayload` (a zstd payload or a zlib CRC32: the whole frame
    read on the host)."""
    from codec import devframe

    data = devframe.device_frame(buf)
    (mf, raw_total), head = devframe.head_read(data, lambda h: parse_many_header(h, data.size, layout, max_elements))
    if raw_total is not None or mf.checksum == "crc32":
        return parse_many(devframe.on_host(data), layout=layout, max_elements=max_elements, verify_payload=verify_payload)
    if verify_payload and mf.checksum == "crc32c":
        devframe.check_payload(data, mf.header_len, _CRC.unpack_from(head, mf.header_len - 2 * _CRC.size)[0])
    mf.payload = devframe.DevicePayload(data, mf.header_len)
    return mf


def parse_many_header(mv, size: int, layout=None, max_elements: int | None = None) -> tuple[ManyFrame, int | None]:
    """Every check of :func:`parse_many` but the payload's, on ``mv``, which holds at least
    the header of a v2 frame of ``size`` bytes (a device frame's header, copied to the host):
    the frame (its ``payload`` still None) and the raw length of a zstd payload (None when
    the payload is stored raw)."""
    if size < FIXED_SIZE + _CRC.size:
        raise CorruptFrameError(f"frame is {size} bytes, shorter than the {FIXED_SIZE + _CRC.size}-byte minimum many-tensor header")
    magic, version, flags, reserved = FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise CorruptFrameError(f"not a gradcodec frame (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise CorruptFrameError(f"frame format version {version} is not a many-tensor frame (version {VERSION})")
    if flags & ~KNOWN_FLAGS or reserved or flags & CHECKSUM_FLAGS == CHECKSUM_FLAGS:
        raise CorruptFrameError(f"reserved header bits are set (flags={flags:#04x}, reserved={reserved:#06x})")
    limit = element_limit(max_elements)
    seen = _seen_header(mv)
    h = read_header(mv) if seen is None else seen[1]
    (crc,) = _CRC.unpack_from(mv, h.crc_at)
    if zlib.crc32(mv[: h.crc_at]) != crc:
        raise CorruptFrameError("header checksum mismatch: the header is damaged")
    try:
        spec = h.spec_raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptFrameError("spec text is not UTF-8") from None
    # the layout: from the table, or the caller's, matched by hash
    if h.layout is None:
        if layout is None:
            raise CodecValueError("layout: this many-tensor frame gives its layout by hash; pass layout= (a codec.Layout or the tensors)")
        lay = _names_checked(as_layout(layout), frame=False)
        if len(lay) != h.count or lay.hash != h.stored_hash:
            raise CorruptFrameError(
                f"many-tensor frame: its layout hash {h.stored_hash.hex()} is not the given layout's "
                f"{lay.hash.hex()} ({len(lay)} tensors; the frame has {h.count})"
            )
        if (lay.names is not None) != h.named:
            raise CorruptFrameError("many-tensor frame: the names flag does not match the given layout")
    else:
        lay = _names_checked(h.layout, frame=True)
        if layout is not None:
            want = _names_checked(as_layout(layout), frame=False)
            if (want.shapes, want.dtypes) != (lay.shapes, lay.dtypes):
                raise CodecValueError("layout: the frame's tensors (dtype and shape) are not the given layout's")
            if want.names is not None and want.names != lay.names:
                raise CodecValueError("layout: the frame's tensor names are not the given layout's")
    # element counts, then every section against its tensor's size and the payload
    if lay.largest > max(limit, MAX_ELEMENTS):  # then name the first tensor beyond it
        for i, shape in enumerate(lay.shapes):
            check_dims(shape, limit, f"tensor {i}: shape")
    sizes = list(lay.sizes)
    total = sum(sizes)
    if total > limit:
        raise CorruptFrameError(f"frame declares {total} elements, more than the limit of {limit}")
    if flags & FLAG_JOINT:
        if len(set(lay.dtypes)) > 1:
            raise CorruptFrameError("many-tensor frame: a joint frame's tensors must share a dtype")
        sizes = [total]  # the one entry codes the concatenation
    stored_len = size - h.header_len
    if seen is not None and seen[2] is lay:  # the same header bytes and layout: the same sections
        tensor_sections, off = seen[3], seen[4]
    else:
        tensor_sections, off = _sections(h, sizes)
        _remember_header(mv, h, lay, tensor_sections, off)
    if h.raw_total is None:
        if off != stored_len:
            raise CorruptFrameError(f"frame is {size} bytes but its sections end at byte {h.header_len + off}")
    elif off != h.raw_total:
        raise CorruptFrameError(f"many-tensor frame: the sections add up to {off} bytes, the header says {h.raw_total}")
    return ManyFrame(spec, flags, lay, h.header_len, None, stored_len, tensor_sections), h.raw_total
