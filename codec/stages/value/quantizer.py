"""What the quantizers share: the ``Quantizer`` value stage (encode through a kernel, decode
through one table-driven kernel), and the sections they write (codes, scalars, exponents).

A quantizer's ``quantize(x, ctx, sections)`` sees the values as a flat float32/float64 array
(16-bit inputs widened exactly) and appends its sections; its ``read(reader, ctx, count)``
reads them back into a :class:`Dequant`: ``value_i = lut[code_i] * scale[b] (+ offset[b])``
for value ``i`` of block ``b``, computed in float64 and rounded once to the array's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from codec.dtypes import on_device
from codec.errors import CorruptFrameError, NonFiniteError
from codec.frame import SectionKind, Section
from codec.ops import first_nonfinite, offsets, readonly, widen
from codec.pack import _code_dtype as code_dtype, padding_bytes  # noqa: F401  (code_dtype: the narrowest unsigned dtype for a code width)
import abc

from codec.stage import Value
from codec.stages.value.dequant import RUN_FIELD, Dequant, write, write_segments
from codec.stages.value.sections import F32_MAX, read_codes
from codec import device
from codec.device import host_copy, Memory
from codec.kernels import backend, module
from codec.manyframe import Entry
from codec.streams import key_text, stream



#: ``quantrun.run_read``'s code-field check when no code can fail it
_NO_LIMIT = (0, 0, -1)


@dataclass(frozen=True)
class RunPlan:
    """What reading a quantizer's run takes from its layout alone
    (:meth:`Quantizer.run_plan`): the codes' width; the run's bytes ``lo:hi`` of the
    payload; the tensors' starts in the run, their heads' starts and sizes; the dtype; each
    head section's offset (in the run's bytes) and item width; each codes section's offset;
    and the last byte (and its padding bits' shift) of each codes section that has padding;
    what the stage's :meth:`Quantizer.run_shape` takes from the layout (``shape``); and the
    code fields' check (:meth:`Quantizer.code_limit`), None when no code can fail it."""

    bits: int
    lo: int
    hi: int
    starts: np.ndarray
    hstarts: np.ndarray
    sizes: np.ndarray
    dtype: np.dtype
    hoffs: np.ndarray
    hwidths: np.ndarray
    dstarts: np.ndarray
    last: np.ndarray
    used: np.ndarray
    shape: object = None
    limit: tuple | None = None


def exponent_range(dtype) -> tuple[int, int]:
    """(exponent of the smallest subnormal, largest exponent) of a float dtype: (-149, 127) for float32."""
    info = ml_dtypes.finfo(dtype)
    return int(np.frexp(float(info.smallest_subnormal))[1]) - 1, int(info.maxexp) - 1


class Quantizer(Value):
    """Base of the quantizer value stages (docs/codecs.md, "Quantizers").

    Every quantizer takes device arrays: its kernels' CUDA twins (``quantize``, ``bucket``,
    ``elias``, ``dequant``) make the same codes on the device, the small per-block numbers
    (windows, norms, bounds, counts) and the codes cross to the host as the frame's bytes
    (bit-packed on the device first: :func:`codes_section`).

    A decode into host arrays that checks a frame's payload CRC-32C in its own pass hands
    :meth:`write` the check (``checks_payload``): the kernel that decodes the codes
    checksums them and tests their fields as it reads them (``dequantize_checked``), so the
    frame is read once; a damaged or forged frame leaves the output NaN (docs/api.md,
    "When the check runs")."""

    lossless = False
    devices = frozenset({"cpu", "cuda"})
    checks_payload = True

    def encode(self, values, ctx, sections):
        if on_device(values):  # (a device array is contiguous: codec.device.as_device_array)
            x = widen(values).reshape(values.size)
        else:
            x = readonly(np.ascontiguousarray(widen(values)).reshape(-1))
        self.quantize(x, ctx, sections)

    @staticmethod
    def codes_buffer(n: int, dtype, like):
        """An array of ``n`` codes of ``dtype`` where ``like`` lives (a device array's codes are
        made, and packed, on the device)."""
        return Memory(on_device(like)).empty(n, dtype)

    @abc.abstractmethod
    def quantize(self, x, ctx, sections) -> None:
        """Append the sections coding ``x`` (float32/float64, 1-D, contiguous, read-only)."""

    def read_values_section(self, reader, ctx, bits: int, count: int):
        """``(data, limit)``: the values section's ``count`` codes of ``bits`` bits
        (:func:`~codec.stages.value.sections.read_codes`), their fields checked against
        :meth:`code_limit` now, or, when decoding checks the payload in its own pass
        (``ctx.checked_in_pass``), left to that pass: then ``limit`` is the check
        (:attr:`Dequant.limit`), else None."""
        limit = self.code_limit()
        later = limit if ctx.checked_in_pass and not ctx.codes_on_device else None
        return read_codes(reader, bits, count, None if later else limit, device=ctx.codes_on_device), later

    def write(self, payload: Dequant, out, mode, check=None) -> None:
        write(payload, out, mode, check)

    def write_segments(self, payload: Dequant, outs, mode, check=None, addrs=None) -> bool:
        """:func:`codec.stages.value.dequant.write_segments`: a run's codes (:meth:`read_run`)
        decoded into every tensor's own array in one kernel call, or False."""
        return write_segments(payload, outs, mode, check, addrs)

    def raise_nonfinite(self, x, ctx):
        raise NonFiniteError(ctx.name, ctx.where(first_nonfinite(host_copy(x) if on_device(x) else x)), self.name)

    @property
    def stochastic(self) -> bool:
        """Whether the stage draws random numbers (its ``rounding``; TernGrad always does)."""
        return self.config.get("rounding", "stochastic") == "stochastic"

    def stream(self, ctx):
        """The frame's random stream (0 when the stage rounds to nearest)."""
        if not self.stochastic:
            return np.uint64(0)

        return stream(self.seed, ctx)

    def streams(self, ctxs) -> np.ndarray:
        """:meth:`stream` of every context (uint64; tensors whose keys have one text and one
        step share it, :func:`codec.streams.key_text`)."""
        if not self.stochastic:
            return np.zeros(len(ctxs), np.uint64)
        memo: dict = {}
        out = np.empty(len(ctxs), np.uint64)
        for i, ctx in enumerate(ctxs):
            at = (key_text(ctx.key), ctx.step)
            out[i] = memo[at] if at in memo else memo.setdefault(at, self.stream(ctx))
        return out

    # ------------------------------------------------------------ many-tensor runs
    #: the section that precedes the codes in a run's tensors (``SCALARS``: float32 items, or
    #: float64 for a tensor whose numbers do not fit; ``INTS``: int16; None: the codes alone)
    run_head: int | None = None

    def quantize_run(self, x, starts, ctxs):
        """The kernels' part of :meth:`encode_run`: ``(head, hstarts, codes)``, every
        tensor's per-block numbers (float64, tensor t's ``head[hstarts[t]:hstarts[t+1]]``) and
        the codes of ``x`` (:meth:`run_bits` wide, any unsigned dtype); or None when a tensor needs
        its own encode (a NaN, a range the codec refuses: the error is raised there)."""
        return None

    def run_shape(self, hstarts, sizes, dtype):
        """What :meth:`run_factors` takes from a run's layout alone (tensors of ``sizes`` and
        ``dtype`` whose per-block numbers start at ``hstarts``), formed once per plan
        (:meth:`run_plan`): the tables, block lengths and places that do not depend on the
        numbers read; None when the heads are not this quantizer's run's (each tensor is then
        read alone)."""
        return None

    def run_factors(self, head, plan: RunPlan):
        """The decoder's part of :meth:`read_run`: from the per-block numbers read (as
        :meth:`quantize_run` gives them) of the run of ``plan`` (its ``shape`` from
        :meth:`run_shape`), ``(lut, blocks, scale, sstarts, offset, lut_top)`` for
        :class:`Dequant`, after the checks :meth:`read` makes (CorruptFrameError); None when
        a tensor must be read alone."""
        return None

    def code_limit(self):
        """``(field mask, shift, largest)`` that :func:`read_codes` checks, or None."""
        return None

    def encode_run(self, flat, starts, ctxs):
        if flat.dtype not in (np.float32, np.float64):
            return None
        got = self.quantize_run(readonly(flat), starts, ctxs)
        if got is None:
            return None
        head, hstarts, codes = got
        bits = self.run_bits()
        nh = np.diff(hstarts)
        if self.run_head == SectionKind.SCALARS:
            if not np.all(np.isfinite(head)):
                return None  # the tensor's own encode says which
            big = offsets(np.abs(head) > F32_MAX)
            widths = np.where(big[hstarts[1:]] > big[hstarts[:-1]], 8, 4)
        else:
            widths = np.full(len(ctxs), 2, np.int64)
        sizes = np.diff(starts)
        code_bytes = (sizes * bits + 7) // 8
        head_bytes = nh * widths if self.run_head is not None else np.zeros_like(nh)
        ostarts = offsets(head_bytes + code_bytes)
        cstarts = ostarts[:-1] + head_bytes
        pack = backend("pack", codes)
        codes = readonly(codes)

        def fill(out):
            if on_device(codes):  # packed on the device (into a device frame, or copied once into a host one), then the heads (host numbers) written

                packed = out if on_device(out) else device.empty(out.size, np.uint8)
                pack.pack_segments(codes, starts, bits, packed, cstarts)
                device.deliver(packed, out)
                if self.run_head is not None:
                    backend("pack", out).put_items(head, hstarts, widths, out, ostarts[:-1])
                return
            if self.run_head is not None:
                pack.put_items(head, hstarts, widths, out, ostarts[:-1])
            pack.pack_segments(codes, starts, bits, out, cstarts)

        table = [
            [Entry(self.run_head, 8 * int(w), int(h)), Entry(SectionKind.VALUES, bits, int(n))] if self.run_head is not None else [Entry(SectionKind.VALUES, bits, int(n))]
            for w, h, n in zip(widths.tolist(), nh.tolist(), sizes.tolist())
        ]
        return table, Section(SectionKind.VALUES, 8, int(ostarts[-1]), fill=fill, device=on_device(codes))

    def read_run(self, data, infos, sizes, dtype, in_pass: bool = False):
        """:meth:`read_planned` of :meth:`run_plan`: the run read and checked at once."""
        plan = self.run_plan(infos, sizes, dtype)
        return None if plan is None else self.read_planned(data, plan, in_pass)

    def run_plan(self, infos, sizes, dtype) -> RunPlan | None:
        """What reading a run takes from its tensors' section infos and sizes alone (their
        sections' kinds, widths, counts and offsets checked), so a caller that reads runs of
        one layout again (:mod:`codec.replay`) forms it once; None when the sections are not
        this quantizer's run (each tensor is then read alone)."""
        bits = self.run_bits()
        if bits is None or np.dtype(dtype) not in (np.float32, np.float64):
            return None
        heads = self.run_head is not None
        want = 2 if heads else 1
        count = len(sizes)
        hoffs, hwidths, hcounts, coffs = [], [], [], []
        allowed = (32, 64) if self.run_head == SectionKind.SCALARS else (16,)
        for secs, n in zip(infos, sizes):
            if len(secs) != want:
                return None
            codes = secs[-1]
            if codes.kind != SectionKind.VALUES or codes.bits != bits or codes.count != n:
                return None
            if heads:
                h = secs[0]
                if h.kind != self.run_head or h.bits not in allowed:
                    return None
                hoffs.append(h.offset)
                hwidths.append(h.bits // 8)
                hcounts.append(h.count)
            coffs.append(codes.offset)
        # the run's own bytes: its kernels then see the run's size, not the frame's (a parallel
        # kernel is dispatched by the size of its first argument: a run of a few small tensors
        # of a 100 MB frame ran threaded, ~60 us of waking the pool per call)
        lo = min(hoffs + coffs) if count else 0
        hi = infos[-1][-1].offset + infos[-1][-1].raw_len if count else 0
        starts = offsets(sizes)
        counts = np.diff(starts)
        dstarts = readonly(np.array([o - lo for o in coffs], np.int64))
        last, used = padding_bytes(dstarts, counts, bits, hi - lo)
        hstarts = readonly(offsets(hcounts if heads else [0] * count))
        sizes = readonly(np.array(sizes, np.int64))
        shape = self.run_shape(hstarts, sizes, np.dtype(dtype))
        if shape is None:
            return None
        limit = self.code_limit()
        if limit is not None and not (count and limit[2] < (((1 << bits) - 1) & limit[0]) >> limit[1]):
            limit = None  # (no code of this width can exceed it)
        return RunPlan(
            bits, lo, hi, readonly(starts), hstarts, sizes, np.dtype(dtype),
            readonly(np.array([o - lo for o in hoffs], np.int64)), readonly(np.array(hwidths, np.int64)), dstarts, readonly(last), readonly(used),
            shape, limit,
        )

    def read_planned(self, data, plan: RunPlan, in_pass: bool = False):
        """The run of ``plan`` (:meth:`run_plan`) read from the raw payload ``data`` (host
        bytes) and checked as :meth:`read` checks each tensor (CorruptFrameError): its heads,
        padding bits and code fields, read and tested by one ``quantrun.run_read`` call, the
        errors raised in a tensor's reader's order.  ``in_pass``: the decode checks the
        payload in the pass that writes (a payload check given to :meth:`write_segments`),
        which tests the code fields too (:attr:`Dequant.limit`), so they are not read here."""
        kern = module("quantrun")
        if data.size < plan.hi:
            return None
        data = data[plan.lo : plan.hi]
        head = np.empty(int(plan.hstarts[-1]))
        limit = _NO_LIMIT if plan.limit is None or in_pass else plan.limit
        flags = kern.run_read(readonly(data), plan.hoffs, plan.hwidths, plan.hstarts, head, plan.last, plan.used, plan.dstarts, plan.bits, plan.starts, *limit)
        if flags & kern.NONFINITE:  # (int16 numbers always are)
            raise CorruptFrameError("scalars section: a non-finite value")
        factors = self.run_factors(head, plan)
        if factors is None:
            return None
        if flags & kern.PADDING:  # as read_codes checks one
            raise CorruptFrameError("values section: padding bits past the last item are set")
        if flags & kern.FIELD:
            raise CorruptFrameError(RUN_FIELD.format(limit[2]))
        bits, starts = plan.bits, plan.starts
        lut, blocks, scale, sstarts, offset, lut_top = factors
        later = plan.limit if in_pass else None
        return Dequant(data, bits, int(starts[-1]), lut, 0, scale, offset, plan.dtype, lut_top=lut_top, starts=starts, dstarts=plan.dstarts, blocks=blocks, sstarts=sstarts, limit=later)

    def run_bits(self) -> int | None:
        """The width of the codes section of a run's tensors; None (the default): this
        quantizer codes no runs (:meth:`quantize_run` is not implemented)."""
        return None
