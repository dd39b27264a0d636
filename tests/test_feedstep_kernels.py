"""The ``feedstep`` kernel family (codec/kernels/cpu/feedstep.py, host only) against NumPy
references: every tensor's ``acc = x + residual`` (``add_segments``), the pass-through
tensors copied into a frame's values and subtracted from themselves (``pass_segments``),
PowerSGD's warm starting ``Q``s orthonormalised and laid out transposed with their zero
columns flagged (``warm_starts``, against the reference Gram-Schmidt of
tests/reference/lowrank.py); both compilations of the parallel kernels, float32 and float64,
sizes 0, 1, odd and past a chunk, heavy tails, NaN and inf."""

from __future__ import annotations

import numpy as np
import pytest

from codec.kernels import module
from codec.layout import CHUNK
from codec.ops import offsets
from codec.testing import assert_identical
from reference import lowrank as ref

K = module("feedstep")
SIZES = [0, 1, 333, CHUNK + 7, 0, 2 * CHUNK - 1, 5]
DTYPES = [np.float32, np.float64]


def heavy(rng, n, dtype):
    """Student-t(2) values over six decades, with a NaN, an inf and a -inf where they fit."""
    x = rng.standard_t(2, n) * 10.0 ** rng.integers(-3, 3, n)
    x[: min(n, 3)] = [np.nan, np.inf, -np.inf][: min(n, 3)]
    return rng.permutation(x).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("twin", ["serial", "parallel"])
def test_add_segments_is_x_plus_residual_of_every_tensor(dtype, twin):
    rng = np.random.default_rng(1)
    xs = [heavy(rng, n, dtype) for n in SIZES]
    rs = [heavy(rng, n, dtype) for n in SIZES]
    accs = [np.full(n, 7, dtype) for n in SIZES]
    addr = lambda arrays: np.array([a.ctypes.data for a in arrays], np.int64)  # noqa: E731
    getattr(K.add_segments, twin)(addr(xs), addr(rs), addr(accs), offsets(SIZES), np.empty(0, dtype))
    for x, r, a in zip(xs, rs, accs):
        with np.errstate(invalid="ignore"):
            assert_identical(a, x + r)
    empty = np.zeros(0, np.int64)
    getattr(K.add_segments, twin)(empty, empty, empty, np.zeros(1, np.int64), np.empty(0, dtype))  # (no tensors)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("twin", ["serial", "parallel"])
def test_pass_segments_copies_each_acc_into_the_values_and_leaves_acc_minus_it(dtype, twin):
    rng = np.random.default_rng(2)
    accs = [heavy(rng, n, dtype) for n in SIZES]
    before = [a.copy() for a in accs]
    gaps = rng.integers(0, 9, len(SIZES))  # (other sections between them, left as they are)
    vstarts = np.cumsum(gaps + np.array([0, *SIZES[:-1]])).astype(np.int64)
    values = rng.standard_normal(int(vstarts[-1]) + SIZES[-1] + 4).astype(dtype)
    want = values.copy()
    for v, a in zip(vstarts, before):
        want[v : v + a.size] = a
    getattr(K.pass_segments, twin)(values, vstarts, np.array([a.ctypes.data for a in accs], np.int64), offsets(SIZES), np.empty(0, dtype))
    assert_identical(values, want)
    for a, b in zip(accs, before):
        with np.errstate(invalid="ignore"):
            assert_identical(a, b - b)  # (zero, NaN where b is not finite)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_warm_starts_are_each_q_orthonormalised_and_laid_out_transposed(dtype):
    """Each last ``Q`` (``m x r``) becomes the reference's orthonormalised ``Q`` transposed
    (``r x m``) at its offset; a ``Q`` whose orthonormalised columns include a zero one
    (a zero column, a dependent one, all zero) is flagged; address 0 leaves its place as it
    is."""
    rng = np.random.default_rng(3)
    qs = [rng.standard_normal((m, r)) * 10.0 ** rng.integers(-3, 3) for m, r in [(1, 1), (9, 4), (37, 3), (300, 2), (5, 5)]]
    qs[1][:, 2] = 0  # (a zero column)
    qs[2][:, 1] = 3 * qs[2][:, 0]  # (a dependent column)
    qs.append(np.zeros((6, 2)))  # (all zero)
    qs.append(rng.standard_t(2, (12, 3)))  # (not handed over: address 0)
    qs = [q.astype(dtype) for q in qs]
    ms, rs = (np.array(col, np.int64) for col in zip(*[q.shape for q in qs]))
    qstarts = offsets([q.size for q in qs])
    qts = np.full(int(qstarts[-1]), 5, dtype)
    addrs = np.array([q.ctypes.data for q in qs[:-1]] + [0], np.int64)
    tiny = float(16 * np.finfo(dtype).eps)
    zero = K.warm_starts(addrs, np.empty(0, dtype), ms, rs, qts, qstarts, tiny)
    for t, q in enumerate(qs[:-1]):
        o = ref.orthogonalize(q)
        assert_identical(qts[qstarts[t] : qstarts[t + 1]], np.ascontiguousarray(o.T).reshape(-1))
        assert zero[t] == (not np.all(np.any(o != 0, axis=0))), t
    assert list(zero) == [0, 1, 1, 0, 0, 1, 0]
    assert (qts[qstarts[-2] :] == 5).all()
    got = K.warm_starts(np.zeros(0, np.int64), np.empty(0, dtype), np.zeros(0, np.int64), np.zeros(0, np.int64), qts[:0], np.zeros(1, np.int64), tiny)
    assert got.size == 0
