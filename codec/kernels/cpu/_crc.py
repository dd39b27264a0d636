"""CRC-32C inside the kernels (Numba CPU): a kernel that writes a frame's codes checksums each
chunk of them while it is still in cache, instead of a second pass over the payload.

A frame's payload CRC-32C (docs/format.md) is otherwise one more read of every code byte after
the kernel wrote them, from memory: about 3 ms of a 25M-value fp16 error-feedback step that
takes 7.6 ms without it.  Here each chunk of codes is checksummed right after it is written,
with the CPU's CRC-32C instruction (SSE4.2 ``crc32``, 8 bytes at a time, three independent
streams per range so the instruction's 3-cycle latency is hidden: ~30 GB/s on one core, as
the ``crc32c`` package), and the chunks' values are joined with the CRC algebra of zlib's
``crc32_combine``: the result is the CRC-32C of the whole range, bit for bit, whatever the
chunking or the thread count.

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
    the bytes before them; 0 to start): ``crc32c.crc32c(arr_bytes[lo:hi], crc)``.

    The range is cut into three equal streams of whole words, stepped together (the register
    step's latency is 3 cycles, its throughput one a cycle) and joined with :func:`shift`;
    the last < 24 bytes follow a word, then a byte, at a time."""
    c = np.uint32(crc) ^ _ONES
    n = hi - lo
    w = (n // 24) * 8  # bytes per stream
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
    return c ^ _ONES


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
