"""CUDA twin of ``codec/kernels/cpu/elias.py``: QSGD's run-length Elias-gamma streams, in two
passes as on the CPU (each chunk's length, a scan on the host of the few lengths, then each
chunk written at its start), with the CPU file's names, arguments and bytes.

A chunk's stream is a bit-serial walk of its buckets, so one thread walks one chunk (the
CPU's unit of parallel work, ``group_buckets`` buckets of about ``CHUNK`` values), with the
CPU file's own ``_elias_chunk``, ``_decode_chunk`` and the gamma helpers compiled
again as device functions: one statement of the code for both backends.  Only the chunk
lengths (8 bytes per chunk) and the stream cross to the host.
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import device_functions, jit, numba_cuda
from codec.kernels.cpu import elias as _cpu
from codec.dtypes import on_device
from codec.kernels.cuda._common import Results, dev, launch

cuda = numba_cuda()

__all__ = list(_cpu.__all__)

_twins = device_functions(_cpu, ["_bitlen", "_put_gamma", "_elias_chunk", "_get_gamma", "_decode_chunk"])
_elias_chunk, _decode_chunk = _twins["_elias_chunk"], _twins["_decode_chunk"]

U = np.uint64


@jit
def _sizes(codes, bucket, per, nbytes, nothing):
    n = codes.size
    span = per * bucket
    for c in range(cuda.grid(1), nbytes.size, cuda.gridsize(1)):
        bits = _elias_chunk(codes, c * span, min(n, (c + 1) * span), bucket, nothing, U(0), False)
        nbytes[c] = (bits + U(7)) >> U(3)


def elias_sizes(codes, bucket, per, nbytes):
    """Bytes of each chunk's Elias stream (``per`` buckets per chunk, padded to whole bytes)."""
    out = Results()
    nb = out(nbytes)
    if nb.size:
        _sizes[launch(nb.size)](codes, bucket, per, nb, cuda.device_array(1, np.uint8))
    out.done()


@jit
def _encode(codes, bucket, per, starts, out):
    n = codes.size
    span = per * bucket
    for c in range(cuda.grid(1), starts.size, cuda.gridsize(1)):
        _elias_chunk(codes, c * span, min(n, (c + 1) * span), bucket, out, U(starts[c]) * U(8), True)


def elias_encode(codes, bucket, per, starts, out):
    """Write each chunk's Elias stream at byte ``starts[c]`` of ``out`` (zeroed here when it is
    a host array, as a device buffer it stands for; a device ``out`` must come zeroed)."""
    res = Results()
    o = res(out, zeroed=not on_device(out))
    if len(starts):
        _encode[launch(len(starts))](codes, bucket, per, dev(starts), o)
    res.done()


@jit
def _decode(data, starts, n, bucket, per, levels, codes, bad):
    for c in range(cuda.grid(1), bad.size, cuda.gridsize(1)):
        bad[c] = 0 if _decode_chunk(data, starts, n, bucket, per, levels, codes, c) else 1


def elias_decode(data, starts, n, bucket, per, levels, codes, bad):
    """QSGD codes from the chunked Elias streams (see the CPU kernel); ``codes`` zeroed by the
    caller; ``bad[c] = 1`` where chunk ``c``'s stream is damaged."""
    out = Results()
    c, b = out(codes), out(bad)
    if b.size:
        if not on_device(codes):
            c.copy_to_device(codes)
        _decode[launch(b.size)](dev(data), dev(starts), n, bucket, per, levels, c, b)
    out.done()
