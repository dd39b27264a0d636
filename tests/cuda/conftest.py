"""Settings every simulator test of tests/cuda shares.

The ``select`` twin's ``candidates`` block and the ``adacomp`` twin's take 8 threads here
instead of 256: the
simulator runs each thread as a Python thread and a block-wide scan's barriers cost it about
0.1 ms per thread, so a 256-thread block spends over a second on a few hundred values.  The
launch shape never changes a result (the kernel tests run both shapes), so the codec-level
tests run the small one.  On a GPU (``GRADCODEC_CUDA_TESTS=1``) nothing is changed.
"""

from __future__ import annotations

import numba
import pytest


@pytest.fixture(autouse=True)
def _small_select_blocks(monkeypatch):
    if numba.config.ENABLE_CUDASIM:
        from codec.kernels import module

        monkeypatch.setattr(module("select", "cuda"), "BLOCK", 8)
        monkeypatch.setattr(module("adacomp", "cuda"), "BLOCK", 8)
