"""CUDA twin of ``codec/kernels/cpu/spectral.py``: the ``fft`` stage on the device.

* ``rfft`` / ``irfft`` / ``rfft_rows`` / ``irfft_rows``: a blocked real FFT in Numba (no cuFFT,
  no CuPy: the simulator runs it and a GPU needs nothing more than Numba), in
  :mod:`codec.kernels.cuda._fft` (radix-2 Stockham, Bluestein's chirp-z for other lengths;
  rows of any mix of lengths in one launch).  Its frames are not the host's bit for bit:
  docs/kernels.md ("The FFT on the device") gives the tolerance the tests hold.
* ``magnitudes``: ``re*re + im*im`` in float64 (products rounded on their own, as the CPU
  kernel's: ``_common.mul``), a thread per coefficient; a row with a NaN or infinite
  magnitude gets ``bad[row] = 1``.
* ``block_top``: the magnitudes, then the exact top-k of every row by the ``select`` twin's
  segmented kernel (``topk_segments``: a radix select and an ordered compaction, ties to the
  lower index) and a gather of the kept ``re, im``: the CPU kernel's answer for the same
  spectrum.
* ``place``: zero the rows, then scatter the kept coefficients (a thread per kept one).
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import jit, numba_cuda
from codec.kernels.cpu import spectral as _cpu
from codec.kernels.cuda import _common, _fft, _segments
from codec.kernels.cuda._common import Results, dev, launch, mul, zero

cuda = numba_cuda()

__all__ = list(_cpu.__all__)


def rfft(x):
    """The CPU kernel's ``rfft`` on the device (:mod:`codec.kernels.cuda._fft`)."""
    rows, length = x.shape
    c = length // 2 + 1
    out = cuda.device_array((rows, 2 * c), x.dtype)
    _fft.transform(x.reshape(x.size), out.reshape(out.size), ((0, length, rows, length, 0, 2 * c),), 0)
    return out


def irfft(spec, length, threads=None):
    """The CPU kernel's ``irfft`` on the device (:mod:`codec.kernels.cuda._fft`; ``threads``,
    the host's FFT workers, means nothing here)."""
    rows = spec.shape[0]
    out = cuda.device_array((rows, length), spec.dtype)
    _fft.transform(spec.reshape(spec.size), out.reshape(out.size), ((0, length, rows, 2 * (length // 2 + 1), 0, length),), 1)
    return out


def rfft_rows(x, parts, out):
    """The CPU kernel's ``rfft_rows`` on the device: every row of at most ``_fft.ROW_M`` in
    one launch (``parts`` a host array)."""
    _fft.transform(x, out, np.asarray(parts, np.int64).reshape(-1, 6).tolist(), 0)


def irfft_rows(spec, parts, out, threads=None):
    """The CPU kernel's ``irfft_rows`` on the device (see :func:`rfft_rows`; ``threads`` means
    nothing here)."""
    _fft.transform(spec, out, np.asarray(parts, np.int64).reshape(-1, 6).tolist(), 1)


@jit
def _magnitudes(spec, mag, bad):
    rows = spec.shape[0]
    c = spec.shape[1] // 2
    for e in range(cuda.grid(1), rows * c, cuda.gridsize(1)):
        r = e // c
        j = e - r * c
        re = np.float64(spec[r, 2 * j])
        im = np.float64(spec[r, 2 * j + 1])
        v = mul(re, re) + mul(im, im)
        mag[e] = v
        if v - v != 0:  # inf (an overflowing square too), or NaN
            bad[r] = 1


def magnitudes(spec, mag, bad):
    """``mag[b*c + j] = |spec[b, j]|**2`` (float64), ``bad[b] = 1`` for a row with NaN/inf
    (see the CPU kernel); ``mag`` and ``bad`` may be host arrays (copied back)."""
    out = Results()
    md, bd = out(mag), out(bad, zeroed=True)  # (the callers pass zeros)
    if mag.size:
        _magnitudes[launch(mag.size)](spec, md, bd)
    out.done()


@jit
def _gather_top(spec, rel, k, base, bad, pos, vals):
    c = spec.shape[1] // 2
    for i in range(cuda.grid(1), rel.size, cuda.gridsize(1)):
        r = i // k
        if bad[r]:  # (a row with NaN/inf selected nothing: its output is unset, as the CPU's)
            continue
        j = rel[i]
        pos[i] = base + r * c + j
        vals[2 * i] = spec[r, 2 * j]
        vals[2 * i + 1] = spec[r, 2 * j + 1]


@jit
def _short_rows(mag, c, k, rel, bad):
    """The top ``k`` of every row of ``c`` magnitudes (a short row: a thread each, the select
    twin's ``short_top``), in index order into ``rel``; a row with NaN or inf gets
    ``bad[row] = 1`` and writes nothing (``_gather_top`` skips it)."""
    for r in range(cuda.grid(1), mag.size // c, cuda.gridsize(1)):
        _segments.short_top(mag, r * c, r * c + c, k, rel, r * k, bad, r)


def block_top(spec, k, base, pos, vals, bad):
    """The CPU kernel's ``block_top``: the ``k`` largest magnitudes of every row, ties to the
    lower index, in index order (``pos``, ``vals``, ``bad`` may be host arrays: copied back).
    A row of at most ``SERIAL_UNIT`` coefficients takes a thread, a longer one a block."""
    rows = spec.shape[0]
    c = spec.shape[1] // 2
    out = Results()
    pd, vd, bd = out(pos), out(vals), out(bad, zeroed=True)  # (the callers pass zeros)
    if rows and c:
        mag = cuda.device_array(rows * c, np.float64)
        _magnitudes[launch(mag.size)](spec, mag, bd)
        rel = cuda.device_array(rows * k, np.int64)
        if c <= _common.SERIAL_UNIT:
            if rel.size:
                _short_rows[launch(rows)](mag, c, k, rel, bd)
        else:
            ones = np.arange(rows + 1, dtype=np.int64)
            _segments.topk_segments(mag, dev(ones * c), dev(np.full(rows, k, np.int64)), dev(ones * k), rel, bd)
        if rel.size:
            _gather_top[launch(rel.size)](spec, rel, k, base, bd, pd, vd)
    out.done()


@jit
def _place(spec, base, pos, vals):
    c = spec.shape[1] // 2
    for i in range(cuda.grid(1), pos.size, cuda.gridsize(1)):
        q = pos[i] - base
        r = q // c
        j = q - r * c
        spec[r, 2 * j] = vals[2 * i]
        spec[r, 2 * j + 1] = vals[2 * i + 1]


def place(spec, base, pos, vals):
    """The CPU kernel's ``place``: ``spec`` (a device array) zeroed, then the kept
    coefficients ``pos``/``vals`` (host or device) scattered into it."""
    if spec.size:
        zero[launch(spec.size)](spec.reshape(spec.size))
    if pos.size:
        _place[launch(pos.size)](spec, base, dev(pos), dev(vals))
