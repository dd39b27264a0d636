"""Container format v1: many named frames (or any byte strings) as one byte string.

``gradcodec encode`` writes one when a file holds several tensors, and the MPI transport
uses it for its per-step message.  The container knows nothing about what it carries: an
entry is a name and a byte string (normally a gradcodec frame, which has its own header
CRC).  All integers are little-endian; offsets are from the first byte of the container.

Byte by byte::

    offset  size  field
    ------  ----  ---------------------------------------------------------------
    0       4     magic  b"\\x89GCC"  (0x89 'G' 'C' 'C'; a frame starts b"\\x89GCF")
    4       1     u8   version = 1
    5       1     u8   flags: bit 0 = frames CRC-32C present; bits 1..7 reserved, must be 0
    6       2     u16  reserved, must be 0
    8       4     u32  count: number of entries
    12      ...   table, ``count`` entries in order, each:
                      u16  name length L (bytes, 0..65535)
                      L    name, UTF-8 (no terminator); names are unique in a container
                      u64  frame length (bytes)
    T       4     u32  only with flags bit 0: CRC-32C (Castagnoli) of all the frames' bytes
    T+C     4     u32  CRC32 (zlib.crc32, IEEE polynomial) of bytes [0, T+C): header, table
                       and the frames' CRC-32C
    T+C+4   ...   the frames, concatenated in table order, with no padding

    T = 12 + sum(10 + L_i) over the entries, C = 4 with flags bit 0 and 0 without.  The
    container ends exactly where the last frame ends: total length = T + C + 4 + sum(frame
    lengths).  Names may be empty.  The smallest container (no entries) is 16 bytes.
    ``pack_frames`` sets flags bit 0 unless asked not to; containers without it (all of them
    before it existed) still unpack.

``unpack_frames`` validates, in this order and before allocating anything in proportion to
a declared size: length >= 16; magic; version; flags and reserved field are zero; ``count``
entries of at least 10 bytes each can fit; every table entry fits in the buffer; the table
CRC32; the frame lengths add up to exactly the bytes that follow the CRC; every name is
valid UTF-8; no name repeats; the frames' CRC-32C when flagged.  Each failure raises
:class:`codec.CorruptFrameError` with a one-line reason.  Each frame's own header also carries
its own CRC (and, by default, a payload CRC-32C).

Unpacking is zero-copy: each frame comes back as a ``memoryview`` into the input buffer.
"""

from __future__ import annotations

import struct
import zlib

from codec.checksum import crc32c
from codec.errors import CodecTypeError, CodecValueError, CorruptFrameError

__all__ = ["MAGIC", "VERSION", "is_container", "pack_frames", "pack_header", "unpack_frames"]

MAGIC = b"\x89GCC"
VERSION = 1

_FIXED = struct.Struct("<4sBBHI")  # magic, version, flags, reserved, count
_NAME_LEN = struct.Struct("<H")
_FRAME_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")
FIXED_SIZE = _FIXED.size  # 12
MIN_ENTRY = _NAME_LEN.size + _FRAME_LEN.size  # 10: an entry with an empty name
MIN_SIZE = FIXED_SIZE + _CRC.size  # 16: an empty container
MAX_NAME = 0xFFFF
#: flags bit 0: a CRC-32C of the frames follows the table
FLAG_FRAMES_CRC32C = 0x01


def _as_bytes_view(buf, what: str) -> memoryview:
    """A flat unsigned-byte memoryview of ``buf`` (no copy when ``buf`` is contiguous)."""
    try:
        mv = memoryview(buf)
    except TypeError:
        raise CodecTypeError(f"{what}: expected a bytes-like object, got {type(buf).__name__}") from None
    if not mv.c_contiguous:
        raise CodecTypeError(f"{what}: expected a contiguous buffer")
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def pack_frames(items, *, checksum: bool = True) -> bytes:
    """Pack named byte strings into one container (with a CRC-32C of the frames unless
    ``checksum=False``).

    ``items`` is a dict ``{name: frame}`` or an iterable of ``(name, frame)`` pairs; a frame is
    any contiguous bytes-like object (bytes, bytearray, memoryview, 1-D uint8 array).  Order is
    kept.  Raises TypeError for a non-string name or a non-buffer frame, ValueError for a
    repeated name or a name longer than 65535 UTF-8 bytes.  The frames are copied once, into
    the result; to send without that copy, write :func:`pack_header` and then the frames.
    """
    pairs = items.items() if isinstance(items, dict) else items
    names, frames = [], []
    for pair in pairs:
        try:
            name, frame = pair
        except (TypeError, ValueError):
            raise CodecTypeError(f"items: expected (name, frame) pairs, got {pair!r:.60}") from None
        names.append(name)
        frames.append(_as_bytes_view(frame, f"items[{name!r}]"))
    crc = None
    if checksum:
        crc = 0
        for f in frames:
            crc = crc32c(f, crc)
    head = pack_header(zip(names, (f.nbytes for f in frames)), frames_crc=crc)
    return b"".join([head, *frames])


def pack_header(entries, *, frames_crc: int | None = None) -> bytes:
    """The container header, table and CRC for ``entries``, an iterable of ``(name, frame_length)``.

    ``frames_crc``: the CRC-32C of the frames' bytes in order (``crc32c.crc32c(frame, crc)``
    chained over them) to store, or None for none.  ``pack_header(...) + frame_0 + frame_1 +
    ...`` (frames in the same order) is exactly ``pack_frames``'s output: a transport can send
    the header and then the frames as they are (vectored I/O) instead of joining them.  Same
    errors as :func:`pack_frames`.
    """
    head = bytearray(FIXED_SIZE)
    seen = set()
    count = 0
    for name, length in entries:
        if not isinstance(name, str):
            raise CodecTypeError(f"items: a name must be a str, got {type(name).__name__}")
        if name in seen:
            raise CodecValueError(f"items: name {name!r} appears twice; names in a container are unique")
        seen.add(name)
        try:
            name_b = name.encode("utf-8")
        except UnicodeEncodeError as e:
            raise CodecValueError(f"items: name {name!r} is not encodable as UTF-8: {e.reason}") from None
        if len(name_b) > MAX_NAME:
            raise CodecValueError(f"items: name {name[:40]!r}... is {len(name_b)} UTF-8 bytes; the limit is {MAX_NAME}")
        if not 0 <= length < 1 << 64:
            raise CodecValueError(f"items: frame length {length} of {name!r} does not fit the format's u64")
        head += _NAME_LEN.pack(len(name_b))
        head += name_b
        head += _FRAME_LEN.pack(length)
        count += 1
    if count > 0xFFFFFFFF:
        raise CodecValueError(f"items: {count} entries; a container holds at most {0xFFFFFFFF}")
    flags = 0
    if frames_crc is not None:
        flags = FLAG_FRAMES_CRC32C
        head += _CRC.pack(frames_crc)
    _FIXED.pack_into(head, 0, MAGIC, VERSION, flags, 0, count)
    head += _CRC.pack(zlib.crc32(head))
    return bytes(head)


def is_container(buf) -> bool:
    """True when ``buf`` starts with the container magic (nothing else is checked)."""
    try:
        mv = memoryview(buf)
    except TypeError:
        return False
    if mv.nbytes < len(MAGIC):
        return False
    if not mv.c_contiguous:
        return False
    return (mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B"))[: len(MAGIC)] == MAGIC


def unpack_frames(buf) -> list[tuple[str, memoryview]]:
    """Validate a container and return its ``[(name, frame)]`` in order; each frame is a
    ``memoryview`` into ``buf`` (no copy; writeable exactly when ``buf`` is).  Raises
    :class:`codec.CorruptFrameError` (one-line reason) for anything that is not a valid
    container; the frames themselves are not parsed."""
    mv = _as_bytes_view(buf, "container")
    size = mv.nbytes
    if size < MIN_SIZE:
        raise CorruptFrameError(f"container is {size} bytes, shorter than the {MIN_SIZE}-byte minimum")
    magic, version, flags, reserved, count = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise CorruptFrameError(f"not a gradcodec container (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise CorruptFrameError(f"container format version {version} is not supported (this gradcodec reads version {VERSION})")
    if flags & ~FLAG_FRAMES_CRC32C or reserved:
        raise CorruptFrameError(f"reserved container header bits are set (flags={flags:#04x}, reserved={reserved:#06x})")
    if count > (size - MIN_SIZE) // MIN_ENTRY:
        raise CorruptFrameError(f"container declares {count} entries, more than its {size} bytes can hold")
    # walk the table: bounds only (offsets and lengths), nothing allocated per declared size
    entries = []
    off = FIXED_SIZE
    checked = flags & FLAG_FRAMES_CRC32C
    limit = size - _CRC.size * (2 if checked else 1)
    if limit < FIXED_SIZE:
        raise CorruptFrameError(f"container is {size} bytes, shorter than the {FIXED_SIZE + 8}-byte minimum with a frames checksum")
    for i in range(count):
        if off + MIN_ENTRY > limit:
            raise CorruptFrameError(f"container table entry {i} runs past the end of the buffer ({size} bytes)")
        (name_len,) = _NAME_LEN.unpack_from(mv, off)
        name_off = off + _NAME_LEN.size
        off = name_off + name_len + _FRAME_LEN.size
        if off > limit:
            raise CorruptFrameError(f"container table entry {i} runs past the end of the buffer ({size} bytes)")
        (frame_len,) = _FRAME_LEN.unpack_from(mv, off - _FRAME_LEN.size)
        entries.append((name_off, name_len, frame_len))
    if checked:
        off += _CRC.size
    (crc,) = _CRC.unpack_from(mv, off)
    if zlib.crc32(mv[:off]) != crc:
        raise CorruptFrameError("container table checksum mismatch: the header or table is damaged")
    data_off = off + _CRC.size
    total = sum(e[2] for e in entries)
    if total != size - data_off:
        raise CorruptFrameError(
            f"container frames add up to {total} bytes but {size - data_off} bytes follow the table"
        )
    if checked and crc32c(mv[data_off:]) != _CRC.unpack_from(mv, off - _CRC.size)[0]:
        raise CorruptFrameError("container frames checksum mismatch: the frames are damaged")
    out = []
    seen = set()
    for i, (name_off, name_len, frame_len) in enumerate(entries):
        try:
            name = str(mv[name_off : name_off + name_len], "utf-8")
        except UnicodeDecodeError:
            raise CorruptFrameError(f"container entry {i}: name is not valid UTF-8") from None
        if name in seen:
            raise CorruptFrameError(f"container entry {i}: name {name!r} appears twice")
        seen.add(name)
        out.append((name, mv[data_off : data_off + frame_len]))
        data_off += frame_len
    return out
