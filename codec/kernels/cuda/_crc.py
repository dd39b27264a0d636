"""CRC-32C of device memory (the CUDA side of ``codec/kernels/cpu/_crc.py``): a frame made or
read on the device is checksummed there, at memory speed, so none of its payload crosses
to the host.  The result is bit for bit ``crc32c.crc32c(bytes, crc)``.

The bulk runs in :data:`REGION`-byte regions, a CUDA block each (``_regions``), with every
read coalesced: thread ``t`` of a block of ``B`` takes the block's 8-byte words ``t, t + B,
t + 2B, ...``, so a warp reads 256 consecutive bytes at a time.  CRC-32C is linear over
GF(2), so the thread's words are checksummed as the region with every other thread's words
zeroed: per word, the register is carried through the ``8B - 8`` zero bytes between two of
its words (one 32x32 GF(2) operator, applied as four 256-entry byte tables) and then takes
the word (slicing-by-8: eight tables).  Twelve shared-memory lookups per 8 bytes, no
byte-serial loop.  Each thread then carries its register to the region's end (the operator
of ``8(B - 1 - t)`` zero bytes), the block xors its threads' registers together, and the
region's own CRC-32C is that raw value and a constant.  The regions' values are joined as
before: ``GROUP`` at a time on the device (``_fold``, the zero operator of a region), then
the groups and the unaligned head and short tail (fewer than 8 and than ``REGION`` bytes:
``_chunk_crcs``, a :data:`CHUNK`-byte chunk per thread) on the host with ``_crc.join``.

The algebra is the CPU file's own (``_times`` is compiled as a device function from its
source; the operators are ``codec.checksum.zero_operators``'s, as zlib's ``crc32_combine``
builds them).
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import device_functions, jit, numba_cuda
from codec.checksum import zero_operators
from codec.kernels.cpu import _crc as _cpu
from codec.kernels.cuda import _common
from codec.kernels.cuda._common import per_context

cuda = numba_cuda()

#: bytes per chunk (a power of two: its zero operator is ``zero_operators()[CHUNK_BITS]``)
CHUNK_BITS = 10
CHUNK = 1 << CHUNK_BITS
#: whole chunks joined per thread in the second step (kernel arguments, not compiled-in
#: constants: the sizes are read when a call is made)
GROUP = 64

_times = device_functions(_cpu, ["_times"])["_times"]


@jit
def _chunk_crcs(data, table, chunk, crcs):
    t = cuda.shared.array(256, np.uint32)
    for k in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
        t[k] = table[k]
    cuda.syncthreads()
    i = cuda.grid(1)
    if i < crcs.size:
        lo = i * chunk
        hi = min(data.size, lo + chunk)
        c = np.uint32(0xFFFFFFFF)
        for j in range(lo, hi):
            c = (c >> np.uint32(8)) ^ t[(c ^ np.uint32(data[j])) & np.uint32(0xFF)]
        crcs[i] = c ^ np.uint32(0xFFFFFFFF)


@jit
def _fold(crcs, op, whole, group, groups):
    g = cuda.grid(1)
    if g < groups.size:
        lo = g * group
        hi = min(whole, lo + group)
        c = crcs[lo]
        for k in range(lo + 1, hi):
            c = _times(op, c) ^ crcs[k]
        groups[g] = c


#: the region kernel's shape: threads per block and 8-byte words per thread (a region of
#: 8 * 256 * 32 = 64 KiB a block; kernel arguments, so the simulator tests take small ones)
REGION_THREADS = 256
REGION_WORDS = 32
REGION = 8 * REGION_THREADS * REGION_WORDS
#: the most threads a region block may have (its shared reduction buffer)
_MAX_THREADS = 1024
_ZT = 8 * 256  # where the carry operator's four byte tables start, after slicing-by-8's eight


@jit
def _regions(words, per, tables, ends, last, crcs):
    sh = cuda.shared.array(12 * 256, np.uint32)
    red = cuda.shared.array(_MAX_THREADS, np.uint32)
    for k in range(cuda.threadIdx.x, 12 * 256, cuda.blockDim.x):
        sh[k] = tables[k]
    cuda.syncthreads()
    t = cuda.threadIdx.x
    nt = cuda.blockDim.x
    base = cuda.blockIdx.x * nt * per
    m = np.uint32(0xFF)
    r = np.uint32(0)
    for k in range(per):
        w = words[base + t + k * nt]
        # carried through the 8 * (nt - 1) zero bytes of the other threads' words, then this word
        z = sh[_ZT + (r & m)] ^ sh[_ZT + 256 + ((r >> np.uint32(8)) & m)] ^ sh[_ZT + 512 + ((r >> np.uint32(16)) & m)] ^ sh[_ZT + 768 + (r >> np.uint32(24))]
        lo = z ^ np.uint32(w & np.uint64(0xFFFFFFFF))
        hi = np.uint32(w >> np.uint64(32))
        r = (
            sh[7 * 256 + (lo & m)] ^ sh[6 * 256 + ((lo >> np.uint32(8)) & m)] ^ sh[5 * 256 + ((lo >> np.uint32(16)) & m)] ^ sh[4 * 256 + (lo >> np.uint32(24))]
            ^ sh[3 * 256 + (hi & m)] ^ sh[2 * 256 + ((hi >> np.uint32(8)) & m)] ^ sh[256 + ((hi >> np.uint32(16)) & m)] ^ sh[hi >> np.uint32(24)]
        )
    red[t] = _times(ends[t], r)  # carried to the region's end
    cuda.syncthreads()
    step = 1
    while step < nt:
        if t % (2 * step) == 0 and t + step < nt:
            red[t] ^= red[t + step]
        cuda.syncthreads()
        step *= 2
    if t == 0:
        crcs[cuda.blockIdx.x] = red[0] ^ last


def _operator(nbytes: int) -> np.ndarray:
    """The 32x32 GF(2) operator (32 columns) that carries a CRC register through ``nbytes``
    zero bytes: the product of ``zero_operators()`` rows, as ``_crc.shift`` applies them."""
    ops = zero_operators()
    mat = np.uint32(1) << np.arange(32, dtype=np.uint32)  # the identity
    k = 0
    while nbytes:
        if nbytes & 1:
            mat = np.array([_cpu._times(ops[k], c) for c in mat], np.uint32)
        nbytes >>= 1
        k += 1
    return mat


def _byte_tables(mat: np.ndarray) -> np.ndarray:
    """Operator ``mat`` as four 256-entry tables: ``mat(v)`` is the xor of table ``j``'s entry
    for byte ``j`` of ``v``."""
    b = np.arange(256, dtype=np.uint32)
    return np.concatenate([[_cpu._times(mat, v) for v in (b << np.uint32(8 * j))] for j in range(4)]).astype(np.uint32)


def _slicing_tables() -> np.ndarray:
    """Slicing-by-8's eight tables: ``T0`` the byte table, ``Tk[i] = (T(k-1)[i] >> 8) ^ T0[T(k-1)[i] & 0xFF]``."""
    t = [np.asarray(_cpu._TABLE, np.uint32)]
    for _ in range(7):
        p = t[-1]
        t.append((p >> np.uint32(8)) ^ t[0][p & np.uint32(0xFF)])
    return np.concatenate(t).astype(np.uint32)


def _region_consts(threads: int, per: int):
    """The region kernel's constants on the device, once per context and shape: the twelve
    tables, the per-thread operators to the region's end, the region's constant (its CRC-32C
    is the raw xor and this: ``shift(~0, size) ^ ~0``) and the zero operator of a region (to
    fold regions; a region's size is a power of two)."""
    size = 8 * threads * per
    if threads > _MAX_THREADS or size & (size - 1):
        raise AssertionError("a CRC region has at most 1024 threads and a power-of-two size")

    def make():
        tables = np.concatenate([_slicing_tables(), _byte_tables(_operator(8 * threads - 8))])
        ends = np.stack([_operator(8 * (threads - 1 - t)) for t in range(threads)])
        last = np.uint32(_cpu._times(_operator(size), np.uint32(0xFFFFFFFF)) ^ np.uint32(0xFFFFFFFF))
        op = np.ascontiguousarray(zero_operators()[size.bit_length() - 1])
        return cuda.to_device(tables), cuda.to_device(ends), last, cuda.to_device(op)

    return per_context(("crc-regions", threads, per), make)


def _consts(chunk_bits: int):
    """The byte table and the zero operator of ``2**chunk_bits`` bytes, on the device once per
    context (``_common.per_context``)."""
    op = np.ascontiguousarray(zero_operators()[chunk_bits])
    return per_context(("crc", chunk_bits), lambda: (cuda.to_device(_cpu._TABLE), cuda.to_device(op)))


def _pieces(data, chunk_bits: int, group: int) -> tuple[list, list]:
    """The CRC-32C values and lengths of consecutive pieces covering uint8 device array
    ``data`` (each from 0): its :data:`CHUNK`-byte chunks' (a thread each, byte by byte),
    joined ``group`` at a time on the device, and the last, shorter chunk's."""
    n = data.size
    if n == 0:
        return [], []
    chunk = 1 << chunk_bits
    table, op = _consts(chunk_bits)
    chunks = -(-n // chunk)
    crcs = cuda.device_array(chunks, np.uint32)
    _chunk_crcs[-(-chunks // _common.THREADS), _common.THREADS](data, table, chunk, crcs)
    whole = n // chunk  # chunks of exactly ``chunk`` bytes (the last may be shorter)
    vals, lens = _folded(crcs, op, whole, chunk, group)
    if whole < chunks:  # the shorter last chunk
        vals.append(int(crcs[whole:].copy_to_host()[0]))
        lens.append(n - whole * chunk)
    return vals, lens


def _folded(crcs, op, whole: int, size: int, group: int) -> tuple[list, list]:
    """The first ``whole`` values of ``crcs`` (CRC-32C values of consecutive pieces of ``size``
    bytes, whose zero operator is ``op``) joined ``group`` at a time on the device: the
    groups' values and lengths, read back."""
    ngroups = -(-whole // group)
    if not ngroups:
        return [], []
    groups = cuda.device_array(ngroups, np.uint32)
    _fold[-(-ngroups // _common.THREADS), _common.THREADS](crcs, op, whole, group, groups)
    lens = np.minimum(group, whole - np.arange(ngroups) * group).astype(np.int64) * size
    return groups.copy_to_host().tolist(), lens.tolist()


def crc32c(data, crc: int = 0, chunk_bits: int | None = None, group: int | None = None, threads: int | None = None, per: int | None = None) -> int:
    """``crc32c.crc32c(bytes of data, crc)`` of the uint8 device array ``data``.  Its 8-byte
    aligned bulk runs in regions of ``8 * threads * per`` bytes, a block of ``threads``
    threads each (default :data:`REGION_THREADS`, :data:`REGION_WORDS`: :data:`REGION`
    bytes); the unaligned head and the tail in chunks of ``2**chunk_bits`` bytes; values
    joined ``group`` at a time on the device (default :data:`CHUNK_BITS`, :data:`GROUP`).
    The value depends on none of them."""
    n = data.size
    if n == 0:
        return int(crc)
    chunk_bits = CHUNK_BITS if chunk_bits is None else chunk_bits
    group = GROUP if group is None else group
    threads = REGION_THREADS if threads is None else threads
    per = REGION_WORDS if per is None else per
    size = 8 * threads * per
    head = min(n, -_common.address(data) % 8)
    regions = (n - head) // size
    vals, lens = [], []
    at = 0
    if regions:
        v, ln = _pieces(data[:head], chunk_bits, group)
        vals += v
        lens += ln
        tables, ends, last, op = _region_consts(threads, per)
        crcs = cuda.device_array(regions, np.uint32)
        body = data[head : head + regions * size].view(np.uint64)
        _regions[regions, threads](body, per, tables, ends, last, crcs)
        v, ln = _folded(crcs, op, regions, size, group)
        vals += v
        lens += ln
        at = head + regions * size
    v, ln = _pieces(data[at:], chunk_bits, group)
    vals += v
    lens += ln
    return int(_cpu.join(np.array(vals, np.uint32), np.uint32(crc), np.array(lens, np.int64)))


def crc_of(codes, crc: int) -> int:
    """The CRC-32C of device array ``codes``' bytes continued from ``crc`` (:func:`crc32c`);
    -1 when none is asked (``crc < 0``): what an encoding twin returns for its codes."""
    if crc < 0:
        return -1
    if not codes.size:
        return int(crc)
    return crc32c(codes.reshape(codes.size).view(np.uint8), crc)
