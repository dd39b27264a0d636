"""Launch shapes every CUDA twin shares (the CUDA side of ``codec/kernels/cpu/_common.py``).

Kernels are grid-stride loops: a launch over ``n`` values uses enough blocks of
:data:`THREADS` for one value per thread, at most :data:`MAX_BLOCKS` (about two blocks per
multiprocessor resident on an H100/H200), each thread striding by the grid's size.  Results
never depend on the launch shape (no kernel sums in thread order).
"""

from __future__ import annotations

import threading

#: threads per block of every kernel, and the most blocks a launch uses
THREADS = 256
MAX_BLOCKS = 1024


def grid(n: int) -> int:
    """Blocks of a launch over ``n`` values (at least one)."""
    return min(MAX_BLOCKS, max(1, (n + THREADS - 1) // THREADS))


_kept = threading.local()


def per_context(key, make):
    """``make()``'s value (device buffers, constants moved to the device), made once per
    thread and CUDA context and kept under ``key``: a kernel call allocates nothing."""
    from codec._cuda_jit import numba_cuda

    ctx = numba_cuda().current_context()
    cache = getattr(_kept, "cache", None)
    if cache is None:
        cache = _kept.cache = {}
    got = cache.get((key, id(ctx)))
    if got is None or got[0] is not ctx:  # (an id reused by a later context)
        got = cache[(key, id(ctx))] = (ctx, make())
    return got[1]
