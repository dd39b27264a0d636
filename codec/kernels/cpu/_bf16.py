"""bfloat16 coding eight values at a time (Numba CPU): the integer code of ``convert`` written
as 8-lane vector operations.

``convert``'s bf16 encoder rounds each float32 to its top 16 bits in integer arithmetic with a
branch for NaN, and LLVM does not vectorise that loop well: 35,434 values in cache took 20-24
us against 6.2 us here.  These intrinsics emit the same arithmetic on ``<8 x i32>`` vectors
(add ``0x7FFF`` plus the lowest kept bit, shift; a NaN keeps its top bits with the quiet bit
set, selected per lane), which every target's vector unit runs (SSE2 and up on x86-64, NEON):
no CPU feature to check, and the same bits as the scalar code for every input, NaN included.
Each returns how many of its eight values were a NaN or an infinity (the encoders' count).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from codec.kernels.cpu._f16c import LANES, f32_array, lanes_at, u16_array

_I32 = ir.VectorType(ir.IntType(32), LANES)
_I16 = ir.VectorType(ir.IntType(16), LANES)
_F32 = ir.VectorType(ir.FloatType(), LANES)


def _const(v):
    return ir.Constant(_I32, [v] * LANES)


def _codes(builder, u):
    """The bf16 codes of the float32 bits ``u`` (an ``<8 x i32>``), nearest even, a NaN quiet
    with its top bits, and the count of lanes that are a NaN or an infinity (an i64)."""
    a = builder.and_(u, _const(0x7FFFFFFF))
    rounded = builder.lshr(builder.add(builder.add(u, _const(0x7FFF)), builder.and_(builder.lshr(u, _const(16)), _const(1))), _const(16))
    quiet = builder.or_(builder.lshr(u, _const(16)), _const(0x40))
    codes = builder.trunc(builder.select(builder.icmp_unsigned(">", a, _const(0x7F800000)), quiet, rounded), _I16)
    special = builder.bitcast(builder.icmp_unsigned(">=", a, _const(0x7F800000)), ir.IntType(LANES))
    count = builder.call(builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(LANES)]), [special])
    return codes, builder.zext(count, ir.IntType(64))


@intrinsic
def narrow8(typingctx, src, i, dst):
    """``dst[i:i+8] = bf16 codes of float32 src[i:i+8]``; returns how many of the eight were a
    NaN or an infinity."""
    if not (f32_array(src) and u16_array(dst) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        u = builder.load(lanes_at(context, builder, sig.args[0], args[0], args[1], _I32), align=1)
        codes, count = _codes(builder, u)
        builder.store(codes, lanes_at(context, builder, sig.args[2], args[2], args[1], _I16), align=1)
        return count

    return types.int64(src, i, dst), codegen


@intrinsic
def feedback8(typingctx, xs, rs, accs, cs, i):
    """Error feedback's fused bf16 step for items ``i:i+8`` (float32 arrays, uint16 codes):
    ``a = xs + rs; cs = bf16 codes of a; accs = a - value(cs)``; returns how many ``a`` were a
    NaN or an infinity."""
    if not (f32_array(xs) and f32_array(rs) and f32_array(accs) and u16_array(cs) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        x = builder.load(lanes_at(context, builder, sig.args[0], args[0], args[4], _F32), align=1)
        r = builder.load(lanes_at(context, builder, sig.args[1], args[1], args[4], _F32), align=1)
        a = builder.fadd(x, r)
        codes, count = _codes(builder, builder.bitcast(a, _I32))
        builder.store(codes, lanes_at(context, builder, sig.args[3], args[3], args[4], _I16), align=1)
        value = builder.bitcast(builder.shl(builder.zext(codes, _I32), _const(16)), _F32)
        builder.store(builder.fsub(a, value), lanes_at(context, builder, sig.args[2], args[2], args[4], _F32), align=1)
        return count

    return types.int64(xs, rs, accs, cs, i), codegen
