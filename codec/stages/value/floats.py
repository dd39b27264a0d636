"""Float value stages: ``none`` (exact), ``fp16`` and ``bf16`` (round to nearest even)."""

from __future__ import annotations

import numpy as np

from codec.dtypes import bfloat16, on_device
from codec.errors import NonFiniteError
from codec.frame import SectionKind, Section
from codec.params import NONFINITE
from codec.stage import Value, register

@register
class Exact(Value):
    """Values stored exactly in the array's own dtype (lossless; NaN and inf carried)."""

    name = "none"
    elementwise = True
    devices = frozenset({"cpu", "cuda"})

    def encode(self, values, ctx, sections):
        if on_device(values):  # the frame's one copy to the host, its CRC-32C formed on the device
            from codec.device import crc32c, to_host

            def fill(out, crc=None):
                to_host(values, out)
                return None if crc is None else crc32c(values, crc)

            sections.append(Section(SectionKind.VALUES, np.dtype(values.dtype).itemsize * 8, values.size, fill=fill, fill_crc=True))
            return
        sections.append(Section(SectionKind.VALUES, values.dtype.itemsize * 8, values.size, values))

    def read(self, reader, ctx, count):
        _, raw = reader.take(SectionKind.VALUES, bits=ctx.dtype.itemsize * 8, count=count)
        return raw.view(ctx.dtype)

    def write(self, values, out, mode):
        from codec.ops import store

        store(values, out, mode)

    def decoded(self, values, ctx):
        return self.written(values, values.size, ctx)


class _Half(Value):
    """A 16-bit IEEE-style float: the shared code of fp16 and bf16."""

    lossless = False
    elementwise = True
    devices = frozenset({"cpu", "cuda"})
    params = (NONFINITE,)
    dtype: np.dtype

    def encode(self, values, ctx, sections):
        from codec.ops import narrow

        if on_device(values):
            sections.append(Section(SectionKind.VALUES, 16, values.size, fill=lambda out, *crc: self._encode_device(values, ctx, out, *crc), fill_crc=True))
            return

        def fill(out, crc=None):  # the codes are written once, straight into the frame
            _, bad, crc = narrow(values, self.dtype, out.view(np.uint16), crc)
            if bad and self.nonfinite == "raise":
                self._raise_nonfinite(values, ctx)
            return crc

        sections.append(Section(SectionKind.VALUES, 16, values.size, fill=fill, fill_crc=True))

    def encode_feedback(self, x, slot, ctx, sections):
        """Fused error-feedback step for float32: one pass forms x + residual, writes its codes
        straight into the frame (checksummed as they are written) and the new residual into a
        spare buffer, committed once the whole frame is built."""
        if x.dtype != np.float32:
            return None
        from codec.kernels import backend
        from codec.ops import continued

        acc = slot.take_spare()
        if on_device(x):
            fill = lambda out, *crc: self._feedback_device(x, slot.residual.reshape(x.size), acc.reshape(x.size), ctx, out, *crc)  # noqa: E731
            sections.append(Section(SectionKind.VALUES, 16, x.size, fill=fill, fill_crc=True))
            return lambda: slot.commit(acc)

        def fill(out, crc=None):
            codes = out.view(np.uint16)
            bad, got = backend("convert", x).half_feedback(x, slot.residual.reshape(-1), acc.reshape(-1), codes, self.dtype != np.float16, -1 if crc is None else crc)
            if bad and self.nonfinite == "raise":
                with np.errstate(over="ignore", invalid="ignore"):  # x + residual in float32, as the kernel adds
                    acc_ = np.add(x, slot.residual.reshape(-1))
                self._raise_nonfinite(acc_, ctx)
            return continued(codes, crc, got)

        sections.append(Section(SectionKind.VALUES, 16, x.size, fill=fill, fill_crc=True))
        return lambda: slot.commit(acc)

    def _encode_device(self, values, ctx, out, crc=None):
        """The codes of device array ``values``, made on the device (``convert.narrow_codes``'s
        CUDA twin, which also forms their CRC-32C continued from ``crc``) and copied once into
        the frame's ``out``; returns the CRC (None when none was asked)."""
        from codec import device
        from codec.kernels import backend
        from codec.ops import continued

        codes = device.empty(values.size, np.uint16)
        bad, got = backend("convert", values).narrow_codes(values, codes, self.dtype != np.float16, -1 if crc is None else crc)
        if bad and self.nonfinite == "raise":
            self._raise_nonfinite(values.copy_to_host(), ctx)  # an error: the host copy names the position
        device.to_host(codes, out)
        return continued(out, crc, got)

    def _feedback_device(self, x, r, acc, ctx, out, crc=None):
        """The fused step on the device (``convert.half_feedback``'s CUDA twin): codes made
        there (with their CRC-32C) and copied once into the frame's ``out``, the new residual
        left in ``acc``; returns the CRC (None when none was asked)."""
        from codec import device
        from codec.kernels import backend
        from codec.ops import continued

        codes = device.empty(x.size, np.uint16)
        bad, got = backend("convert", x).half_feedback(x, r, acc, codes, self.dtype != np.float16, -1 if crc is None else crc)
        if bad and self.nonfinite == "raise":
            with np.errstate(over="ignore", invalid="ignore"):  # x + residual in float32, as the kernel adds
                self._raise_nonfinite(np.add(x.copy_to_host(), r.copy_to_host()), ctx)  # an error: host copies name it
        device.to_host(codes, out)
        return continued(out, crc, got)

    def _raise_nonfinite(self, values, ctx):
        from codec.ops import first_nonfinite

        raise NonFiniteError(ctx.name, ctx.where(first_nonfinite(values)), self.name, f"is lossy, pass {self.name}(nonfinite=keep) to send NaN/inf anyway")

    def read(self, reader, ctx, count):
        _, raw = reader.take(SectionKind.VALUES, bits=16, count=count)
        return raw.view(np.uint16)

    def decoded(self, values, ctx):
        from codec.ops import narrow

        codes = np.empty(values.size, np.uint16)
        narrow(values, self.dtype, codes)
        return self.written(codes, values.size, ctx)

    def write(self, codes, out, mode):
        from codec.device import to_device
        from codec.kernels import backend

        if on_device(out):  # the codes' one copy to the device
            codes = to_device(codes)
        backend("convert", out).half_decode(codes, out, mode, self.dtype != np.float16)


@register
class Fp16(_Half):
    """IEEE half precision (1+5+10 bits), round to nearest even; |x| >= 65520 becomes +-inf."""

    name = "fp16"
    dtype = np.dtype(np.float16)


@register
class Bf16(_Half):
    """bfloat16 (1+8+7 bits, float32's range), round to nearest even; overflow becomes +-inf."""

    name = "bf16"
    dtype = bfloat16
