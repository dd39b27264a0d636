"""Kernel layer: one module per family, a CPU file and (later) a CUDA twin with the same names.

``codec.kernels.cpu.pack`` and ``codec.kernels.cuda.pack`` define the same functions; callers
never import either directly but ask :func:`backend` for the module that matches where the
arrays live.  Kernel modules import Numba at import time, so only call this from inside a
stage method, never at module level.
"""

from __future__ import annotations

import functools
import importlib

import numpy as np


def on_device(*arrays) -> bool:
    """True when any argument exposes ``__cuda_array_interface__`` (a CUDA array)."""
    for a in arrays:
        if type(a) is not np.ndarray and hasattr(a, "__cuda_array_interface__"):
            return True
    return False


def backend(family: str, *arrays):
    """The kernel module of ``family`` ("pack", "convert", "scatter", "select") for ``arrays``."""
    return _module(family, "cuda" if on_device(*arrays) else "cpu")


@functools.cache
def _module(family: str, device: str):
    # cached: importlib's lookup costs ~8 us, and small tensors make several calls per frame
    try:
        return importlib.import_module(f"codec.kernels.{device}.{family}")
    except ModuleNotFoundError:
        if device == "cuda":
            raise TypeError(f"no CUDA kernels for {family!r} yet; pass host (NumPy) arrays") from None
        raise
