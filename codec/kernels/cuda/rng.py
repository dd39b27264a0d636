"""CUDA twin of ``codec/kernels/cpu/rng.py``: the counter-based random bits as device
functions, the CPU file's own functions compiled from their Python source
(:func:`codec._cuda_jit.device_functions`), so a value's random bits are the same on both
backends by construction (integer arithmetic only).  They are called inside kernels, as
their CPU twins are; ``tests/cuda/test_cuda_rng.py`` checks them through a kernel against
the CPU's values."""

from __future__ import annotations

from codec._cuda_jit import device_functions
from codec.kernels.cpu import rng as _cpu
from codec.kernels.cuda import _common

__all__ = list(_cpu.__all__)

globals().update(device_functions(_cpu, __all__, extra=_common.MATH))
