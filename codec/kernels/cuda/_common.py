"""Launch shapes every CUDA twin shares (the CUDA side of ``codec/kernels/cpu/_common.py``).

Kernels are grid-stride loops: a launch over ``n`` values uses enough blocks of
:data:`THREADS` for one value per thread, at most :data:`MAX_BLOCKS` (about two blocks per
multiprocessor resident on an H100/H200), each thread striding by the grid's size.  Results
never depend on the launch shape (no kernel sums in thread order).
"""

from __future__ import annotations

#: threads per block of every kernel, and the most blocks a launch uses
THREADS = 256
MAX_BLOCKS = 1024


def grid(n: int) -> int:
    """Blocks of a launch over ``n`` values (at least one)."""
    return min(MAX_BLOCKS, max(1, (n + THREADS - 1) // THREADS))
