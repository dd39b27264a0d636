"""The ``spectral`` family's CUDA twin, in the simulator.

* ``rfft`` / ``irfft`` (a Numba FFT: radix-2 Stockham, Bluestein for other lengths) against
  scipy's transforms in float64 of the same values, within the bound docs/kernels.md gives
  ("The FFT on the device"): per row, ``||got - want||_2 <= bound(L, dtype) * ||want||_2``,
  an all-zero row exactly zero.  Lengths: 1, powers of two, odd and even others (Bluestein),
  float32 and float64, normal, heavy-tailed and zero rows.
* ``rfft_rows`` / ``irfft_rows`` (rows of several lengths, one launch): each part as ``rfft``
  / ``irfft`` of it alone, bit for bit.
* ``magnitudes``, ``block_top`` and ``place`` against the CPU kernels for the same spectrum,
  bit for bit (ties at every cut, k = 0 and k = c, NaN and infinite rows flagged); the CPU
  kernels are checked against NumPy references in tests/test_spectral.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.fft
from numba import cuda

from codec.dtypes import readonly as ro
from codec.kernels import module
from codec.kernels.cuda import _fft as F  # the twin's FFT (its ROW_M)
from test_spectral import ROW_PARTS, _block_top, _kernel_rows, check_rows

G, C = module("spectral", "cuda"), module("spectral", "cpu")


def bound(length: int, dtype) -> float:
    """The rounding bound the device FFT holds (docs/kernels.md): ``8 eps log2(2m)`` of the
    power-of-two length ``m`` it runs, three times that through Bluestein's three passes."""
    m = length if length & (length - 1) == 0 else 1 << (2 * length - 2).bit_length()
    passes = 1 if m == length else 3
    return 8 * passes * float(np.finfo(dtype).eps) * np.log2(2 * m)


def rows_of(rows: int, length: int, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, length])
    x = np.empty((rows, length))
    for r in range(rows):
        kind = r % 3
        x[r] = rng.standard_normal(length) if kind == 0 else rng.standard_t(1.5, length) * 1e-3 if kind == 1 else 0.0
    return x.astype(dtype)


def within(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    for r in range(want.shape[0]):
        err = np.linalg.norm(got[r] - want[r])
        scale = np.linalg.norm(want[r])
        assert err <= tol * scale, f"{what}, row {r}: relative error {err / max(scale, 1e-300):.3g} above {tol:.3g}"


@pytest.mark.parametrize("dtype", (np.float32, np.float64), ids=("f32", "f64"))
@pytest.mark.parametrize("length,row_m", [(n, F.ROW_M) for n in (1, 2, 8, 3, 12, 37)] + [(8, 0), (37, 0)], ids=lambda v: str(v) if v else "pass-per-launch")
def test_transforms_within_the_bound(length, row_m, dtype, monkeypatch):
    """One launch per transform (rows up to ``ROW_M``), and a launch per pass (``ROW_M`` 0)."""
    monkeypatch.setattr(F, "ROW_M", row_m)
    x = rows_of(3, length, dtype, seed=1)
    c = length // 2 + 1
    got = G.rfft(cuda.to_device(x)).copy_to_host()
    assert got.dtype == dtype and got.shape == (3, 2 * c)
    want = scipy.fft.rfft(x.astype(np.float64), axis=1)
    tol = bound(length, dtype)
    within(got.astype(np.float64).view(np.complex128), want, tol, f"rfft of {length}")
    assert not got[2].any()  # a zero row: exactly zero
    spec = want.copy()
    spec[:, 0] += 0.25j  # the imaginary parts an inverse ignores
    if length % 2 == 0:
        spec[:, -1] -= 0.5j
    half = np.empty((3, 2 * c), dtype)
    half[:, 0::2], half[:, 1::2] = spec.real, spec.imag
    back = G.irfft(cuda.to_device(half), length).copy_to_host()
    assert back.dtype == dtype and back.shape == (3, length)
    within(back.astype(np.float64), scipy.fft.irfft(half.astype(np.float64).view(np.complex128), n=length, axis=1), tol, f"irfft of {length}")
    assert np.array_equal(C.rfft(x), scipy.fft.rfft(x, axis=1).view(dtype))  # the CPU family's is scipy's


@pytest.mark.parametrize("row_m", (F.ROW_M, 8), ids=("one-launch", "long-rows"))
def test_rows_of_several_lengths_at_once(row_m, monkeypatch):
    """``rfft_rows``/``irfft_rows``: every part's rows as ``rfft``/``irfft`` of the part alone
    give them, bit for bit, in one launch (and, with ``ROW_M`` 8, the rows beyond it through
    the launch-per-pass path, beside the others)."""
    monkeypatch.setattr(F, "ROW_M", row_m)
    check_rows(G, np.float32, ROW_PARTS)
    check_rows(G, np.float64, ROW_PARTS[:3])


def test_no_rows():
    assert G.rfft(cuda.device_array((0, 5), np.float32)).shape == (0, 6)
    assert G.irfft(cuda.device_array((0, 6), np.float64), 11).shape == (0, 11)


@pytest.mark.parametrize("dtype, c", [(np.float32, 9), (np.float64, 9), (np.float32, 70)], ids=("f32", "f64", "f32-long"))
def test_selection_matches_the_cpu_kernels(dtype, c):
    """Rows of 9 coefficients (a thread each) and of 70 (a block each, the select twin's radix
    select)."""
    rows = 5
    spec = _kernel_rows(dtype, rows, c, seed=4)
    d = cuda.to_device(spec)
    for k in (0, 1, c // 2, c):
        want = _block_top(C.block_top, spec, k, 100)
        got = _block_top(lambda s, *a: G.block_top(d, *a), spec, k, 100)
        for g, w in zip(got, want):
            assert np.array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}")), k
        pos, vals, _ = want
        out = cuda.to_device(np.full((rows, 2 * c), 7, dtype))
        G.place(out, 100, pos, vals)
        host = np.full((rows, 2 * c), 7, dtype)
        C.place(host, 100, ro(pos), ro(vals))  # (inputs read-only, as the stage passes them)
        assert np.array_equal(out.copy_to_host(), host)
    mag_c, mag_g = np.empty(rows * c), np.empty(rows * c)
    spec[1, 3], spec[3, 0] = np.nan, np.inf
    bad_c, bad_g = np.zeros(rows, np.uint8), np.zeros(rows, np.uint8)
    C.magnitudes(ro(spec), mag_c, bad_c)
    G.magnitudes(cuda.to_device(spec), mag_g, bad_g)
    assert bad_g.tolist() == bad_c.tolist() == [0, 1, 0, 1, 0]
    assert np.array_equal(mag_g, mag_c, equal_nan=True)
    bad = np.zeros(rows, np.uint8)
    G.block_top(cuda.to_device(spec), 2, 0, np.empty(2 * rows, np.int64), np.empty(4 * rows, dtype), bad)
    assert bad.tolist() == [0, 1, 0, 1, 0]
