"""PowerSGD's CUDA twins (``lowrank``: ``project``, ``back_project``, ``expand``,
``orthogonalize``) against the CPU kernels, bit for bit, in the simulator: widths that do and
do not divide the columns, ranks across the twin's eight-column passes, float32 and float64,
NaN/inf counted.  The CPU kernels are checked against NumPy references in
tests/test_lowrank.py."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from codec.dtypes import readonly as ro
from codec.kernels import module
from codec.modes import ADD, SUB

G, C = module("lowrank", "cuda"), module("lowrank", "cpu")


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}")), (a, b)


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n, m, r", [(1, 1, 1), (3, 11, 2), (5, 17, 9)])
def test_products(n, m, r, dtype):
    rng = np.random.default_rng([n, m, r])
    mat = (rng.standard_t(3, (n, m)) * 1e-2).astype(dtype)
    qt = rng.standard_normal((r, m)).astype(dtype)
    if n * m > 10:
        mat[1, 3] = np.nan
    for width in (4, m):
        pc, pg = np.empty((n, r), dtype), np.empty((n, r), dtype)
        assert C.project(ro(mat), qt, pc, width) == G.project(cuda.to_device(mat), qt, pg, width)
        same(pg, pc)
    p = rng.standard_normal((n, r)).astype(dtype)
    qc, qg = np.empty((m, r), dtype), np.empty((m, r), dtype)
    C.back_project(ro(mat), p, qc)  # (the matrix read-only, as the stage passes it)
    G.back_project(cuda.to_device(mat), p, qg)
    same(qg, qc)
    q = rng.standard_normal((m, r)).astype(dtype)
    oc, og = np.empty((n, m), dtype), cuda.device_array((n, m), dtype)
    C.expand(p, np.ascontiguousarray(q.T), oc)
    G.expand(cuda.to_device(p), np.ascontiguousarray(q.T), og)
    same(og.copy_to_host(), oc)
    base = rng.standard_t(2, (n, m)).astype(dtype)
    for mode in (ADD, SUB):  # (added to or subtracted from what out holds, as the CPU's)
        oc, og = base.copy(), cuda.to_device(base)
        C.expand(p, np.ascontiguousarray(q.T), oc, mode)
        G.expand(cuda.to_device(p), np.ascontiguousarray(q.T), og, mode)
        same(og.copy_to_host(), oc)
    w = rng.standard_normal((n + 4, r))
    wc, wg = w.copy(), cuda.to_device(w)
    C.orthogonalize(wc, 1e-10)
    G.orthogonalize(wg, 1e-10)
    same(wg.copy_to_host(), wc)


def test_power_segments_views_matrices_by_address():
    """``power_segments``' twin reads each matrix at its device address (a real device): the
    simulator cannot view one, and says so naming ``addrs``."""
    from codec.errors import CodecTypeError

    like = cuda.device_array(4 * 6, np.float32)
    values = np.zeros(2 * (4 + 6), np.float32)
    one = np.array([0], np.int64)
    with pytest.raises(CodecTypeError, match="addrs"):
        G.power_segments(values, np.array([8], np.int64), like, one, np.array([4]), np.array([6]), np.array([2]), np.zeros(12, np.float32), np.array([0, 12]), 4, 1e-6)
