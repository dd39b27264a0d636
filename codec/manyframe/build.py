"""Writing a many-tensor frame: :func:`build_many`."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from codec.errors import CodecValueError
from codec.device import put_bytes
from codec.frame import _CRC, CHECKSUMS, MAGIC, MAX_SPEC, Encoding, close_header, raw_length
from codec.payload import write_payload
from codec.framebuffer import frame_bytes
from codec.manyframe.table import Layout
from codec.manyframe.wire import COUNT_WRITTEN, DERIVED_KINDS, FIXED, FIXED_SIZE, FLAG_DERIVED, FLAG_JOINT, FLAG_LAYOUT_HASH, FLAG_NAMES, FLAG_ZSTD, MAX_SECTIONS, VERSION, common_rules, count_rules, put_varint
from codec.ops import remember


class Entry(NamedTuple):
    """A section as the table describes it (kind, item width, count), without its bytes:
    what :func:`build_many` takes for a tensor whose bytes another piece holds (a named
    tuple: a run makes one per tensor, and a frozen dataclass cost a microsecond each)."""

    kind: int
    bits: int
    count: int

    @property
    def raw_len(self) -> int:
        return raw_length(self.count, self.bits)


#: the headers :func:`build_many` made lately, up to their payload's length (a model's frame
#: has the header of the step before: the same layout object, from ``Layout.of``'s cache, and
#: the same section kinds, widths and counts for a dense codec or a fixed k), so a step pays
#: for one key, not for the table's rules and varints (on the bundled sample's 8 tensors,
#: building the header took 68 us of a 256 us ``encode_many``)
_HEADS: dict = {}
_HEADS_MAX = 8


#: each tensor's sections as :func:`_table_head` reads them, per ``(sections, derived)``:
#: their (kind, bits) pattern, count rules and raw length (a model's tensors repeat theirs
#: between steps; top-k's index widths take a few values)
_TENSORS: dict = {}
_TENSORS_MAX = 4096


def _tensor(t: tuple, derived: bool) -> tuple:
    """The pattern ``(kind, bits)`` per section, the count rules and the raw payload length
    of a tensor whose sections are ``t`` (``(kind, bits, count)`` triples)."""
    key = (t, derived)
    got = _TENSORS.get(key)
    if got is None:
        if len(t) > MAX_SECTIONS:
            raise CodecValueError(f"a tensor's codec made {len(t)} sections; a many-tensor frame allows {MAX_SECTIONS}")
        mine = count_rules([count for _, _, count in t]) if derived else (COUNT_WRITTEN,) * len(t)
        got = (tuple((kind, bits) for kind, bits, _ in t), mine, sum(raw_length(count, bits) for _, bits, count in t))
        if len(_TENSORS) >= _TENSORS_MAX:
            _TENSORS.clear()
        _TENSORS[key] = got
    return got


def _remember(key, entry) -> None:
    remember(_HEADS, key, entry, _HEADS_MAX)


def build_many(spec: str, layout: Layout, sections, *, form: str = "table", compressor=None, checksum: str | None = None, pieces=None, joint: bool = False, out=None) -> bytes:
    """A v2 frame of ``layout``'s tensors, ``sections[i]`` being tensor i's list of
    :class:`codec.frame.Section`.  ``form``: "table" or "hash"; ``compressor``/``checksum``
    as for :func:`codec.frame.build_frame` (the compressor sees the whole payload).

    ``pieces``: the payload's bytes in order, when they are not the sections' own: a list of
    Sections whose raw lengths add up to the sections', such as one section coding a run of
    consecutive tensors at once (an elementwise value stage); then ``sections`` only
    describe the table (their kinds, widths and counts).

    ``joint``: the tensors were coded as one, their concatenation: ``sections`` holds one
    list, that of the concatenation (the layout's tensors must share a dtype).

    ``out``: as for :func:`codec.frame.build_frame` (the frame written into a caller's buffer)."""
    if form not in ("table", "hash"):
        raise CodecValueError(f"layout: expected 'table' or 'hash', got {form!r}")
    tables = tuple(tuple((sec.kind, sec.bits, sec.count) for sec in secs) for secs in sections)
    table_head, flags, payload_len = _known_head(spec, layout, tables, form, joint)
    head = bytearray(table_head)
    if pieces is None:
        pieces = [s for secs in sections for s in secs]
    elif sum(p.raw_len for p in pieces) != payload_len:
        raise AssertionError("build_many: the pieces do not hold the sections' bytes")
    stored = None
    if compressor is not None and payload_len:
        raw = np.empty(payload_len, np.uint8)
        write_payload(raw, pieces)
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
    frame, out = frame_bytes(size, out)
    crc = None
    if stored is None:
        crc = write_payload(out[header_len:], pieces, checksum == "crc32c")
    else:
        put_bytes(stored, out[header_len:])
    FIXED.pack_into(head, 0, MAGIC, VERSION, flags, 0)
    close_header(head, out, header_len, flag, payload_crc, crc)
    return frame


def head_of(spec: str, layout: Layout, tables: tuple, flag: int) -> tuple:
    """The header of a table-form frame whose tensor ``t`` has the sections ``tables[t]``
    (a tuple of ``(kind, bits, count)`` triples) up to its checksums, its fixed fields
    written with the payload checksum's ``flag``; the header's length with the checksums
    and the payload's length.  What a replayed step whose sections' widths change between
    steps (a sparse codec's index sections, :func:`codec.replaydecode.encode_selected`) writes before
    ``close_header``, as :func:`build_many` writes it."""
    table_head, flags, payload_len = _known_head(spec, layout, tables, "table", False)
    head = bytearray(table_head)
    FIXED.pack_into(head, 0, MAGIC, VERSION, flags | flag, 0)
    return bytes(head), len(head) + _CRC.size * (2 if flag else 1), payload_len


def _known_head(spec: str, layout: Layout, tables: tuple, form: str, joint: bool):
    """:func:`_table_head`, from the recent headers when these ``tables`` of ``layout`` were
    framed lately (the header of the step before: the same layout object, from
    ``Layout.of``'s cache or a replayed plan, kept alive by the entry)."""
    key = (spec, form, joint, id(layout), tables)
    known = _HEADS.get(key)
    if known is not None and known[0] is layout:
        return known[1:]
    got = _table_head(spec, layout, tables, form, joint)
    _remember(key, (layout, *got))
    return got


def _table_head(spec: str, layout: Layout, tables: tuple, form: str, joint: bool):
    """The header of a frame whose tensor ``t`` has the sections ``tables[t]`` (``(kind,
    bits, count)`` triples) up to the payload (its fixed fields' flags not yet written), the
    flags the tables give and the payload's raw length."""
    spec_b = spec.encode("utf-8")
    if len(spec_b) > MAX_SPEC:
        raise CodecValueError(f"spec is {len(spec_b)} bytes; the frame format allows {MAX_SPEC}")
    derived = all(kind < DERIVED_KINDS for t in tables for kind, _, _ in t)  # the kinds fit beside a rule
    flags = (FLAG_DERIVED if derived else 0) | (FLAG_LAYOUT_HASH if form == "hash" else 0)
    if layout.names is not None:
        flags |= FLAG_NAMES
    if joint:
        if len(tables) != 1 or len(set(layout.dtypes)) > 1:
            raise AssertionError("build_many: a joint frame has one list of sections and one dtype")
        flags |= FLAG_JOINT
    elif len(tables) != len(layout):
        raise AssertionError("build_many: one list of sections per tensor")
    head = bytearray(FIXED_SIZE)
    put_varint(head, len(spec_b))
    head += spec_b
    put_varint(head, len(layout))
    head += layout.hash if form == "hash" else layout.table()
    infos = [_tensor(t, derived) for t in tables]
    rules: dict = {}  # (kind, bits) pattern -> the count rules its tensors share (rule 0 without the flag)
    for shape, mine, _ in infos:
        have = rules.get(shape)
        rules[shape] = mine if have is None or have == mine else common_rules(have, mine)
    ids: dict = {}  # (kind, bits) pattern -> its id (in order of first use) and its written counts' places
    patterns = []
    body = bytearray()  # per tensor: pattern id and the counts its pattern does not derive
    payload_len = 0
    for t, (shape, _, raw) in zip(tables, infos):
        got = ids.get(shape)
        if got is None:
            kept = rules[shape]
            patterns.append(tuple((kind | rule << 4, bits) for (kind, bits), rule in zip(shape, kept)))
            got = ids[shape] = (len(ids), [j for j, rule in enumerate(kept) if rule == COUNT_WRITTEN])
        put_varint(body, got[0])
        for j in got[1]:
            put_varint(body, t[j][2])
        payload_len += raw
    put_varint(head, len(patterns))
    for pattern in patterns:
        head.append(len(pattern))
        for entry in pattern:  # kind (and count rule), bits
            head += bytes(entry)
    head += body
    return bytes(head), flags, payload_len
