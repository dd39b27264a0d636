"""The seam between device arrays and MPI: host staging today, device buffers where the MPI
allows.

An input that exposes ``__cuda_array_interface__`` (CuPy, PyTorch CUDA tensors, Numba device
arrays) is copied to host memory for encoding, and the reduced result is copied back to a
Numba device array, so a caller gets device arrays for device inputs.  The codecs' CUDA
kernels come later; when they land, ``to_host`` is where a device frame path plugs in.  Both
copies need the optional ``numba-cuda`` package (``pip install -e ".[cuda]"``).
"""

from __future__ import annotations

import numpy as np

from codec.errors import CodecTypeError


def _cuda():
    # imported on the first device array, not at module level: numba.cuda is optional
    # (the ``cuda`` extra) and loading it costs time every host-only job would pay
    try:
        from numba import cuda
    except ImportError:  # pragma: no cover - numba always imports; numba.cuda may not
        cuda = None
    if cuda is None or not hasattr(cuda, "as_cuda_array"):
        raise CodecTypeError('tensors: device (CUDA) arrays need the numba-cuda package: pip install -e ".[cuda]"')
    return cuda


def to_host(x) -> np.ndarray:
    """A host copy of the device array ``x``."""
    return _cuda().as_cuda_array(x).copy_to_host()


def to_device(a: np.ndarray):
    """A device copy of the host array ``a`` (a Numba device array)."""
    return _cuda().to_device(a)
