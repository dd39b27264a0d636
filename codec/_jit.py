"""The one place the project's Numba options are set.

Every kernel module does ``from codec._jit import jit`` and decorates with ``@jit`` (or
``@jit(parallel=True)``).  Options fixed here: ``cache=True`` (compiled code is kept on disk
next to the module), lazy signatures (nothing compiles before the first call), no
``fastmath`` (gradient code must keep IEEE semantics: NaN checks, signed zeros, exact
rounding), and the NumPy error model (division by zero gives inf/nan, never a Python
exception from inside a kernel).

Importing this module imports numba, so only kernel modules import it, and kernel modules
are only imported from inside stage methods: ``import codec`` stays cheap.
"""

from __future__ import annotations

import numba

_DEFAULTS = dict(cache=True, nogil=True, error_model="numpy", fastmath=False)


def jit(fn=None, **options):
    """``numba.njit`` with the project's defaults; usable as ``@jit`` or ``@jit(parallel=True)``."""
    opts = dict(_DEFAULTS)
    opts.update(options)
    if opts.get("fastmath"):
        raise ValueError("fastmath is not allowed on gradient kernels")
    if fn is None:
        return lambda f: numba.njit(**opts)(f)
    return numba.njit(**opts)(fn)


prange = numba.prange

# Work is cut into this many chunks at most; chunk boundaries depend on the array size only,
# never on the thread count, so every result is the same whatever NUMBA_NUM_THREADS says.
CHUNKS = 64
MIN_CHUNK = 1 << 16


def chunk_bounds(n: int, align: int = 1):
    """Chunk count and chunk length for ``n`` items, each chunk a multiple of ``align``."""
    if n <= 0:
        return 0, align
    size = max(MIN_CHUNK, -(-n // CHUNKS))
    size = -(-size // align) * align
    return -(-n // size), size
