"""``qsgd(levels=16, bucket=512, rounding=stochastic)``: QSGD (Alistarh et al., NeurIPS 2017),
per-bucket L2 norm and ``levels`` levels per sign (docs/codecs.md)."""

from __future__ import annotations

import functools

import numpy as np

from codec.device import Memory
from codec.dtypes import on_device
from codec.errors import CorruptFrameError
from codec.frame import MAX_ELEMENTS, SectionKind, Section
from codec.ops import offsets, readonly
from codec.stages.value.quantizer import (
    Dequant,
    Quantizer,
    code_dtype,
    codes_section,
    read_codes,
    read_scalars,
    scalars_section,
)
from codec.layout import bucket_groups
from codec.params import Param, SEED, rounding
from codec.stage import register


@functools.lru_cache(maxsize=64)
def _levels(s: int, w: int) -> np.ndarray:
    """The value of every ``w``-bit code ``level << 1 | sign`` over ``s`` levels, ``+-level /
    s`` (computed once per codec; read-only)."""
    code = np.arange(1 << w)
    level, negative = code >> 1, code & 1
    lut = np.where(negative == 1, -(level / s), level / s)
    lut.flags.writeable = False
    return lut


@register
class Qsgd(Quantizer):
    """QSGD: per bucket an L2 norm, each |v|/norm on s levels (stochastic, unbiased), sign+level packed."""

    name = "qsgd"
    params = (
        Param("levels", int, 16, "quantization levels s per sign", low=1, high=32767),
        Param("bucket", int, 512, "values per bucket (each has its own norm)", low=1, high=MAX_ELEMENTS),
        rounding("stochastic"),
        Param("coding", str, "packed", "packed: fixed-width sign+level codes; elias: the paper's run-length Elias-gamma", choices=("packed", "elias")),
        SEED,
    )

    @property
    def code_bits(self) -> int:
        return 1 + int(self.levels).bit_length()

    def quantize(self, x, ctx, sections):
        from codec.kernels import backend
        from codec.layout import LANES

        n = x.size
        nb, _, ngroups = bucket_groups(n, self.bucket)
        norms = np.empty(nb)
        codes = self.codes_buffer(n, code_dtype(self.code_bits), x)
        bad = np.zeros(ngroups, np.int64)
        if n:
            backend("bucket", x).qsgd_encode(x, self.bucket, self.levels, self.stochastic, self.stream(ctx), LANES, norms, codes, bad)
        if bad.any():
            self.raise_nonfinite(x, ctx)
        sections.append(scalars_section(norms))
        if self.coding == "elias":
            sections.extend(self._elias(codes))
        else:
            sections.append(codes_section(codes, self.code_bits))

    run_head = SectionKind.SCALARS

    def run_bits(self):
        return self.code_bits

    def code_limit(self):
        w = self.code_bits
        return ((1 << w) - 1, 1, self.levels)  # level = code >> 1 <= s

    def quantize_run(self, x, starts, ctxs):
        from codec.kernels import backend
        from codec.layout import LANES

        if self.coding != "packed":
            return None
        bstarts = offsets(-(-np.diff(starts) // self.bucket))
        norms = np.empty(int(bstarts[-1]))
        codes = self.codes_buffer(x.size, code_dtype(self.code_bits), x)
        bad = np.zeros(len(ctxs), np.int64)
        backend("bucket", x).qsgd_encode_segments(
            x, starts, bstarts, self.bucket, self.levels, self.stochastic, self.streams(ctxs), LANES, norms, codes, bad
        )
        if bad.any():
            return None
        return norms, bstarts, codes

    def run_factors(self, head, hstarts, sizes, dtype):
        if self.coding != "packed" or not np.array_equal(np.diff(hstarts), -(-sizes // self.bucket)):
            return None
        if head.size and head.min() < 0:
            raise CorruptFrameError("qsgd frame: a negative norm")
        s, w = self.levels, self.code_bits
        return _levels(s, w), np.full(sizes.size, self.bucket, np.int64), head, hstarts, np.empty(0), 1.0

    def encode_feedback(self, x, slot, ctx, sections):
        """Fused error-feedback step for float32/float64: one pass over memory forms ``acc =
        x + residual`` bucket by bucket (into a spare buffer), codes it and leaves ``acc -
        decoded`` there (``qsgd_encode`` with ``r``, ``acc``; a value beyond the dtype's range,
        as under a norm beyond it, saturates as its decoder clips it), bit for bit what adding,
        encoding, decoding and subtracting give.  None (the unfused step) for 16-bit input."""
        from codec.kernels import backend
        from codec.layout import LANES

        if x.dtype not in (np.float32, np.float64):
            return None
        n = x.size
        nb, _, ngroups = bucket_groups(n, self.bucket)
        norms = np.empty(nb)
        codes = self.codes_buffer(n, code_dtype(self.code_bits), x)
        bad = np.zeros(ngroups, np.int64)
        acc = slot.take_spare()
        flat = acc.reshape(acc.size)
        if n:
            backend("bucket", x).qsgd_encode(
                x, self.bucket, self.levels, self.stochastic, self.stream(ctx), LANES, norms, codes, bad, slot.residual.reshape(n), flat
            )
        if bad.any():
            self.raise_nonfinite(flat, ctx)
        sections.append(scalars_section(norms))
        sections.extend(self._elias(codes) if self.coding == "elias" else [codes_section(codes, self.code_bits)])
        return lambda: slot.commit(acc)

    def most_values(self, bits: int) -> int:
        """Elias coding writes one bit at least per bucket (gamma(nnz + 1)), not per value: a
        bucket of zeros costs one bit; packed codes take ``code_bits`` each."""
        return bits * self.bucket if self.coding == "elias" else bits

    def _chunks(self, n: int) -> tuple[int, int]:
        """Buckets per Elias chunk (the kernels' bucket group) and the number of chunks."""
        _, per, ngroups = bucket_groups(n, self.bucket)
        return per, ngroups

    def _elias(self, codes):
        """Run-length Elias-gamma streams, one per chunk of buckets, each padded to whole
        bytes so chunks code in parallel; an ``ints`` section holds each chunk's byte length."""
        from codec.kernels import backend

        kern = backend("elias", codes)
        per, nchunk = self._chunks(codes.size)
        sizes = np.zeros(nchunk, np.uint64)
        codes = readonly(codes)
        if nchunk:
            kern.elias_sizes(codes, self.bucket, per, sizes)
        starts = offsets(sizes)
        out = Memory(on_device(codes)).zeros(int(starts[-1]), np.uint8)  # (device codes stay there until the frame is written)
        if nchunk:
            kern.elias_encode(codes, self.bucket, per, starts[:-1], out)
        return [Section(SectionKind.INTS, 64, nchunk, sizes.astype("<u8")), Section(SectionKind.VALUES, 8, out.size, out)]

    def read(self, reader, ctx, count):
        nb = -(-count // self.bucket)
        norms = read_scalars(reader, nb)
        if norms.size and norms.min() < 0:
            raise CorruptFrameError("qsgd frame: a negative norm")
        s, w = self.levels, self.code_bits
        if self.coding == "elias":
            data, w = self._read_elias(reader, count), 8 * np.dtype(code_dtype(w)).itemsize
        else:
            data = read_codes(reader, w, count, self.code_limit(), device=ctx.codes_on_device)
        return Dequant(data, w, count, _levels(s, w), self.bucket, norms, np.empty(0), ctx.dtype, lut_top=1.0)

    def _read_elias(self, reader, count):
        """The codes (little-endian bytes of uint8/uint16 codes) of an Elias-coded frame."""
        from codec.kernels import backend

        per, nchunk = self._chunks(count)
        _, raw = reader.take(SectionKind.INTS, bits=64, count=nchunk)
        sizes = raw.view("<u8")
        info = reader.remaining()[0] if reader.remaining() else None
        if info is None or info.kind != SectionKind.VALUES or info.bits != 8 or int(sizes.sum(dtype=np.uint64)) != info.count:
            raise CorruptFrameError("qsgd frame: the Elias chunk lengths do not add up to the values section")
        _, data = reader.take(SectionKind.VALUES, bits=8, count=info.count)
        starts = offsets(sizes.astype(np.int64))
        codes = np.zeros(count, code_dtype(self.code_bits))
        bad = np.zeros(nchunk, np.int64)
        if nchunk:
            backend("elias", data).elias_decode(readonly(data), starts, count, self.bucket, per, self.levels, codes, bad)
        if bad.any():
            raise CorruptFrameError(f"qsgd frame: Elias stream of chunk {int(np.flatnonzero(bad)[0])} is damaged")
        return codes.astype(codes.dtype.newbyteorder("<"), copy=False).view(np.uint8)

