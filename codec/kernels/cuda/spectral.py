"""CUDA twin of ``codec/kernels/cpu/spectral.py``: the ``fft`` stage on the device.

* ``rfft`` / ``irfft``: a blocked real FFT in Numba (no cuFFT, no CuPy: the simulator runs it
  and a GPU needs nothing more than Numba).  A row of length ``L`` is a complex transform of
  length ``L`` (imaginary parts zero; the inverse fills the Hermitian half), a radix-2
  Stockham FFT when ``L`` is a power of two, else Bluestein's chirp-z through a power-of-two
  ``M >= 2L - 1``.  Each radix-2 pass is one grid-stride launch over every row's butterflies
  (ping-pong between two buffers of interleaved ``re, im``); twiddles, chirps and the
  chirp filter's transform are tables formed on the host in float64 and rounded once to the
  working dtype (:func:`_table`).  The order of operations is fixed (no atomics, no
  reductions), so a device's frames do not depend on the launch shape, but they are not the
  host's: pocketfft (scipy) orders its butterflies otherwise.  docs/kernels.md ("The FFT on
  the device") gives the measured differences and the tolerance the tests hold.
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

import functools
import threading
from collections import OrderedDict

import numpy as np

from codec._cuda_jit import jit, numba_cuda
from codec.errors import CodecValueError
from codec.kernels.cpu import spectral as _cpu
from codec.kernels.cuda import _common, _segments
from codec.kernels.cuda._common import Results, dev, launch, mul, nothing, zero

cuda = numba_cuda()

__all__ = list(_cpu.__all__)

#: the kernels whose fused multiply-adds are allowed (scripts/cuda_compile_check.py): the
#: FFT's frames are not the host's anyway (see the module), and a fused complex product is
#: one rounding closer to the exact transform
FUSED = ("_load", "_stage", "_multiply", "_finish", "_finish_real", "_rows")


# ---------------------------------------------------------------------------- tables
#: tables kept per (context, kind, length, dtype), and row layouts (:func:`_described`: one
#: per shape of a tensor coded alone and per run, each way); a bounded cache: a model's step
#: meets a few hundred (ResNet-50's 161 tensors: about as many forward and inverse), each at
#: most 64 bytes a row beside the tables, which are a few times a row
TABLES = 512
_tables = threading.local()


def _table(key, make):
    """``make()`` (a host array) moved to the device once per thread, context and ``key``,
    the ``TABLES`` most recently used kept."""
    cache = getattr(_tables, "cache", None)
    if cache is None:
        cache = _tables.cache = OrderedDict()
    ctx = cuda.current_context()
    full = (id(ctx),) + key
    got = cache.get(full)
    if got is None or got[0] is not ctx:
        got = cache[full] = (ctx, cuda.to_device(make()))
        while len(cache) > TABLES:
            cache.popitem(last=False)
    cache.move_to_end(full)
    return got[1]


def _pairs(z, dtype):
    """Complex ``z`` (float64 parts) as interleaved ``re, im`` of ``dtype`` (each rounded once)."""
    out = np.empty(2 * z.size, dtype)
    out[0::2], out[1::2] = z.real, z.imag
    return out


def _twiddles(m, dtype):
    """``exp(-2 pi i t / m)`` for ``t < m/2``."""
    return _table(("twiddles", m, np.dtype(dtype).str), lambda: _pairs(np.exp(-2j * np.pi * np.arange(m // 2) / m), dtype))


def _chirp_angles(length):
    j = np.arange(length, dtype=np.int64)
    return np.pi * ((j * j) % (2 * length)) / length  # (j*j exact in int64; reduced mod 2L before the float)


def _chirp(length, sign, dtype):
    """``exp(sign * i pi j^2 / L)`` for ``j < L``: Bluestein's chirp of a forward (-1) or
    inverse (+1) transform."""
    return _table(("chirp", length, sign, np.dtype(dtype).str), lambda: _pairs(np.exp(sign * 1j * _chirp_angles(length)), dtype))


def _filter(length, m, sign, dtype):
    """The transform (length ``m``) of the chirp's conjugate, wrapped, divided by ``m``: what
    the padded rows' transforms are multiplied by (the inverse pass then needs no scaling)."""

    def make():
        b = np.zeros(m, np.complex128)
        w = np.exp(-sign * 1j * _chirp_angles(length))
        b[:length] = w
        b[m - length + 1 :] = w[1:][::-1]
        return _pairs(np.fft.fft(b) / m, dtype)

    return _table(("filter", length, m, sign, np.dtype(dtype).str), make)


def _plan(length):
    """``(m, bluestein)``: the power-of-two transform length a row of ``length`` runs through."""
    if length & (length - 1) == 0:
        return length, False
    return 1 << (2 * length - 2).bit_length(), True


# ---------------------------------------------------------------------------- kernels
@jit(device=True)
def _cmul(ar, ai, br, bi):
    """The complex product ``(ar + i ai)(br + i bi)`` as ``(re, im)``."""
    return ar * br - ai * bi, ar * bi + ai * br


@jit(device=True)
def _chirped(re, im, chirp, j):
    """``(re + i im) * chirp[j]``, or the value as it is when there is no chirp."""
    if chirp.size:
        return _cmul(re, im, chirp[2 * j], chirp[2 * j + 1])
    return re, im


@jit
def _load(x, length, m, chirp, hermitian, buf):
    """Row ``r`` of ``buf`` (``m`` complex) from row ``r`` of ``x``: real values (``hermitian``
    0: ``x`` is ``(rows, L)``) or a half spectrum of ``c`` complex coefficients extended to
    ``L`` (``hermitian`` 1: ``x[r, L-j]`` conjugated for ``j >= c``; the imaginary parts of
    the first and the Nyquist coefficient dropped, as pocketfft drops them); times ``chirp[j]`` when
    there is one; zero from ``L`` to ``m``."""
    rows = buf.shape[0]
    c = length // 2 + 1
    for e in range(cuda.grid(1), rows * m, cuda.gridsize(1)):
        r = e // m
        j = e - r * m
        re = x.dtype.type(0)
        im = x.dtype.type(0)
        if j < length:
            if hermitian == 0:
                re = x[r, j]
            elif j < c:
                re = x[r, 2 * j]
                if j != 0 and 2 * j != length:  # (the first and the Nyquist coefficient: real)
                    im = x[r, 2 * j + 1]
            else:
                re = x[r, 2 * (length - j)]
                im = -x[r, 2 * (length - j) + 1]
            re, im = _chirped(re, im, chirp, j)
        buf[r, 2 * j] = re
        buf[r, 2 * j + 1] = im


@jit
def _stage(src, dst, m, s, tw, sign):
    """One radix-2 Stockham pass of length-``m`` transforms of every row: sub-transforms of
    length ``m / s``; butterfly ``t`` (``p = t // s``, ``q = t % s``) reads ``q + s*p`` and
    ``q + s*(p + m/(2s))`` and writes ``q + 2sp`` (sum) and ``q + s(2p + 1)`` (difference
    times ``exp(sign * 2 pi i p s / m)``: the table ``tw``'s, conjugated for ``sign`` 1)."""
    rows = src.shape[0]
    half = m // 2
    span = half // s
    for e in range(cuda.grid(1), rows * half, cuda.gridsize(1)):
        r = e // half
        t = e - r * half
        p = t // s
        q = t - p * s
        a = q + s * p
        b = a + s * span
        ar = src[r, 2 * a]
        ai = src[r, 2 * a + 1]
        br = src[r, 2 * b]
        bi = src[r, 2 * b + 1]
        wr = tw[2 * p * s]
        wi = -tw[2 * p * s + 1] if sign > 0 else tw[2 * p * s + 1]
        dr = ar - br
        di = ai - bi
        o = q + 2 * s * p
        dst[r, 2 * o] = ar + br
        dst[r, 2 * o + 1] = ai + bi
        dst[r, 2 * (o + s)], dst[r, 2 * (o + s) + 1] = _cmul(dr, di, wr, wi)


@jit
def _multiply(buf, f):
    """Every row of ``buf`` times the filter ``f`` (``m`` complex), elementwise."""
    rows = buf.shape[0]
    m = f.size // 2
    for e in range(cuda.grid(1), rows * m, cuda.gridsize(1)):
        r = e // m
        j = e - r * m
        buf[r, 2 * j], buf[r, 2 * j + 1] = _cmul(buf[r, 2 * j], buf[r, 2 * j + 1], f[2 * j], f[2 * j + 1])


@jit
def _finish(buf, chirp, out):
    """``out[r, j] = buf[r, j] * chirp[j]`` (or ``buf[r, j]``) for the ``c`` coefficients of
    each row of ``out`` (interleaved)."""
    rows = out.shape[0]
    c = out.shape[1] // 2
    for e in range(cuda.grid(1), rows * c, cuda.gridsize(1)):
        r = e // c
        j = e - r * c
        out[r, 2 * j], out[r, 2 * j + 1] = _chirped(buf[r, 2 * j], buf[r, 2 * j + 1], chirp, j)


@jit
def _finish_real(buf, chirp, scale, out):
    """``out[r, j] = re(buf[r, j] * chirp[j]) * scale`` (or ``re(buf[r, j]) * scale``)."""
    rows, length = out.shape
    for e in range(cuda.grid(1), rows * length, cuda.gridsize(1)):
        r = e // length
        j = e - r * length
        out[r, j] = _chirped(buf[r, 2 * j], buf[r, 2 * j + 1], chirp, j)[0] * scale


def _transform(buf, other, m, sign, dtype):
    """Transform every row of ``buf`` (length ``m``, a power of two) through the pair of
    buffers (``sign`` -1: forward, +1: inverse, unscaled); returns ``(result, spare)``."""
    if m < 2:
        return buf, other
    tw = _twiddles(m, dtype)
    cfg = launch(buf.shape[0] * (m // 2))
    s = 1
    while s < m:
        _stage[cfg](buf, other, m, s, tw, sign)
        buf, other = other, buf
        s *= 2
    return buf, other


def _run(x, rows, length, hermitian, dtype):
    """The complex transform (forward for real rows, inverse for half spectra) of every row,
    Bluestein's chirps applied; returns ``(buffer, chirp)``: row ``r``'s result before its last
    chirp, and that chirp (empty when there is none)."""
    m, blue = _plan(length)
    sign = 1 if hermitian else -1
    chirp = _chirp(length, sign, dtype) if blue else nothing(dtype)
    buf = cuda.device_array((rows, 2 * m), dtype)
    other = cuda.device_array((rows, 2 * m), dtype)
    _load[launch(rows * m)](x, length, m, chirp, hermitian, buf)
    if not blue:
        return _transform(buf, other, m, sign, dtype)[0], chirp
    buf, other = _transform(buf, other, m, -1, dtype)
    _multiply[launch(rows * m)](buf, _filter(length, m, sign, dtype))
    return _transform(buf, other, m, 1, dtype)[0], chirp


# ---------------------------------------------------------------------------- one launch
#: the longest power-of-two transform a row runs in one launch (:func:`_rows`: a block per
#: row, its passes one after another with a barrier between them); a row needing a longer one
#: (a tensor coded as one long block) takes a launch per pass over every row (:func:`_run`)
ROW_M = 1 << 16


@functools.lru_cache(maxsize=256)
def _row_tables(length, sign, dtype):
    """The host tables of a row of ``length`` (``sign`` -1: forward, +1: inverse), end to
    end: ``(floats, m, twiddles at, chirp at or -1, filter at or -1)``; the values are those
    of :func:`_twiddles`, :func:`_chirp` and :func:`_filter`."""
    m, blue = _plan(length)
    parts = [_pairs(np.exp(-2j * np.pi * np.arange(m // 2) / m), dtype)]
    if blue:
        parts.append(_pairs(np.exp(sign * 1j * _chirp_angles(length)), dtype))
        b = np.zeros(m, np.complex128)
        w = np.exp(-sign * 1j * _chirp_angles(length))
        b[:length] = w
        b[m - length + 1 :] = w[1:][::-1]
        parts.append(_pairs(np.fft.fft(b) / m, dtype))
    at = np.concatenate([[0], np.cumsum([q.size for q in parts])]).tolist()
    return np.concatenate(parts), m, at[0], at[1] if blue else -1, at[2] if blue else -1


def _described(parts, sign, dtype):
    """``(desc, tables, floats)`` of the rows ``parts`` (``(in at, length, rows, in step, out
    at, out step)`` each): per row ``in at, length, out at, buffer at, m, twiddles at, chirp
    at, filter at`` (int64, on the device), the tables every length needs end to end (on the
    device), and the floats each of the two work buffers holds.  Kept per ``parts``
    (:func:`_table`, one device array): a model's step meets the same rows every time."""
    dtype = np.dtype(dtype)
    nrows = sum(p[2] for p in parts)
    floats = sum(2 * _plan(p[1])[0] * p[2] for p in parts)

    def make():
        tabs, where, rows, buf, base = [], {}, [], 0, 0
        for i0, length, count, istep, o0, ostep in parts:
            if length not in where:
                t, m, tw, ch, fl = _row_tables(length, sign, dtype)
                where[length] = (m, base + tw, base + ch if ch >= 0 else -1, base + fl if fl >= 0 else -1)
                tabs.append(t)
                base += t.size
            m, tw, ch, fl = where[length]
            for r in range(count):
                rows.append((i0 + r * istep, length, o0 + r * ostep, buf, m, tw, ch, fl))
                buf += 2 * m
        desc = np.array(rows, np.int64).reshape(-1)
        return np.concatenate([desc.view(np.uint8)] + [t.view(np.uint8) for t in tabs])

    raw = _table(("rows", parts, sign, dtype.str), make)
    return raw[: 64 * nrows].view(np.int64).reshape(nrows, 8), raw[64 * nrows :].view(dtype), floats


@jit(device=True)
def _pass(src, dst, b0, m, s, tables, tw, sign):
    """One radix-2 Stockham pass of the row at ``b0`` (:func:`_stage`'s butterflies), strided
    over the block's threads."""
    half = m // 2
    span = half // s
    for t in range(cuda.threadIdx.x, half, cuda.blockDim.x):
        p = t // s
        q = t - p * s
        a = b0 + 2 * (q + s * p)
        b = a + 2 * s * span
        ar = src[a]
        ai = src[a + 1]
        br = src[b]
        bi = src[b + 1]
        wr = tables[tw + 2 * p * s]
        wi = -tables[tw + 2 * p * s + 1] if sign > 0 else tables[tw + 2 * p * s + 1]
        dr = ar - br
        di = ai - bi
        o = b0 + 2 * (q + 2 * s * p)
        dst[o] = ar + br
        dst[o + 1] = ai + bi
        dst[o + 2 * s], dst[o + 2 * s + 1] = _cmul(dr, di, wr, wi)


@jit(device=True)
def _passes(buf, other, b0, m, tables, tw, sign, flip):
    """Every pass of a length-``m`` transform of the row at ``b0``, starting in ``buf``
    (``flip`` 0) or ``other`` (1); returns where the result is (0 or 1)."""
    s = 1
    while s < m:
        if flip == 0:
            _pass(buf, other, b0, m, s, tables, tw, sign)
        else:
            _pass(other, buf, b0, m, s, tables, tw, sign)
        cuda.syncthreads()
        flip = 1 - flip
        s *= 2
    return flip


@jit
def _rows(x, desc, tables, hermitian, buf, other, out):
    """Every row of ``desc`` (see :func:`_described`) transformed whole by one block: the
    operations of :func:`_load`, :func:`_stage`, :func:`_multiply` and :func:`_finish` /
    :func:`_finish_real` on the row, in their order (the same results).  ``x`` and ``out``
    are flat: real rows in and half spectra out (``hermitian`` 0), or the reverse (1)."""
    t0 = cuda.threadIdx.x
    nt = cuda.blockDim.x
    zero_ = x.dtype.type(0)
    for r in range(cuda.blockIdx.x, desc.shape[0], cuda.gridDim.x):
        i0 = desc[r, 0]
        length = desc[r, 1]
        o0 = desc[r, 2]
        b0 = desc[r, 3]
        m = desc[r, 4]
        tw = desc[r, 5]
        ch = desc[r, 6]
        fl = desc[r, 7]
        c = length // 2 + 1
        for j in range(t0, m, nt):
            re = zero_
            im = zero_
            if j < length:
                if hermitian == 0:
                    re = x[i0 + j]
                elif j < c:
                    re = x[i0 + 2 * j]
                    if j != 0 and 2 * j != length:  # (the first and the Nyquist coefficient: real)
                        im = x[i0 + 2 * j + 1]
                else:
                    re = x[i0 + 2 * (length - j)]
                    im = -x[i0 + 2 * (length - j) + 1]
                if ch >= 0:
                    re, im = _cmul(re, im, tables[ch + 2 * j], tables[ch + 2 * j + 1])
            buf[b0 + 2 * j] = re
            buf[b0 + 2 * j + 1] = im
        cuda.syncthreads()
        if ch < 0:
            flip = _passes(buf, other, b0, m, tables, tw, 1 if hermitian else -1, 0)
        else:
            flip = _passes(buf, other, b0, m, tables, tw, -1, 0)
            src = buf if flip == 0 else other
            for j in range(t0, m, nt):
                src[b0 + 2 * j], src[b0 + 2 * j + 1] = _cmul(src[b0 + 2 * j], src[b0 + 2 * j + 1], tables[fl + 2 * j], tables[fl + 2 * j + 1])
            cuda.syncthreads()
            flip = _passes(buf, other, b0, m, tables, tw, 1, flip)
        src = buf if flip == 0 else other
        if hermitian == 0:
            for j in range(t0, c, nt):
                re = src[b0 + 2 * j]
                im = src[b0 + 2 * j + 1]
                if ch >= 0:
                    re, im = _cmul(re, im, tables[ch + 2 * j], tables[ch + 2 * j + 1])
                out[o0 + 2 * j] = re
                out[o0 + 2 * j + 1] = im
        else:
            scale = x.dtype.type(1.0 / length)
            for j in range(t0, length, nt):
                re = src[b0 + 2 * j]
                if ch >= 0:
                    re = _cmul(re, src[b0 + 2 * j + 1], tables[ch + 2 * j], tables[ch + 2 * j + 1])[0]
                out[o0 + j] = re * scale
        cuda.syncthreads()  # (the block's next row may reuse nothing, but its threads start together)


def _rows_transform(x, out, parts, hermitian):
    """Transform the rows ``parts`` (``(in at, length, rows, in step, out at, out step)``) of
    flat ``x`` into flat ``out``: real rows to half spectra (``hermitian`` 0: ``2*(length//2
    + 1)`` floats a row) or half spectra to real rows (1).  The rows of at most
    :data:`ROW_M` take one launch together; a longer part's rows take :func:`_run`'s
    launches."""
    dtype = np.dtype(x.dtype)
    parts = tuple(tuple(int(v) for v in p) for p in parts if p[1] and p[2])
    for i0, length, rows, istep, o0, ostep in (p for p in parts if _plan(p[1])[0] > ROW_M):
        c = length // 2 + 1
        if rows > 1 and (istep, ostep) != ((2 * c, length) if hermitian else (length, 2 * c)):
            raise CodecValueError("parts: a row longer than ROW_M must lie end to end with its part's others")
        width = 2 * c if hermitian else length
        buf, chirp = _run(x[i0 : i0 + rows * width].reshape(rows, width), rows, length, hermitian, dtype)
        dst = out[o0 : o0 + rows * (length if hermitian else 2 * c)].reshape(rows, -1)
        if hermitian:
            _finish_real[launch(rows * length)](buf, chirp, dtype.type(1.0 / length), dst)
        else:
            _finish[launch(rows * c)](buf, chirp, dst)
    parts = tuple(p for p in parts if _plan(p[1])[0] <= ROW_M)
    desc, tables, floats = _described(parts, 1 if hermitian else -1, dtype)
    if desc.shape[0]:
        buf = cuda.device_array(floats, dtype)
        other = cuda.device_array(floats, dtype)
        blocks = min(desc.shape[0], _common.MAX_BLOCKS * 16)
        _rows[blocks, _common.SCAN_BLOCK](x, desc, tables, hermitian, buf, other, out)


def rfft(x):
    """The CPU kernel's ``rfft`` on the device (see the module for the algorithm)."""
    rows, length = x.shape
    c = length // 2 + 1
    out = cuda.device_array((rows, 2 * c), x.dtype)
    _rows_transform(x.reshape(x.size), out.reshape(out.size), ((0, length, rows, length, 0, 2 * c),), 0)
    return out


def irfft(spec, length):
    """The CPU kernel's ``irfft`` on the device (see the module for the algorithm)."""
    rows = spec.shape[0]
    c = length // 2 + 1
    out = cuda.device_array((rows, length), spec.dtype)
    _rows_transform(spec.reshape(spec.size), out.reshape(out.size), ((0, length, rows, 2 * c, 0, length),), 1)
    return out


def rfft_rows(x, parts, out):
    """The CPU kernel's ``rfft_rows`` on the device: every row of at most :data:`ROW_M` in
    one launch (``parts`` a host array)."""
    _rows_transform(x, out, np.asarray(parts, np.int64).reshape(-1, 6).tolist(), 0)


def irfft_rows(spec, parts, out):
    """The CPU kernel's ``irfft_rows`` on the device (see :func:`rfft_rows`)."""
    _rows_transform(spec, out, np.asarray(parts, np.int64).reshape(-1, 6).tolist(), 1)



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
def _short_rows(mag, c, k, rel):
    """The top ``k`` of every row of ``c`` magnitudes (a short row: a thread each), in index
    order into ``rel``: magnitude ``j`` is kept when fewer than ``k`` beat it (larger, or
    equal at a lower index).  Rows with NaN or inf are skipped (``_gather_top`` skips them)."""
    rows = mag.size // c
    for r in range(cuda.grid(1), rows, cuda.gridsize(1)):
        row = r * c
        o = r * k
        for j in range(c):
            v = mag[row + j]
            if v - v != 0:
                break
            beat = 0
            for i in range(c):
                w = mag[row + i]
                beat += w > v or (w == v and i < j)
            if beat < k:
                rel[o] = j
                o += 1


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
                _short_rows[launch(rows)](mag, c, k, rel)
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
