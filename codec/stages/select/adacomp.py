"""``adacomp(bin=auto)``: AdaComp (Chen et al., AAAI 2018), residual binning with localized
selection per bin and one scale per tensor (docs/codecs.md)."""

from __future__ import annotations

import numpy as np

from codec.frame import MAX_ELEMENTS, SectionKind, Section, raw_length
from codec.ops import add, offsets, readonly, round_to, store, WIDE, widen
from codec.dtypes import on_device
from codec.device import Memory
from codec.stages.select.base import IndexSelect
from codec.stages.select.magnitude import collect, raise_nonfinite, segment_room
from codec.params import Param
from codec.stage import Bound, Value, register
from codec.kernels import backend
from codec.layout import bucket_groups
from codec.manyframe import Entry
from codec.pack import encode_indices, unpack_bits

#: the paper's bin lengths: convolutions (ndim >= 3) and everything else
CONV_BIN, FC_BIN = 50, 500


def _words(values):
    """``values``' bits as unsigned words (where they live): what ``pack.sign_bits`` reads."""
    return values.reshape(values.size).view(f"u{np.dtype(values.dtype).itemsize}")


class SignScale(Value):
    """AdaComp's own value coding: one sign bit per kept value (1 = negative) and the scale."""

    name = "adacomp.signs"
    lossless = False

    def encode(self, values, ctx, sections):
        sections.append(Section(SectionKind.SCALARS, 64, 1, np.array([ctx.hints["scale"]], "<f8")))
        mem = Memory(on_device(values))  # device values: the sign bits made there, only they come back
        bits = mem.empty((values.size + 7) // 8, np.uint8)
        backend("pack", bits).sign_bits(_words(values), mem.put(np.array([0, values.size], np.int64)), bits, mem.put(np.zeros(1, np.int64)))
        sections.append(Section(SectionKind.VALUES, 1, values.size, mem.host(bits)))

    def bound(self, ctx):
        """Always two sections, whatever the values: the float64 scale (8 bytes) and one sign
        bit per value, ``ceil(n/8)`` bytes: exact."""
        return Bound(2, 8 + raw_length(ctx.n, 1))

    def read(self, reader, ctx, count):
        _, raw = reader.take(SectionKind.SCALARS, bits=64, count=1)
        scale = float(raw.view("<f8")[0])
        _, bits = reader.take(SectionKind.VALUES, bits=1, count=count)
        return scale, unpack_bits(bits, 1, count)

    def write(self, payload, out, mode):
        scale, negative = payload
        if np.ndim(scale):  # a sparse run (read_kept): each value's own tensor's scale, exact in float64
            store(np.where(negative.astype(bool), -scale, scale), out, mode)
            return
        # float32 when that holds the scale exactly (it does for every float32 or 16-bit frame),
        # so the values are rounded once whatever out's dtype; a two-entry table indexed by the
        # sign bits (np.where with scalars took 5x as long)
        exact32 = abs(scale) <= float(np.finfo(np.float32).max) and float(np.float32(scale)) == scale  # (no overflowing cast)
        s = np.float32(scale) if exact32 else np.float64(scale)
        store(np.array([s, -s]).take(negative.view(np.uint8)), out, mode)

    def decoded(self, values, ctx):
        return self.written((ctx.hints["scale"], np.signbit(values)), values.size, ctx)

    def encode_kept(self, values, kstarts, ctxs):
        """A sparse run's scales and sign bits, each tensor's as :meth:`encode` writes them, in
        one buffer (one ``put_items``, one ``pack_segments``)."""
        mem = Memory(on_device(values))  # device values: the bytes made there, only they come back
        ks = np.diff(kstarts)
        starts = offsets(8 + (ks + 7) // 8)
        data = mem.empty(int(starts[-1]), np.uint8)
        kern = backend("pack", data)
        put = mem.put
        scales = np.array([c.hints["scale"] for c in ctxs], np.float64)
        kern.put_items(put(scales), put(np.arange(ks.size + 1, dtype=np.int64)), put(np.full(ks.size, 8, np.int64)), data, put(starts[:-1]))
        kern.sign_bits(_words(values), put(np.ascontiguousarray(kstarts, np.int64)), data, put(starts[:-1] + 8))
        data = mem.host(data)
        table = [[Entry(SectionKind.SCALARS, 64, 1), Entry(SectionKind.VALUES, 1, k)] for k in ks.tolist()]
        return table, Section(SectionKind.VALUES, 8, data.size, data), starts

    def read_kept(self, data, sections, counts, dtype):
        """A sparse run's scales and sign bits read at once: ``(scale per value, sign bits)``,
        which :meth:`write` decodes (None: a tensor whose sections are not a scale then its
        sign bits)."""
        at = np.empty(len(counts), np.int64)
        bits_at = np.empty(len(counts), np.int64)
        for t, (secs, k) in enumerate(zip(sections, counts)):
            if len(secs) != 2 or (secs[0].kind, secs[0].bits, secs[0].count) != (SectionKind.SCALARS, 64, 1) or (secs[1].kind, secs[1].bits, secs[1].count) != (SectionKind.VALUES, 1, k):
                return None
            at[t], bits_at[t] = secs[0].offset, secs[1].offset
        scales = data[at[:, None] + np.arange(8)].view("<f8").reshape(-1)
        ks = np.asarray(counts, np.int64)
        j = np.arange(int(ks.sum())) - np.repeat(np.cumsum(ks) - ks, ks)  # each value's index in its tensor
        negative = (data[np.repeat(bits_at, ks) + (j >> 3)] >> (j & 7).astype(np.uint8)) & 1
        return np.repeat(scales, ks), negative


@register
class AdaComp(IndexSelect):
    """AdaComp: per bin, send |G+dW| >= max|G|; values as sign bits times one scale."""

    name = "adacomp"
    default_value = SignScale
    devices = frozenset({"cpu", "cuda"})  # the bins run in the adacomp family's CUDA twin
    sees_gradient = True  # |G + dW| >= max |G|: dW on its own, not only G (select_segments takes gradient=)
    params = (Param("bin", int, None, f"bin length L; auto = {CONV_BIN} if ndim >= 3 else {FC_BIN}", low=1, high=MAX_ELEMENTS, auto=True),)

    def length(self, shape) -> int:
        return self.bin if self.bin is not None else (CONV_BIN if len(shape) >= 3 else FC_BIN)

    def kept_range(self, n, step):
        """Data-dependent, from none (all zeros: ``g_i != 0`` is required) to all ``n`` (a bin of
        equal non-zero magnitudes sends every element: ``|2 g| >= max |g|``): the bound is the
        bitmap, ``ceil(n/8)`` bytes, which a tensor sending every element reaches."""
        return 0, n

    def select(self, values, ctx, sections, residual=None, out=None):
        n = values.size
        L = self.length(ctx.shape)
        nbins, per_chunk, nchunk = bucket_groups(n, L)  # kernel chunks of whole bins, about CHUNK values
        # float32/float64 under error feedback: the kernel forms G = R + dW into out in its pass;
        # 16-bit: G is rounded to the array's dtype first, the test runs on exact float32 widenings
        form = residual is not None and values.dtype in WIDE
        if form or residual is None:
            g = out if form else values
        else:
            g = out
            add(values, residual, out)
        dw = readonly(widen(values))
        kg = g if form else readonly(widen(g))
        kern = backend("adacomp", dw)
        mem = Memory(on_device(dw))  # a device array: the bins run in the CUDA twin, the sends stay there
        gmax = mem.empty(nbins, kg.dtype)
        bad = mem.zeros(nchunk, np.int64)

        def run(chunks, buf, vals, counts):
            if form and chunks[1] - chunks[0] == nchunk:
                kern.feedback_adacomp_bins(dw, readonly(residual), kg, L, per_chunk, chunks, buf, vals, counts, bad, gmax)
            else:  # a re-run of one overfull chunk reads the G the first run formed
                kern.adacomp_bins(dw, readonly(kg), L, per_chunk, chunks, buf, vals, counts, bad, gmax)

        cap = n if nchunk <= 1 else max(64, per_chunk * L // 16)
        # the kernel records each send's g as it finds it (in cache): no gather from g afterwards
        idx, sent = collect(run, nchunk, cap, kg.dtype, mem.device) if n else (np.empty(0, np.int64), np.empty(0, kg.dtype))
        if mem.host(bad).any():
            raise_nonfinite(g, ctx, self.name)
        total = np.zeros(1)
        kern.bin_sums(gmax, np.array([0, nbins], np.int64), total)  # np.sum's order, where gmax lives: 8 bytes come back
        scale = total[0] / nbins if nbins else 0.0
        ctx.hints["scale"] = float(round_to(scale, values.dtype))  # exact in every output dtype
        sections.append(encode_indices(idx, n))
        if sent.dtype != g.dtype:  # a 16-bit g's exact widening: narrowed back (on a device, gathered from g)
            sent = mem.gather(g.reshape(n), idx) if mem.device else sent.astype(g.dtype)
        return idx, sent

    def find_segments(self, flat, starts, ctxs, gradient=None):
        """Every tensor's bins in one kernel call (``adacomp_segments``), its scale from its
        bins' maxima as :meth:`select` takes it (set in each context's hints), the kept
        values as the kernel found them.  ``gradient``: under error feedback, the run's gradients (``flat`` is ``acc =
        gradient + residual``), which the test ``|G + dW| >= max |G|`` reads."""
        sizes = np.diff(starts)
        lengths = np.array([self.length(c.shape) for c in ctxs], np.int64)
        bstarts = offsets(-(-sizes // lengths))
        mem = Memory(on_device(flat))  # device arrays: the twin's one launch, the finds stay there
        gmax = mem.empty(int(bstarts[-1]), flat.dtype)
        room, pos, counts, bad = segment_room(sizes)  # (only each tensor's first sends are written)
        pos, counts, bad = mem.put(pos), mem.put(counts), mem.put(bad)
        vals = mem.empty(flat.size, flat.dtype)
        dw = readonly(flat if gradient is None else gradient)  # (read-only either way: one signature)
        backend("adacomp", flat).adacomp_segments(dw, readonly(flat), mem.put(starts), mem.put(lengths), mem.put(bstarts), pos, vals, counts, bad, gmax)
        if mem.host(bad).any():
            return None  # select() raises the error naming the tensor and position
        counts = mem.host(counts)  # (the finds stay where they are: segments_picked gathers them)
        sums = np.zeros(sizes.size)
        backend("adacomp", flat).bin_sums(gmax, bstarts, sums)  # each tensor's maxima added in np.sum's order, where they live
        nbins = np.diff(bstarts)
        scales = np.divide(sums, nbins, out=np.zeros(sizes.size), where=nbins > 0)
        for ctx, scale in zip(ctxs, round_to(scales, flat.dtype).tolist()):
            ctx.hints["scale"] = scale  # exact in every output dtype
        return room, pos, counts, vals
