"""The ``fft`` stage's inverse (:mod:`codec.stages.transform.fft`): a tensor's kept
coefficients, or a whole run's (:class:`RunSpectrum`), back into its elements, a chunk of
whole blocks at a time, where the output lives.

Consecutive blocks of any lengths (a tensor's full blocks and its tail; a run's tensors, one
after another) are grouped into chunks of about ``CHUNK`` output elements and spectrum
floats on the host, ``DEVICE_CHUNK`` on a device.  A chunk's kept coefficients are placed in
its zero spectrum (``place`` over it as one row), its rows inverted (``irfft``, or
``irfft_rows`` for several lengths), its elements rounded to a 16-bit dtype and stored or
added (``stage.emit``).  Every block is one inverse transform of its whole length, whatever
shares its call, so the result is the unchunked inverse bit for bit, and the working memory
is a chunk's, not the tensor's.  On the host the chunks run on the thread budget's threads
(``codec.threads.each``: each takes the next chunk, its transform on one worker, its kernels
serial; no barrier between chunks, so a descheduled thread holds back only its own chunk);
on a device, one after another.
"""

from __future__ import annotations

import numpy as np

from codec import threads
from codec.device import Memory
from codec.dtypes import on_device
from codec.kernels import backend
from codec.ops import readonly

__all__ = ["CHUNK", "DEVICE_CHUNK", "RunSpectrum", "chunk_rows", "emit_chunked", "invert"]

#: output elements (and spectrum floats) a host chunk holds: whole blocks, one block when a
#: block is longer.  Decoding's working memory beside the coefficients is a few chunks per
#: thread.  Below ``codec._jit.PARALLEL_MIN``, so a chunk's kernels run serially: one
#: parallel region per chunk cost up to a scheduler slice each on a busy machine
#: (2**18-element chunks: 0.1 s -> 2 s for 20M elements on 2 loaded cores); the chunks run on
#: the thread budget's threads instead.  One chunk after another, each transform of 15
#: blocks split between two workers, decoded 25M float32 values in 103-114 ms; on two
#: threads 43-49 ms (issue 33, twenty-third stop)
CHUNK = 1 << 16
#: the same for a device output: launches, not memory, are what a chunk costs there (one
#: radix-2 pass is a launch over every row of a chunk)
DEVICE_CHUNK = 1 << 22


class RunSpectrum:
    """What :meth:`FFT.read_segments` reads of a run of tensors: its
    :class:`~codec.stages.transform.fft.RunLayout`, the kept positions in the run's spectrum
    (sorted, checked) and the frame's dtype."""

    def __init__(self, run, pos, dtype):
        self.run, self.pos, self.dtype = run, pos, dtype


def invert(stage, payload, values, out, mode) -> None:
    """``stage.emit`` (``mode``) of the inverse of ``payload`` into ``out``: a tensor's
    ``(Layout, kept positions, dtype)`` (positions None: every coefficient kept, and
    ``values`` is the spectrum itself, transformed in place of a copy on the host) or a
    :class:`RunSpectrum`, whose tensors lie end to end in ``out``; ``values`` the kept
    ``re, im`` in the domain dtype.  The module docstring has the chunks."""
    if isinstance(payload, RunSpectrum):
        run, pos, dtype = payload.run, payload.pos, payload.dtype
        parts = [(s + start, length, rows, c, cb + base) for lay, s, cb in zip(run.lays, run.starts, run.cbase) for start, length, rows, c, base in lay.parts()]
    else:
        lay, pos, dtype = payload
        parts = list(lay.parts())
    device = on_device(out)
    limit = DEVICE_CHUNK if device else CHUNK
    mem = Memory(device)
    kern = backend("spectral", out)
    flat = out.reshape(out.size)
    if pos is not None:
        pos, values = readonly(pos), readonly(values)
    chunks = _chunks(parts, limit)
    widest = max((max(ne, 2 * nc) for _, ne, _, nc, _ in chunks), default=0)
    workers = None if device else 1  # (a host chunk's transform on its thread alone)

    def chunk(i, bufs):
        e0, ne, c0, nc, table = chunks[i]
        if pos is None:
            spec = mem.put(values[2 * c0 : 2 * (c0 + nc)])
        else:
            spec = bufs[0][: 2 * nc]
            p0, p1 = np.searchsorted(pos, (c0, c0 + nc))
            kern.place(spec.reshape(1, 2 * nc), c0, pos[p0:p1], values[2 * p0 : 2 * p1])
        if table.shape[0] == 1:  # (one piece: its inverse emitted as it is)
            _, n, r, w, _, _ = table[0].tolist()
            y = kern.irfft(readonly(spec).reshape(r, w), n, workers).reshape(ne)
        else:
            if bufs[1] is None:
                bufs[1] = mem.empty(widest, values.dtype)
            y = bufs[1][:ne]
            kern.irfft_rows(readonly(spec), table, y, workers)
        emit_chunked(stage, y, flat[e0 : e0 + ne], mode, dtype, limit)

    def scratch():
        """A thread's spectrum (none when it is ``values`` itself) and its chunks' inverse
        (made when a chunk has several pieces)."""
        return [None if pos is None else mem.empty(widest, values.dtype), None]

    if device:
        bufs = scratch()
        for i in range(len(chunks)):
            chunk(i, bufs)
    else:  # (each chunk writes its own elements of out)
        threads.each(len(chunks), chunk, scratch)


def _chunks(parts, limit: int) -> list:
    """``parts`` (first element, length, rows, coefficients per row, first coefficient;
    elements and coefficients each lying end to end) cut into pieces of whole rows of at
    most ``limit`` elements and spectrum floats (:func:`chunk_rows`), consecutive pieces
    grouped into chunks of at most that much: per chunk its first element, elements, first
    coefficient, coefficients and its ``irfft_rows`` table (in the chunk's spectrum floats
    and elements)."""
    chunks, rows_of, size = [], [], 0

    def close():
        e0, c0 = rows_of[0][4], rows_of[0][0]
        last = rows_of[-1]
        table = np.array([(2 * (cs - c0), n, r, 2 * c, es - e0, n) for cs, n, r, c, es in rows_of], np.int64)
        chunks.append((e0, last[4] + last[2] * last[1] - e0, c0, last[0] + last[2] * last[3] - c0, table))
        rows_of.clear()

    for start, length, rows, c, base in parts:
        step = chunk_rows(length, rows, limit)
        for r0 in range(0, rows, step):
            r = min(step, rows - r0)
            work = r * max(length, 2 * c)
            if rows_of and size + work > limit:
                close()
                size = 0
            rows_of.append((base + r0 * c, length, r, c, start + r0 * length))
            size += work
    if rows_of:
        close()
    return chunks


def chunk_rows(length: int, rows: int, chunk: int = CHUNK) -> int:
    """Rows of ``length`` elements the inverse transforms at a time: at most ``chunk`` output
    elements and spectrum floats (``2*(length//2 + 1)`` a row), at least one row.  Each row
    is one whole inverse transform; pocketfft's result for a row does not depend on which
    rows share the call (checked for lengths 1 to 65537, arbitrary row ranges, 1-3 workers),
    nor does the device's (a fixed order per row)."""
    return min(max(1, chunk // max(length, 2 * (length // 2 + 1))), max(rows, 1))


def emit_chunked(stage, y, out, mode, dtype, chunk: int = CHUNK) -> None:
    """``stage.emit`` of flat ``y`` into flat ``out``, ``chunk`` elements at a time: rounding
    to a 16-bit dtype and adding are elementwise, so the result is the unchunked one, and the
    temporaries are those of a chunk."""
    for i in range(0, y.size, chunk):
        stage.emit(y[i : i + chunk], out[i : i + chunk], mode, dtype)
