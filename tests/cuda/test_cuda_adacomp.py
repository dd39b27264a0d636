"""The ``adacomp`` family's CUDA twin against its CPU kernels (which tests/test_select_kernels.py
checks against NumPy): the bins' maxima, each chunk's sends (positions and values) in its
row, the counts and the non-finite counts, with and without forming ``g = r + dw``, over
several chunks with rows small enough to overflow; and adacomp through device arrays."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import codec
from codec.dtypes import readonly
from codec.errors import NonFiniteError
from codec.kernels import module
from codec.kernels.cuda import _common

G = module("adacomp", "cuda")
C = module("adacomp", "cpu")


def run(kern, put, dw, r, g, length, per_chunk, nchunk, cap, form):
    dtype = dw.dtype
    nb = -(-dw.size // length)
    arrs = [put(np.zeros((nchunk, cap), np.int64)), put(np.zeros((nchunk, cap), dtype)), put(np.zeros(nchunk, np.int64)),
            put(np.zeros(nchunk, np.int64)), put(np.zeros(nb, dtype))]
    chunks = np.array([0, nchunk])
    inp = put if kern is G else readonly  # (the CPU kernel's inputs read-only, as the stages pass them: one signature a dtype)
    if form:
        kern.feedback_adacomp_bins(inp(dw), inp(r), g, length, per_chunk, chunks, *arrs)
    else:
        kern.adacomp_bins(inp(dw), inp(g), length, per_chunk, chunks, *arrs)
    return [a if isinstance(a, np.ndarray) else a.copy_to_host() for a in arrs + [g]]


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_bin_sums_match_the_cpu_kernel(monkeypatch, dtype):
    """Each tensor's maxima added on the device as np.sum adds them on the host: sizes 0, 1,
    7, a leaf and one more, and several of NumPy's buffers (made small here: the simulator
    runs 8,192 values a thread slowly), into a host and a device ``out``."""
    from codec.kernels.cpu import adacomp as cpu

    monkeypatch.setattr(cpu, "NP_BUFFER", 300)  # (both backends read it at the call)
    rng = np.random.default_rng(9)
    sizes = [0, 1, 7, 128, 129, 301, 905]
    x = np.abs(rng.standard_t(1, sum(sizes)) * 10.0 ** rng.integers(-6, 6, sum(sizes))).astype(dtype)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    want = np.empty(len(sizes))
    C.bin_sums(x, starts, want)
    got = np.full(len(sizes), np.nan)
    G.bin_sums(cuda.to_device(x), starts, got)
    assert got.tobytes() == want.tobytes()
    on_device = cuda.to_device(np.zeros(len(sizes)))
    G.bin_sums(cuda.to_device(x), starts, on_device)
    assert on_device.copy_to_host().tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n,length,per_chunk", [(0, 5, 2), (1, 5, 2), (37, 5, 2), (301, 7, 5), (300, 50, 2)])
@pytest.mark.parametrize("form", (False, True), ids=("g", "r+dw"))
def test_bins_match_the_cpu_kernel(monkeypatch, n, length, per_chunk, dtype, form):
    monkeypatch.setattr(_common, "SCAN_ITEMS", 3)  # several stretches per chunk
    rng = np.random.default_rng(n + length)
    dw = (rng.standard_t(2, n) * 10.0 ** rng.integers(-3, 3, n)).astype(dtype)
    dw[::11] = 0  # zeros are never sent
    r = rng.standard_normal(n).astype(dtype)
    g0 = dw.copy() if not form else np.zeros(n, dtype)
    nchunk = -(-(-(-n // length)) // per_chunk)
    cap = 3  # most chunks send more: their counts say how many
    cpu = run(C, np.asarray, dw, r, g0.copy(), length, per_chunk, nchunk, cap, form)
    dev = run(G, cuda.to_device, dw, r, cuda.to_device(g0), length, per_chunk, nchunk, cap, form)
    counts = cpu[2]
    assert np.array_equal(dev[2], counts) and np.array_equal(dev[3], cpu[3])
    for c in range(nchunk):
        m = min(cap, int(counts[c]))
        assert np.array_equal(dev[0][c, :m], cpu[0][c, :m]) and np.array_equal(dev[1][c, :m], cpu[1][c, :m]), c
    assert np.array_equal(dev[4], cpu[4])  # the bins' maxima
    assert np.array_equal(dev[5], cpu[5])  # g (formed under error feedback)


def test_nonfinite_values_are_counted_not_sent():
    dw = np.linspace(-1, 1, 40).astype(np.float32)
    dw[[3, 17, 33]] = [np.nan, np.inf, -np.inf]
    cpu = run(C, np.asarray, dw, dw, dw.copy(), 8, 2, 3, 40, False)
    dev = run(G, cuda.to_device, dw, dw, cuda.to_device(dw), 8, 2, 3, 40, False)
    assert dev[3].sum() == cpu[3].sum() == 3
    assert np.array_equal(dev[3], cpu[3]) and np.array_equal(dev[2], cpu[2])


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("spec,shape", [("adacomp", (300,)), ("adacomp", (4, 3, 30)), ("adacomp(bin=7)+zstd", (301,)), ("adacomp", (0,)), ("adacomp", (1,))])
def test_adacomp_through_device_arrays_matches_the_host(spec, shape, dtype):
    rng = np.random.default_rng(len(shape))
    x = rng.standard_t(2, int(np.prod(shape))).astype(dtype).reshape(shape)
    c = codec.get_codec(spec)
    frame = c.encode(cuda.to_device(x))
    assert bytes(frame) == bytes(c.encode(x))
    out = cuda.device_array(shape, dtype)
    c.decode(frame, out=out)
    assert np.array_equal(out.copy_to_host(), c.decode(frame))
    on_dev, on_host = codec.ErrorFeedback(spec), codec.ErrorFeedback(spec)
    for step in range(3):
        xs = (x * (step + 1)).astype(dtype)
        assert bytes(on_dev.encode(cuda.to_device(xs), key="k")) == bytes(on_host.encode(xs, key="k")), step
        if x.size:
            assert np.array_equal(on_dev.residual("k").copy_to_host(), on_host.residual("k")), step


def test_adacomp_nonfinite_on_the_device_names_the_position():
    x = np.ones(200, np.float32)
    x[77] = np.nan
    with pytest.raises(NonFiniteError, match=r"position \(77,\)"):
        codec.get_codec("adacomp").encode(cuda.to_device(x))


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_segments_match_the_cpu_kernel(monkeypatch, dtype):
    """Segments of 0 to 120 values with their own bin lengths, one holding a NaN, tested
    against a gradient of their own: the same maxima, sends (relative positions and values),
    counts and NaN/inf counts."""
    monkeypatch.setattr(_common, "SCAN_ITEMS", 3)
    rng = np.random.default_rng(3)
    sizes = [0, 1, 17, 120, 33, 8]
    lengths = np.array([5, 5, 4, 50, 7, 3], np.int64)
    x = (rng.standard_t(2, sum(sizes)) * 10.0 ** rng.integers(-3, 3, sum(sizes))).astype(dtype)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    x[starts[4] + 2] = np.nan
    dw = (x + rng.standard_normal(x.size)).astype(dtype)  # (g = x beside a gradient of its own: error feedback's test)
    bstarts = np.concatenate([[0], np.cumsum(-(-np.array(sizes) // lengths))]).astype(np.int64)
    res = {}
    for name, kern, put in (("cpu", C, np.asarray), ("cuda", G, cuda.to_device)):
        arrs = [put(np.full(x.size, -1, np.int64)), put(np.zeros(x.size, dtype)), put(np.zeros(len(sizes), np.int64)),
                put(np.zeros(len(sizes), np.int64)), put(np.zeros(bstarts[-1], dtype))]
        inp = put if kern is G else readonly  # (read-only inputs, as run's)
        kern.adacomp_segments(inp(dw), inp(x), put(starts), put(lengths), put(bstarts), *arrs)
        res[name] = [a if isinstance(a, np.ndarray) else a.copy_to_host() for a in arrs]
    pos, vals, counts, bad, gmax = res["cpu"]
    assert np.array_equal(res["cuda"][2], counts) and np.array_equal(res["cuda"][3], bad) and bad.tolist() == [0, 0, 0, 0, 1, 0]
    for s, (lo, n) in enumerate(zip(starts[:-1], counts)):
        if not bad[s]:
            assert np.array_equal(res["cuda"][0][lo : lo + n], pos[lo : lo + n]) and np.array_equal(res["cuda"][1][lo : lo + n], vals[lo : lo + n]), s
    keep = np.concatenate([np.arange(bstarts[s], bstarts[s + 1]) for s in range(len(sizes)) if not bad[s]])
    assert np.array_equal(res["cuda"][4][keep], gmax[keep])
