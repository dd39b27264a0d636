"""Kernel layer: one module per family, a CPU file and (later) a CUDA twin with the same names.

Families are discovered, not listed: every public module ``codec/kernels/cpu/<family>.py``
(a name not starting with ``_``) is a family, so adding one means adding its file and nothing
here.  A family's ``__all__`` is its contract: the CUDA twin ``codec/kernels/cuda/<family>.py``
defines the same names with the same arguments (docs/kernels.md).  Private helpers that
several CPU families share live in ``codec/kernels/cpu/_common.py``; the layout numbers every
backend agrees on (chunks, lanes, bucket groups, the random stream's span) in
:mod:`codec.layout`.

Callers never import a backend module directly but ask for one:

* ``backend(family, *arrays)``: the module that matches where ``arrays`` live: the CUDA twin
  when any of them is a device array (:func:`codec.dtypes.on_device`), else the CPU one.
  What stages, :mod:`codec.ops` and :mod:`codec.pack` call.
* ``module(family, device="cpu")``: the module of ``family`` on ``device`` by name: what the
  kernel tests use to run one suite against every backend (the ``backend`` fixture).

Both take ``package="codec.kernels"``: kernels that live outside the library follow the same
layout, ``<package>.cpu.<family>`` and ``<package>.cuda.<family>``, and are reached with
``backend("int8", x, package="recipe.kernels")``.  Lookups are cached (importlib's costs
~8 us, and small tensors make several calls per frame).  Errors: an unknown family is a
ValueError naming the families of that package; a device array whose family has no CUDA
twin yet is a TypeError ("no CUDA kernels for ...").

Kernel modules import Numba at import time, so call these from inside a stage method, never
at module level: importing this package imports no kernel module (the families are found by
listing ``cpu/``, not by importing it).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from pathlib import Path

from codec.dtypes import on_device
from codec.errors import CodecTypeError, CodecValueError

#: the backends a family may have, in dispatch order
BACKENDS = ("cpu", "cuda")

__all__ = ["BACKENDS", "backend", "families", "module"]


@functools.cache
def families(package: str = __name__) -> tuple[str, ...]:
    """The kernel families of ``package``, sorted: the public modules of ``<package>.cpu``
    (every family has a CPU file; a CUDA twin is optional).  For this package the folder is
    listed without importing anything; for another package its ``cpu`` subpackage is located
    (its parents are imported, it is not)."""
    import pkgutil  # here, not at import: ``import codec`` imports this package and must stay cheap

    if package == __name__:
        where = [str(Path(__file__).with_name("cpu"))]
    else:
        spec = importlib.util.find_spec(f"{package}.cpu")
        where = list(spec.submodule_search_locations or []) if spec is not None else []
    return tuple(sorted(m.name for m in pkgutil.iter_modules(where) if not m.name.startswith("_")))


def backend(family: str, *arrays, package: str = __name__):
    """The kernel module of ``family`` for ``arrays``: ``<package>.cuda.<family>`` when any of
    them is a device array (:func:`codec.dtypes.on_device`), else ``<package>.cpu.<family>``."""
    return _module(family, "cuda" if on_device(*arrays) else "cpu", package)


def module(family: str, device: str = "cpu", package: str = __name__):
    """The kernel module of ``family`` on backend ``device`` ("cpu" or "cuda"), by name:
    ``<package>.<device>.<family>``; what the kernel tests use to run one suite against every
    backend."""
    if device not in BACKENDS:
        raise CodecValueError(f"device: must be one of {BACKENDS}, got {device!r}")
    return _module(family, device, package)


@functools.cache
def _module(family: str, device: str, package: str):
    known = families(package)
    if family not in known:
        where = "" if package == __name__ else f" in {package}"
        raise CodecValueError(f"no kernel family {family!r}{where}; families: {', '.join(known) or '(none)'}")
    name = f"{package}.{device}.{family}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        # only the twin (or its backend package) being absent means "no CUDA kernels"; a
        # module missing inside a twin that exists is a real error and propagates
        if device == "cuda" and e.name in (name, f"{package}.{device}"):
            raise CodecTypeError(f"no CUDA kernels for {family!r} yet; pass host (NumPy) arrays") from None
        raise
