"""The one place the project's Numba CUDA options are set: :mod:`codec._jit`'s twin for the
CUDA kernels.

Every CUDA twin ``codec/kernels/cuda/<family>.py`` starts with::

    from codec._cuda_jit import jit, numba_cuda

    cuda = numba_cuda()  # the intrinsics kernels use: cuda.grid, cuda.shared.array, atomics

and decorates its kernels with ``@jit`` and its device functions with ``@jit(device=True)``,
exactly as the CPU file of the same family uses :func:`codec._jit.jit` (docs/kernels.md,
"Adding a CUDA twin").  The intrinsics must be reached through a module-level global that
*is* the ``numba.cuda`` module (the simulator swaps that global for its own).  Options fixed here: ``cache=True`` (compiled code is kept on disk
next to the module), lazy signatures (nothing compiles before the first launch), and no
``fastmath`` (gradient code keeps IEEE semantics; frames made on a GPU must equal the CPU's
byte for byte).

Numba's CUDA target (the ``numba-cuda`` package, or the ``numba.cuda`` that older Numba
releases bundle) is imported on first use, when the first kernel is decorated, never when
this module is imported: a twin module is itself only imported when a device array reaches
:func:`codec.kernels.backend`, so ``import codec`` and CPU-only runs never load it.  With
``NUMBA_ENABLE_CUDASIM=1`` the same kernels run on Numba's CUDA simulator (no GPU needed),
which is how the kernel tests run the CUDA backend on CPU-only machines.
"""

from __future__ import annotations

import importlib

from codec.errors import CodecValueError

_DEFAULTS = dict(cache=True, fastmath=False)

__all__ = ["device_functions", "jit", "numba_cuda"]


def numba_cuda():
    """The ``numba.cuda`` module, imported on the first call (host code only: never call this
    inside a kernel); ImportError with a sentence saying what to install when it is missing."""
    try:
        return importlib.import_module("numba.cuda")
    except ImportError as e:
        raise ImportError(f"CUDA kernels need Numba's CUDA target: pip install numba-cuda ({e})") from e


def jit(fn=None, **options):
    """``numba.cuda.jit`` with the project's defaults; usable as ``@jit``, ``@jit(device=True)``
    or with any other ``numba.cuda.jit`` option except ``fastmath``.  A kernel is launched as
    Numba's are: ``kernel[blocks, threads](*args)``."""
    opts = dict(_DEFAULTS)
    opts.update(options)
    if opts.get("fastmath"):
        raise CodecValueError("fastmath is not allowed on gradient kernels")

    def wrap(f):
        return numba_cuda().jit(**opts)(f)

    return wrap if fn is None else wrap(fn)


def device_functions(module, names, extra=None) -> dict:
    """CUDA device-function twins of the scalar ``@jit`` functions ``names`` of the CPU kernel
    module ``module``, compiled from their Python source: one statement of a rule (a
    rounding, a hash) for both backends.  Each is rebuilt over a copy of the module's globals
    in which every name of ``names`` is its twin, so their calls to each other stay on the
    device (``rng.stream`` calls ``mix``); ``extra`` (``{name: device function}``) binds more
    names there: the twins of helpers the module imports from elsewhere.  Returns ``{name:
    device function}``."""
    import types

    ns = dict(vars(module))
    ns.update(extra or {})
    out = {}
    for name in names:
        f = getattr(module, name).py_func
        g = types.FunctionType(f.__code__, ns, f.__name__, f.__defaults__, f.__closure__)
        out[name] = ns[name] = jit(device=True)(g)
    return out
