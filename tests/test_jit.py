"""The jit wrapper: project options, and serial/parallel twins that agree bit for bit."""

import numpy as np
import pytest

from codec import _jit
from codec.kernels.cpu import convert, pack, scatter
from codec.ops import lut


def test_fastmath_is_refused():
    with pytest.raises(ValueError, match="fastmath"):
        _jit.jit(fastmath=True)


def test_parallel_kernels_pick_by_size_and_both_twins_agree():
    n = _jit.PARALLEL_MIN + 12_345
    rng = np.random.default_rng(0)
    x = (rng.standard_t(2, n) * 1e-3).astype(np.float32)
    runs = []
    for twin in ("serial", "parallel"):
        codes = np.empty(n, np.uint16)
        bad = getattr(convert.narrow_codes, twin)(x, codes, False)
        dec = np.empty(n, np.float64)
        getattr(convert.lut_decode, twin)(codes, lut(np.float16), dec, 0)
        packed = np.zeros((n * 11 + 7) // 8, np.uint8)
        getattr(pack._pack, twin)(codes.view(np.uint8), 2, 11, packed)
        out = np.ones(n, np.float32)
        idx = np.flatnonzero(np.abs(x) > 1e-3)
        getattr(scatter.scatter, twin)(x[idx], idx, out, 1)
        runs.append((bad, codes.tobytes(), dec.tobytes(), packed.tobytes(), out.tobytes()))
    assert runs[0] == runs[1]
