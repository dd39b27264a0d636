"""``fft(theta=, block=, keep=)``: FFT-based gradient sparsification (Wang et al., HPDC'20).

The flat array is cut into blocks of ``block`` elements (the last one may be shorter; 0 means
one block, the whole array); each block goes through a real FFT (the ``spectral`` family's
``rfft``: scipy's pocketfft on the host, a Numba FFT on the device; float32 for 16- and
32-bit input, float64 for float64), and the fraction ``theta`` of its coefficients with the
smallest magnitude is dropped, per block or over the whole spectrum.  A device array's
spectrum, selection, kept coefficients and inverse stay on the device; the index and value
stages code the kept ones there and only their sections come to the host (docs/kernels.md,
"The FFT on the device": its frames are not the host's bit for bit, and the tolerance).
The kept coefficients' ``re, im`` go to the value stage (default ``rangefloat``, 8 bits),
their positions in the spectrum to the shared index coder.  Decoding scatters them into a
zero spectrum and inverts each block.  docs/codecs.md has the exact rules.
"""

from __future__ import annotations

import math

import numpy as np

from codec.errors import CodecValueError
from codec.frame import MAX_ELEMENTS, raw_length, SectionKind
from codec.params import Param
from codec.stage import Bound, Transform, register
from codec.device import concat, host_copy, Memory
from codec.dtypes import on_device
from codec.kernels import backend
from codec.ops import first_nonfinite, offsets, readonly, widen
from codec.pack import decode_indices, encode_indices, index_bound, index_segments
from codec.stages.select.magnitude import Magnitudes, raise_nonfinite
from codec.stages.transform.fftinverse import RunSpectrum, invert



class Layout:
    """How ``n`` elements split into blocks: ``full`` blocks of ``block`` elements, then a
    ``tail`` block of ``n - full*block`` (0: none).  A block of length L has L//2 + 1
    coefficients (``per_block``, ``tail_coefficients``); the spectrum lists the full blocks'
    coefficients, then the tail's: ``coefficients`` in all."""

    __slots__ = ("block", "full", "tail", "per_block", "tail_coefficients", "coefficients")

    def __init__(self, n: int, block: int):
        self.block = block if block and block < n else n
        self.full = n // self.block if self.block else 0
        self.tail = n - self.full * self.block
        self.per_block = self.block // 2 + 1
        self.tail_coefficients = self.tail // 2 + 1 if self.tail else 0
        self.coefficients = self.full * self.per_block + self.tail_coefficients

    def parts(self):
        """``(start, length, rows, coefficients per row, first coefficient)`` of the full
        blocks and of the tail."""
        if self.full:
            yield 0, self.block, self.full, self.per_block, 0
        if self.tail:
            yield self.full * self.block, self.tail, 1, self.tail_coefficients, self.full * self.per_block


def dropped(theta: float, count: int) -> int:
    """How many of ``count`` coefficients ``theta`` drops: ``floor(theta * count)`` (float64)."""
    return math.floor(theta * count)


@register
class FFT(Transform):
    """Blocked real FFT; drop the fraction theta of smallest-magnitude coefficients (Wang et al. HPDC'20)."""

    name = "fft"
    default_value = "rangefloat"
    #: the transforms, the selection and the inverse run where the gradient lives (the
    #: ``spectral`` twins); per block, the kept coefficients and positions stay there for the
    #: index and value stages (``keep="global"`` gathers them on the host)
    devices = frozenset({"cpu", "cuda"})
    #: a many-tensor frame's runs are transformed at once (:meth:`forward_segments`,
    #: :meth:`read_segments`)
    segmented = True
    #: a device's frames hold its FFT's coefficients (pocketfft's within a few units of
    #: rounding, docs/kernels.md), so they decode within this of the host's, relative to the
    #: input, also where a value stage rounds a coefficient to its other neighbour
    device_tolerance = 2.0**-10
    params = (
        Param(
            "theta",
            float,
            0.9,
            "fraction of coefficients dropped (smallest magnitudes), in [0, 1]; a schedule makes it diminish",
            low=0.0,
            high=1.0,
            schedule=True,
        ),
        Param("block", int, 4096, "elements per FFT block; 0 = the whole tensor as one block", low=0, high=MAX_ELEMENTS),
        Param("keep", str, "per_block", "drop theta of every block's coefficients, or of the whole spectrum", choices=("per_block", "global")),
    )

    # ------------------------------------------------------------------ encode
    def bound(self, ctx):
        """One index section over the spectrum's coefficients and ``2 K`` values (``re, im``
        of each kept coefficient) of the domain's dtype (float64 for float64 input, else
        float32), ``K`` being exactly what :meth:`forward` keeps whatever the values: every
        block's ``c - floor(theta c)`` (``per_block``), or ``total - floor(theta total)``
        (``global``).  Only the index section's width depends on the data: its largest gap is
        at most ``total - K`` (global: all of the dropped ones between two kept), and per block
        the free coefficients of two neighbouring blocks (:func:`_largest_gap`)."""
        lay = Layout(ctx.n, self.block)
        theta = self.at("theta", ctx.step)
        total = lay.coefficients
        if self.keep == "global":
            k = total - dropped(theta, total)
            nbytes = index_bound(k, total)
        else:
            kept = [(rows, c, c - dropped(theta, c)) for _, _, rows, c, _ in lay.parts()]
            k = sum(rows * kc for rows, _, kc in kept)
            nbytes = index_bound(k, total, gap=_largest_gap(kept))
        return Bound(1, nbytes, ctx.domain(2 * k, self.domain_dtype(ctx.dtype)))

    def forward(self, flat, ctx, sections):
        x = widen(flat)
        dt = np.dtype(x.dtype)
        lay = Layout(x.size, self.block)
        theta = self.at("theta", ctx.step)
        kern = backend("spectral", x)
        parts = []  # (first coefficient, spectrum rows as a float view), where x lives
        for start, length, rows, _, base in lay.parts():
            parts.append((base, readonly(kern.rfft(x[start : start + rows * length].reshape(rows, length)))))
        if self.keep == "per_block":
            pos, vals = self._per_block(parts, theta, kern, flat, ctx, dt)
        else:
            pos, vals = self._global(parts, lay, theta, kern, flat, ctx, dt)
        sections.append(encode_indices(pos, lay.coefficients))
        return vals

    def forward_segments(self, flat, starts, ctxs):
        """:meth:`forward` of a run of tensors at once, where they live: every block of every
        tensor transformed together (``rfft_rows``: on a device, one launch for rows of up to
        ``ROW_M``), the kept coefficients of every block (``per_block``) or tensor
        (``global``) chosen by one ``topk_segments`` over the run's magnitudes (the same
        exact top-k as ``block_top`` and :class:`Magnitudes`: ties to the lower index), one
        gather of their ``re, im`` and the run's index sections (``index_segments``).  None
        (each tensor alone, which raises its error) when a block holds a NaN or inf."""
        x = widen(flat)
        dt = np.dtype(x.dtype)
        mem = Memory(on_device(flat))
        run = RunLayout(np.diff(starts).tolist(), self.block)
        total = run.cbase[-1]
        segs, rel, ks, rows = [], [], [], []  # the selection's segments: start in the run's spectrum, start in its tensor, k
        for t, (lay, ctx) in enumerate(zip(run.lays, ctxs)):
            theta = self.at("theta", ctx.step)
            if self.keep == "global":
                segs.append([run.cbase[t]])
                rel.append([0])
                ks.append([lay.coefficients - dropped(theta, lay.coefficients)])
                rows.append(1)
                continue
            rows.append(0)
            for _, _, count, c, base in lay.parts():
                first = base + c * np.arange(count, dtype=np.int64)
                segs.append(run.cbase[t] + first)
                rel.append(first)
                ks.append(np.full(count, c - dropped(theta, c), np.int64))
                rows[-1] += count
        segs, rel, ks = (np.concatenate(a).astype(np.int64) if a else np.empty(0, np.int64) for a in (segs, rel, ks))
        kern = backend("spectral", x)
        spectrum = mem.empty(2 * total, dt)
        kern.rfft_rows(x, run.parts(forward=True), spectrum)
        mag = mem.empty(total, np.float64)
        if total:
            kern.magnitudes(readonly(spectrum.reshape(1, 2 * total)), mag, mem.zeros(1, np.uint8))  # (inputs read-only: _global's signature)
        kstarts = offsets(ks)
        found = mem.empty(int(kstarts[-1]), np.int64)
        bad = mem.zeros(segs.size, np.uint8)
        dk = mem.put(kstarts)
        backend("select", mag).topk_segments(readonly(mag), mem.put(np.append(segs, total)), mem.put(ks), dk, found, bad)
        if mem.host(bad).any():
            return None
        index_kern = backend("index", found)
        pos = mem.empty(found.size, np.int64)  # each tensor's coefficient positions
        index_kern.absolute_positions(found, dk, mem.put(rel), pos)
        index_kern.absolute_positions(found, dk, mem.put(segs), found)  # (now the run spectrum's)
        pairs = np.complex64 if dt == np.float32 else np.complex128  # (re, im) as one item
        values = mem.gather(readonly(spectrum).view(pairs), found).view(dt)
        tstarts = kstarts[offsets(rows)]
        index = index_segments(pos, tstarts, [lay.coefficients for lay in run.lays])
        if index is None:
            return None
        return 2 * tstarts, values, index

    def _per_block(self, parts, theta, kern, flat, ctx, dt):
        """Every block's kept coefficients (``block_top``), where the spectrum lives: a
        device's positions and values stay there for the index and value stages, only the
        blocks' non-finite flags (a byte per block) come back."""
        mem = Memory(on_device(flat))
        pos, vals = [], []
        for base, spec in parts:
            rows, c = spec.shape[0], spec.shape[1] // 2
            k = c - dropped(theta, c)
            p = mem.empty(rows * k, np.int64)
            v = mem.empty(2 * rows * k, spec.dtype)
            bad = mem.zeros(rows, np.uint8)
            kern.block_top(spec, k, base, p, v, bad)
            if mem.host(bad).any():
                self._raise_nonfinite(flat, ctx)
            pos.append(p)
            vals.append(v)
        if len(pos) == 1:
            return pos[0], vals[0]
        if mem.device:
            return concat(pos, mem.empty(sum(p.size for p in pos), np.int64)), concat(vals, mem.empty(sum(v.size for v in vals), dt))
        return np.concatenate(pos or [np.empty(0, np.int64)]), np.concatenate(vals or [np.empty(0, dt)])

    def _global(self, parts, lay, theta, kern, flat, ctx, dt):
        """The top of the whole spectrum's magnitudes (:class:`Magnitudes`), where it lives:
        the kept coefficients are gathered as complex pairs from the spectrum in coefficient
        order (its parts end to end), so on a device the positions and values stay there."""
        total = lay.coefficients
        mem = Memory(on_device(flat))
        mag = mem.empty(total, np.float64)  # (where the spectrum lives)
        for base, spec in parts:
            rows, c = spec.shape[0], spec.shape[1] // 2
            bad = mem.zeros(rows, np.uint8)
            kern.magnitudes(spec, mag[base : base + rows * c], bad)
            if mem.host(bad).any():
                self._raise_nonfinite(flat, ctx)
        k = total - dropped(theta, total)
        pos = mem.arange(total) if k == total else Magnitudes(mag, ctx.domain(total, np.float64), self.name).top(k)
        flats = [spec.reshape(spec.size) for _, spec in parts]
        if len(flats) == 1:
            whole = flats[0]
        elif mem.device:
            whole = concat(flats, mem.empty(2 * total, dt))
        else:
            whole = np.concatenate(flats) if flats else np.empty(0, dt)
        pairs = np.complex64 if dt == np.float32 else np.complex128  # (re, im) as one item
        return pos, mem.gather(whole.view(pairs), pos).view(dt)

    def _raise_nonfinite(self, flat, ctx):
        flat = host_copy(flat) if on_device(flat) else flat
        if first_nonfinite(flat) >= 0:
            raise_nonfinite(flat, ctx, self.name)
        raise CodecValueError(f"{ctx.name}: the spectrum overflows (|x| too large for the block's FFT or its squared magnitudes); fft needs smaller values")

    # ------------------------------------------------------------------ decode
    def read(self, reader, ctx):
        lay = Layout(ctx.n, self.block)
        pos = _kept_positions(*reader.take((SectionKind.INDEX_DELTA, SectionKind.INDEX_BITMAP)), lay.coefficients)
        k = lay.coefficients if pos is None else pos.size
        return (lay, pos, ctx.dtype), ctx.domain(2 * k, self.domain_dtype(ctx.dtype))

    def read_segments(self, data, sections, sizes, dtype):
        """:meth:`read` of a run's tensors at once (the inverse of :meth:`forward_segments`):
        ``data`` the raw payload (uint8), ``sections[t]`` tensor t's index section (its
        info, an offset into ``data``), ``sizes[t]`` its element count.  Returns ``(payload,
        counts)``: a :class:`RunSpectrum` that :meth:`inverse` writes the run's
        concatenation from, and per tensor the number of values its value sections hold
        (``re, im`` of each kept coefficient); every section checked as :meth:`read` checks it
        (CorruptFrameError)."""
        run = RunLayout(sizes, self.block)
        pos, counts = [], []
        for info, lay, base in zip(sections, run.lays, run.cbase):
            p = _kept_positions(info, data[info.offset : info.offset + info.raw_len], lay.coefficients)
            p = np.arange(lay.coefficients, dtype=np.int64) if p is None else p
            pos.append(p + base)
            counts.append(2 * p.size)
        return RunSpectrum(run, np.concatenate(pos) if pos else np.empty(0, np.int64), np.dtype(dtype)), counts

    def inverse(self, payload, values, out, mode):
        """Invert the blocks a chunk at a time, where ``out`` lives
        (:func:`codec.stages.transform.fftinverse.invert`): the working memory is a chunk's
        spectrum and inverse, not the tensor's, and the result the unchunked one, bit for
        bit."""
        invert(self, payload, values, out, mode)


class RunLayout:
    """A run of tensors of ``sizes`` elements in fft blocks of ``block``: each tensor's
    :class:`Layout` (``lays``), first element in the run (``starts``) and first coefficient
    in the run's spectrum (``cbase``; the last entry: the run's coefficients)."""

    def __init__(self, sizes, block: int):
        self.lays = [Layout(int(n), block) for n in sizes]
        self.starts = offsets([int(n) for n in sizes]).tolist()
        self.cbase = offsets([lay.coefficients for lay in self.lays]).tolist()

    def parts(self, forward: bool) -> np.ndarray:
        """The run's rows as ``rfft_rows`` (``forward``) or ``irfft_rows`` take them: every
        tensor's full blocks, then its tail, between the run's elements and its spectrum."""
        rows = []
        for lay, s, cb in zip(self.lays, self.starts, self.cbase):
            for start, length, count, c, base in lay.parts():
                elements, coefficients = (s + start, length), (2 * (cb + base), 2 * c)
                rows.append((elements[0], length, count, elements[1], *coefficients) if forward else (coefficients[0], length, count, coefficients[1], *elements))
        return np.array(rows, np.int64).reshape(-1, 6)


def _largest_gap(kept) -> int:
    """The largest gap (:func:`codec.pack.encode_indices`' gaps-minus-one, the first counted
    from 0) that per-block positions can have: ``kept`` lists the spectrum's groups of blocks
    in order, ``(rows, c, kc)``: ``rows`` blocks of ``c`` coefficients keeping ``kc`` each.
    A block keeping ``kc`` leaves ``s = c - kc`` free, before its first kept coefficient or
    after its last, so a gap spans at most ``s`` of one block, the free ``s`` of the next
    and any blocks between that keep nothing (``theta = 1``); every such gap occurs for some
    spectrum (a block's first ``kc`` kept, the next one's last)."""
    best = run = 0  # run: the most free coefficients since the last kept one (or the start)
    for rows, c, kc in kept:
        if kc == 0:
            run += rows * c
            continue
        s = c - kc
        best = max(best, run + s, 2 * s if rows > 1 else 0)
        run = s
    return best


def _kept_positions(info, raw, total: int):
    """The kept positions an index section holds (sorted, unique, in ``range(total)``:
    ``decode_indices`` checks them, CorruptFrameError), or None when it keeps all ``total``."""
    if _keeps_all(info, raw, total):
        return None
    pos = decode_indices(info, raw, total)
    return None if pos.size == total else pos


def _keeps_all(info, raw, total: int) -> bool:
    """True when the index section is the one an encoder writes for every one of ``total``
    positions kept: ``total`` gaps-minus-one of 1 bit, all zero (a bitmap is never chosen
    then: ties go to the gaps).  Checked without decoding ``total`` int64 positions."""
    if int(info.kind) != SectionKind.INDEX_DELTA or int(info.count) != total or int(info.bits) != 1:
        return False
    data = np.asarray(raw).reshape(-1).view(np.uint8)
    return data.size == raw_length(total, 1) and not data.any()
