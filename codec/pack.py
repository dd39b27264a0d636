"""Packing shared by every codec: n-bit codes and index sets (kernels: the ``pack`` and ``index`` families).

* :func:`pack_bits` / :func:`unpack_bits`: codes of 1..64 bits, LSB-first, exactly
  ``ceil(n*bits/8)`` bytes.
* :func:`encode_indices` / :func:`decode_indices`: a sorted set of positions in ``range(n)``
  as whichever is smaller, a bitmap (``n`` bits) or gaps-minus-one bit-packed with the
  minimal width; the choice is the section's kind, recorded in the frame header.  Positions
  are int64 throughout, so any element count up to 2**40 works.
"""

from __future__ import annotations

import operator

import numpy as np

from codec.device import Memory
from codec.dtypes import on_device
from codec.errors import CodecTypeError, CodecValueError, CorruptFrameError
from codec.frame import SectionKind, Section, SectionRun, raw_length
from codec.kernels import backend
from codec.ops import continued, offsets, readonly


def _code_dtype(bits: int):
    return np.uint8 if bits <= 8 else np.uint16 if bits <= 16 else np.uint32 if bits <= 32 else np.uint64


def _integer(value, name: str) -> int:
    """``value`` as a Python int (anything ``operator.index`` takes), or a CodecTypeError naming ``name``."""
    try:
        return operator.index(value)
    except TypeError:
        raise CodecTypeError(f"{name}: expected an integer, got {type(value).__name__}") from None


def _bits(bits) -> int:
    b = _integer(bits, "bits")
    if not 1 <= b <= 64:
        raise CodecValueError(f"bits: must be within 1..64, got {b}")
    return b


def _as_bytes(data) -> np.ndarray:
    """``data`` (bytes-like or any NumPy array) as a flat, contiguous uint8 array of its bytes."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(data, np.uint8)


def pack_bits(codes, bits: int) -> np.ndarray:
    """Pack unsigned integer ``codes`` (low ``bits`` of each, 1 <= bits <= 64) into uint8."""
    bits = _bits(bits)
    codes = _natural(codes, bits)
    out = np.empty(raw_length(codes.size, bits), np.uint8)  # the kernel writes every byte
    _pack(codes, bits, out, None)
    return out


def pack_into(codes, bits: int, out: np.ndarray, crc: int | None = None) -> int | None:
    """:func:`pack_bits` of host ``codes`` into ``out`` (uint8, exactly ``ceil(n*bits/8)``
    bytes: a section's place in its frame); with ``crc`` (the payload's CRC-32C so far),
    return it continued over ``out``, each chunk checksummed as it is packed."""
    bits = _bits(bits)
    return _pack(_natural(codes, bits), bits, out, crc)


def _natural(codes, bits: int) -> np.ndarray:
    """Unsigned ``codes`` flat in the natural dtype for the width (a cast keeps the low bits,
    the only ones packed): one kernel signature per width class; no copy when the caller
    already uses it."""
    codes = np.asarray(codes)
    if codes.dtype.kind != "u":
        raise CodecTypeError(f"codes: expected an unsigned integer array, got {codes.dtype}")
    return np.ascontiguousarray(codes, _code_dtype(bits)).reshape(-1)


def _pack(codes, bits: int, out, crc):
    """The packing of :func:`pack_bits` and :func:`pack_into`, their arguments checked
    (``codes`` in their natural dtype)."""
    got = backend("pack", codes).pack_codes(readonly(codes), bits, out, -1 if crc is None else crc) if codes.size else -1
    return continued(out, crc, got)


def unpack_bits(data, bits: int, count: int, dtype=None) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``count`` codes (the narrowest unsigned dtype, or ``dtype``).

    ``data`` is any bytes-like object or array (read as its bytes); bytes past the first
    ``ceil(count*bits/8)`` are ignored.
    """
    bits = _bits(bits)
    count = _integer(count, "count")
    if count < 0:
        raise CodecValueError(f"count: must be >= 0, got {count}")
    dtype = np.dtype(_code_dtype(bits) if dtype is None else dtype)  # (a dtype object is falsy on NumPy 1.x)
    if dtype.kind != "u":
        raise CodecTypeError(f"dtype: expected an unsigned integer dtype, got {dtype}")
    if dtype.itemsize * 8 < bits:
        raise CodecValueError(f"dtype: {dtype} cannot hold {bits}-bit codes")
    data = _as_bytes(data)
    if data.size < raw_length(count, bits):
        raise CodecValueError(f"data: {data.size} bytes cannot hold {count} codes of {bits} bits")
    out = np.empty(count, _code_dtype(bits))
    if count:
        backend("pack", data).unpack_codes(readonly(data), bits, out)
    return out if out.dtype == dtype else out.astype(dtype)


def encode_indices(idx, n: int) -> Section:
    """Code sorted unique positions ``idx`` (< n) as the smaller of a bitmap and packed gaps.

    Ties go to the packed gaps.  The bitmap is only allocated when it is chosen, so a few
    positions in a huge range cost no memory.  Positions in device memory (1-D int64) are
    coded there by the ``index`` and ``pack`` twins, the section's bytes left there (a
    device array, moved once to wherever the frame is written): only three scalars (the
    last position, the largest gap and the order check) come to the host.
    """
    n = _integer(n, "n")
    if n < 0:
        raise CodecValueError(f"n: must be >= 0, got {n}")
    mem = Memory(on_device(idx))
    idx = _positions_below(idx, n, mem)
    k = idx.size
    kern = backend("index", idx)
    gaps = mem.empty(k, np.uint64)
    big = kern.delta_encode(idx, gaps) if k else 0  # (-1 also for a negative first position)
    if big < 0:
        raise CodecValueError("idx: positions must be strictly increasing")
    width = max(1, int(big).bit_length())
    if raw_length(k, width) <= raw_length(n, 1):
        if not mem.device:
            return Section(SectionKind.INDEX_DELTA, width, k, pack_bits(gaps, width))
        out = mem.empty(raw_length(k, width), np.uint8)
        if k:
            backend("pack", gaps).pack_codes(gaps, width, out)
        return Section(SectionKind.INDEX_DELTA, width, k, out)  # (device bytes: moved once, to wherever the frame is)
    bitmap = mem.empty(raw_length(n, 1), np.uint8)  # the kernel writes every byte
    kern.bitmap_encode(idx, bitmap)
    return Section(SectionKind.INDEX_BITMAP, 1, n, bitmap)


def index_bound(most: int, n: int, least: int | None = None, gap: int | None = None) -> int:
    """The most raw bytes :func:`encode_indices` writes for positions in ``range(n)``, whatever
    they are, when there are between ``least`` and ``most`` of them (``least`` defaults to
    ``most``: exactly that many; ``most`` is capped at ``n``).  A select or transform
    stage's :meth:`~codec.stage.Select.bound` of its index section (always one section).

    The section is the smaller of the bitmap, ``raw_length(n, 1)``, and ``j`` gaps packed at
    the width of the largest gap (``max(1, bit_length)``; gaps are minus one, the first
    being the first position itself: :func:`codec.kernels.cpu.index.delta_encode`).  ``j``
    positions' gaps add up to at most ``n - j`` (the last position is below ``n``), and all
    of it can be one gap (the last ``j`` positions), so the worst width of ``j`` positions is
    that of ``n - j``; ``gap``: the largest gap the caller's positions can have, when it is
    less (fft's blocks).  The packed size ``j * width(n - j)`` is not monotone in ``j`` (the
    width falls by a bit as ``n - j`` crosses a power of two), so the largest over ``[least,
    most]`` is taken: at ``most``, or at the last ``j`` before a width falls.  Without
    ``gap`` it is exact: some ``j`` positions in the range reach it."""
    n = int(n)
    most = min(int(most), n)
    least = most if least is None else max(0, min(int(least), most))
    if most <= 0:
        return 0
    if gap is not None:
        return min(raw_length(n, 1), raw_length(most, max(1, int(gap).bit_length())))
    worst = raw_length(most, max(1, (n - most).bit_length()))
    for b in range((n - most).bit_length() + 1, n.bit_length() + 1):  # j = n - 2**(b-1): the largest j of width b
        j = n - (1 << (b - 1))
        if least <= j < most:
            worst = max(worst, raw_length(j, b))
    return min(raw_length(n, 1), worst)


def _positions_below(idx, n: int, mem):
    """``idx`` as the int64 positions :func:`encode_indices` codes (read-only on the host),
    after the checks that need no pass over them: integers, 1-D on a device, the first at
    least 0 (on the host) and the last below ``n`` (the order and the rest are checked as
    the gaps are formed)."""
    if mem.device:
        if idx.dtype != np.int64 or idx.ndim != 1:
            raise CodecTypeError(f"idx: device positions must be 1-D int64, got {idx.dtype}{list(idx.shape)}")
        if idx.size and int(mem.host(idx[idx.size - 1 :])[0]) >= n:
            raise CodecValueError(f"idx: positions must lie in [0, {n})")
        return idx
    idx = np.asarray(idx)
    if idx.size and idx.dtype.kind not in "iu":
        raise CodecTypeError(f"idx: expected integer positions, got {idx.dtype}")
    if idx.dtype.kind == "u" and idx.size and idx.max() > np.iinfo(np.int64).max:
        raise CodecValueError(f"idx: positions must lie in [0, {n})")
    idx = np.ascontiguousarray(idx, dtype=np.int64).reshape(-1)
    if idx.size and (idx[0] < 0 or idx[-1] >= n):
        raise CodecValueError(f"idx: positions must lie in [0, {n})")
    return readonly(idx)


def index_segments(pos, starts, sizes) -> SectionRun | None:
    """:func:`encode_index_segments` as one :class:`codec.frame.SectionRun`, or None when a set's gaps need
    more than 56 bits (then :func:`encode_indices` codes each set)."""
    mem = Memory(on_device(pos))  # device positions: the sections made there, only their bytes (and a width per set) come back
    if not mem.device:
        pos = readonly(np.ascontiguousarray(pos, np.int64))
    starts = readonly(np.ascontiguousarray(starts, np.int64))
    sizes = np.asarray(sizes, np.int64)
    nseg = sizes.size
    counts = starts[1:] - starts[:-1]
    kern = backend("index", pos)
    dstarts = mem.put(starts)
    widths = mem.empty(nseg, np.int64)
    kern.index_widths(pos, dstarts, mem.put(readonly(sizes)), widths)
    widths = mem.host(widths)
    if nseg and widths.min() < 0:
        raise CodecValueError("idx: each set's positions must be strictly increasing and lie in [0, n)")
    if nseg and widths.max() > 56:  # gaps beyond the kernel's 64-bit accumulator
        return None
    delta = (counts * widths + 7) // 8
    full = (sizes + 7) // 8
    bitmap = delta > full  # ties go to the packed gaps, as encode_indices decides
    at = offsets(np.where(bitmap, full, delta))
    out = mem.empty(int(at[-1]), np.uint8)
    if nseg:
        kern.index_write(pos, dstarts, mem.put(widths), mem.put(readonly(bitmap)), mem.put(at), out)
    out = mem.host(out)
    kinds = np.where(bitmap, _BITMAP, _DELTA).tolist()  # (plain ints: NumPy converts an enum member slowly)
    return SectionRun(out, at, kinds, np.where(bitmap, 1, widths).tolist(), np.where(bitmap, sizes, counts).tolist())


_BITMAP, _DELTA = int(SectionKind.INDEX_BITMAP), int(SectionKind.INDEX_DELTA)
#: the kinds of an index section, as plain ints (a set: a section's kind is looked up once)
INDEX_KINDS = frozenset((_BITMAP, _DELTA))


def encode_index_segments(pos, starts, sizes) -> list:
    """:func:`encode_indices` of many position sets at once: set ``s`` is
    ``pos[starts[s]:starts[s+1]]`` (sorted, unique, relative to its own range ``sizes[s]``),
    and its section is exactly what ``encode_indices(set, sizes[s])`` gives, computed by two
    kernel calls for all the sets (``index_widths``, ``index_write``) into one buffer that the
    sections view.  For the runs of small tensors of a many-tensor frame (gaps of at most 56
    bits: any tensor below 2**56 elements)."""
    run = index_segments(pos, starts, sizes)
    if run is not None:
        return run.sections()
    pos, starts = np.asarray(pos, np.int64), np.asarray(starts, np.int64)
    return [encode_indices(pos[starts[i] : starts[i + 1]], int(sizes[i])) for i in range(len(sizes))]


def decode_index_segments(data, infos, sizes) -> list | None:
    """:func:`decode_indices` of many index sections at once: ``infos[s]`` (a SectionInfo:
    kind, bits, count, raw length and offset into ``data``, a raw uint8 payload) addresses
    ``sizes[s]`` elements.  Returns each section's positions (views of one array: what
    :func:`decode_index_run` reads), or None when any section is not one an encoder writes
    (or has gaps beyond 56 bits): :func:`decode_indices` of each, the one definition of what
    is refused and how it is named, then finds it."""
    got = decode_index_run(data, infos, sizes)
    if got is None:
        return None
    pos, out_starts = got
    o = out_starts.tolist()
    return [pos[o[s] : o[s + 1]] for s in range(len(infos))]


def decode_index_run(data, infos, sizes) -> tuple | None:
    """:func:`decode_index_segments` as one array: ``(positions, starts)``, section ``s``'s
    positions (from its own tensor's start) being ``positions[starts[s]:starts[s+1]]``, read
    by two kernel calls (``index_counts``, ``index_read``); None as it refuses."""
    nseg = len(infos)
    if not nseg:
        return np.empty(0, np.int64), np.zeros(1, np.int64)
    table = section_table(infos)
    sizes = np.asarray(sizes, np.int64)
    kern = backend("index", data)
    data = readonly(data)
    found = np.empty(nseg, np.int64)
    kern.index_counts(data, table, sizes, found)
    if found.min() < 0:
        return None
    out_starts = offsets(found)
    pos = np.empty(int(out_starts[-1]), np.int64)
    bad = np.zeros(nseg, np.uint8)
    kern.index_read(data, table, sizes, out_starts, pos, bad)
    if bad.any():
        return None
    return pos, out_starts


def section_table(infos) -> np.ndarray:
    """The ``index`` family's section table of ``infos`` (SectionInfo): one int64 row per
    section, its kind, bits, count, offset and raw length (``codec.kernels.cpu.index``'s
    ``KIND`` .. ``LENGTH`` columns)."""
    return readonly(np.array([(i.kind, i.bits, i.count, i.offset, i.raw_len) for i in infos], np.int64).reshape(-1, 5))


def padding_bytes(starts, counts, bits, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per section of ``counts`` items of ``bits`` bits (arrays, or a scalar ``bits``) packed
    from byte ``starts`` of ``nbytes`` bytes, for those whose last byte has padding bits past
    their last item: that byte (one outside the bytes reads the nearest; callers check the
    lengths) and the padding's shift, so that a section's padding is clear, as
    :func:`_check_payload` checks one, when ``data[last] >> shift`` is 0 (and ``nbytes`` is
    not 0).  What reading a run of codes checks (:meth:`codec.stages.value.quantizer.Quantizer.run_plan`)."""
    used = (np.asarray(counts, np.int64) * bits) % 8
    pad = used != 0
    last = np.minimum(np.maximum(starts + (counts * bits + 7) // 8 - 1, 0), max(nbytes - 1, 0))  # (np.clip's wrapper costs more than the rest)
    return last[pad], used[pad]


def _check_payload(raw: np.ndarray, count: int, bits: int, what: str) -> None:
    """``raw`` must be exactly ``count`` items of ``bits`` bits with the padding bits clear."""
    want = raw_length(count, bits)
    if raw.size != want:
        raise CorruptFrameError(f"{what}: {raw.size} bytes for {count} items of {bits} bits (want {want})")
    used = (count * bits) % 8
    if used and int(raw[-1]) >> used:
        raise CorruptFrameError(f"{what}: padding bits past the last item are set")


#: the smallest index section (bytes) that a decode into a device array reads on the device:
#: the twin costs four or five launches and one scalar read back (about 0.2 ms with Numba,
#: docs/benchmarks-log.md), the host about 1 ns a position to read gaps plus the int64
#: positions' copy; from 128 KB (about 95K positions of 11-bit gaps, a bitmap of a million
#: elements) the device is the cheaper, by that estimate
DEVICE_SECTION = 1 << 17


def decode_indices(info, raw, n: int, device: bool = False):
    """Positions from an index section (``info`` from the frame header, ``raw`` its bytes).

    Raises CorruptFrameError for anything an encoder cannot have produced: positions out of
    ``range(n)``, a width wider than any gap in ``range(n)`` needs, a wrong byte length,
    set padding bits, or a section that is not an index set.  ``device``: a decode that
    writes a device array; a section of at least :data:`DEVICE_SECTION` bytes is then read
    on the device (its bytes copied there, the ``index`` family's CUDA twin reading them)
    and its positions returned as a device array, so the section crosses the link instead of
    8 bytes a position; a section of a device frame (``raw`` a device array) is read there
    whatever its size.
    """
    n = _integer(n, "n")
    raw = raw if on_device(raw) else _as_bytes(raw)  # (a device frame's section, read on the device)
    kind, bits, count = int(info.kind), int(info.bits), int(info.count)
    if kind == SectionKind.INDEX_DELTA:
        if count > n or not 1 <= bits <= max(1, (n - 1).bit_length()):
            raise CorruptFrameError(f"index section: {count} gaps of {bits} bits cannot address {n} elements")
        _check_payload(raw, count, bits, "index section")
    elif kind == SectionKind.INDEX_BITMAP:
        if bits != 1 or count != n:
            raise CorruptFrameError(f"index bitmap: {count} items of {bits} bits for {n} elements")
        _check_payload(raw, n, 1, "index bitmap")
    else:
        raise CorruptFrameError(f"section kind {kind} is not an index set")
    mem = Memory(device and raw.size > 0 and (on_device(raw) or raw.size >= DEVICE_SECTION))
    raw = mem.put(readonly(raw))
    kern = backend("index", raw)
    if kind == SectionKind.INDEX_DELTA:
        gaps = mem.empty(count, _code_dtype(bits))
        if count:
            backend("pack", raw).unpack_codes(raw, bits, gaps)
        idx = mem.empty(count, np.int64)
        if not kern.delta_decode(readonly(gaps), n, idx):
            raise CorruptFrameError(f"index section: a position lies beyond the {n} elements")
        return idx
    counts = kern.bitmap_count(raw)
    idx = mem.empty(int(counts.sum()), np.int64)
    if idx.size:
        kern.bitmap_decode(raw, offsets(counts[:-1]), idx)
    return idx
