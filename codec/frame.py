"""Frame format v1: the self-describing bytes every codec produces (docs/format.md, byte by byte).

A frame is a header followed by sections (their types: :mod:`codec.section`).  The header names the pipeline (its canonical
spec string), the element dtype and shape, and describes every section: its role (kind),
how it is stored (raw or zstd), the width in bits of one item, the number of items, its raw
length and its stored length.  A CRC32 closes the header.  All integers are little-endian.

``parse_frame`` validates, in this order and before allocating anything: length >= fixed
header; magic; version; reserved bits; full header length; header CRC32; dtype, ndim and
spec text; every section's lengths against its item count and against the real buffer
length; element count against ``max_elements``; the payload checksum (CRC-32C by default,
CRC32 from the ``crc32`` stage, none when the codec opted out); every zstd
section's declared content size against the raw length the header implies.  Each failure
raises :class:`CorruptFrameError` with a one-line reason.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from codec import checksum, dtypes
from codec.device import host_copy, put_bytes
from codec.dtypes import on_device
from codec.errors import CodecTypeError, CodecValueError, CorruptFrameError
from codec.framebuffer import frame_bytes
from codec.payload import materialized, write_payload
from codec.section import Encoding, Section, SectionInfo, SectionKind, SectionRun, raw_length  # noqa: F401  (the section types, part of this module's API)

MAGIC = b"\x89GCF"
VERSION = 1
#: flags bit 0: a payload CRC32 (zlib, IEEE polynomial) follows the section table: the
#: ``crc32`` stage's checksum, and the only one before the default below
FLAG_PAYLOAD_CRC = 0x01
#: flags bit 1: a payload CRC-32C (Castagnoli; hardware-accelerated, ~4x zlib's CRC32 here)
#: follows the section table: what every frame carries unless its codec opts out
FLAG_PAYLOAD_CRC32C = 0x02
_PAYLOAD_FLAGS = FLAG_PAYLOAD_CRC | FLAG_PAYLOAD_CRC32C
_RESERVED_FLAGS = 0xFC
#: payload checksum name -> (flag bit, function of (bytes-like) -> uint32)
CHECKSUMS = {"crc32": (FLAG_PAYLOAD_CRC, zlib.crc32), "crc32c": (FLAG_PAYLOAD_CRC32C, checksum.crc32c)}
DEFAULT_CHECKSUM = "crc32c"
MAX_NDIM = 32
MAX_SPEC = 4096
#: default ceiling on the element count a frame may declare (2**40 elements)
MAX_ELEMENTS = 1 << 40
#: the largest ``max_elements`` a caller may ask for: 2**60 float64 values are NumPy's limit
MAX_ELEMENTS_LIMIT = 1 << 60
#: the most raw bytes a section may hold per element of the array (plus 1024): two float64
#: values per element, what a transform's domain can reach (fft with 1- or 2-element blocks
#: keeps up to one complex coefficient per element; powersgd's r*(n+m) <= 2*n*m values)
SECTION_BYTES_PER_ELEMENT = 16

_FIXED = struct.Struct("<4sBBBBBBH")  # magic, version, flags, dtype, ndim, nsections, reserved, spec_len
_SECTION = struct.Struct("<BBHQQQ")  # kind, encoding, bits, count, raw_len, stored_len
_CRC = struct.Struct("<I")
FIXED_SIZE = _FIXED.size  # 12
SECTION_SIZE = _SECTION.size  # 28
MIN_FRAME = FIXED_SIZE + _CRC.size  # 16


def header_length(ndim: int, spec_len: int, sections: int, checksum: bool = True) -> int:
    """The header length H of a frame: ``12 + 8*ndim + L + 28*S + 4``, plus 4 with a payload
    checksum (every frame's default)."""
    return FIXED_SIZE + 8 * ndim + spec_len + SECTION_SIZE * sections + _CRC.size * (2 if checksum else 1)


def build_frame(spec: str, dtype, shape, sections, *, compressor=None, checksum: str | None = None, out=None) -> bytes:
    """Assemble a frame.  ``compressor(raw) -> (Encoding, stored)`` may store sections compressed;
    ``checksum`` names the payload checksum to store (a key of :data:`CHECKSUMS`) or is None;
    ``out`` (from :func:`codec.framebuffer.frame_out`): write the frame at the start of that
    buffer and return a memoryview of it instead of a new ``bytes``."""
    spec_b = spec.encode("utf-8")
    if len(spec_b) > MAX_SPEC:
        raise CodecValueError(f"spec is {len(spec_b)} bytes; the frame format allows {MAX_SPEC}")
    if len(shape) > MAX_NDIM:
        raise CodecValueError(f"x: {len(shape)} dimensions; the frame format allows {MAX_NDIM}")
    if len(sections) > 255:
        raise CodecValueError("a frame holds at most 255 sections")
    stored = []  # per section: (encoding, bytes-like or None when filled in place, stored length)
    for s, raw in zip(sections, [None] * len(sections) if compressor is None else materialized(sections)):
        if compressor is None:
            stored.append((Encoding.RAW, s.data, s.raw_len))
        else:
            enc, data = compressor(raw)
            stored.append((enc, data, memoryview(data).nbytes))
    flag, payload_crc = CHECKSUMS[checksum] if checksum is not None else (0, None)
    head = bytearray(_FIXED.pack(MAGIC, VERSION, flag, dtypes.code_of(dtype), len(shape), len(sections), 0, len(spec_b)))
    for d in shape:
        head += struct.pack("<Q", int(d))
    head += spec_b
    for s, (enc, _, size) in zip(sections, stored):
        head += _SECTION.pack(s.kind, enc, s.bits, s.count, s.raw_len, size)
    header_len = header_length(len(shape), len(spec_b), len(sections), bool(flag))
    frame, out = frame_bytes(header_len + sum(size for _, _, size in stored), out)
    # compressed sections are written as the bytes they are stored as (the checksum covers those)
    pieces = sections if compressor is None else [Section(s.kind, 8, size, data=data) for s, (_, data, size) in zip(sections, stored)]
    crc = write_payload(out[header_len:], pieces, checksum == "crc32c")
    close_header(head, out, header_len, flag, payload_crc, crc)
    return frame


def close_header(head: bytearray, out, header_len: int, flag: int, payload_crc, crc) -> None:
    """Finish a frame whose payload ``out[header_len:]`` is written (both formats): append the
    payload checksum (``crc``, or ``payload_crc`` of the payload when None; nothing without
    ``flag``) and the header's CRC32 to ``head``, and write ``head`` at the start of ``out``,
    host or device.  A device payload's zlib CRC32 (the ``crc32`` stage; the default CRC-32C is
    formed on the device) is the one case that reads the payload back to the host."""
    if flag:
        if crc is None:
            payload = out[header_len:]
            crc = payload_crc(host_copy(payload) if on_device(payload) else payload)
        head += _CRC.pack(crc)
    head += _CRC.pack(zlib.crc32(head))
    put_bytes(head, out[:header_len])


@dataclass
class Frame:
    """A validated frame: header fields plus lazy access to each section's raw bytes."""

    buf: memoryview
    version: int
    flags: int
    dtype: np.dtype
    shape: tuple
    spec: str
    sections: list
    header_len: int
    #: the payload check decoding completes (:class:`codec.payloadcheck.PayloadCheck`), for a
    #: frame parsed with ``verify_payload="defer"``; else None (checked, or no checksum)
    check: object = None

    @property
    def n(self) -> int:
        return math.prod(self.shape)

    @property
    def checksum(self) -> str | None:
        """The payload checksum the frame carries (``"crc32c"``, ``"crc32"``) or None."""
        return checksum_name(self.flags)

    def raw(self, i: int, device: bool = False) -> np.ndarray:
        """Raw (decompressed) bytes of section ``i`` as a uint8 array; with ``device``, a device
        frame's (:class:`codec.devframe.DevicePayload`) as a device view, no copy."""
        s = self.sections[i]
        if device and hasattr(self.buf, "device"):
            return self.buf.device(s.offset, s.offset + s.stored_len)
        stored = self.buf[s.offset : s.offset + s.stored_len]
        if s.encoding == Encoding.RAW:
            return np.frombuffer(stored, np.uint8)
        import zstandard

        try:
            out = zstandard.ZstdDecompressor().decompress(stored, max_output_size=s.raw_len, allow_extra_data=False)
        except zstandard.ZstdError as e:
            raise CorruptFrameError(f"section {i} ({s.kind_name}): zstd data is damaged: {e}") from None
        if len(out) != s.raw_len:
            raise CorruptFrameError(f"section {i} ({s.kind_name}): zstd gave {len(out)} bytes, header says {s.raw_len}")
        return np.frombuffer(out, np.uint8)

    def reader(self) -> "SectionReader":
        return SectionReader(self)


class SectionReader:
    """Hands sections to stages in frame order, checking each against what the stage expects."""

    def __init__(self, frame: Frame):
        self.frame = frame
        self.i = 0

    def take(self, kind, bits=None, count=None, max_count=None, device: bool = False) -> tuple[SectionInfo, np.ndarray]:
        """The next section, which must have ``kind`` (a SectionKind or tuple of them; ``bits``/``count`` if
        given): returns (info, raw bytes).  ``device``: the stage reads the bytes on the device
        (the output is a device array), so a device frame's stay there (a device view)."""
        f = self.frame
        if self.i >= len(f.sections):
            raise CorruptFrameError(f"frame has {len(f.sections)} sections; codec {f.spec!r} needs another section")
        s = f.sections[self.i]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if s.kind not in kinds:
            want = " or ".join(k.name.lower() for k in kinds)
            raise CorruptFrameError(f"{self._where(s)}: codec {f.spec!r} expects a {want} section here")
        if bits is not None and s.bits not in (bits if isinstance(bits, tuple) else (bits,)):
            raise CorruptFrameError(f"{self._where(s)}: {s.bits}-bit items, codec expects {bits}")
        if count is not None and s.count != count:
            raise CorruptFrameError(f"{self._where(s)}: {s.count} items, codec expects {count}")
        if max_count is not None and s.count > max_count:
            raise CorruptFrameError(f"{self._where(s)}: {s.count} items, at most {max_count} possible")
        data = f.raw(self.i, device)
        self.i += 1
        return s, data

    def _where(self, s) -> str:
        """How an error names the section being taken (formatted only for an error)."""
        return f"section {self.i} ({s.kind_name})"

    def remaining(self) -> list:
        """The infos of the sections not taken yet (to bound an allocation before taking them)."""
        return self.frame.sections[self.i :]

    def done(self) -> None:
        if self.i != len(self.frame.sections):
            raise CorruptFrameError(f"frame has {len(self.frame.sections) - self.i} section(s) that codec {self.frame.spec!r} does not use")


def checksum_name(flags: int) -> str | None:
    """The payload checksum a frame's ``flags`` name (``"crc32c"``, ``"crc32"``) or None
    (formats v1 and v2 share the two flag bits)."""
    return next((name for name, (bit, _) in CHECKSUMS.items() if flags & bit), None)


def element_limit(max_elements) -> int:
    """The element-count limit a decode applies: ``max_elements`` (an integer in
    ``[0, 2**60]``, else ValueError naming it) or the default :data:`MAX_ELEMENTS`."""
    limit = MAX_ELEMENTS if max_elements is None else max_elements
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or not 0 <= limit <= MAX_ELEMENTS_LIMIT:
        raise CodecValueError(f"max_elements: must be an integer in [0, 2**60], got {max_elements!r}")
    return int(limit)


def check_dims(shape, limit: int, what: str) -> None:
    """CorruptFrameError (``what``, then the shape) when the non-zero dimensions of a declared
    ``shape`` exceed the larger of ``limit`` and 2**40: an empty shape such as ``(2**62, 0)``
    is no array NumPy can make."""
    if math.prod(d for d in shape if d) > max(limit, MAX_ELEMENTS):
        raise CorruptFrameError(f"{what} {tuple(shape)}: its non-zero dimensions exceed {max(limit, MAX_ELEMENTS)} elements")


def check_payload(mv, flags: int, crc_at: int, start: int) -> None:
    """The payload checksum ``flags`` name, stored at ``crc_at``, against ``mv[start:]``
    (nothing when the frame carries none); CorruptFrameError on a mismatch."""
    name = checksum_name(flags)
    if name is None:
        return
    (stored,) = _CRC.unpack_from(mv, crc_at)
    if CHECKSUMS[name][1](mv[start:]) != stored:
        raise CorruptFrameError("payload checksum mismatch: the section data is damaged")


#: payloads shorter than this are checked before decoding, in one call (a few microseconds
#: while still in cache), which costs less than noting a decode's pieces
CHECK_IN_PASS_MIN = 1 << 20


def payload_check(mv, flags: int, crc_at: int, start: int):
    """:func:`check_payload` left to the decode that reads ``mv[start:]``: a
    :class:`codec.payloadcheck.PayloadCheck` for a CRC-32C (the kernels that read the payload
    checksum it as they go); a zlib CRC32 and a payload below :data:`CHECK_IN_PASS_MIN` bytes
    are checked now, and a frame without a checksum has nothing to check (all None)."""
    if checksum_name(flags) != "crc32c" or mv.nbytes - start < CHECK_IN_PASS_MIN:
        check_payload(mv, flags, crc_at, start)
        return None
    from codec.payloadcheck import PayloadCheck

    return PayloadCheck(mv[start:], _CRC.unpack_from(mv, crc_at)[0])


def _as_buffer(buf) -> memoryview:
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise CodecTypeError(f"frame: expected bytes or a 1-D uint8 array, got an array of {buf.dtype} with shape {buf.shape}")
        buf = np.ascontiguousarray(buf)
    try:
        mv = memoryview(buf)
    except TypeError:
        raise CodecTypeError(f"frame: expected a bytes-like object, got {type(buf).__name__}") from None
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def parse_frame(buf, *, max_elements: int | None = None, verify_payload: bool | str = True) -> Frame:
    """Validate ``buf`` as a frame and return its parsed header (sections are read lazily).

    ``verify_payload=False`` skips the payload checksum (one pass over the payload) and
    nothing else: only for a frame this process has just built and still holds, as the
    error-feedback step's subtraction of its own frame (``Codec.subtract``).
    ``verify_payload="defer"``: the frame's ``check`` is the payload check its decode
    completes (:func:`payload_check`; ``Codec.decode_frame`` does), reading the payload once.

    ``buf`` may be a device frame (a uint8 device array): only its header crosses to the
    host, its checksum is verified on the device (:mod:`codec.devframe`)."""
    if on_device(buf):
        return _parse_device(buf, max_elements, verify_payload)
    mv = _as_buffer(buf)
    fr = parse_header(mv, mv.nbytes, max_elements)
    if verify_payload == "defer":
        fr.check = payload_check(mv, fr.flags, fr.header_len - 2 * _CRC.size, fr.header_len)
    elif verify_payload:
        check_payload(mv, fr.flags, fr.header_len - 2 * _CRC.size, fr.header_len)
    check_zstd(mv, fr.sections)
    return fr


def _parse_device(buf, max_elements, verify_payload: bool) -> Frame:
    """:func:`parse_frame` of a device frame: its header copied to the host and parsed there,
    its CRC-32C verified on the device, its sections read through a
    :class:`codec.devframe.DevicePayload` (zstd sections and a zlib CRC32: the whole frame
    read on the host)."""
    from codec import devframe

    data = devframe.device_frame(buf)
    head = devframe.head(data, MIN_FRAME)
    if data.size >= MIN_FRAME:
        head = devframe.head(data, fixed_header_length(head))
    fr = parse_header(head, data.size, max_elements)
    if checksum_name(fr.flags) == "crc32" or any(s.encoding != Encoding.RAW for s in fr.sections):
        return parse_frame(devframe.on_host(data), max_elements=max_elements, verify_payload=verify_payload)
    if verify_payload and fr.flags & FLAG_PAYLOAD_CRC32C:
        devframe.check_payload(data, fr.header_len, _CRC.unpack_from(head, fr.header_len - 2 * _CRC.size)[0])
    fr.buf = devframe.DevicePayload(data)
    return fr


def check_zstd(mv, sections) -> None:
    """Every zstd section's declared content size against the raw length its header implies
    (CorruptFrameError), before anything is decompressed."""
    if any(s.encoding == Encoding.ZSTD for s in sections):
        import zstandard

        for i, s in enumerate(sections):
            if s.encoding != Encoding.ZSTD:
                continue
            try:
                params = zstandard.get_frame_parameters(mv[s.offset : s.offset + s.stored_len])
            except zstandard.ZstdError as e:
                raise CorruptFrameError(f"section {i}: bad zstd header: {e}") from None
            if params.content_size != s.raw_len:
                raise CorruptFrameError(f"section {i}: zstd declares {params.content_size} bytes, header implies {s.raw_len}")


def fixed_header_length(fixed) -> int:
    """The header length a v1 frame's fixed 12 bytes ``fixed`` declare (nothing checked)."""
    _, _, flags, _, ndim, nsec, _, spec_len = _FIXED.unpack_from(fixed, 0)
    return header_length(ndim, spec_len, nsec, bool(flags & _PAYLOAD_FLAGS))


def parse_header(mv, size: int, max_elements: int | None = None) -> Frame:
    """Every check of :func:`parse_frame` but the payload's (its checksum, its zstd headers)
    on ``mv``, which holds at least the header of a frame of ``size`` bytes (a device
    frame's header, copied to the host); the Frame's ``buf`` is ``mv``."""
    if size < MIN_FRAME:
        raise CorruptFrameError(f"frame is {size} bytes, shorter than the {MIN_FRAME}-byte minimum header")
    magic, version, flags, dcode, ndim, nsec, reserved, spec_len = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise CorruptFrameError(f"not a gradcodec frame (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version == 2:
        raise CorruptFrameError("this is a many-tensor frame (format v2, from encode_many): decode it with codec.decode_many")
    if version != VERSION:
        raise CorruptFrameError(f"frame format version {version} is not supported (this gradcodec reads versions 1 and 2)")
    if flags & _RESERVED_FLAGS or reserved or flags & _PAYLOAD_FLAGS == _PAYLOAD_FLAGS:
        raise CorruptFrameError(f"reserved header bits are set (flags={flags:#04x}, reserved={reserved:#04x})")
    if ndim > MAX_NDIM or spec_len > MAX_SPEC:
        raise CorruptFrameError(f"header declares ndim={ndim}, spec length {spec_len}: beyond the format's limits")
    header_len = header_length(ndim, spec_len, nsec, bool(flags & _PAYLOAD_FLAGS))
    pos = header_len - _CRC.size
    if size < header_len:
        raise CorruptFrameError(f"frame is {size} bytes, shorter than its {header_len}-byte header")
    (crc,) = _CRC.unpack_from(mv, pos)
    if zlib.crc32(mv[:pos]) != crc:
        raise CorruptFrameError("header checksum mismatch: the header is damaged")
    if dcode not in dtypes.CODES:
        raise CorruptFrameError(f"unknown dtype code {dcode}")
    off = FIXED_SIZE
    shape = struct.unpack_from(f"<{ndim}Q", mv, off)
    off += 8 * ndim
    try:
        spec = bytes(mv[off : off + spec_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptFrameError("spec text is not UTF-8") from None
    off += spec_len
    n = math.prod(shape)
    sections = []
    data_off = header_len
    for i in range(nsec):
        kind, enc, bits, count, raw_len, stored_len = _SECTION.unpack_from(mv, off)
        off += SECTION_SIZE
        if enc not in (Encoding.RAW, Encoding.ZSTD) or not 1 <= bits <= 64:
            raise CorruptFrameError(f"section {i}: unknown encoding {enc} or item width {bits} bits")
        if raw_len != raw_length(count, bits):
            raise CorruptFrameError(f"section {i}: raw length {raw_len} does not hold {count} items of {bits} bits")
        if raw_len > SECTION_BYTES_PER_ELEMENT * n + 1024:
            raise CorruptFrameError(f"section {i}: {raw_len} raw bytes is more than {n} elements can need")
        if enc == Encoding.RAW and stored_len != raw_len:
            raise CorruptFrameError(f"section {i}: stored length {stored_len} != raw length {raw_len}")
        if stored_len > size - data_off:
            raise CorruptFrameError(f"section {i}: {stored_len} bytes declared, only {size - data_off} left in the frame")
        sections.append(SectionInfo(kind, enc, bits, count, raw_len, stored_len, data_off))
        data_off += stored_len
    if data_off != size:
        raise CorruptFrameError(f"frame is {size} bytes but its sections end at byte {data_off}")
    limit = element_limit(max_elements)
    if n > limit:
        raise CorruptFrameError(f"frame declares {n} elements, more than the limit of {limit}")
    check_dims(shape, limit, "frame declares shape")
    return Frame(mv, version, flags, dtypes.dtype_of(dcode), tuple(int(d) for d in shape), spec, sections, header_len)
