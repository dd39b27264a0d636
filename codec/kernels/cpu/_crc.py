"""CRC-32C inside the kernels (Numba CPU): a kernel that writes a frame's codes checksums each
chunk of them while it is still in cache, instead of a second pass over the payload.

A frame's payload CRC-32C (docs/format.md) is otherwise one more read of every code byte after
the kernel wrote them, from memory: about 3 ms of a 25M-value fp16 error-feedback step that
takes 7.6 ms without it.  Here each chunk of codes is checksummed right after it is written,
with the CPU's CRC-32C instruction (SSE4.2 ``crc32``, 8 bytes at a time, three independent
streams per range so the instruction's 3-cycle latency is hidden: ~30 GB/s on one core, as
the ``crc32c`` package), and the chunks' values are joined with the CRC algebra of zlib's
``crc32_combine``: the result is the CRC-32C of the whole range, bit for bit, whatever the
chunking or the thread count.  Where the CPU multiplies without carries on 512-bit vectors
(:data:`FOLD`: VPCLMULQDQ with AVX-512) a range's whole 256-byte blocks are folded instead
(~60 GB/s on one core, 2.2-2.9x the streams: docs/benchmarks.md, "Payload checksum") and
the register steps take only the last < 256 bytes.

Where the CPU has no CRC-32C instruction (:data:`HARDWARE` False) the same functions compile
with a byte-table step (correct, but slower than the ``crc32c`` package), and the kernels
checksum nothing: they return -1, and the caller checksums their output in one pass as before
(``codec.ops.continued``).

Everything here works on raw bytes: ``lo``/``hi`` are byte offsets into an array's memory,
whatever its dtype (a uint16 code array is checksummed as its bytes, as the frame holds them).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from codec._jit import jit
from codec.kernels.cpu._common import target_has
from codec.checksum import POLY, zero_operators


#: whether the CPU Numba compiles for has the CRC-32C instruction this module uses (x86-64
#: with SSE4.2); else the byte-table step, and the kernels return -1 (no checksum formed)
HARDWARE = target_has("sse4.2")
#: whether it also multiplies without carries on 512-bit vectors (VPCLMULQDQ with AVX-512F:
#: Intel Ice Lake and later, AMD Zen 4 and later): :func:`crc_bytes` then folds a range's
#: whole 256-byte blocks (:func:`_folded`) before its register steps take the rest
FOLD = HARDWARE and target_has("vpclmulqdq") and target_has("avx512f")
#: bytes per folded block (four 512-bit accumulators): a range's whole blocks are folded (one
#: block, 16 ns here, against 54 for the register steps)
FOLD_BLOCK = 256
#: the shortest range the register steps cut into three streams: joining them costs two
#: :func:`shift` (~30 ns), what one stream's latency costs over ~1.5 KB
STREAMS_MIN = 2048


def _byte_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> np.uint32(1)) ^ np.uint32(POLY), t >> np.uint32(1)).astype(np.uint32)
    return t


_TABLE = _byte_table()
_ONES = np.uint32(0xFFFFFFFF)
_ZEROS = zero_operators()  # the crc32_combine operators of 2**k zero bytes (codec.checksum)


@intrinsic
def load_u64(typingctx, arr, off):
    """The 8 bytes at byte offset ``off`` of ``arr``'s memory as a little-endian uint64 (an
    unaligned load; the caller keeps ``off + 8`` within the array's bytes)."""
    if not isinstance(arr, types.Array) or not isinstance(off, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        off = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.gep(builder.bitcast(ary.data, ir.IntType(8).as_pointer()), [off])
        return builder.load(builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)

    return types.uint64(arr, off), codegen


@intrinsic
def load_u8(typingctx, arr, off):
    """The byte at byte offset ``off`` of ``arr``'s memory."""
    if not isinstance(arr, types.Array) or not isinstance(off, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        off = context.cast(builder, args[1], signature.args[1], types.intp)
        return builder.load(builder.gep(builder.bitcast(ary.data, ir.IntType(8).as_pointer()), [off]))

    return types.uint8(arr, off), codegen


def _sse42(name, width):
    """An intrinsic ``(crc: uint32, data) -> uint32`` calling LLVM's ``llvm.x86.sse42.<name>``."""

    @intrinsic
    def step(typingctx, crc, data):
        def codegen(context, builder, signature, args):
            wide = ir.IntType(64) if width == 64 else ir.IntType(32)
            fnty = ir.FunctionType(wide, [wide, ir.IntType(width)])
            fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.x86.sse42.{name}")
            reg = builder.zext(args[0], wide) if width == 64 else args[0]
            res = builder.call(fn, [reg, args[1]])
            return builder.trunc(res, ir.IntType(32)) if width == 64 else res

        return types.uint32(types.uint32, types.uint64 if width == 64 else types.uint8), codegen

    return step


_hw_u64 = _sse42("crc32.64.64", 64)
_hw_u8 = _sse42("crc32.32.8", 8)


@jit
def _sw_u8(c, b):
    """One byte into the (raw, reflected) CRC-32C register ``c``: the table step."""
    return (c >> np.uint32(8)) ^ _TABLE[(c ^ np.uint32(b)) & np.uint32(0xFF)]


@jit
def _sw_u64(c, w):
    """Eight bytes (little-endian ``w``) into the register ``c``, a byte at a time."""
    for k in range(8):
        c = _sw_u8(c, np.uint8((w >> np.uint64(8 * k)) & np.uint64(0xFF)))
    return c


# the register steps every function below compiles with: the instruction where there is one
step_u64 = _hw_u64 if HARDWARE else _sw_u64
step_u8 = _hw_u8 if HARDWARE else _sw_u8


@jit
def _times(mat, v):
    """GF(2) operator ``mat`` (32 columns) applied to the 32-bit vector ``v``, branch-free."""
    out = np.uint32(0)
    for i in range(32):
        out ^= mat[i] & (np.uint32(0) - ((v >> np.uint32(i)) & np.uint32(1)))
    return out


@jit
def shift(c, nbytes):
    """The CRC register ``c`` carried through ``nbytes`` zero bytes (zlib's ``crc32_combine``
    operator: ``crc(A + B) == shift(crc(A), len(B)) ^ crc(B)``, on raw registers and on
    finished CRC-32C values alike)."""
    c = np.uint32(c)
    n = np.uint64(nbytes)
    k = 0
    while n:
        if n & np.uint64(1):
            c = _times(_ZEROS[k], c)
        n >>= np.uint64(1)
        k += 1
    return c


@jit
def combine(crc1, crc2, len2):
    """The CRC-32C of ``A + B`` from ``crc1 = crc32c(A)``, ``crc2 = crc32c(B)``, ``len2 = len(B)``."""
    return shift(crc1, len2) ^ np.uint32(crc2)


@jit
def crc_bytes(arr, lo, hi, crc):
    """CRC-32C of bytes ``lo:hi`` of ``arr``'s memory, continued from ``crc`` (the CRC-32C of
    the bytes before them; 0 to start): ``crc32c.crc32c(arr_bytes[lo:hi], crc)``.  Where the
    CPU can (:data:`FOLD`) the range's whole 256-byte blocks are folded first
    (:func:`_folded`), then :func:`_streams` steps the register through the rest."""
    lo, c = bulk(arr, lo, hi, np.uint32(crc) ^ _ONES)
    return _streams(arr, lo, hi, c) ^ _ONES


@jit
def _streams(arr, lo, hi, c):
    """The raw register ``c`` stepped through bytes ``lo:hi`` of ``arr``'s memory: from
    :data:`STREAMS_MIN` bytes the range cut into three equal streams of whole words, stepped
    together (the register step's latency is 3 cycles, its throughput one a cycle) and joined
    with :func:`shift`; the rest (all of a shorter range) a word, then a byte, at a time."""
    n = hi - lo
    w = (n // 24) * 8 if n >= STREAMS_MIN else 0  # bytes per stream
    if w:
        c1 = np.uint32(0)
        c2 = np.uint32(0)
        for j in range(w // 8):
            at = lo + 8 * j
            c = step_u64(c, load_u64(arr, at))
            c1 = step_u64(c1, load_u64(arr, at + w))
            c2 = step_u64(c2, load_u64(arr, at + 2 * w))
        c = shift(c, w) ^ c1
        c = shift(c, w) ^ c2
    i = lo + 3 * w
    while i + 8 <= hi:
        c = step_u64(c, load_u64(arr, i))
        i += 8
    while i < hi:
        c = step_u8(c, load_u8(arr, i))
        i += 1
    return c


# ------------------------------------------------------------------ folding (VPCLMULQDQ)
# A range's bytes are a polynomial over GF(2); its CRC register is that polynomial times x**32
# mod P.  Folding keeps a 256-byte window congruent to everything read so far: each 128-bit
# lane (64-bit words L then H, the earlier first) moves D bits forward as
#     L x**(D+64) + H x**D  ==  x (L (x**(D+63) mod P) + H (x**(D-1) mod P))   (mod P),
# two carry-less products of a word by a 32-bit constant.  In the bit-reflected order of this
# CRC (a word's first bit is its highest power), the product of a 64-bit word and a constant
# stored reflected in 64 bits lands exactly in the next lane, the factor x included.  The
# sixteen lanes of the last window then fold onto its last lane, and the register of those
# 16 bytes, stepped from zero, is the range's (Intel, "Fast CRC Computation for Generic
# Polynomials Using PCLMULQDQ Instruction", 2009; the register's start is xored into the first
# word, which is what stepping from it does).


def _x_mod(exponents) -> dict:
    """``x**e mod P`` (P the Castagnoli polynomial; bit d: the coefficient of x**d) for each
    ``e`` of ``exponents``, in one pass of multiplications by x."""
    normal = int(f"{POLY:032b}"[::-1], 2)  # POLY is bit-reflected
    want, got, r = set(exponents), {}, 1
    for e in range(max(want) + 1):
        if e in want:
            got[e] = r
        r <<= 1
        if r >> 32:
            r ^= (1 << 32) | normal
    return got


def _fold_constants(distances) -> list:
    """Per distance D (bits), the pair of 64-bit constants a lane folds D bits forward with:
    ``x**(D+63) mod P`` for its first word and ``x**(D-1) mod P`` for its second, each
    bit-reflected in 64 bits (x**d at bit 63 - d); D == 0 (the last lane): zeros."""
    powers = _x_mod([e for d in distances if d for e in (d + 63, d - 1)])
    reflect = lambda r: sum(1 << (63 - d) for d in range(32) if r >> d & 1)  # noqa: E731
    return [(reflect(powers[d + 63]), reflect(powers[d - 1])) if d else (0, 0) for d in distances]


#: the 512-bit fold's constants: every lane 2048 bits forward (one window), and lane k of
#: accumulator a (byte 64 a + 16 k of the last window) onto the window's last lane
_FOLD_WINDOW = _fold_constants([8 * FOLD_BLOCK] * 4)
_FOLD_LAST = [_fold_constants([128 * (15 - 4 * a - k) for k in range(4)]) for a in range(4)]


@intrinsic
def _fold(typingctx, arr, lo, nblocks, reg):
    """The 128 bits (two little-endian words) congruent to bytes ``lo : lo + 256 nblocks`` of
    ``arr``'s memory (``nblocks >= 1``) with the raw register ``reg`` as their start: four
    512-bit accumulators folded one window at a time with VPCLMULQDQ, then reduced onto one
    lane.  Compiled only where :data:`FOLD` holds (LLVM cannot select it elsewhere)."""
    if not isinstance(arr, types.Array) or not all(isinstance(t, types.Integer) for t in (lo, nblocks, reg)):
        return None

    def codegen(context, builder, signature, args):
        i8, i64 = ir.IntType(8), ir.IntType(64)
        v8 = ir.VectorType(i64, 8)
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        start = context.cast(builder, args[1], signature.args[1], types.intp)
        count = context.cast(builder, args[2], signature.args[2], types.intp)
        base = builder.gep(builder.bitcast(ary.data, i8.as_pointer()), [start])
        clmul = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8, v8, i8]), "llvm.x86.pclmulqdq.512")

        def load(off):
            return builder.load(builder.bitcast(builder.gep(base, [off]), v8.as_pointer()), align=1)

        def const(pairs):  # (as signed 64-bit values, which LLVM's text form takes)
            return ir.Constant(v8, [w - (1 << 64) if w >> 63 else w for pair in pairs for w in pair])

        def times(acc, k):  # each lane's two words by its two constants: the lane moved forward
            return builder.xor(builder.call(clmul, [acc, k, ir.Constant(i8, 0x00)]), builder.call(clmul, [acc, k, ir.Constant(i8, 0x11)]))

        accs = []
        for a in range(4):
            slot = cgutils.alloca_once(builder, v8)
            builder.store(load(ir.Constant(count.type, 64 * a)), slot)
            accs.append(slot)
        first = builder.load(accs[0])
        seed = builder.insert_element(ir.Constant(v8, None), builder.zext(context.cast(builder, args[3], signature.args[3], types.uint32), i64), ir.Constant(ir.IntType(32), 0))
        seed = builder.shuffle_vector(seed, ir.Constant(v8, None), ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] + [8] * 7))
        builder.store(builder.xor(first, seed), accs[0])
        window = const(_FOLD_WINDOW)
        with cgutils.for_range(builder, builder.sub(count, ir.Constant(count.type, 1))) as loop:
            at = builder.mul(builder.add(loop.index, ir.Constant(count.type, 1)), ir.Constant(count.type, FOLD_BLOCK))
            for a in range(4):
                data = load(builder.add(at, ir.Constant(count.type, 64 * a)))
                builder.store(builder.xor(times(builder.load(accs[a]), window), data), accs[a])
        last = builder.load(accs[3])
        keep = ir.Constant(v8, [0] * 6 + [-1] * 2)  # the last lane stays where it is
        total = builder.and_(last, keep)
        for a in range(4):
            total = builder.xor(total, times(builder.load(accs[a]), const(_FOLD_LAST[a])))
        words = [builder.extract_element(total, ir.Constant(ir.IntType(32), k)) for k in range(8)]
        first_word = builder.xor(builder.xor(words[0], words[2]), builder.xor(words[4], words[6]))
        second_word = builder.xor(builder.xor(words[1], words[3]), builder.xor(words[5], words[7]))
        return context.make_tuple(builder, signature.return_type, [first_word, second_word])

    return types.UniTuple(types.uint64, 2)(arr, lo, nblocks, reg), codegen


@jit
def _folded(arr, lo, hi, c):
    """``(lo', c')``: the raw register ``c`` carried through the whole 256-byte blocks of bytes
    ``lo:hi`` of ``arr``'s memory (:func:`_fold`) and where they end (a range shorter than a
    block: ``(lo, c)``)."""
    if hi - lo < FOLD_BLOCK:
        return lo, c
    nblocks = (hi - lo) // FOLD_BLOCK
    first, second = _fold(arr, lo, nblocks, c)
    return lo + nblocks * FOLD_BLOCK, step_u64(step_u64(np.uint32(0), first), second)


@jit
def _unfolded(arr, lo, hi, c):
    """:func:`_folded` where the CPU cannot fold: nothing done."""
    return lo, c


#: what :func:`crc_bytes` carries a range's register through first
bulk = _folded if FOLD else _unfolded


@jit
def join(crcs, crc, lens):
    """The CRC-32C of consecutive pieces continued from ``crc``: ``crcs[k]`` is piece ``k``'s
    own CRC-32C and ``lens[k]`` its length in bytes."""
    c = np.uint32(crc)
    for k in range(crcs.size):
        c = combine(c, crcs[k], lens[k])
    return c


@jit
def crc_pieces(npieces, crc):
    """What a kernel keeps its pieces' checksums in: ``(sums, lens)``, each piece's CRC-32C
    and byte length, ``npieces`` of them when a checksum is asked (``crc >= 0``) and the CPU
    has the instruction, else empty (then it checksums nothing: :func:`crc_piece` is skipped
    on ``sums.size == 0``)."""
    m = npieces if crc >= 0 and HARDWARE else 0
    return np.zeros(m, np.uint32), np.zeros(m, np.int64)


@jit
def crc_piece(sums, lens, k, arr, lo, hi):
    """Piece ``k``: items ``lo:hi`` of the 1-D array ``arr``, just written (their bytes)."""
    sums[k] = crc_bytes(arr, lo * arr.itemsize, hi * arr.itemsize, 0)
    lens[k] = (hi - lo) * arr.itemsize


@jit
def joined(sums, lens, crc):
    """What a kernel that checksummed its output's pieces returns: the CRC-32C of those bytes
    continued from ``crc``; -1 when none was asked (``crc < 0``) or this CPU has no CRC-32C
    instruction (the caller then checksums the output itself)."""
    if crc < 0 or not HARDWARE:
        return np.int64(-1)
    return np.int64(join(sums, crc, lens))
