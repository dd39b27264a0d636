"""The ``randomk`` family's CUDA twin against its CPU kernels, value for value, in the
simulator: one tensor's draws in draw order and sorted (a bitmap read back in order), and a
run's segments (one bitmap over the concatenated tensors), at sizes that are and are not
powers of four (the Feistel permutation cycle-walks), k from 1 to n, one-element and empty
segments.  The CPU kernels are checked against a NumPy reference in tests/test_sparse.py."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from codec.kernels import module

G, C = module("randomk", "cuda"), module("randomk", "cpu")
U = np.uint64


def half(n):
    return U((max(2, (n - 1).bit_length()) + 1) // 2)


@pytest.mark.parametrize("n", (2, 3, 16, 17, 1000))
def test_one_tensor(n):
    for k in sorted({1, n // 3 or 1, n}):
        args = (U(7), U(0xDEADBEEF12345678), U(3), half(n), n)
        want = np.empty(k, np.int64)
        C.random_positions(want, *args)
        got = np.empty(k, np.int64)
        G.random_positions(got, *args)
        assert np.array_equal(got, want), (n, k)
        dev = cuda.device_array(k, np.int64)
        G.sorted_positions(dev, *args)
        C.sorted_positions(want, *args)
        assert np.array_equal(dev.copy_to_host(), want) and np.array_equal(want, np.sort(got)), (n, k)


def test_segments():
    sizes = np.array([5, 1, 0, 64, 300, 2, 33], np.int64)
    ks = np.array([2, 1, 0, 64, 30, 1, 11], np.int64)
    kstarts = np.zeros(ks.size + 1, np.int64)
    np.cumsum(ks, out=kstarts[1:])
    seeds = np.full(ks.size, 9, np.uint64)
    khashes = np.arange(ks.size, dtype=np.uint64) * U(0x9E3779B97F4A7C15)
    steps = np.array([0, 1, 2, 3, 4, 5, 1 << 40], np.uint64)
    want = np.empty(int(kstarts[-1]), np.int64)
    C.random_positions_segments(want, kstarts, sizes, seeds, khashes, steps)
    for out in (np.empty_like(want), cuda.device_array(want.size, np.int64)):
        G.random_positions_segments(out, kstarts, sizes, seeds, khashes, steps)
        got = out if isinstance(out, np.ndarray) else out.copy_to_host()
        assert np.array_equal(got, want)


def test_scatter_segments_draws_the_cpu_kernels_positions():
    """``random_scatter_segments``'s twin draws the run's positions as the CPU kernel does
    (each tensor's own, plus its start in the run), then writes through the ``scatter``
    twin's ``scatter_segments``, which views arrays by device address: the simulator
    cannot, and says so naming ``addrs``."""
    from codec.errors import CodecTypeError

    sizes = np.array([5, 1, 0, 64, 300, 2], np.int64)
    ks = np.array([2, 1, 0, 64, 30, 1], np.int64)
    kstarts, starts = (np.concatenate([[0], np.cumsum(a)]).astype(np.int64) for a in (ks, sizes))
    keys = (np.full(ks.size, 9, U), np.arange(ks.size, dtype=U) * U(0x9E3779B97F4A7C15), np.arange(ks.size, dtype=U))
    want = np.empty(int(kstarts[-1]), np.int64)
    C.random_positions_segments(want, kstarts, sizes, *keys)
    got = cuda.device_array(want.size, np.int64)
    G._run_positions(got, kstarts, sizes, *keys)
    assert np.array_equal(got.copy_to_host(), want + np.repeat(starts[:-1], ks))
    outs = cuda.device_array(int(starts[-1]), np.float32)
    with pytest.raises(CodecTypeError, match="addrs"):
        G.random_scatter_segments(np.ones(want.size, np.float32), kstarts, sizes, *keys, np.zeros(sizes.size, np.int64), starts, outs, 0)
