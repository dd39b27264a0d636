"""CUDA twin of ``codec/kernels/cpu/index.py``: the same names, arguments, positions and bytes.

The many-set kernels (``index_widths``, ``index_write``, ``index_counts``, ``index_read``)
take one thread per set, as the CPU takes one ``prange`` iteration per set, and each runs
the CPU file's own per-set function (``_width_of``, ``_write_section``, ``_count_bits``,
``_read_section``), compiled again as a device function from its Python source
(:func:`codec._cuda_jit.device_functions`): one statement of a section's bytes for both
backends.

One set on its own takes chunks of work per thread, with no barrier and no sort:

* ``delta_decode``: positions are the running sum of gaps plus one, a scan.  Each thread
  sums the gaps of its chunk of :data:`CHUNK` (launch 1), one thread adds the chunks' sums
  in order (launch 2: each chunk's first position, and whether the last one reaches ``n``),
  and each thread writes its chunk's positions from there (launch 3).  The sums saturate at
  ``n + 1``: a set whose positions pass ``n`` is refused whatever its gaps add up to, and no
  sum can overflow.  The answer is read back (one scalar).
* ``bitmap_count`` / ``bitmap_decode``: each thread counts the set bits of its stretch of
  :data:`CHUNK` bytes; the CPU's chunks of ``_BYTES`` bytes are whole stretches, so
  ``bitmap_count`` adds a chunk's stretches (one thread per chunk) and ``bitmap_decode``
  gives each stretch its first output slot from the chunk's ``starts`` (one thread per
  chunk, in order) before each thread writes its stretch's positions.
* ``delta_encode``: one thread per position writes its gap and checks its order; the largest
  gap is an atomic maximum.  ``bitmap_encode``: the bitmap is zeroed, then the first
  position of each byte writes that byte (it reads the at most eight positions in it).

Arguments may be device arrays or host NumPy arrays (Numba then copies them in and out, as
the kernel tests do); what the CPU functions return (``delta_encode``'s largest gap,
``delta_decode``'s answer, ``bitmap_count``'s counts) is returned on the host.
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import device_functions, jit, numba_cuda
from codec.errors import CodecValueError
from codec.kernels.cpu import index as _cpu
from codec.kernels.cuda._common import launch, owner, per_context, zero

cuda = numba_cuda()

__all__ = list(_cpu.__all__)

#: gaps a thread sums (and bitmap bytes a thread counts) in the one-set kernels; a divisor of
#: the CPU's ``_BYTES``, so its chunks are whole stretches
CHUNK = 256
assert _cpu._BYTES % CHUNK == 0

_twins = device_functions(_cpu, ["_popcount8", "_count_bits", "_bit_length", "_section_count", "_step", "_width_of", "_write_section", "_read_section"])
_count_bits, _section_count, _step, _width_of, _write_section, _read_section = (
    _twins[k] for k in ("_count_bits", "_section_count", "_step", "_width_of", "_write_section", "_read_section")
)
KIND, BITS, COUNT, BEGIN, LENGTH, BITMAP = _cpu.KIND, _cpu.BITS, _cpu.COUNT, _cpu.BEGIN, _cpu.LENGTH, _cpu.BITMAP


def _scalars():
    """Two int64 device scalars per context (a kernel's answer), reused by every call."""
    return per_context("index.scalars", lambda: cuda.device_array(2, np.int64))


def _stretches(n: int) -> int:
    return (n + CHUNK - 1) // CHUNK


# ---------------------------------------------------------------- one set: gaps
@jit
def _gaps(idx, out, got):
    for i in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        x = np.int64(idx[i])
        prev = np.int64(idx[i - 1]) if i else np.int64(-1)
        if x <= prev:
            got[1] = 1  # (every thread that finds one writes the same value)
            continue
        d = x - prev - 1
        out[i] = np.uint64(d)
        cuda.atomic.max(got, 0, d)


def delta_encode(idx, out):
    """Gaps of sorted unique ``idx``: out[0] = idx[0], out[i] = idx[i] - idx[i-1] - 1.

    Returns the largest gap (0 when empty); -1 if ``idx`` is not strictly increasing and >= 0."""
    if not idx.size:
        return 0
    got = _scalars()
    zero[1, 2](got)
    _gaps[launch(idx.size)](idx, out, got)
    big, bad = (int(v) for v in got.copy_to_host())
    return -1 if bad else big


@jit
def _gap_sums(gaps, cap, sums):
    for c in range(cuda.grid(1), sums.size, cuda.gridsize(1)):
        s = np.uint64(0)
        for i in range(c * CHUNK, min(gaps.size, (c + 1) * CHUNK)):
            g = np.uint64(gaps[i])
            s = cap if g >= cap else min(cap, s + g + np.uint64(1))
            if s == cap:
                break
        sums[c] = s


@jit
def _in_order(sums, cap, firsts, got):
    """One thread: each chunk's first value (the saturated sum of the chunks before it), and
    the total."""
    if cuda.grid(1) == 0:
        s = np.uint64(0)
        for c in range(sums.size):
            firsts[c] = s
            s = min(cap, s + sums[c])
        got[0] = np.int64(s)


@jit
def _positions(gaps, firsts, n, out):
    for c in range(cuda.grid(1), firsts.size, cuda.gridsize(1)):
        pos = np.int64(firsts[c]) - 1  # (at most n: the sums saturate at n + 1)
        if pos >= n:
            continue  # (the total says so: the set is refused)
        for i in range(c * CHUNK, min(gaps.size, (c + 1) * CHUNK)):
            pos = _step(pos, np.uint64(gaps[i]), n)
            if pos >= n:
                break  # (likewise)
            out[i] = pos


def delta_decode(gaps, n, out):
    """Positions from gaps; returns False (leaving ``out`` partly filled) if one reaches ``n``."""
    m = gaps.size
    if not m:
        return True
    if n >= 1 << 62:
        raise CodecValueError(f"n: {n} elements; gaps decode on the device below 2**62")
    if n < 1:
        return False
    k = _stretches(m)
    sums = cuda.device_array(k, np.uint64)
    firsts = cuda.device_array(k, np.uint64)
    cap = np.uint64(n + 1)  # sums saturate here: any set that reaches it is refused
    got = _scalars()
    _gap_sums[launch(k)](gaps, cap, sums)
    _in_order[1, 1](sums, cap, firsts, got)
    _positions[launch(k)](gaps, firsts, n, out)
    return int(got[:1].copy_to_host()[0]) <= n


# ---------------------------------------------------------------- one set: bitmaps
@jit
def _set_bytes(idx, out):
    for i in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        b = idx[i] >> 3
        if b < 0 or b >= out.size or (i and idx[i - 1] >> 3 == b):
            continue  # outside the bitmap (the CPU skips it too), or not the byte's first position: that one writes the byte
        v = np.uint8(0)
        j = i
        while j < idx.size and idx[j] >> 3 == b:
            v |= np.uint8(1) << np.uint8(idx[j] & 7)
            j += 1
        out[b] = v


def bitmap_encode(idx, out):
    """Bitmap of sorted unique positions ``idx`` (LSB-first) into ``out``, every byte written."""
    if out.size:
        zero[launch(out.size)](out)
    if idx.size:
        _set_bytes[launch(idx.size)](idx, out)


@jit
def _stretch_counts(bitmap, counts):
    for c in range(cuda.grid(1), counts.size, cuda.gridsize(1)):
        counts[c] = _count_bits(bitmap, c * CHUNK, min(bitmap.size, (c + 1) * CHUNK))


@jit
def _chunk_totals(counts, per, totals):
    for c in range(cuda.grid(1), totals.size, cuda.gridsize(1)):
        s = np.int64(0)
        for j in range(c * per, min(counts.size, (c + 1) * per)):
            s += counts[j]
        totals[c] = s


def _counted(bitmap):
    counts = cuda.device_array(_stretches(bitmap.size), np.int64)
    if counts.size:
        _stretch_counts[launch(counts.size)](bitmap, counts)
    return counts


def bitmap_count(bitmap):
    """Set bits per chunk of ``_BYTES`` bytes (an int64 host array)."""
    counts = _counted(bitmap)
    per = _cpu._BYTES // CHUNK
    totals = cuda.device_array((counts.size + per - 1) // per, np.int64)
    if totals.size:
        _chunk_totals[launch(totals.size)](counts, per, totals)
    return totals.copy_to_host()


@jit
def _stretch_firsts(counts, per, starts, firsts):
    for c in range(cuda.grid(1), starts.size, cuda.gridsize(1)):
        s = np.int64(starts[c])
        for j in range(c * per, min(firsts.size, (c + 1) * per)):
            firsts[j] = s
            s += counts[j]


@jit
def _bit_positions(bitmap, firsts, out):
    for c in range(cuda.grid(1), firsts.size, cuda.gridsize(1)):
        k = firsts[c]
        for t in range(c * CHUNK, min(bitmap.size, (c + 1) * CHUNK)):
            b = bitmap[t]
            for j in range(8):
                if (b >> j) & 1:
                    out[k] = np.int64(t) * 8 + j
                    k += 1


def bitmap_decode(bitmap, starts, out):
    """Positions of set bits, given each chunk's first output slot ``starts`` (from bitmap_count)."""
    counts = _counted(bitmap)
    per = _cpu._BYTES // CHUNK
    k = min(counts.size, starts.size * per)  # the stretches of the chunks ``starts`` names (the CPU reads those)
    if not k:
        return
    firsts = cuda.device_array(k, np.int64)
    _stretch_firsts[launch(starts.size)](counts, per, starts, firsts)
    _bit_positions[launch(k)](bitmap, firsts, out)


# ---------------------------------------------------------------- many sets: a thread each
@jit
def _widths(pos, starts, sizes, widths):
    for s in range(cuda.grid(1), widths.size, cuda.gridsize(1)):
        widths[s] = _width_of(pos, starts[s], starts[s + 1], sizes[s])


def index_widths(pos, starts, sizes, widths):
    """Per set ``s``, ``widths[s]``: its gaps' width, or -1 (the CPU kernel's contract)."""
    if widths.size:
        _widths[launch(widths.size)](pos, starts, sizes, widths)


@jit
def _write(pos, starts, widths, bitmap, offsets, out):
    for s in range(cuda.grid(1), widths.size, cuda.gridsize(1)):
        _write_section(pos, starts[s], starts[s + 1], widths[s], bitmap[s], out, offsets[s], offsets[s + 1])


def index_write(pos, starts, widths, bitmap, offsets, out):
    """Set ``s``'s index section at ``out[offsets[s]:offsets[s+1]]`` (the CPU kernel's bytes)."""
    if widths.size:
        _write[launch(widths.size)](pos, starts, widths, bitmap, offsets, out)


@jit
def _counts(data, sections, sizes, out_counts):
    for s in range(cuda.grid(1), sizes.size, cuda.gridsize(1)):
        out_counts[s] = _section_count(data, sections[s, KIND], sections[s, BITS], sections[s, COUNT], sections[s, BEGIN], sections[s, LENGTH], sizes[s])


def index_counts(data, sections, sizes, out_counts):
    """Per index section ``s`` (row ``s`` of the section table), how many positions it
    holds, or -1 when no encoder writes it (the CPU kernel's contract)."""
    if sizes.size:
        _counts[launch(sizes.size)](data, sections, sizes, out_counts)


@jit
def _read(data, sections, sizes, out_starts, out, bad):
    for s in range(cuda.grid(1), sizes.size, cuda.gridsize(1)):
        lo = sections[s, BEGIN]
        if not _read_section(data, lo, lo + sections[s, LENGTH], sections[s, KIND] == BITMAP, sections[s, BITS], sizes[s], out, out_starts[s], out_starts[s + 1]):
            bad[s] = 1


def index_read(data, sections, sizes, out_starts, out, bad):
    """Index section ``s``'s positions into ``out[out_starts[s]:out_starts[s+1]]``, ``bad[s] =
    1`` when one reaches ``sizes[s]`` (the CPU kernel's contract)."""
    if sizes.size:
        _read[launch(sizes.size)](data, sections, sizes, out_starts, out, bad)


# ---------------------------------------------------------------- many sets: a thread per position
@jit
def _absolute(pos, kstarts, starts, out):
    for j in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[j] = pos[j] + starts[owner(kstarts, j)]


def absolute_positions(pos, kstarts, starts, out):
    """The CPU kernel's ``absolute_positions``: a thread per position, its set found by a
    binary search of ``kstarts``."""
    if out.size:
        _absolute[launch(out.size)](pos, kstarts, starts, out)
