"""bfloat16 coding sixteen values at a time (Numba CPU): the integer code of ``convert`` written
as 16-lane vector operations.

``convert``'s bf16 encoder rounds each float32 to its top 16 bits in integer arithmetic with a
branch for NaN, and LLVM does not vectorise that loop well: 35,434 values in cache took 20-24
us against 6.2 us with 8 lanes, and 16 lanes (one AVX-512 register, or two AVX2 ones; the
count of special values then added once per 16) took 4.9 -> 3.4 us here (issue 33, twentieth
stop).  These intrinsics emit the same arithmetic on ``<16 x i32>`` vectors (the
error-feedback step's on ``<8 x i32>``: :data:`FEEDBACK_LANES`)
(add ``0x7FFF`` plus the lowest kept bit, shift; a NaN keeps its top bits with the quiet bit
set, selected per lane), which every target's vector unit runs (SSE2 and up on x86-64, NEON):
no CPU feature to check, and the same bits as the scalar code for every input, NaN included.
Each returns how many of its values were a NaN or an infinity (the encoders' count).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from codec.kernels.cpu._f16c import f32_array, lanes_at, u16_array

#: values per vector operation of the encoder (``narrow16``) and of the error-feedback step
#: (``feedback8``, which reads two arrays and writes two: with 16 lanes its 25M-value step
#: ran 13.7 -> 15.8 ms on 2 threads, 26.1 -> 30.0 on one)
NARROW_LANES = 16
FEEDBACK_LANES = 8


def _vectors(lanes: int) -> tuple:
    """The ``<lanes x i32>``, ``<lanes x i16>`` and ``<lanes x float>`` types."""
    return ir.VectorType(ir.IntType(32), lanes), ir.VectorType(ir.IntType(16), lanes), ir.VectorType(ir.FloatType(), lanes)


def _const(v, lanes: int):
    return ir.Constant(ir.VectorType(ir.IntType(32), lanes), [v] * lanes)


def _codes(builder, u, lanes: int):
    """The bf16 codes of the float32 bits ``u`` (a ``<lanes x i32>``), nearest even, a NaN quiet
    with its top bits, and the count of lanes that are a NaN or an infinity (an i64)."""
    c = lambda v: _const(v, lanes)  # noqa: E731
    a = builder.and_(u, c(0x7FFFFFFF))
    rounded = builder.lshr(builder.add(builder.add(u, c(0x7FFF)), builder.and_(builder.lshr(u, c(16)), c(1))), c(16))
    quiet = builder.or_(builder.lshr(u, c(16)), c(0x40))
    codes = builder.trunc(builder.select(builder.icmp_unsigned(">", a, c(0x7F800000)), quiet, rounded), _vectors(lanes)[1])
    special = builder.bitcast(builder.icmp_unsigned(">=", a, c(0x7F800000)), ir.IntType(lanes))
    count = builder.call(builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(lanes)]), [special])
    return codes, builder.zext(count, ir.IntType(64))


@intrinsic
def narrow16(typingctx, src, i, dst):
    """``dst[i:i+16] = bf16 codes of float32 src[i:i+16]``; returns how many of the sixteen
    were a NaN or an infinity."""
    if not (f32_array(src) and u16_array(dst) and isinstance(i, types.Integer)):
        return None

    i32, i16, _ = _vectors(NARROW_LANES)

    def codegen(context, builder, sig, args):
        u = builder.load(lanes_at(context, builder, sig.args[0], args[0], args[1], i32), align=1)
        codes, count = _codes(builder, u, NARROW_LANES)
        builder.store(codes, lanes_at(context, builder, sig.args[2], args[2], args[1], i16), align=1)
        return count

    return types.int64(src, i, dst), codegen


@intrinsic
def feedback8(typingctx, xs, rs, accs, cs, i):
    """Error feedback's fused bf16 step for items ``i:i+8`` (float32 arrays, uint16 codes):
    ``a = xs + rs; cs = bf16 codes of a; accs = a - value(cs)``; returns how many ``a`` were a
    NaN or an infinity."""
    if not (f32_array(xs) and f32_array(rs) and f32_array(accs) and u16_array(cs) and isinstance(i, types.Integer)):
        return None

    i32, i16, f32 = _vectors(FEEDBACK_LANES)

    def codegen(context, builder, sig, args):
        x = builder.load(lanes_at(context, builder, sig.args[0], args[0], args[4], f32), align=1)
        r = builder.load(lanes_at(context, builder, sig.args[1], args[1], args[4], f32), align=1)
        a = builder.fadd(x, r)
        codes, count = _codes(builder, builder.bitcast(a, i32), FEEDBACK_LANES)
        builder.store(codes, lanes_at(context, builder, sig.args[3], args[3], args[4], i16), align=1)
        value = builder.bitcast(builder.shl(builder.zext(codes, i32), _const(16, FEEDBACK_LANES)), f32)
        builder.store(builder.fsub(a, value), lanes_at(context, builder, sig.args[2], args[2], args[4], f32), align=1)
        return count

    return types.int64(xs, rs, accs, cs, i), codegen
