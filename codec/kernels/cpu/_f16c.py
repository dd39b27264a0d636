"""fp16 conversion with the CPU's F16C instructions (Numba CPU): eight values per instruction.

The fp16 kernels of ``convert`` compute each code in integer arithmetic, which is exact and
vectorises, but costs about 1.3 ns a value on one core (25M values: compute-bound, not
memory-bound, and slower still beside other work).  x86-64 CPUs since 2012 convert eight
values in one instruction (``vcvtps2ph``, ``vcvtph2ps``): what torch's cast uses.  Here LLVM's
``fptrunc``/``fpext`` of an 8-lane vector, which it selects as those instructions where the
target has F16C (measured on 35,434 float32 values in cache: encode 45 -> 11 us, decode
23 -> 11 us, the finiteness check included).

The instructions round to nearest even, as the integer code does, and convert every finite
value and infinity exactly as it does; they differ only on NaN (a signalling NaN comes back
quiet, and a float32 NaN's payload is cut differently).  So a block goes through here only
when it is all finite: :func:`narrow` returns -1 for a block with a NaN or an infinity, and
:func:`widen` for a block with a code whose exponent is all ones; the caller then takes the
integer path for the whole block, and the bytes never depend on which path ran.

Where the CPU Numba compiles for has no F16C (:data:`HARDWARE` False: not x86-64, or a
portable cache for a generic CPU) both return -1 and nothing here is compiled in.  Only
float32 values take this path (float64 input is rounded to odd first, for a correctly
rounded result; float64 output is widened from float32 by the instructions, which is exact).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from codec.kernels.cpu._common import target_has
from codec.modes import ADD, SET, SUB

#: whether the CPU Numba compiles for converts fp16 in hardware (x86-64 with F16C)
HARDWARE = target_has("f16c")

_LANES = 8


def _at(context, builder, aryty, ary, i, vecty):
    """A pointer to ``_LANES`` items of the 1-D array ``ary`` from item ``i``, as ``vecty``."""
    a = context.make_array(aryty)(context, builder, ary)
    return builder.bitcast(builder.gep(a.data, [i]), vecty.as_pointer())


@intrinsic
def _narrow8(typingctx, src, i, dst):
    """``dst[i:i+8] = fp16 codes of float32 src[i:i+8]`` (round to nearest even)."""
    if not (isinstance(src, types.Array) and src.dtype == types.float32 and isinstance(dst, types.Array) and dst.dtype == types.uint16):
        return None

    def codegen(context, builder, sig, args):
        v = builder.load(_at(context, builder, sig.args[0], args[0], args[1], ir.VectorType(ir.FloatType(), _LANES)), align=1)
        h = builder.fptrunc(v, ir.VectorType(ir.HalfType(), _LANES))
        codes = ir.VectorType(ir.IntType(16), _LANES)
        builder.store(builder.bitcast(h, codes), _at(context, builder, sig.args[2], args[2], args[1], codes), align=1)
        return context.get_dummy_value()

    return types.none(src, types.intp, dst), codegen


@intrinsic
def _widen8(typingctx, src, i, dst, mode):
    """``dst[i:i+8] (=|+=|-=) value(fp16 codes src[i:i+8])`` into float32/float64 ``dst``;
    ``mode`` a literal SET, ADD or SUB."""
    if not (isinstance(src, types.Array) and src.dtype == types.uint16 and isinstance(dst, types.Array) and dst.dtype in (types.float32, types.float64)):
        return None
    if not isinstance(mode, types.IntegerLiteral):
        return None

    def codegen(context, builder, sig, args):
        codes = ir.VectorType(ir.IntType(16), _LANES)
        vals = ir.VectorType(context.get_value_type(sig.args[2].dtype), _LANES)
        h = builder.bitcast(builder.load(_at(context, builder, sig.args[0], args[0], args[1], codes), align=1), ir.VectorType(ir.HalfType(), _LANES))
        v = builder.fpext(h, vals)
        where = _at(context, builder, sig.args[2], args[2], args[1], vals)
        m = sig.args[3].literal_value
        if m != SET:
            old = builder.load(where, align=1)
            v = builder.fadd(old, v) if m == ADD else builder.fsub(old, v)
        builder.store(v, where, align=1)
        return context.get_dummy_value()

    return types.none(src, types.intp, dst, mode), codegen


@intrinsic
def _feedback8(typingctx, xs, rs, accs, cs, i):
    """``a = xs + rs; cs = fp16 codes of a; accs = a - value(cs)`` for items ``i:i+8``
    (float32 arrays, uint16 codes): error feedback's fused step."""
    f32 = types.float32
    if not (all(isinstance(t, types.Array) and t.dtype == f32 for t in (xs, rs, accs)) and isinstance(cs, types.Array) and cs.dtype == types.uint16):
        return None

    def codegen(context, builder, sig, args):
        vals = ir.VectorType(ir.FloatType(), _LANES)
        codes = ir.VectorType(ir.IntType(16), _LANES)
        half = ir.VectorType(ir.HalfType(), _LANES)
        x = builder.load(_at(context, builder, sig.args[0], args[0], args[4], vals), align=1)
        r = builder.load(_at(context, builder, sig.args[1], args[1], args[4], vals), align=1)
        a = builder.fadd(x, r)
        h = builder.fptrunc(a, half)
        builder.store(builder.bitcast(h, codes), _at(context, builder, sig.args[3], args[3], args[4], codes), align=1)
        builder.store(builder.fsub(a, builder.fpext(h, vals)), _at(context, builder, sig.args[2], args[2], args[4], vals), align=1)
        return context.get_dummy_value()

    return types.none(xs, rs, accs, cs, types.intp), codegen


def narrow(xs, os):
    """fp16 codes of the float32 block ``xs`` into ``os`` (uint16, as long) by F16C, all but
    the last ``len % 8``: returns how many were written (a multiple of 8), or -1, writing
    nothing, when the block holds a NaN or an infinity, ``xs`` is not float32 or the CPU has
    no F16C (the caller codes the block, or the rest of it, itself)."""


@overload(narrow, jit_options={"cache": True})
def _narrow_impl(xs, os):
    if not (HARDWARE and isinstance(xs, types.Array) and xs.dtype == types.float32):
        return lambda xs, os: -1

    def impl(xs, os):
        n = xs.size
        finite = True
        for i in range(n):
            v = xs[i]
            finite &= v - v == 0
        if not finite:
            return -1
        m = n - n % _LANES
        for i in range(0, m, _LANES):
            _narrow8(xs, i, os)
        return m

    return impl


def feedback(xs, rs, accs, cs):
    """Error feedback's fp16 step of a float32 block by F16C, all but the last ``len % 8``:
    ``a = xs + rs``, ``cs`` its codes, ``accs = a - value(cs)``; returns how many were done
    (a multiple of 8), or -1, touching nothing, when some ``a`` is not finite, the arrays are
    not float32 or the CPU has no F16C."""


@overload(feedback, jit_options={"cache": True})
def _feedback_impl(xs, rs, accs, cs):
    if not (HARDWARE and all(isinstance(t, types.Array) and t.dtype == types.float32 for t in (xs, rs, accs))):
        return lambda xs, rs, accs, cs: -1

    def impl(xs, rs, accs, cs):
        n = xs.size
        finite = True
        for i in range(n):
            a = xs[i] + rs[i]
            finite &= a - a == 0
        if not finite:
            return -1
        m = n - n % _LANES
        for i in range(0, m, _LANES):
            _feedback8(xs, rs, accs, cs, i)
        return m

    return impl


def widen(cs, os, mode):
    """``os (=|+=|-=) value(cs)`` for the fp16 codes ``cs`` by F16C, all but the last
    ``len % 8``: returns how many were done (a multiple of 8), or -1, touching nothing, when a
    code is an infinity or a NaN (a signalling NaN would come back quiet) or the CPU has no
    F16C."""


@overload(widen, jit_options={"cache": True})
def _widen_impl(cs, os, mode):
    if not (HARDWARE and isinstance(os, types.Array) and os.dtype in (types.float32, types.float64)):
        return lambda cs, os, mode: -1

    def impl(cs, os, mode):
        n = cs.size
        special = np.uint16(0)
        for i in range(n):
            special |= np.uint16((cs[i] & np.uint16(0x7C00)) == np.uint16(0x7C00))
        if special:
            return -1
        m = n - n % _LANES
        if mode == SET:
            for i in range(0, m, _LANES):
                _widen8(cs, i, os, SET)
        elif mode == ADD:
            for i in range(0, m, _LANES):
                _widen8(cs, i, os, ADD)
        else:
            for i in range(0, m, _LANES):
                _widen8(cs, i, os, SUB)
        return m

    return impl

