"""The one place the project's Numba options are set.

Every kernel module does ``from codec._jit import jit`` and decorates with ``@jit`` (or
``@jit(parallel=True)``).  Options fixed here: ``cache=True`` (compiled code is kept on disk
next to the module), lazy signatures (nothing compiles before the first call), no
``fastmath`` (gradient code must keep IEEE semantics: NaN checks, signed zeros, exact
rounding), the NumPy error model (division by zero gives inf/nan, never a Python
exception from inside a kernel), and Numba's optimisation level ``NUMBA_OPT=max`` unless the
user chose one (:data:`OPT`: a kernel compiled in this process runs as fast as one loaded
from the cache).

Importing this module imports numba, so only kernel modules import it, and kernel modules
are only imported from inside stage methods: ``import codec`` stays cheap.
"""

from __future__ import annotations

import functools
import os
import types

from codec import threads
from codec.errors import CodecValueError

threads.prepare_numba()  # before Numba's OpenMP runtime loads: idle threads wait passively

#: Numba's optimisation level, unless the user set ``NUMBA_OPT``: "max" runs its first
#: module pass at -O3 with loop vectorisation as well (the default runs that one at -O0, to
#: inline, then the full -O3 pass once).  Why it matters: a kernel's ``@jit`` helpers are
#: compiled as functions of their own and again, already optimised once, inside the kernel;
#: a process that compiles the kernel calls the helpers' own copies (the JIT linker binds
#: its calls to the copy it loaded first), a process that loads it from the disk cache calls
#: the copies inside it.  Optimised once, some helpers' loops are not vectorised (qsgd's
#: coding loop: 3.2 against 0.77 ns a value), so at the default level a kernel compiled in
#: this process (a first run, or any run after a change) ran up to 4x slower than the same
#: kernel loaded from the cache: the qsgd error-feedback step 55 ms against 26
#: (docs/kernels.md, "The jit wrappers").  Compiling takes ~20% longer; values unchanged.
OPT = "max"
os.environ.setdefault("NUMBA_OPT", OPT)

import numba  # noqa: E402

numba.core.config.reload_config()  # (where Numba was imported before this module: read before its first compile fixes its passes)

_DEFAULTS = dict(cache=True, nogil=True, error_model="numpy", fastmath=False)

#: below this many items (the size of a parallel kernel's first argument, or its ``work``)
#: the serial compilation runs: waking the thread pool costs ~60 us, and on a busy machine a
#: parallel region waits a whole scheduler slice (~16 ms) for a descheduled worker.
PARALLEL_MIN = 1 << 17


class _SizeDispatch:
    """A parallel kernel compiled twice: ``prange`` as threads, and as a plain loop.

    Both compilations run the same chunked loop (chunk boundaries depend on the array length
    only), so results are identical; the call picks by the size of the first argument, or by
    ``work(*args)`` where the kernel names its work otherwise (a decode whose first argument
    is the frame's few coefficients and whose output is a whole matrix).  The serial twin is
    a copy of the function with its own qualified name, so the two never share
    an entry in Numba's on-disk cache.  Parallel kernels are called from Python only.

    A call that leaves out defaulted arguments gets them filled in before Numba sees it:
    Numba types a left-out argument ``omitted(default=...)``, a compilation of its own beside
    the one for a caller that passes the same value (``half_decode`` with and without its
    ``crc``, ``expand`` with and without its mode: 18-47 s each for PowerSGD's).
    """

    def __init__(self, fn, opts, work=None):
        self.work = work
        self._defaults = fn.__defaults__ or ()
        self._nargs = fn.__code__.co_argcount
        twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        twin.__qualname__ = fn.__qualname__ + "__serial"
        twin.__module__ = fn.__module__
        self.parallel = numba.njit(parallel=True, **opts)(fn)
        self.serial = numba.njit(**opts)(twin)
        functools.update_wrapper(self, fn)

    def items(self, *args) -> int:
        """The size the call picks its twin by: the first argument's, or ``work(*args)``."""
        return getattr(args[0], "size", 0) if self.work is None else self.work(*args)

    def complete(self, args: tuple) -> tuple:
        """``args`` with the defaults of the arguments it leaves out (one signature whether
        a caller passes them or not)."""
        missing = self._nargs - len(args)
        if 0 < missing <= len(self._defaults):
            args += self._defaults[len(self._defaults) - missing :]
        return args

    def __call__(self, *args):
        args = self.complete(args)
        if self.items(*args) < PARALLEL_MIN:
            return self.serial(*args)
        n = threads.budget()  # this process's share of the cores (codec/threads.py)
        if n <= 1:
            return self.serial(*args)
        mine = numba.get_num_threads()  # the calling thread's setting: lowered, never raised
        if n >= mine:
            return self.parallel(*args)
        numba.set_num_threads(n)
        try:
            return self.parallel(*args)
        finally:
            numba.set_num_threads(mine)


def jit(fn=None, **options):
    """``numba.njit`` with the project's defaults; usable as ``@jit`` or ``@jit(parallel=True)``
    (a parallel kernel runs serially below ``PARALLEL_MIN`` items, see ``_SizeDispatch``;
    ``work=f``: ``f(*args)`` counts them instead of the first argument's size)."""
    opts = dict(_DEFAULTS)
    opts.update(options)
    if opts.get("fastmath"):
        raise CodecValueError("fastmath is not allowed on gradient kernels")
    parallel = opts.pop("parallel", False)
    work = opts.pop("work", None)
    if work is not None and not parallel:
        raise CodecValueError("work= names a parallel kernel's size: it needs parallel=True")

    def wrap(f):
        return _SizeDispatch(f, opts, work) if parallel else numba.njit(**opts)(f)

    return wrap if fn is None else wrap(fn)


prange = numba.prange
