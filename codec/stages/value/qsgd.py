"""``qsgd(levels=16, bucket=512, rounding=stochastic)``: QSGD (Alistarh et al., NeurIPS 2017),
per-bucket L2 norm and ``levels`` levels per sign (docs/codecs.md)."""

from __future__ import annotations

import functools
import math

import numpy as np

from codec.device import Memory
from codec.dtypes import on_device
from codec.errors import CorruptFrameError
from codec.frame import MAX_ELEMENTS, SectionKind, Section, raw_length
from codec.ops import offsets, readonly
from codec.stages.value.dequant import Dequant, top_of
from codec.stages.value.quantizer import Quantizer, code_dtype
from codec.stages.value.sections import codes_section, read_scalars, scalars_bytes, scalars_section
from codec.layout import bucket_groups, LANES
from codec.params import Param, SEED, rounding
from codec.stage import Bound, register
from codec.kernels import backend


#: no offsets (a QSGD value is its level times its bucket's norm)
_NO_OFFSET = readonly(np.empty(0))


@functools.lru_cache(maxsize=64)
def _levels(s: int, w: int) -> np.ndarray:
    """The value of every ``w``-bit code ``level << 1 | sign`` over ``s`` levels, ``+-level /
    s`` (computed once per codec; read-only)."""
    code = np.arange(1 << w)
    level, negative = code >> 1, code & 1
    lut = np.where(negative == 1, -(level / s), level / s)
    lut.flags.writeable = False
    return lut


def _steps(chains: int, budget: int, cost, top: int | None = None) -> int:
    """The most steps ``chains`` chains can take within ``budget`` when step ``j`` (1, 2, ...,
    ``top``) of a chain costs ``cost(j)``, non-decreasing in ``j``: the cheapest steps first."""
    total, j = 0, 1
    while chains and (top is None or j <= top):
        c = cost(j)
        t = min(chains, budget // c)
        total, budget = total + t, budget - t * c
        if t < chains:  # every further step costs at least c > what is left
            break
        j += 1
    return total


def _budget(x: int) -> int:
    """An integer at least ``x (1 + 2^-20)``: the slack for the rounding of the norm and of
    ``|v| s / norm`` (relative errors below ``2^-28`` even for float64 sums of ``2^40`` squares)."""
    return x + (x >> 20) + 1


def _elias_bits(m: int, s: int, stochastic: bool) -> int:
    """The most bits of the run-length Elias-gamma code of one bucket of ``m`` values over
    ``s`` levels (``kernels/cpu/elias.py``; ``gamma(v)`` takes ``2 bitlen(v) - 1`` bits).

    A bucket of ``k`` non-zero levels ``l_i``, ``r_i`` zeros before each (``sum r_i <= m - k``:
    trailing zeros are not written) takes ``gamma(k + 1)``, then per non-zero ``gamma(r_i +
    1)``, its sign bit and ``gamma(l_i)``: ``2 bitlen(k+1) - 1 + 3k + 2 sum(bitlen(r_i+1) - 1)
    + 2 sum(bitlen(l_i) - 1)``.  A run's 2 bits more (``bitlen`` from ``j`` to ``j + 1``) cost
    ``2^(j-1)`` more zeros.  A level rounds ``t_i = |v_i| s / norm``, ``sum t_i^2 <= s^2 (1 +
    2^-20)`` (the norm rounded up, or float64's: off by far less than 2^-20): stochastically
    to ``l_i < t_i + 1``, so ``sum (l_i - 1)^2`` is within that budget; to nearest, ``l_i <=
    t_i + 1/2``, so ``sum (2 l_i - 1)^2 <= 4 s^2 (1 + 2^-20)``.  The cheapest level of bit
    length ``j + 1`` is ``2^j``, so a level's 2 bits more cost the difference of its weights
    at ``2^j`` and ``2^(j-1)``.  Both costs rise with ``j``: the cheapest steps first take the
    most (:func:`_steps`).  One more non-zero adds 3 bits and costs at most one run step (2
    bits) and, to nearest, one level step (at least 8 of the budget, so 8 more non-zeros lose
    at most one): the most is at ``k = m`` (stochastic), or within 7 of the most non-zeros
    the nearest budget allows."""
    top = int(s).bit_length() - 1  # level steps: bit lengths 1 .. bitlen(s)
    if stochastic:
        levels = _steps(m, _budget(s * s), lambda j: ((1 << j) - 1) ** 2 - ((1 << (j - 1)) - 1) ** 2, top)
        return 2 * (m + 1).bit_length() - 1 + 3 * m + 2 * levels
    budget = _budget(4 * s * s)

    def bits(k):  # k non-zeros, each of weight 1 at level 1
        levels = _steps(k, budget - k, lambda j: ((2 << j) - 1) ** 2 - ((1 << j) - 1) ** 2, top)
        return 2 * (k + 1).bit_length() - 1 + 3 * k + 2 * levels + 2 * _steps(k, m - k, lambda j: 1 << (j - 1))

    most = min(m, budget)
    return max(bits(k) for k in range(max(0, most - 7), most + 1))


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

    def bound(self, ctx):
        """The norms (one per bucket), then packed codes (exact) or the Elias chunks' lengths
        and streams (:func:`_elias_bits` per bucket, each chunk padded to bytes).  A norm of
        ``m >= 2`` values may exceed float32 (``max|v| sqrt(m)``: float32, bfloat16, float64
        values): float64 items then; a single value's norm is itself."""
        n, bucket = ctx.n, self.bucket
        nb = -(-n // bucket)
        m = min(bucket, n)
        most = top_of(ctx.dtype) * (math.sqrt(m) * (1 + 2.0**-20) if m > 1 else 1.0)
        norms = scalars_bytes(nb, most)
        if self.coding != "elias":
            return Bound(2, norms + raw_length(n, self.code_bits))
        per, nchunk = self._chunks(n)
        if not nchunk:
            return Bound(3, norms)
        full = _elias_bits(bucket, self.levels, self.stochastic)
        last = (nb - 1 - (nchunk - 1) * per) * full + _elias_bits(n - (nb - 1) * bucket, self.levels, self.stochastic)
        stream = (nchunk - 1) * (-(-per * full // 8)) + -(-last // 8)
        return Bound(3, norms + 8 * nchunk + stream)

    run_head = SectionKind.SCALARS

    def run_bits(self):
        return self.code_bits

    def code_limit(self):
        w = self.code_bits
        return ((1 << w) - 1, 1, self.levels)  # level = code >> 1 <= s

    def quantize_run(self, x, starts, ctxs):
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

    def run_shape(self, hstarts, sizes, dtype):
        """The code table and each tensor's bucket length, when every tensor has one norm per
        bucket."""
        if self.coding != "packed" or hstarts.size != sizes.size + 1 or not (hstarts[1:] - hstarts[:-1] == -(-sizes // self.bucket)).all():
            return None
        return _levels(self.levels, self.code_bits), readonly(np.full(sizes.size, self.bucket, np.int64))

    def run_factors(self, head, plan):
        if head.size and head.min() < 0:
            raise CorruptFrameError("qsgd frame: a negative norm")
        lut, blocks = plan.shape
        return lut, blocks, head, plan.hstarts, _NO_OFFSET, 1.0

    def encode_feedback(self, x, slot, ctx, sections):
        """Fused error-feedback step for float32/float64: one pass over memory codes ``x +
        residual`` bucket by bucket and writes ``acc = x + residual - decoded`` into a spare
        buffer (``qsgd_encode`` with ``r``, ``acc``; a value beyond the dtype's range,
        as under a norm beyond it, saturates as its decoder clips it), bit for bit what adding,
        encoding, decoding and subtracting give.  None (the unfused step) for 16-bit input."""
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
                x, self.bucket, self.levels, self.stochastic, self.stream(ctx), LANES, norms, codes, bad, slot.read_residual(), flat
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
        limit = None  # (the codes checked; else the check the decoding pass makes)
        if self.coding == "elias":
            data, w = self._read_elias(reader, count), 8 * np.dtype(code_dtype(w)).itemsize
        else:
            data, limit = self.read_values_section(reader, ctx, w, count)
        return Dequant(data, w, count, _levels(s, w), self.bucket, norms, np.empty(0), ctx.dtype, lut_top=1.0, limit=limit)

    def _read_elias(self, reader, count):
        """The codes (little-endian bytes of uint8/uint16 codes) of an Elias-coded frame."""
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

