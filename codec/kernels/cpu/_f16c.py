"""fp16 conversion with the CPU's F16C instructions (Numba CPU): eight values per instruction.

The fp16 kernels of ``convert`` compute each code in integer arithmetic, which is exact and
vectorises, but costs about 1.3 ns a value on one core (25M values: compute-bound, not
memory-bound, and slower still beside other work).  x86-64 CPUs since 2012 convert eight
values in one instruction (``vcvtps2ph``, ``vcvtph2ps``): what torch's cast uses.  The
intrinsics here emit LLVM's ``fptrunc``/``fpext`` of 8-lane vectors (16 for the encoder's
:func:`narrow16`: two instructions, or one where the CPU has AVX-512), which LLVM selects as
those instructions where the target has F16C.

The instructions round to nearest even, as the integer code does, and convert every finite
value and infinity exactly as it does; they differ only on NaN (a signalling NaN comes back
quiet, and a float32 NaN's payload is cut differently).  So each intrinsic looks at its
values first, and when one of them is special (a NaN or an infinity in; a code whose exponent
is all ones) it writes nothing and returns True: the kernel then codes those values with its
integer code, and the bytes never depend on which path ran.  The test rides in the same pass
(a vector compare), so a block pays no second read.

Where the CPU Numba compiles for has no F16C (:data:`HARDWARE` False: not x86-64, or a
portable cache for a generic CPU) the kernels never call these (``convert`` picks its loop at
compile time), and LLVM is never asked for the instructions.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from codec.kernels.cpu._common import target_has
from codec.kernels.cpu._stream import LANES, lanes_at, store_nt
from codec.modes import ADD, SET

#: whether the CPU Numba compiles for converts fp16 in hardware (x86-64 with F16C)
HARDWARE = target_has("f16c")
#: values per call of the encoder's intrinsic (:func:`narrow16`: two ``vcvtps2ph`` of eight,
#: or one of sixteen with AVX-512; 35,424 values in cache 3.6 -> 2.4 us against eight, issue
#: 33's twentieth stop); the decoder's and the error-feedback step's take :data:`LANES` (16
#: lanes did not speed up the decoder, and made bf16's feedback step slower)
NARROW_LANES = 16





def _any(builder, mask, count: int = LANES):
    """Whether any lane of the ``<count x i1>`` ``mask`` is set."""
    return builder.icmp_unsigned("!=", builder.bitcast(mask, ir.IntType(count)), ir.Constant(ir.IntType(count), 0))


def nonfinite(builder, v, count: int = LANES):
    """Per lane of the ``count``-lane float32 vector ``v``: is it a NaN or an infinity (exponent all ones)."""
    lanes = ir.VectorType(ir.IntType(32), count)
    exp = ir.Constant(lanes, [0x7F800000] * count)
    return builder.icmp_unsigned("==", builder.and_(builder.bitcast(v, lanes), exp), exp)


def f32_array(t) -> bool:
    return isinstance(t, types.Array) and t.dtype == types.float32


def u16_array(t) -> bool:
    return isinstance(t, types.Array) and t.dtype == types.uint16


@intrinsic
def narrow16(typingctx, src, i, dst):
    """``dst[i:i+16] = fp16 codes of float32 src[i:i+16]`` (nearest, ties to even), unless one
    of the sixteen is a NaN or an infinity: then nothing is written and the result is True."""
    if not (f32_array(src) and u16_array(dst) and isinstance(i, types.Integer)):
        return None
    n = NARROW_LANES

    def codegen(context, builder, sig, args):
        v = builder.load(lanes_at(context, builder, sig.args[0], args[0], args[1], ir.VectorType(ir.FloatType(), n)), align=1)
        special = _any(builder, nonfinite(builder, v, n), n)
        with builder.if_then(builder.not_(special), likely=True):
            codes = ir.VectorType(ir.IntType(16), n)
            h = builder.fptrunc(v, ir.VectorType(ir.HalfType(), n))
            builder.store(builder.bitcast(h, codes), lanes_at(context, builder, sig.args[2], args[2], args[1], codes), align=1)
        return special

    return types.boolean(src, i, dst), codegen


def _widen(context, builder, sig, args, mode):
    """The code of :func:`widen8` (``mode`` SET, ADD or SUB) and :func:`widen8_stream`
    (``mode`` None: SET with a streaming store): the eight codes' values written, unless one
    of them is special; returns that test."""
    lanes = ir.VectorType(ir.IntType(16), LANES)
    raw = builder.load(lanes_at(context, builder, sig.args[0], args[0], args[1], lanes), align=1)
    exp = ir.Constant(lanes, [0x7C00] * LANES)
    special = _any(builder, builder.icmp_unsigned("==", builder.and_(raw, exp), exp))
    with builder.if_then(builder.not_(special), likely=True):
        vals = ir.VectorType(context.get_value_type(sig.args[2].dtype), LANES)
        v = builder.fpext(builder.bitcast(raw, ir.VectorType(ir.HalfType(), LANES)), vals)
        where = lanes_at(context, builder, sig.args[2], args[2], args[1], vals)
        if mode is None:
            store_nt(builder, v, where)
        else:
            if mode != SET:
                old = builder.load(where, align=1)
                v = builder.fadd(old, v) if mode == ADD else builder.fsub(old, v)
            builder.store(v, where, align=1)
    return special


def _widen_types(src, i, dst) -> bool:
    return u16_array(src) and isinstance(dst, types.Array) and dst.dtype in (types.float32, types.float64) and isinstance(i, types.Integer)


@intrinsic
def widen8_stream(typingctx, src, i, dst):
    """``dst[i:i+8] = value(fp16 codes src[i:i+8])`` as :func:`widen8` in SET mode, with
    streaming stores (``&dst[i]`` aligned to ``_stream.ALIGN``: :mod:`codec.kernels.cpu._stream`)."""
    if not _widen_types(src, i, dst):
        return None
    return types.boolean(src, i, dst), lambda context, builder, sig, args: _widen(context, builder, sig, args, None)


@intrinsic
def widen8(typingctx, src, i, dst, mode):
    """``dst[i:i+8] (=|+=|-=) value(fp16 codes src[i:i+8])`` into float32/float64 ``dst``
    (``mode`` a literal SET, ADD or SUB), unless one of the codes is an infinity or a NaN:
    then nothing is written and the result is True."""
    if not (_widen_types(src, i, dst) and isinstance(mode, types.IntegerLiteral)):
        return None
    return types.boolean(src, i, dst, mode), lambda context, builder, sig, args: _widen(context, builder, sig, args, sig.args[3].literal_value)


@intrinsic
def feedback8(typingctx, xs, rs, accs, cs, i):
    """Error feedback's fused step for items ``i:i+8`` (float32 arrays, uint16 codes):
    ``a = xs + rs; cs = fp16 codes of a; accs = a - value(cs)``, unless one ``a`` is a NaN or
    an infinity: then nothing is written and the result is True."""
    if not (f32_array(xs) and f32_array(rs) and f32_array(accs) and u16_array(cs) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        vals = ir.VectorType(ir.FloatType(), LANES)
        x = builder.load(lanes_at(context, builder, sig.args[0], args[0], args[4], vals), align=1)
        r = builder.load(lanes_at(context, builder, sig.args[1], args[1], args[4], vals), align=1)
        a = builder.fadd(x, r)
        special = _any(builder, nonfinite(builder, a))
        with builder.if_then(builder.not_(special), likely=True):
            codes = ir.VectorType(ir.IntType(16), LANES)
            h = builder.fptrunc(a, ir.VectorType(ir.HalfType(), LANES))
            builder.store(builder.bitcast(h, codes), lanes_at(context, builder, sig.args[3], args[3], args[4], codes), align=1)
            builder.store(builder.fsub(a, builder.fpext(h, vals)), lanes_at(context, builder, sig.args[2], args[2], args[4], vals), align=1)
        return special

    return types.boolean(xs, rs, accs, cs, i), codegen
