"""``adacomp(bin=auto)``: AdaComp (Chen et al., AAAI 2018), residual binning with localized
selection per bin and one scale per tensor (docs/codecs.md)."""

from __future__ import annotations

import numpy as np

from codec.frame import MAX_ELEMENTS, SectionKind, Section
from codec.ops import readonly
from codec.stages.select.magnitude import IndexSelect, collect, raise_nonfinite
from codec.params import Param
from codec.stage import Value, register

#: the paper's bin lengths: convolutions (ndim >= 3) and everything else
CONV_BIN, FC_BIN = 50, 500


class SignScale(Value):
    """AdaComp's own value coding: one sign bit per kept value (1 = negative) and the scale."""

    name = "adacomp.signs"
    lossless = False

    def encode(self, values, ctx, sections):
        from codec.pack import pack_bits

        sections.append(Section(SectionKind.SCALARS, 64, 1, np.array([ctx.hints["scale"]], "<f8")))
        signs = np.signbit(values).view(np.uint8)
        sections.append(Section(SectionKind.VALUES, 1, values.size, pack_bits(signs, 1)))

    def read(self, reader, ctx, count):
        from codec.pack import unpack_bits

        _, raw = reader.take(SectionKind.SCALARS, bits=64, count=1)
        scale = float(raw.view("<f8")[0])
        _, bits = reader.take(SectionKind.VALUES, bits=1, count=count)
        return scale, unpack_bits(bits, 1, count)

    def write(self, payload, out, mode):
        from codec.ops import store

        scale, negative = payload
        # float32 when that holds the scale exactly (it does for every float32 or 16-bit frame),
        # so the values are rounded once whatever out's dtype; a two-entry table indexed by the
        # sign bits (np.where with scalars took 5x as long)
        exact32 = abs(scale) <= float(np.finfo(np.float32).max) and float(np.float32(scale)) == scale  # (no overflowing cast)
        s = np.float32(scale) if exact32 else np.float64(scale)
        store(np.array([s, -s]).take(negative.view(np.uint8)), out, mode)

    def decoded(self, values, ctx):
        return self.written((ctx.hints["scale"], np.signbit(values)), values.size, ctx)


@register
class AdaComp(IndexSelect):
    """AdaComp: per bin, send |G+dW| >= max|G|; values as sign bits times one scale."""

    name = "adacomp"
    default_value = SignScale
    params = (Param("bin", int, None, f"bin length L; auto = {CONV_BIN} if ndim >= 3 else {FC_BIN}", low=1, high=MAX_ELEMENTS, auto=True),)

    def length(self, shape) -> int:
        return self.bin if self.bin is not None else (CONV_BIN if len(shape) >= 3 else FC_BIN)

    def select(self, values, ctx, sections, residual=None, out=None):
        from codec.kernels import backend
        from codec.layout import bucket_groups
        from codec.ops import WIDE, round_to, widen
        from codec.pack import encode_indices

        n = values.size
        L = self.length(ctx.shape)
        nbins, per_chunk, nchunk = bucket_groups(n, L)  # kernel chunks of whole bins, about CHUNK values
        # float32/float64 under error feedback: the kernel forms G = R + dW into out in its pass;
        # 16-bit: G is rounded to the array's dtype first, the test runs on exact float32 widenings
        form = residual is not None and values.dtype in WIDE
        if form or residual is None:
            g = out if form else values
        else:
            g = np.add(values, residual, out=out)
        dw = readonly(widen(values))
        kg = g if form else readonly(widen(g))
        kern = backend("select", dw)
        gmax = np.empty(nbins, kg.dtype)
        bad = np.zeros(nchunk, np.int64)

        def run(chunks, buf, vals, counts):
            if form and chunks[1] - chunks[0] == nchunk:
                kern.feedback_adacomp_bins(dw, readonly(residual), kg, L, per_chunk, chunks, buf, vals, counts, bad, gmax)
            else:  # a re-run of one overfull chunk reads the G the first run formed
                kern.adacomp_bins(dw, readonly(kg), L, per_chunk, chunks, buf, vals, counts, bad, gmax)

        cap = n if nchunk <= 1 else max(64, per_chunk * L // 16)
        # the kernel records each send's g as it finds it (in cache): no gather from g afterwards
        idx, sent = collect(run, nchunk, cap, kg.dtype) if n else (np.empty(0, np.int64), kg[:0])
        if bad.any():
            raise_nonfinite(g, ctx, self.name)
        scale = np.sum(gmax, dtype=np.float64) / nbins if nbins else 0.0
        ctx.hints["scale"] = float(round_to(scale, values.dtype))  # exact in every output dtype
        sections.append(encode_indices(idx, n))
        return idx, sent.astype(g.dtype, copy=False)  # a 16-bit g's exact widening, narrowed back
