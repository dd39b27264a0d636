"""The base of the value stages (``codec/stages/value/``)."""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from codec.context import Context
from codec.stage.base import Bound, Stage
from codec.device import Memory
from codec.frame import raw_length
from codec.manyframe import Entry
from codec.modes import SET
from codec.ops import offsets, wide_dtype

class Value(Stage, kind_base=True):
    """Base of the value stages: how the kept values are coded.  Required hooks:
    :meth:`encode`, :meth:`read`, :meth:`write`; optional: :meth:`encode_feedback`."""

    kind = "value"
    #: True when each element's code depends only on that element, its dtype and the stage's
    #: parameters (never on the key, the step, other elements or state), in one ``values``
    #: section of ``n`` items whose width is a whole number of bytes: then the codes of
    #: consecutive same-dtype tensors are the codes of their concatenation, and a many-tensor
    #: frame codes a run of small tensors with one kernel call (``none``, ``fp16``, ``bf16``)
    elementwise: ClassVar[bool] = False
    #: True when :meth:`write` takes ``check=`` (a :class:`codec.payloadcheck.PayloadCheck`) and
    #: notes the CRC-32C of the payload bytes its kernel reads, so a decode verifies the
    #: frame in the same pass (``fp16``, ``bf16``, the quantizers); a stage without it is
    #: checked before decoding, as the whole payload (its :meth:`write_segments` notes the
    #: check too)
    checks_payload: ClassVar[bool] = False
    #: True when the stage has ``encode_segments(arrays, ctx, sections)``: ``encode`` of the
    #: concatenation of ``arrays`` (flat host float32/float64 arrays of one dtype) without
    #: forming it, in one pass where they lie (``fp16``, ``bf16``).  Decoding's counterpart
    #: is :meth:`write_segments`.  Both run on the arrays' addresses: such a stage also has
    #: ``encode_at(out, addrs, starts, like, crc)`` and ``write_at(codes, addrs, starts,
    #: like, mode, crc)``, what a replayed step calls (:mod:`codec.replay`)
    segmented: ClassVar[bool] = False

    @abc.abstractmethod
    def encode(self, values, ctx, sections) -> None:
        """Append the sections coding ``values`` (1-D, the array's dtype or the domain's)."""

    @abc.abstractmethod
    def read(self, reader, ctx, count):
        """Check and read the sections of ``count`` values; returns a compact payload and
        allocates nothing dense."""

    @abc.abstractmethod
    def write(self, payload, out, mode) -> None:
        """Write the decoded values into the float32/float64 buffer ``out`` (``mode`` SET, ADD
        or SUB)."""

    @abc.abstractmethod
    def bound(self, ctx) -> Bound:
        """The most the sections coding ``ctx.n`` values of ``ctx.dtype`` take at
        ``ctx.step``, whatever the values (the array itself, or what a select or transform
        stage hands on: its :attr:`Bound.values`)."""

    def most_values(self, bits):
        """The most values that sections of ``bits`` raw bits in all can code in this stage's
        format: a bound a reader checks a count it did not read against (``randomk`` draws
        its positions from a key, so only the values' bits bound their number) before
        allocating anything of that size.  It must hold for every frame the stage writes; the
        default assumes one bit per value at least.  ``bits`` may be an int64 array (one
        bound per tensor of a frame): the bound is arithmetic on it."""
        return bits

    def written(self, payload, count: int, ctx) -> np.ndarray:
        """``count`` decoded values of ``payload`` (what :meth:`read` gave) in a new array of
        the accumulator dtype of ``ctx.dtype`` (float32; float64 for float64): exact."""
        out = Memory(ctx.device).empty(count, wide_dtype(ctx.dtype))  # (decoding into a device array: there)
        self.write(payload, out, SET)
        return out

    def decoded(self, values, ctx):
        """What decoding this stage's coding of ``values`` gives, in the accumulator dtype of
        the array (float32; float64 for float64 arrays), computed from ``values`` without the
        frame and bit for bit what :meth:`read` then :meth:`write` (SET) give; or None (the
        default) when only decoding the frame knows.  Error feedback after a select stage
        subtracts it at the sent positions instead of decoding the frame it has just built."""
        return None

    def encode_run(self, flat, starts, ctxs):
        """Code a run of small same-dtype tensors of a many-tensor frame at once (a codec of
        this value stage alone): ``flat`` their concatenation, tensor ``t`` being
        ``flat[starts[t]:starts[t+1]]`` with context ``ctxs[t]``.  Returns ``(table, piece)``:
        per tensor its sections as :class:`codec.manyframe.Entry` (kind, width, count), and
        one :class:`codec.frame.Section` holding the run's payload, exactly the bytes that
        coding each tensor alone gives, in tensor order.  None (the default, or whenever a
        tensor needs its own encode, e.g. to raise its error) codes them one by one."""
        return None

    def encode_kept(self, values, kstarts, ctxs):
        """The kept values of a sparse many-tensor run coded at once (after a select stage's
        ``select_segments``): tensor t's are ``values[kstarts[t]:kstarts[t+1]]``, its context
        ``ctxs[t]``.  Returns ``(table, section, starts)``: per tensor its value sections as
        :class:`codec.manyframe.Entry`, and one :class:`codec.frame.Section` whose bytes
        ``starts[t]:starts[t+1]`` are exactly what :meth:`encode` writes for tensor t; or
        None to code each tensor's on its own.  The default codes an elementwise stage's
        values as one array (the codes of the concatenation are the tensors' codes), and
        another's as a run of them (:meth:`encode_run`, when the stage has one)."""
        if not self.elementwise:  # a quantizer's run of the kept values (its tensors' codes end to end)
            got = self.encode_run(values, kstarts, ctxs)
            if got is None:
                return None
            table, piece = got
            return table, piece, offsets([sum(raw_length(e.count, e.bits) for e in entries) for entries in table])
        secs: list = []
        self.encode(values, Context(values.shape, values.dtype, name="tensors"), secs)
        (sec,) = secs
        return [[Entry(sec.kind, sec.bits, k)] for k in (kstarts[1:] - kstarts[:-1]).tolist()], sec, kstarts * (sec.bits // 8)

    def read_kept(self, data, sections, counts, dtype):
        """The inverse of :meth:`encode_kept`: from the raw payload ``data`` (uint8) and per
        tensor its value sections (infos, offsets into ``data``) and kept count, a payload that
        :meth:`write` decodes into the run's kept values (``dtype`` the frame's), after
        :meth:`read`'s checks; None (the default) when a tensor's sections are not what the
        run expects.  An elementwise stage needs none: the many-tensor decoder reads its
        run's values sections as one section (``codec.many``); another reads them as a run
        of its own (:meth:`read_run`, when it has one)."""
        if self.elementwise:
            return None
        return self.read_run(data, sections, counts, dtype)

    def read_run(self, data, infos, sizes, dtype, in_pass: bool = False):
        """The inverse of :meth:`encode_run`: from the raw payload ``data`` (uint8) and, per
        tensor of the run, its section infos (offsets into ``data``) and size, a payload that
        :meth:`write` decodes into the run's concatenation (``dtype``), after the checks
        :meth:`read` makes (CorruptFrameError); None (the default, or sections that are not
        what the run expects) reads each tensor on its own.  ``in_pass``: as
        ``Context.checked_in_pass`` (the write is given the frame's payload check)."""
        return None

    def write_segments(self, payload, outs, mode, check=None) -> bool:
        """:meth:`write` of a run's payload (what reading the run gave: an :attr:`elementwise`
        stage's values section over the run, or :meth:`read_run`'s) straight into each
        tensor's own flat host array ``outs[t]`` (run order, each of its tensor's dtype,
        float32/float64), with no buffer of the run; ``check``: as :meth:`write`'s (only for a
        stage that :attr:`checks_payload`).  Returns False, having written nothing, when it
        cannot (the default): the run is then decoded into one buffer and copied out.  Every
        elementwise stage writes; a quantizer does where its one kernel can (codec.many
        decodes a whole model through it)."""
        return False

    def encode_feedback(self, x, slot, ctx, sections):
        """A fused error-feedback step for a codec of this value stage alone: append the
        sections coding ``x + slot.residual``, writing the new residual into a buffer from
        ``slot.take_spare()`` (in a section's ``fill`` or here), and return a function of no
        arguments that commits it (``slot.commit``), which ``ErrorFeedback`` calls once the
        whole frame is built; or return None (the default) to let ``ErrorFeedback`` add,
        encode and subtract."""
        return None
