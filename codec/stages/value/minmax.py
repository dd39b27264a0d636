"""``minmax(bits=8, bucket=1024, rounding=nearest)``: per-bucket min and max with uniform
levels between them (CGX, Bagua's ByteGrad; docs/codecs.md)."""

from __future__ import annotations

import functools

import numpy as np

from codec.dtypes import on_device
from codec.errors import CodecValueError, CorruptFrameError
from codec.ops import continued, offsets, readonly
from codec.layout import bucket_groups
from codec.stages.value.dequant import Dequant, top_of
from codec.stages.value.quantizer import Quantizer
from codec.stages.value.sections import codes_section, read_codes, read_scalars, scalars_bytes, scalars_section
from codec.frame import MAX_ELEMENTS, Section, SectionKind, raw_length
from codec.params import Param, SEED, rounding
from codec.stage import Bound, register
from codec.kernels import backend


@functools.lru_cache(maxsize=16)
def _codes(bits: int) -> np.ndarray:
    """Every ``bits``-bit code as a float64 (the decoder's table; read-only)."""
    lut = np.arange(1 << bits, dtype=np.float64)
    lut.flags.writeable = False
    return lut


def _keys(values: np.ndarray):
    """The kernels' integer view of float32/float64 ``values`` (ordered keys of their bits)
    with its sign-clearing mask and infinity pattern: ``(ibits, low, inf)``."""
    wide = values.dtype == np.float64
    low, inf = ((1 << 63) - 1, 0x7FF0000000000000) if wide else (0x7FFFFFFF, 0x7F800000)
    return values.view(np.int64 if wide else np.int32), low, inf


def _check_spans(lows, highs, ctx) -> None:
    """A bucket whose ``max - min`` overflows float64 cannot be coded: ValueError naming it."""
    with np.errstate(over="ignore"):
        span = highs - lows
    if not np.all(np.isfinite(span)):
        b = int(np.flatnonzero(~np.isfinite(span))[0])
        raise CodecValueError(f"{ctx.name}: bucket {b} spans more than float64's range (max - min overflows); minmax cannot code it")


@register
class MinMax(Quantizer):
    """Per bucket min and max, 2**bits - 1 uniform steps between them (nearest or stochastic)."""

    name = "minmax"
    params = (
        Param("bits", int, 8, "code width in bits", low=1, high=8),
        Param("bucket", int, 1024, "values per bucket (each has its own min and max)", low=1, high=MAX_ELEMENTS),
        rounding("nearest"),
        SEED,
    )

    def quantize(self, x, ctx, sections):
        n = x.size
        nb, _, ngroups = bucket_groups(n, self.bucket)
        lows, highs = np.empty(nb), np.empty(nb)
        codes = self.codes_buffer(n, np.uint8, x)
        bad = np.zeros(ngroups, np.int64)
        if n:
            ibits, low, inf = _keys(x)
            backend("bucket", x).minmax_encode(
                x, readonly(ibits), low, inf, self.bucket, (1 << self.bits) - 1, self.stochastic, self.stream(ctx),
                lows, highs, codes, bad,
            )
        if bad.any():
            self.raise_nonfinite(x, ctx)
        _check_spans(lows, highs, ctx)
        sections.append(scalars_section(np.concatenate([lows, highs])))
        sections.append(codes_section(codes, self.bits))

    def bound(self, ctx):
        """Always the bounds section (2 per bucket) and ``bits``-bit codes.  The bounds are the
        values' own min and max: float32 items for 16-bit and float32 values (exact), float64
        items allowed for float64 values (what a value beyond float32's range takes)."""
        nb = -(-ctx.n // self.bucket)
        return Bound(2, scalars_bytes(2 * nb, top_of(ctx.dtype)) + raw_length(ctx.n, self.bits))

    run_head = SectionKind.SCALARS

    def run_bits(self):
        return self.bits

    def quantize_run(self, x, starts, ctxs):
        nb = -(-np.diff(starts) // self.bucket)
        bstarts = offsets(nb)
        lows, highs = np.empty(int(bstarts[-1])), np.empty(int(bstarts[-1]))
        codes = self.codes_buffer(x.size, np.uint8, x)
        bad = np.zeros(len(ctxs), np.int64)
        ibits, low, inf = _keys(x)
        backend("bucket", x).minmax_encode_segments(
            x, readonly(ibits), low, inf, starts, bstarts, self.bucket, (1 << self.bits) - 1, self.stochastic, self.streams(ctxs),
            lows, highs, codes, bad,
        )
        with np.errstate(over="ignore"):
            finite = np.all(np.isfinite(highs - lows))
        if bad.any() or not finite:
            return None
        # per tensor its lows, then its highs (the scalars section of a tensor alone)
        head = np.empty(2 * lows.size)
        tensor = np.repeat(np.arange(nb.size), nb)
        at = np.arange(lows.size) + bstarts[:-1][tensor]  # bucket b of tensor t at 2*bstarts[t] + b
        head[at] = lows
        head[at + nb[tensor]] = highs
        return head, 2 * bstarts, codes

    def run_shape(self, hstarts, sizes, dtype):
        """Where each bucket's minimum and maximum lie in the heads read (per tensor its
        lows, then its highs), the buckets' starts and lengths, when every tensor has two
        numbers per bucket."""
        nb = -(-sizes // self.bucket)
        if not np.array_equal(np.diff(hstarts), 2 * nb):
            return None
        tensor = np.repeat(np.arange(nb.size), nb)
        at = np.arange(int(nb.sum())) + hstarts[:-1][tensor] // 2
        return at, at + nb[tensor], hstarts // 2, np.full(sizes.size, self.bucket, np.int64)

    def run_factors(self, head, plan):
        low_at, high_at, sstarts, blocks = plan.shape
        lows, highs = head[low_at], head[high_at]
        if np.any(lows > highs):
            raise CorruptFrameError("minmax frame: a bucket's minimum exceeds its maximum")
        levels = (1 << self.bits) - 1
        return _codes(self.bits), blocks, (highs - lows) / levels, sstarts, lows, float(levels)

    def encode_feedback(self, x, slot, ctx, sections):
        """Fused error-feedback step for float32/float64: one pass over memory codes ``x +
        residual`` bucket by bucket and writes ``acc = x + residual - decoded`` into a spare
        buffer (``minmax_encode`` with ``r``, ``acc``; a value beyond the dtype's
        range saturates, as its decoder clips it), bit for bit what adding, encoding,
        decoding and subtracting give.  None (the unfused step) for 16-bit input.

        8-bit codes of float32 are written straight into the frame, checksummed as they are
        written, and the bounds section, whose width (float32) is known before the pass, is
        filled after it (``Section.late``); otherwise the pass runs here and the frame
        copies its codes."""
        if x.dtype not in (np.float32, np.float64):
            return None
        n = x.size
        nb, _, ngroups = bucket_groups(n, self.bucket)
        lows, highs = np.empty(nb), np.empty(nb)
        acc = slot.take_spare()
        flat = acc.reshape(acc.size)

        def code(codes, crc=None):
            bad = np.zeros(ngroups, np.int64)
            got = -1
            if n:
                ibits, low, inf = _keys(flat)
                got = backend("bucket", x).minmax_encode(
                    x, ibits, low, inf, self.bucket, (1 << self.bits) - 1, self.stochastic, self.stream(ctx),
                    lows, highs, codes, bad, slot.read_residual(), flat, -1 if crc is None else crc,
                )
            if bad.any():
                self.raise_nonfinite(flat, ctx)
            _check_spans(lows, highs, ctx)
            return continued(codes, crc, got)

        if self.bits == 8 and x.dtype == np.float32:  # float32 bounds: float32 scalars
            def bounds(out):  # the one writer of a scalars section, filled once the pass found them
                out[:] = np.frombuffer(scalars_section(np.concatenate([lows, highs])).data, np.uint8)  # (a device frame's: through a host buffer)

            sections.append(Section(SectionKind.SCALARS, 32, 2 * nb, fill=bounds, late=True))
            sections.append(Section(SectionKind.VALUES, 8, n, fill=code, fill_crc=True, device=on_device(x)))
        else:
            codes = self.codes_buffer(n, np.uint8, x)
            code(codes)
            sections.append(scalars_section(np.concatenate([lows, highs])))
            sections.append(codes_section(codes, self.bits))
        return lambda: slot.commit(acc)

    def read(self, reader, ctx, count):
        nb = -(-count // self.bucket)
        bounds = read_scalars(reader, 2 * nb)
        lows, highs = bounds[:nb], bounds[nb:]
        if np.any(lows > highs):
            raise CorruptFrameError("minmax frame: a bucket's minimum exceeds its maximum")
        levels = (1 << self.bits) - 1
        data = read_codes(reader, self.bits, count, device=ctx.codes_on_device)
        return Dequant(data, self.bits, count, _codes(self.bits), self.bucket, (highs - lows) / levels, lows, ctx.dtype, lut_top=float(levels))
