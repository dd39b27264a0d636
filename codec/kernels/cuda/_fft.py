"""The Numba FFT of the ``spectral`` twin (``codec/kernels/cuda/spectral.py``): real rows to
half spectra and back, rows of any mix of lengths in one call (:func:`transform`).

A row of length ``L`` is a complex transform of length ``L`` (imaginary parts zero; the
inverse fills the Hermitian half), a radix-2 Stockham FFT when ``L`` is a power of two, else
Bluestein's chirp-z through a power-of-two ``m >= 2L - 1``: the row times the chirp, a
forward transform, a product with the chirp filter's transform, an inverse transform, the
chirp again.  Twiddles, chirp and filter of a length are one table formed on the host in
float64 and rounded once to the working dtype (:func:`_row_tables`), kept on the device.

Two ways to run the same operations, in the same order (:func:`_element`, :func:`_chirp_at`,
:func:`_butterfly` are shared), ping-ponging each row between two work buffers:

* a row whose ``m`` is at most :data:`ROW_M` is transformed whole by one CUDA block
  (:func:`_rows`: every pass in one launch, a barrier between passes), every such row of a
  call in one launch, whatever their lengths (a per-row descriptor, :func:`_described`);
* a longer row (a tensor coded as one long block) takes a grid-stride launch per pass over
  all its part's rows (:func:`_run`), which spreads one row over the whole GPU.

The order of operations is fixed (no atomics, no reductions), so a device's frames do not
depend on the launch shape, but they are not the host's: pocketfft (scipy) orders its
butterflies otherwise.  docs/kernels.md ("The FFT on the device") gives the measured
differences and the tolerance the tests hold.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

import numpy as np

from codec._cuda_jit import jit, numba_cuda
from codec.kernels.cuda import _common
from codec.kernels.cuda._common import launch

cuda = numba_cuda()

#: the kernels whose fused multiply-adds are allowed (scripts/cuda_compile_check.py): the
#: FFT's frames are not the host's anyway (see the module), and a fused complex product is
#: one rounding closer to the exact transform
FUSED = ("_load", "_stage", "_multiply", "_finish", "_finish_real", "_rows")

#: the longest power-of-two transform a row runs in one launch (:func:`_rows`); a row needing
#: a longer one takes a launch per pass (:func:`_run`)
ROW_M = 1 << 16


# ---------------------------------------------------------------------------- tables
#: device arrays kept per (context, key): a length's tables and a call's row layouts
#: (:func:`_described`: one per shape of a tensor coded alone and per run, each way); a
#: bounded cache: a model's step meets a few hundred (ResNet-50's 161 tensors: about as many
#: forward and inverse), each at most 64 bytes a row beside tables of a few times a row
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


def _chirp_angles(length):
    j = np.arange(length, dtype=np.int64)
    return np.pi * ((j * j) % (2 * length)) / length  # (j*j exact in int64; reduced mod 2L before the float)


def _plan(length):
    """``(m, bluestein)``: the power-of-two transform length a row of ``length`` runs through."""
    if length & (length - 1) == 0:
        return length, False
    return 1 << (2 * length - 2).bit_length(), True


@functools.lru_cache(maxsize=256)
def _row_tables(length, sign, dtype):
    """The host tables of a row of ``length`` (``sign`` -1: forward, +1: inverse), end to
    end: ``(floats, m, twiddles at, chirp at, filter at)`` (-1: none).  Twiddles
    ``exp(-2 pi i t / m)`` for ``t < m/2``; through Bluestein, the chirp ``exp(sign * i pi
    j^2 / L)`` for ``j < L`` and the filter: the transform (length ``m``) of the chirp's
    conjugate, wrapped, divided by ``m`` (so the inverse pass needs no scaling)."""
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


def _device_tables(length, sign, dtype):
    """:func:`_row_tables` of one length on the device: ``(tables, m, twiddles at, chirp
    at, filter at)``."""
    host, m, tw, ch, fl = _row_tables(length, sign, np.dtype(dtype))
    return _table(("row", length, sign, np.dtype(dtype).str), lambda: host), m, tw, ch, fl


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


# ---------------------------------------------------------------------------- the operations
@jit(device=True)
def _cmul(ar, ai, br, bi):
    """The complex product ``(ar + i ai)(br + i bi)`` as ``(re, im)``."""
    return ar * br - ai * bi, ar * bi + ai * br


@jit(device=True)
def _chirp_at(re, im, tables, at, j):
    """``(re + i im)`` times the chirp's ``j``-th value (from ``tables[at]``), or the value as
    it is when there is no chirp (``at`` < 0)."""
    if at >= 0:
        return _cmul(re, im, tables[at + 2 * j], tables[at + 2 * j + 1])
    return re, im


@jit(device=True)
def _element(x, i0, length, j, hermitian):
    """Element ``j < length`` of the complex row read from ``x[i0:]``: a real value
    (``hermitian`` 0), or the half spectrum's coefficient extended to ``L`` (``hermitian`` 1:
    ``x[L-j]`` conjugated for ``j >= c``; the imaginary parts of the first and the Nyquist
    coefficient dropped, as pocketfft drops them)."""
    if hermitian == 0:
        return x[i0 + j], x.dtype.type(0)
    c = length // 2 + 1
    if j < c:
        im = x[i0 + 2 * j + 1] if j != 0 and 2 * j != length else x.dtype.type(0)
        return x[i0 + 2 * j], im
    return x[i0 + 2 * (length - j)], -x[i0 + 2 * (length - j) + 1]


@jit(device=True)
def _butterfly(src, dst, b0, m, s, t, tables, tw, sign):
    """Butterfly ``t`` of the radix-2 Stockham pass with sub-transforms of length ``m / s`` of
    the row at ``b0`` (``p = t // s``, ``q = t % s``): reads ``q + s*p`` and ``q + s*(p +
    m/(2s))``, writes ``q + 2sp`` (sum) and ``q + s(2p + 1)`` (difference times ``exp(sign * 2 pi
    i p s / m)``: the twiddle table's, conjugated for ``sign`` 1)."""
    p = t // s
    q = t - p * s
    a = b0 + 2 * (q + s * p)
    b = a + m  # (s * m/(2s) complex values further)
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


# ---------------------------------------------------------------------------- one launch
@jit(device=True)
def _passes(buf, other, b0, m, tables, tw, sign, flip):
    """Every pass of a length-``m`` transform of the row at ``b0`` by the block's threads,
    starting in ``buf`` (``flip`` 0) or ``other`` (1); returns where the result is."""
    s = 1
    while s < m:
        for t in range(cuda.threadIdx.x, m // 2, cuda.blockDim.x):
            if flip == 0:
                _butterfly(buf, other, b0, m, s, t, tables, tw, sign)
            else:
                _butterfly(other, buf, b0, m, s, t, tables, tw, sign)
        cuda.syncthreads()
        flip = 1 - flip
        s *= 2
    return flip


@jit
def _rows(x, desc, tables, hermitian, buf, other, out):
    """Every row of ``desc`` (see :func:`_described`) transformed whole by one block, the
    operations of :func:`_run`'s kernels in their order.  ``x`` and ``out`` are flat: real
    rows in and half spectra out (``hermitian`` 0), or the reverse (1)."""
    t0 = cuda.threadIdx.x
    nt = cuda.blockDim.x
    for r in range(cuda.blockIdx.x, desc.shape[0], cuda.gridDim.x):
        i0 = desc[r, 0]
        length = desc[r, 1]
        o0 = desc[r, 2]
        b0 = desc[r, 3]
        m = desc[r, 4]
        tw = desc[r, 5]
        ch = desc[r, 6]
        fl = desc[r, 7]
        for j in range(t0, m, nt):
            re = x.dtype.type(0)
            im = x.dtype.type(0)
            if j < length:
                re, im = _element(x, i0, length, j, hermitian)
                re, im = _chirp_at(re, im, tables, ch, j)
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
            for j in range(t0, length // 2 + 1, nt):
                out[o0 + 2 * j], out[o0 + 2 * j + 1] = _chirp_at(src[b0 + 2 * j], src[b0 + 2 * j + 1], tables, ch, j)
        else:
            scale = x.dtype.type(1.0 / length)
            for j in range(t0, length, nt):
                out[o0 + j] = _chirp_at(src[b0 + 2 * j], src[b0 + 2 * j + 1], tables, ch, j)[0] * scale
        cuda.syncthreads()  # (the block's next row may reuse nothing, but its threads start together)


# ---------------------------------------------------------------------------- a launch per pass
@jit
def _load(x, i0, istep, length, m, rows, tables, ch, hermitian, buf):
    """Row ``r`` of ``buf`` (``m`` complex from ``2mr``) from ``x[i0 + r*istep:]``: its
    elements (:func:`_element`) times the chirp, zero from ``L`` to ``m``."""
    for e in range(cuda.grid(1), rows * m, cuda.gridsize(1)):
        r = e // m
        j = e - r * m
        re = x.dtype.type(0)
        im = x.dtype.type(0)
        if j < length:
            re, im = _element(x, i0 + r * istep, length, j, hermitian)
            re, im = _chirp_at(re, im, tables, ch, j)
        buf[2 * e] = re
        buf[2 * e + 1] = im


@jit
def _stage(src, dst, m, s, rows, tables, tw, sign):
    """Pass ``s`` of every row's transform, a thread per butterfly (:func:`_butterfly`)."""
    half = m // 2
    for e in range(cuda.grid(1), rows * half, cuda.gridsize(1)):
        r = e // half
        _butterfly(src, dst, 2 * m * r, m, s, e - r * half, tables, tw, sign)


@jit
def _multiply(buf, m, tables, fl):
    """Every row of ``buf`` times the filter (``m`` complex from ``tables[fl]``), elementwise."""
    for e in range(cuda.grid(1), buf.size // 2, cuda.gridsize(1)):
        j = e % m
        buf[2 * e], buf[2 * e + 1] = _cmul(buf[2 * e], buf[2 * e + 1], tables[fl + 2 * j], tables[fl + 2 * j + 1])


@jit
def _finish(buf, m, c, rows, tables, ch, out, o0, ostep):
    """``out[o0 + r*ostep:]`` = row ``r``'s first ``c`` values times the chirp (interleaved)."""
    for e in range(cuda.grid(1), rows * c, cuda.gridsize(1)):
        r = e // c
        j = e - r * c
        b = 2 * (m * r + j)
        out[o0 + r * ostep + 2 * j], out[o0 + r * ostep + 2 * j + 1] = _chirp_at(buf[b], buf[b + 1], tables, ch, j)


@jit
def _finish_real(buf, m, length, rows, tables, ch, scale, out, o0, ostep):
    """``out[o0 + r*ostep + j] = re(row r's value j times the chirp) * scale``."""
    for e in range(cuda.grid(1), rows * length, cuda.gridsize(1)):
        r = e // length
        j = e - r * length
        b = 2 * (m * r + j)
        out[o0 + r * ostep + j] = _chirp_at(buf[b], buf[b + 1], tables, ch, j)[0] * scale


def _run(x, part, hermitian, out):
    """The rows of one part (``(in at, length, rows, in step, out at, out step)``) through a
    launch per pass over all of them."""
    i0, length, rows, istep, o0, ostep = part
    dtype = np.dtype(x.dtype)
    sign = 1 if hermitian else -1
    tables, m, tw, ch, fl = _device_tables(length, sign, dtype)
    buf = cuda.device_array(2 * m * rows, dtype)
    other = cuda.device_array(2 * m * rows, dtype)
    _load[launch(rows * m)](x, i0, istep, length, m, rows, tables, ch, hermitian, buf)

    def passes(buf, other, sign):
        s = 1
        while s < m:
            _stage[launch(rows * (m // 2))](buf, other, m, s, rows, tables, tw, sign)
            buf, other = other, buf
            s *= 2
        return buf, other

    if ch < 0:
        buf, other = passes(buf, other, sign)
    else:
        buf, other = passes(buf, other, -1)
        _multiply[launch(rows * m)](buf, m, tables, fl)
        buf, other = passes(buf, other, 1)
    if hermitian:
        _finish_real[launch(rows * length)](buf, m, length, rows, tables, ch, dtype.type(1.0 / length), out, o0, ostep)
    else:
        _finish[launch(rows * (length // 2 + 1))](buf, m, length // 2 + 1, rows, tables, ch, out, o0, ostep)


def transform(x, out, parts, hermitian):
    """Transform the rows ``parts`` (``(in at, length, rows, in step, out at, out step)``) of
    flat ``x`` into flat ``out``: real rows to half spectra (``hermitian`` 0: ``2*(length//2
    + 1)`` floats a row) or half spectra to real rows (1).  The rows of at most
    :data:`ROW_M` take one launch together; a longer part's rows take :func:`_run`'s."""
    parts = tuple(tuple(int(v) for v in p) for p in parts if p[1] and p[2])
    for part in parts:
        if _plan(part[1])[0] > ROW_M:
            _run(x, part, hermitian, out)
    short = tuple(p for p in parts if _plan(p[1])[0] <= ROW_M)
    desc, tables, floats = _described(short, 1 if hermitian else -1, x.dtype)
    if desc.shape[0]:
        buf = cuda.device_array(floats, x.dtype)
        other = cuda.device_array(floats, x.dtype)
        _rows[min(desc.shape[0], _common.MAX_BLOCKS * 16), _common.SCAN_BLOCK](x, desc, tables, hermitian, buf, other, out)
