"""Small floats: ``rangefloat`` (Wang et al.'s range-based float, the exponent window taken from
the data) and ``fp8`` (the OCP e4m3 / e5m2 formats).  Both are a sign, ``e`` exponent bits with
subnormals at exponent code 0 and ``m`` mantissa bits over a window whose lowest normal binade
is ``2**emin``; they differ in where the window sits and which codes exist (docs/codecs.md).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from codec.dtypes import on_device
from codec.errors import CodecValueError, CorruptFrameError
from codec.frame import MAX_ELEMENTS, SectionKind, Section, raw_length
from codec.stages.value.dequant import Dequant
from codec.stages.value.quantizer import Quantizer, code_dtype, exponent_range
from codec.stages.value.sections import codes_section, magnitude_bits, magnitude_values, ints_section, read_ints
from codec.params import Param, SEED, rounding
from codec.stage import Bound, register
from codec.ops import add, continued, offsets
from codec.kernels import backend
from codec.layout import CHUNK


@functools.lru_cache(maxsize=64)
def magnitudes(m: int, bits: int) -> np.ndarray:
    """float64 value of every code of a ``bits``-wide float with ``m`` mantissa bits and
    ``emin = 0`` (sign in the top bit; read-only)."""
    codes = np.arange(1 << bits, dtype=np.int64)
    mag = codes & ((1 << (bits - 1)) - 1)
    ec, f = mag >> m, mag & ((1 << m) - 1)
    value = np.where(ec == 0, np.ldexp(f.astype(np.float64), -m), np.ldexp((f + (1 << m)).astype(np.float64), ec - 1 - m))
    value = np.where(codes >> (bits - 1), -value, value)
    value.flags.writeable = False
    return value


class _MiniFloat(Quantizer):
    """A sign, exponent and mantissa over a window chosen per block (``windows``)."""

    #: total width, mantissa bits and largest magnitude code (set by the subclass)
    width: int
    mant: int
    maxmag: int

    def block_len(self, n: int) -> int:
        return n

    def windows(self, amax: np.ndarray, dtype) -> np.ndarray:
        """The int16 stored per block (rangefloat: T; fp8: the scale exponent), from the block maxima."""
        raise NotImplementedError

    def emins(self, stored: np.ndarray) -> np.ndarray:
        """Each block's ``emin`` from what the frame stores."""
        raise NotImplementedError

    def needs_max(self) -> bool:
        return True

    def _units(self, n: int):
        """``(block, nblocks, upb, units)``: the window length, the windows, and the kernels'
        work units (``upb`` pieces of at most CHUNK values per window)."""
        block = max(1, self.block_len(n))
        nblocks = -(-n // block)
        upb = -(-block // CHUNK)
        return block, nblocks, upb, nblocks * upb

    def _stored(self, top, nblocks, upb, values, ctx):
        """What the frame stores per window (T, or fp8's scale exponent) from the work units'
        largest magnitude bits ``top`` of the values ``values()`` returns (a function: the
        error-feedback step forms its sum only to name a NaN/inf); NaN/inf there is the error
        naming its position."""
        amax, bad = magnitude_values(top, np.float32 if top.itemsize == 4 else np.float64)  # float32's bits, or float64's
        if bad:
            self.raise_nonfinite(values(), ctx)
        if not self.needs_max():
            return np.zeros(nblocks, np.int64)
        return self.windows(amax.reshape(nblocks, upb).max(1, initial=0.0), ctx.dtype)

    def _codes_section(self, kern, values, units, block, upb, emin, ctx, formed=None) -> Section:
        """The values section of the codes of ``values`` in the windows ``emin`` (kernel
        ``minifloat_encode``; with ``formed = (x, r)``, the error-feedback step: the codes of
        ``x + r``, and ``values`` written once, holding ``x + r - decoded``,
        ``feedback_minifloat_encode``): written straight into
        the frame for 8- and 16-bit codes, else into an array that is then bit-packed."""
        n, w, strm = values.size, self.width, self.stream(ctx)
        args = (self.mant, self.maxmag, w - 1, self.stochastic, strm)

        def code_into(codes, crc=None):
            bad = np.zeros(units, np.int64)
            start = -1 if crc is None else crc
            got = -1
            if n and formed is not None:
                got = kern.feedback_minifloat_encode(*formed, values, block, upb, emin, *args, codes, bad, start)
            elif n:
                got = kern.minifloat_encode(values, block, upb, emin, *args, codes, bad, start)
            if bad.any():  # a NaN/inf stays one in values - decoded, and nothing before it turns into one
                self.raise_nonfinite(values, ctx)
            return continued(codes, crc, got)

        if w in (8, 16):  # checksummed as it is written (Section.fill_crc)
            return Section(SectionKind.VALUES, w, n, fill=lambda out, *crc: code_into(out.view(code_dtype(w)), *crc), fill_crc=True, device=on_device(values))
        codes = self.codes_buffer(n, code_dtype(w), values)
        code_into(codes)
        return codes_section(codes, w)

    def quantize(self, x, ctx, sections):
        kern = backend("quantize", x)
        n = x.size
        block, nblocks, upb, units = self._units(n)
        if self.needs_max():
            bits, mask = magnitude_bits(x)
            top = np.zeros(units, bits.dtype)
            if n:
                kern.absmax_units(bits, block, upb, mask, top)
            stored = self._stored(top, nblocks, upb, lambda: x, ctx)
            sections.append(ints_section(stored))
        else:
            stored = np.zeros(nblocks, np.int64)
        emin = self.emins(stored).astype(np.int64)
        sections.append(self._codes_section(kern, x, units, block, upb, emin, ctx))

    def encode_feedback(self, x, slot, ctx, sections):
        """Fused error-feedback step for float32/float64, bit for bit what adding, encoding,
        decoding and subtracting give (four passes): ``x + residual`` formed where it is coded
        and ``acc`` written once, with the residual; a value beyond the dtype's range saturates, as its decoder clips it.  None
        (the unfused step) for 16-bit input or a window below ``2**-1000``.

        Where the windows are the data's (rangefloat, fp8 with a scale), the codes need the
        maxima of whole blocks first: one pass reads ``x + residual`` for its maxima alone
        (``feedback_absmax_units``), and the one pass of the fixed windows (fp8's) follows:
        it forms the sum again, codes it and writes ``acc - decoded`` into ``acc``, once
        (``feedback_minifloat_encode``).  (Guessing a data window from the last step to make
        it one pass was measured and dropped: docs/benchmarks.md, 2026-11-28.)"""
        if x.dtype not in (np.float32, np.float64):
            return None
        kern = backend("quantize", x)
        n = x.size
        block, nblocks, upb, units = self._units(n)
        acc = slot.take_spare()
        flat, r = acc.reshape(acc.size), slot.read_residual()
        if not self.needs_max():
            emin = self.emins(np.zeros(nblocks, np.int64)).astype(np.int64)
            sections.append(self._codes_section(kern, flat, units, block, upb, emin, ctx, formed=(x, r)))
            return lambda: slot.commit(acc)
        bits, mask = magnitude_bits(flat)
        top = np.zeros(units, bits.dtype)
        if n:
            kern.feedback_absmax_units(x, r, block, upb, mask, top)
        stored = self._stored(top, nblocks, upb, lambda: add(x, r, flat), ctx)  # a NaN/inf is refused before anything is coded
        emin = self.emins(stored).astype(np.int64)
        if emin.size and int(emin.min()) < -1000:  # a window the fused kernels do not rescale
            return None
        sections.append(ints_section(stored))
        sections.append(self._codes_section(kern, flat, units, block, upb, emin, ctx, formed=(x, r)))
        return lambda: slot.commit(acc)

    def bound(self, ctx):
        """What every encode writes, whatever the values: the int16 per window where the
        windows are the data's (:meth:`needs_max`), then ``width``-bit codes: exact."""
        n = ctx.n
        codes = raw_length(n, self.width)
        if not self.needs_max():
            return Bound(1, codes)
        return Bound(2, 2 * self._units(n)[1] + codes)

    @property
    def run_head(self):
        return SectionKind.INTS if self.needs_max() else None

    def run_bits(self):
        return self.width

    def _run_blocks(self, sizes):
        """Per tensor of ``sizes`` (int64): its window length and its number of windows."""
        blocks = np.array([max(1, self.block_len(n)) for n in sizes.tolist()], np.int64)
        return blocks, -(-sizes // blocks)

    def quantize_run(self, x, starts, ctxs):
        kern = backend("quantize", x)
        sizes = np.diff(starts)
        blocks, nblocks = self._run_blocks(sizes)
        if np.any(blocks > CHUNK):  # a window of several work units (never in a run of small tensors)
            return None
        bstarts = offsets(nblocks)
        if self.needs_max():
            bits, mask = magnitude_bits(x)
            top = np.zeros(int(bstarts[-1]), bits.dtype)
            kern.absmax_units_segments(bits, starts, blocks, bstarts, mask, top)
            amax, bad = magnitude_values(top, x.dtype)
            if bad:
                return None
            stored = self.windows(amax, x.dtype).astype(np.int64)
        else:
            stored = np.zeros(int(bstarts[-1]), np.int64)
        codes = self.codes_buffer(x.size, code_dtype(self.width), x)
        bad = np.zeros(len(ctxs), np.int64)
        emin = self.emins(stored).astype(np.int64)
        kern.minifloat_encode_segments(
            x, starts, blocks, bstarts, emin, self.mant, self.maxmag, self.width - 1, self.stochastic, self.streams(ctxs), codes, bad
        )
        if bad.any():
            return None
        return stored.astype(np.float64), bstarts, codes

    def run_shape(self, hstarts, sizes, dtype):
        """Each tensor's window length, the windows' starts and the range of what a frame of
        ``dtype`` stores per window (None: nothing stored), when every tensor stores one
        number per window."""
        blocks, nblocks = self._run_blocks(sizes)
        if not self.needs_max():
            return blocks, offsets(nblocks), None
        if not np.array_equal(np.diff(hstarts), nblocks):
            return None
        return blocks, hstarts, self.window_range(dtype)

    def run_factors(self, head, plan):
        blocks, hstarts, window = plan.shape
        if window is not None:
            low, high, what = window
            if head.size and (head.min() < low or head.max() > high):
                raise CorruptFrameError(f"ints section: {what} outside [{low}, {high}]")
            stored = head.astype(np.int64)
        else:
            stored = np.zeros(int(hstarts[-1]), np.int64)
        emin = self.emins(stored).astype(np.int64)
        if emin.size and int(emin.min()) < -1000:  # _exact_factors rescales that tensor's table
            return None
        return magnitudes(self.mant, self.width), blocks, np.ldexp(1.0, emin), hstarts, np.empty(0), None

    def read(self, reader, ctx, count):
        n = count
        block, nblocks, _, _ = self._units(n)
        stored = self.read_windows(reader, ctx, nblocks)
        data, limit = self.read_values_section(reader, ctx, self.width, n)
        lut, scale, rescue = _exact_factors(magnitudes(self.mant, self.width), self.emins(stored).astype(np.int64))
        return Dequant(data, self.width, n, lut, block, scale, np.empty(0), ctx.dtype, rescue=rescue, limit=limit)

    def read_windows(self, reader, ctx, nblocks):
        """What the frame stores per window (``nblocks`` int16 in :meth:`window_range`)."""
        if not self.needs_max():
            return np.zeros(nblocks, np.int64)
        return read_ints(reader, nblocks, *self.window_range(ctx.dtype))

    def window_range(self, dtype) -> tuple[int, int, str]:
        """``(low, high, what)``: the stored numbers a frame of ``dtype`` may hold."""
        raise NotImplementedError

    def code_limit(self):
        """(field mask, shift, largest): the magnitude field of a code is at most ``maxmag``."""
        return ((1 << (self.width - 1)) - 1, 0, self.maxmag)


def _exact_factors(lut: np.ndarray, emin: np.ndarray):
    """``(lut * 2**-K, 2**(emin + K), rescue)`` whose products are ``lut * 2**emin`` rounded
    once: ``K > 0`` only when a window lies below float64's normal range (``2**emin`` itself
    would underflow).  When another block's factor would then overflow (a frame whose windows
    span more than float64's exponent range), the blocks below -1000 get factor 0 here and
    ``rescue`` is their own ``(lut * 2**-K, factors)`` (0 for the other blocks), a second pass
    :func:`codec.stages.value.dequant.dequantize` takes for them; else ``rescue`` is None."""
    k = max(0, -1000 - int(emin.min())) if emin.size else 0
    if k and int(emin.max()) + k > 1023:
        tiny = emin < -1000
        return lut, np.where(tiny, 0.0, np.ldexp(1.0, np.where(tiny, 0, emin))), (np.ldexp(lut, -k), np.where(tiny, np.ldexp(1.0, np.where(tiny, emin + k, 0)), 0.0))
    return (np.ldexp(lut, -k) if k else lut), np.ldexp(1.0, emin + k), None


def _window_tops(amax: np.ndarray, m: int, dtype, top_of_format: float) -> np.ndarray:
    """Per block: T = floor(log2 max|v|), plus one when max|v| exceeds the window's largest
    value ``top_of_format * 2**T`` and T + 1 stays within the dtype's exponents; all-zero
    blocks get the dtype's smallest subnormal exponent."""
    sub, emax = exponent_range(dtype)
    t = np.frexp(amax)[1].astype(np.int64) - 1
    bump = (amax > np.ldexp(top_of_format, t)) & (t + 1 <= emax)
    t = t + bump
    return np.where(amax > 0, t, sub)


@register
class RangeFloat(_MiniFloat):
    """Range-based float (Wang et al. HPDC'20): 1+e+m bits, exponent window from the data's max."""

    name = "rangefloat"
    params = (
        Param("bits", int, 8, "total width in bits: 1 sign + exp_bits + mantissa", low=3, high=16),
        Param("exp_bits", int, None, "exponent bits, 1..min(8, bits-1); auto = min(5, bits // 2)", low=1, high=8, auto=True),
        Param("block", int, 0, "values per exponent window; 0 = one window for the whole message", low=0, high=MAX_ELEMENTS),
        rounding("nearest"),
        SEED,
    )

    def validate(self):
        if self.exp_bits is not None and self.exp_bits > self.bits - 1:
            raise CodecValueError(f"rangefloat: parameter exp_bits must be <= bits - 1 = {self.bits - 1}, got {self.exp_bits}")
        self.ebits = self.exp_bits if self.exp_bits is not None else min(5, self.bits // 2)
        self.width = self.bits
        self.mant = self.bits - 1 - self.ebits
        self.maxmag = (1 << (self.bits - 1)) - 1

    def block_len(self, n):
        return min(self.block or n, n)  # a window longer than the message is the whole message

    def windows(self, amax, dtype):
        return _window_tops(amax, self.mant, dtype, 2.0 - math.ldexp(1.0, -self.mant))

    def emins(self, tops):
        return tops - (1 << self.ebits) + 2

    def window_range(self, dtype):
        sub, emax = exponent_range(dtype)
        return sub, emax, "window exponent"


#: OCP FP8 formats: mantissa bits, emin, largest magnitude code, largest value's exponent
FP8 = {"e4m3": (3, -6, 0x7E, 8, 448.0), "e5m2": (2, -14, 0x7B, 15, 57344.0)}


@register
class Fp8(_MiniFloat):
    """OCP 8-bit float (e4m3: max 448, e5m2: max 57344), saturating; optional power-of-two scale."""

    name = "fp8"
    params = (
        Param("format", str, "e4m3", "e4m3 (more precision) or e5m2 (more range)", choices=tuple(FP8)),
        Param("scale", bool, False, "per-tensor power-of-two scale putting max|x| in the top binade"),
        rounding("nearest"),
        SEED,
    )

    def validate(self):
        self.mant, self.emin, self.maxmag, self.top, self.maxval = FP8[self.format]
        self.width = 8

    def needs_max(self):
        return self.scale

    def windows(self, amax, dtype):
        tops = _window_tops(amax, self.mant, dtype, self.maxval / 2.0**self.top)
        return np.where(amax > 0, tops - self.top, 0)

    def emins(self, scales):
        return scales + self.emin

    def window_range(self, dtype):
        sub, emax = exponent_range(dtype)
        return sub - self.top, emax - self.top, "scale exponent"
