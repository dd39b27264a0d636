"""Float value stages: ``none`` (exact), ``fp16`` and ``bf16`` (round to nearest even)."""

from __future__ import annotations

import numpy as np

from codec.dtypes import bfloat16, on_device, readonly
from codec.errors import NonFiniteError
from codec.frame import SectionKind, Section, raw_length
from codec.kernels import backend  # (imports no kernel module: each is imported on its first call)
from codec.params import NONFINITE
from codec.stage import Bound, Value, register
from codec import device as dev
from codec.device import host_copy, to_device
from codec.ops import addresses, continued, first_nonfinite, narrow, offsets, store

@register
class Exact(Value):
    """Values stored exactly in the array's own dtype (lossless; NaN and inf carried)."""

    name = "none"
    elementwise = True
    devices = frozenset({"cpu", "cuda"})

    def encode(self, values, ctx, sections):
        # device values are the section's bytes as they are: copied once to wherever the frame is written
        sections.append(Section(SectionKind.VALUES, np.dtype(values.dtype).itemsize * 8, values.size, values))

    def bound(self, ctx):
        """One values section of the values' own bytes, whatever they are: exact."""
        return Bound(1, raw_length(ctx.n, ctx.dtype.itemsize * 8))

    def read(self, reader, ctx, count):
        _, raw = reader.take(SectionKind.VALUES, bits=ctx.dtype.itemsize * 8, count=count, device=ctx.codes_on_device)
        return raw.view(ctx.dtype)

    def write(self, values, out, mode):
        store(values, out, mode)

    def write_segments(self, values, outs, mode, check=None):
        """:meth:`write` of a run's values (one per element) into each tensor's array, tensor
        by tensor (a copy each: nothing to convert in one pass)."""
        at = 0
        for out in outs:
            self.write(values[at : at + out.size], out, mode)
            at += out.size
        return True

    def decoded(self, values, ctx):
        return self.written(values, values.size, ctx)


class _Half(Value):
    """A 16-bit IEEE-style float: the shared code of fp16 and bf16."""

    lossless = False
    elementwise = True
    devices = frozenset({"cpu", "cuda"})
    params = (NONFINITE,)
    dtype: np.dtype
    #: the kernels' flag: bf16 codes (else fp16)
    bf16: bool

    def encode(self, values, ctx, sections):
        if on_device(values):  # codes and CRC made on the device, copied once into the frame
            def code(codes, crc):
                return backend("convert", values).narrow_codes(values, codes, self.bf16, crc)

            sections.append(self._kernel_section(values.size, ctx, code, values.copy_to_host, True))
            return

        def fill(out, crc=None):  # the codes are written once, straight into the frame
            _, bad, crc = narrow(values, self.dtype, out.view(np.uint16), crc)
            if bad and self.nonfinite == "raise":
                self._raise_nonfinite(values, ctx)
            return crc

        sections.append(Section(SectionKind.VALUES, 16, values.size, fill=fill, fill_crc=True))

    def encode_feedback(self, x, slot, ctx, sections):
        """Fused error-feedback step for float32: one pass forms x + residual, writes its codes
        straight into the frame (checksummed as they are written; on a device, made there and
        copied once) and the new residual into a spare buffer, committed once the whole frame
        is built."""
        if x.dtype != np.float32:
            return None

        acc = slot.take_spare()
        r, a = slot.read_residual(), acc.reshape(x.size)

        def code(codes, crc):
            return backend("convert", x).half_feedback(x, r, a, codes, self.bf16, crc)

        def named():  # x + residual in float32, as the kernel adds: its first NaN/inf is the error's
            with np.errstate(over="ignore", invalid="ignore"):
                return np.add(host_copy(x) if on_device(x) else x, host_copy(r) if on_device(r) else r)

        sections.append(self._kernel_section(x.size, ctx, code, named, on_device(x)))
        return lambda: slot.commit(acc)

    def _kernel_section(self, n, ctx, code, named, device: bool) -> Section:
        """The values section of ``n`` codes that ``code(codes, crc)`` writes, returning ``(non-finite
        count, crc)`` as the ``convert`` kernels do: straight into the frame, or with ``device``
        into a device buffer copied once into a host frame (the kernel forming the CRC-32C
        there), or straight into a device frame.  A
        non-finite count under ``nonfinite=raise`` is the error naming the first NaN/inf of
        ``named()`` (host values)."""

        def fill(out, crc=None):
            codes = dev.empty(n, np.uint16) if device and not on_device(out) else out.view(np.uint16)
            bad, got = code(codes, -1 if crc is None else crc)
            if bad and self.nonfinite == "raise":
                self._raise_nonfinite(named(), ctx)
            if device:
                dev.deliver(codes, out)
            return continued(out, crc, got)

        return Section(SectionKind.VALUES, 16, n, fill=fill, fill_crc=True, device=device)

    def _raise_nonfinite(self, values, ctx):
        raise NonFiniteError(ctx.name, ctx.where(first_nonfinite(values)), self.name, f"is lossy, pass {self.name}(nonfinite=keep) to send NaN/inf anyway")

    def bound(self, ctx):
        """One values section of 16-bit codes, whatever the values (NaN/inf kept or refused): exact."""
        return Bound(1, raw_length(ctx.n, 16))

    def read(self, reader, ctx, count):
        _, raw = reader.take(SectionKind.VALUES, bits=16, count=count, device=ctx.codes_on_device)
        return raw.view(np.uint16)

    def decoded(self, values, ctx):
        codes = np.empty(values.size, np.uint16)
        narrow(values, self.dtype, codes)
        return self.written(codes, values.size, ctx)

    checks_payload = True
    segmented = True

    def encode_segments(self, arrays, ctx, sections):
        """One section of the run's codes, written straight into the frame from every tensor
        where it lies (:meth:`encode_at`), checksummed as they are written."""
        addrs = addresses(arrays)
        starts = offsets([a.size for a in arrays])

        def fill(out, crc=None):
            ok, got = self.encode_at(out, addrs, starts, arrays[0], crc)
            if not ok:  # (many.encode names the tensor: codec.runs._exact_errors)
                self._raise_nonfinite(np.concatenate(arrays), ctx)
            return got

        sections.append(Section(SectionKind.VALUES, 16, ctx.n, fill=fill, fill_crc=True))
        return sections

    def encode_at(self, out, addrs, starts, like, crc=None) -> tuple:
        """The codes of a run of host arrays found by address (tensor ``t``: the
        ``starts[t+1] - starts[t]`` values of ``like``'s dtype at ``addrs[t]``, C-contiguous,
        kept alive by the caller; ``like`` flat float32/float64) into ``out``, the run's
        uint8 bytes in the frame, in one pass (``narrow_codes_segments``): returns ``(ok,
        crc)``, ``ok`` False when a value is NaN/inf under ``nonfinite=raise`` (the caller
        names it), ``crc`` the CRC-32C of ``out`` continued from ``crc`` (None: none).  What
        :meth:`encode_segments` and a replayed step (:mod:`codec.replay`) write."""
        bad, got = backend("convert", like).narrow_codes_segments(out.view(np.uint16), readonly(addrs), readonly(starts), like, self.bf16, -1 if crc is None else crc)
        return not (bad and self.nonfinite == "raise"), continued(out, crc, got)

    def write_at(self, codes, addrs, starts, like, mode, crc: bool = False) -> int:
        """The run's ``codes`` decoded into host arrays found by address (as :meth:`encode_at`
        finds them; written, ``mode`` SET, ADD or SUB) in one pass
        (``half_decode_segments``).  Returns the CRC-32C of the codes' bytes, formed as they
        are read, when ``crc`` asks for it; else, or when this CPU's kernel cannot form it, -1."""
        return backend("convert", like).half_decode_segments(readonly(codes), readonly(addrs), readonly(starts), like, mode, self.bf16, 0 if crc else -1)

    def write(self, codes, out, mode, check=None):
        if on_device(out):  # the codes' one copy to the device
            codes = to_device(codes)
        crc = backend("convert", out).half_decode(readonly(codes), out, mode, self.bf16, -1 if check is None else 0)
        if check is not None:
            check.note(codes, crc)

    def write_segments(self, codes, outs, mode, check=None):
        """The run's codes decoded into every tensor's array in one parallel pass
        (:meth:`write_at`), checksummed as they are read when ``check`` is given."""
        if outs:
            crc = self.write_at(codes, addresses(outs), offsets([o.size for o in outs]), outs[0], mode, check is not None)
            if check is not None:
                check.note(codes, crc)
        return True


@register
class Fp16(_Half):
    """IEEE half precision (1+5+10 bits), round to nearest even; |x| >= 65520 becomes +-inf."""

    name = "fp16"
    dtype = np.dtype(np.float16)
    bf16 = False


@register
class Bf16(_Half):
    """bfloat16 (1+8+7 bits, float32's range), round to nearest even; overflow becomes +-inf."""

    name = "bf16"
    dtype = bfloat16
    bf16 = True
