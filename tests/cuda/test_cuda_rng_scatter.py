"""The rng and scatter families' CUDA twins: the random bits through a kernel equal the CPU's
(which tests/test_quant_kernels.py checks against its NumPy reference), and scatter against
NumPy, every mode and dtype, on small sizes in the simulator."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import cuda

from codec.dtypes import readonly as ro
from codec.kernels import module
from codec.modes import ADD, SET, SUB

R = module("rng", "cuda")
RC = module("rng", "cpu")
S = module("scatter", "cuda")


@cuda.jit
def _draw(strms, idx, keys, bits, unif, mixed, streams):
    """Each thread: block_key, bits32, uniform, mix and stream of its case."""
    t = cuda.grid(1)
    if t < idx.size:
        k = R.block_key(strms[t], idx[t])
        keys[t] = k
        bits[t] = R.bits32(k, idx[t])
        unif[t] = R.uniform(k, idx[t])
        mixed[t] = R.mix(strms[t])
        streams[t] = R.stream(strms[t], idx[t], numba.uint64(t))


def test_random_bits_match_the_cpu():
    rng = np.random.default_rng(3)
    n = 300
    strms = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    idx = np.concatenate([np.array([0, 1, 65535, 65536, 65537, 131071, 131072, 2**40 + 5], np.uint64), rng.integers(0, 2**41, n - 8, dtype=np.uint64)])
    keys, bits = np.zeros(n, np.uint32), np.zeros(n, np.uint32)
    unif, mixed, streams = np.zeros(n), np.zeros(n, np.uint64), np.zeros(n, np.uint64)
    _draw[2, 256](strms, idx, keys, bits, unif, mixed, streams)
    for t in range(n):
        k = np.uint32(RC.block_key(strms[t], idx[t]))
        assert keys[t] == k
        assert bits[t] == np.uint32(RC.bits32(k, idx[t]))
        assert unif[t] == RC.uniform(k, idx[t])
        assert mixed[t] == np.uint64(RC.mix(strms[t]))
        assert streams[t] == np.uint64(RC.stream(strms[t], idx[t], np.uint64(t)))


def test_twins_define_the_cpu_contracts():
    for fam in ("rng", "scatter"):
        cpu, twin = module(fam, "cpu"), module(fam, "cuda")
        assert sorted(twin.__all__) == sorted(cpu.__all__)
        for name in cpu.__all__:
            assert callable(getattr(twin, name)), (fam, name)


@pytest.mark.parametrize("mode", (SET, ADD, SUB))
@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n,k", [(0, 0), (1, 0), (1, 1), (7, 3), (700, 257), (700, 700)])
def test_scatter_matches_numpy(n, k, dtype, mode):
    rng = np.random.default_rng(n + k)
    idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int64) if n else np.zeros(0, np.int64)
    values = (rng.standard_t(2, k) * 10.0 ** rng.integers(-5, 5, k)).astype(dtype)
    base = rng.standard_normal(n).astype(dtype)
    want = np.zeros(n, dtype) if mode == SET else base.copy()
    if mode == SET:
        want[idx] = values
    elif mode == ADD:
        want[idx] += values
    else:
        want[idx] -= values
    out = cuda.to_device(base)
    S.scatter(cuda.to_device(values), cuda.to_device(idx), out, mode)
    got = out.copy_to_host()
    assert np.array_equal(got.view(f"u{np.dtype(dtype).itemsize}"), want.view(f"u{np.dtype(dtype).itemsize}"))


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n,k", [(1, 0), (1, 1), (7, 3), (700, 257)])
def test_gather_matches_numpy(n, k, dtype):
    rng = np.random.default_rng(n + k)
    src = (rng.standard_t(2, n) * 10.0 ** rng.integers(-5, 5, n)).astype(dtype)
    idx = rng.choice(n, k, replace=False).astype(np.int64)  # unsorted
    out = cuda.device_array(k, dtype)
    S.gather(cuda.to_device(src), cuda.to_device(idx), out)
    assert out.copy_to_host().tobytes() == src[idx].tobytes()


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_put_leaves_the_rest(dtype):
    rng = np.random.default_rng(2)
    base = rng.standard_normal(300).astype(dtype)
    idx = rng.choice(300, 40, replace=False).astype(np.int64)
    values = rng.standard_normal(40).astype(dtype)
    want = base.copy()
    want[idx] = values
    out = cuda.to_device(base)
    S.put(cuda.to_device(values), cuda.to_device(idx), out)
    assert out.copy_to_host().tobytes() == want.tobytes()


def test_index_scatter_segments_refuses_as_the_cpu_kernel():
    """``index_scatter_segments``' twin checks and reads a frame's index sections on the host
    with the CPU kernels: a refused section names the same tensor, nothing written; a frame it
    takes is written through ``scatter_segments``, which views arrays by device address (the
    simulator cannot, and says so naming ``addrs``)."""
    from codec.errors import CodecTypeError
    from codec.pack import encode_indices

    C = module("scatter", "cpu")
    sizes = [5, 9]
    picks = [np.array([1, 4]), np.array([0, 2, 8])]
    raws = [np.frombuffer(bytes(encode_indices(p, n).data), np.uint8) for p, n in zip(picks, sizes)]
    secs = [encode_indices(p, n) for p, n in zip(picks, sizes)]
    vals = [np.arange(p.size, dtype=np.float32) + 1 for p in picks]
    data = np.concatenate([raws[0], vals[0].view(np.uint8), raws[1], vals[1].view(np.uint8)])
    at0 = raws[0].size + vals[0].nbytes
    table = np.array([(int(secs[0].kind), secs[0].bits, secs[0].count, 0, raws[0].size), (int(secs[1].kind), secs[1].bits, secs[1].count, at0, raws[1].size)], np.int64)
    values_at = np.array([raws[0].size, at0 + raws[1].size], np.int64)
    starts = np.array([0, 5, 14], np.int64)
    host = np.zeros(14, np.float32)
    addrs = np.array([host.ctypes.data, host.ctypes.data + 20], np.int64)
    like = cuda.device_array(14, np.float32)
    for counts in (np.array([2, 4]), np.array([3, 3])):
        inputs = [ro(a) for a in (data, table, values_at, counts, addrs, starts)]  # (read-only, as the decode passes them)
        want = C.index_scatter_segments(*inputs, host)
        assert want >= 0 and S.index_scatter_segments(*inputs, like) == want
    with pytest.raises(CodecTypeError, match="addrs"):
        S.index_scatter_segments(data, table, values_at, np.array([2, 3]), addrs, starts, like)
