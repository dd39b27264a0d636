"""The base of the transform stages (``codec/stages/transform/``)."""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from codec.stage.base import Bound, Stage
from codec.device import empty, to_device
from codec.dtypes import on_device
from codec.kernels import backend
from codec.ops import round_to, store, WIDE, wide_dtype

class Transform(Stage, kind_base=True):
    """Base of the transform stages (``fft``, ``powersgd``): the array is mapped into another
    domain, the transform keeps what it sends, and the value stage codes the kept
    coefficients.  Required hooks: :meth:`forward`, :meth:`read`, :meth:`inverse`."""

    kind = "transform"
    lossless = False
    #: the value stage a spec without one gets: a registered name, or a Value class of its own
    default_value: ClassVar[str | type] = "none"
    #: the stage codes a many-tensor frame's runs at once (:meth:`forward_segments`,
    #: :meth:`read_segments`), so error feedback's runs take their step together
    segmented: ClassVar[bool] = False
    #: every tensor is either passed through (its values as they are) or a matrix
    #: ``matrix(shape) -> (n, m, r)`` whose frame holds ``P`` (``n x r``) then ``Q`` (``m x
    #: r``), decoded as ``lowrank.expand``'s ``P Q^T`` (PowerSGD): a many-tensor frame's header
    #: is then its layout's, and :mod:`codec.replay` replays its decoding with one
    #: ``expand_segments`` call
    lowrank: ClassVar[bool] = False

    @abc.abstractmethod
    def forward(self, flat, ctx, sections) -> np.ndarray:
        """The coefficients to code (1-D, float32 or float64: the value stage sees
        ``ctx.domain(values.size, values.dtype)``), appending the transform's own sections
        (e.g. the positions of the kept coefficients) first."""

    def forward_segments(self, flat, starts, ctxs):
        """:meth:`forward` for many small tensors at once (a many-tensor frame's run, as
        :meth:`Select.select_segments`): ``flat`` holds them concatenated (float32 or
        float64), tensor ``i`` is ``flat[starts[i]:starts[i + 1]]`` with context ``ctxs[i]``.
        Returns ``(vstarts, values, index)``: tensor i's coefficients to code are
        ``values[vstarts[i]:vstarts[i+1]]`` and ``index`` (a :class:`codec.frame.SectionRun`)
        holds its transform section, exactly as :meth:`forward` gives them for that tensor
        alone (a transform with one section of its own); or None (the default, and whenever
        a tensor needs :meth:`forward`'s own handling, its error) to run each alone."""
        return None

    def passes(self, shape) -> bool:
        """Whether a tensor of ``shape`` passes through uncoded: :meth:`forward` returns it
        as it is and writes no section, :meth:`read` reads none and :meth:`inverse` stores the
        values (PowerSGD's vectors and small matrices).  A many-tensor call then codes a run
        of such tensors as an elementwise value stage codes one (:func:`codec.runs.passing_runs`).
        False by default."""
        return False

    def read_segments(self, data, sections, sizes, dtype):
        """:meth:`read` of a run's tensors at once (a :attr:`segmented` stage's inverse of
        :meth:`forward_segments`): ``data`` the raw payload (uint8), ``sections[t]`` tensor
        t's transform section (its info, an offset into ``data``), ``sizes[t]`` its element
        count, ``dtype`` the frame's.  Returns ``(payload, counts)``: what :meth:`inverse`
        writes the run's concatenation from, and per tensor the number of values its value
        sections hold; every section checked as :meth:`read` checks it (CorruptFrameError)."""
        raise NotImplementedError(f"{self.name} does not read runs (segmented is False)")

    @abc.abstractmethod
    def read(self, reader, ctx):
        """Check and read the transform's sections, allocating nothing of the dense size;
        returns ``(payload, vctx)``, ``vctx`` being the value stage's context (count, dtype)."""

    @abc.abstractmethod
    def bound(self, ctx) -> Bound:
        """The most the transform's own sections take for an array of ``ctx.shape`` and
        ``ctx.dtype`` at ``ctx.step``, and (``values``) the value stage's context at its
        largest: the most coefficients :meth:`forward` hands on, and their dtype."""

    @abc.abstractmethod
    def inverse(self, payload, values, out, mode) -> None:
        """Write the dense array for ``values`` (the decoded coefficients, float32/float64)
        into flat ``out`` through :meth:`emit` (``mode`` SET, ADD or SUB; any float dtype,
        rounded once)."""

    def inverse_segments(self, value, payloads, outs, mode) -> bool:
        """:meth:`inverse` of many tensors at once (a many-tensor decode into arrays given):
        ``payloads[t]`` tensor t's ``(payload, vctx, value payload)`` as decoding reads it
        (:meth:`read`, then ``value``'s :meth:`~codec.stage.Value.read`), ``outs[t]`` its flat
        host array.  Returns False (the default), having written nothing, when the stage
        cannot: each tensor is then written on its own.  PowerSGD forms every matrix's
        ``P Q^T`` in one kernel call."""
        return False

    @staticmethod
    def domain_dtype(dtype) -> np.dtype:
        """The coefficients' dtype for an array of ``dtype``: float64 for float64, else float32
        (16-bit input is widened exactly)."""
        return wide_dtype(dtype)

    @staticmethod
    def emit(y, out, mode, dtype) -> None:
        """Write the dense piece ``y`` (the domain's float32/float64) into flat ``out`` per
        ``mode``.  A 16-bit frame's values are ``y`` rounded to its ``dtype`` first, so
        ``decode_add`` adds exactly what ``decode`` returns (and rounds once more, into ``out``)."""
        if dtype not in WIDE and on_device(out):  # rounded to the 16-bit codes on the device, then stored or added from them

            kern = backend("convert", out)
            y = y if on_device(y) else to_device(np.ascontiguousarray(y))
            codes = empty(y.size, np.uint16)
            bf16 = np.dtype(dtype) != np.float16
            if y.size:
                kern.narrow_codes(y, codes, bf16, -1)
                kern.half_decode(codes, out, mode, bf16)
            return
        store(y if dtype in WIDE else round_to(y, dtype), out, mode)
