"""The simulator's launch shapes, shared by tests/cuda/conftest.py (every simulator test) and
the scripts it launches under mpiexec (tests/mpi_device.py): one block of 32 threads for the
grid-stride launches, scanning blocks of 4 threads of 128 values, a short thread switch
interval, and every index section a device decode meets read there.  Why: tests/cuda/conftest.py."""

from __future__ import annotations

import sys

import numba

#: the interpreter's thread switch interval in the simulator (tests/cuda/conftest.py)
SWITCH_INTERVAL = 5e-4


def settings() -> list:
    """``(module, attribute, value)`` of every setting, the simulator's shapes only under it."""
    import codec.pack

    out = [(codec.pack, "DEVICE_SECTION", 0)]
    if numba.config.ENABLE_CUDASIM:
        from codec.kernels.cuda import _common

        out += [(_common, "THREADS", 32), (_common, "MAX_BLOCKS", 1), (_common, "SCAN_BLOCK", 4), (_common, "SCAN_ITEMS", 128)]
    return out


def apply(setattr_=setattr) -> None:
    """Apply :func:`settings` with ``setattr_`` (pytest's ``monkeypatch.setattr`` in a test)."""
    if numba.config.ENABLE_CUDASIM:
        sys.setswitchinterval(SWITCH_INTERVAL)
    for module, name, value in settings():
        setattr_(module, name, value)
