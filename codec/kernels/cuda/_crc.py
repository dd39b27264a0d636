"""CRC-32C of device memory (the CUDA side of ``codec/kernels/cpu/_crc.py``): a frame's codes
made on the device are checksummed there, so the host only copies them.

Three steps, the result bit for bit ``crc32c.crc32c(bytes, crc)``:

1. one thread per :data:`CHUNK`-byte chunk computes the chunk's own CRC-32C, a byte at a time
   through the Castagnoli table (kept in shared memory);
2. one thread per :data:`GROUP` consecutive whole chunks joins them, carrying the running
   value through a chunk's worth of zero bytes with the fixed GF(2) operator of ``CHUNK``
   zero bytes (zlib's ``crc32_combine`` algebra; the operator is ``zero_operators()[10]``);
3. the host joins the groups' values (a few hundred for 50 MB) and the last, shorter chunk
   with ``_crc.join``, continuing from the caller's ``crc``.

The algebra is the CPU file's own (``_times`` is compiled as a device function from its
source).
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


def _consts(chunk_bits: int):
    """The byte table and the zero operator of ``2**chunk_bits`` bytes, on the device once per
    context (``_common.per_context``)."""
    op = np.ascontiguousarray(zero_operators()[chunk_bits])
    return per_context(("crc", chunk_bits), lambda: (cuda.to_device(_cpu._TABLE), cuda.to_device(op)))


def crc32c(data, crc: int = 0, chunk_bits: int | None = None, group: int | None = None) -> int:
    """``crc32c.crc32c(bytes of data, crc)`` of the uint8 device array ``data``; chunks of
    ``2**chunk_bits`` bytes joined ``group`` at a time on the device (default
    :data:`CHUNK_BITS`, :data:`GROUP`; the value does not depend on them)."""
    n = data.size
    if n == 0:
        return int(crc)
    chunk_bits = CHUNK_BITS if chunk_bits is None else chunk_bits
    group = GROUP if group is None else group
    chunk = 1 << chunk_bits
    table, op = _consts(chunk_bits)
    chunks = -(-n // chunk)
    crcs = cuda.device_array(chunks, np.uint32)
    _chunk_crcs[-(-chunks // _common.THREADS), _common.THREADS](data, table, chunk, crcs)
    whole = n // chunk  # chunks of exactly ``chunk`` bytes (the last may be shorter)
    ngroups = -(-whole // group)
    lens = np.zeros(0, np.int64)
    vals = np.zeros(0, np.uint32)
    if ngroups:
        groups = cuda.device_array(ngroups, np.uint32)
        _fold[-(-ngroups // _common.THREADS), _common.THREADS](crcs, op, whole, group, groups)
        vals = groups.copy_to_host()
        lens = np.minimum(group, whole - np.arange(ngroups) * group).astype(np.int64) * chunk
    if whole < chunks:  # the shorter last chunk
        vals = np.concatenate([vals, crcs[whole:].copy_to_host()])
        lens = np.append(lens, n - whole * chunk)
    return int(_cpu.join(vals, np.uint32(crc), lens))


def crc_of(codes, crc: int) -> int:
    """The CRC-32C of device array ``codes``' bytes continued from ``crc`` (:func:`crc32c`);
    -1 when none is asked (``crc < 0``): what an encoding twin returns for its codes."""
    if crc < 0:
        return -1
    if not codes.size:
        return int(crc)
    return crc32c(codes.reshape(codes.size).view(np.uint8), crc)
