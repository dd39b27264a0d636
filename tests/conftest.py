"""Shared test fixtures: a correctly rounded reference for the 16-bit float formats, and the
kernel backends the kernel tests run against."""

from __future__ import annotations

import os
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

# The suite compiles at Numba's default optimisation level unless one is set: codec._jit
# raises it to "max" (a kernel compiled in its own process then runs at the cached speed),
# which no value depends on (no fastmath) and which cost a fresh clone's run 15-16 -> 19-20
# minutes, most of it compiling (tests/README.md, "Where the time goes"). test_jit checks
# the library's setting; subprocesses (the simulator's run, launched ranks) inherit this one.
os.environ.setdefault("NUMBA_OPT", "3")

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
# significand bits (implicit one included), exponent of the subnormal quantum, first overflowing magnitude
FORMATS = {F16: (11, -24, 2.0**16), BF16: (8, -133, 2.0**128)}
QNAN = {F16: 0x7E00, BF16: 0x7FC0}


def round16(x, dtype) -> np.ndarray:
    """uint16 codes of float64 ``x`` rounded to nearest, ties to even, in ``dtype`` (float16/bfloat16).

    Pure NumPy: scale by the quantum at each value's binade (exact: a power of two), ``np.rint``
    (round half to even, exact on float64), scale back.  NaN gives the canonical quiet NaN.
    """
    dtype = np.dtype(dtype)
    p, qmin, top = FORMATS[dtype]
    x = np.asarray(x, np.float64).reshape(-1)
    with np.errstate(all="ignore"):
        _, e = np.frexp(x)
        q = np.maximum(e - p, qmin).astype(np.int32)
        v = np.ldexp(np.rint(np.ldexp(x, -q)), q)
        v = np.where(np.abs(v) >= top, np.copysign(np.inf, x), v)
    nan = np.isnan(x)
    v[nan] = 0.0
    if dtype == F16:
        codes = v.astype(np.float16).view(np.uint16).copy()
    else:
        codes = (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    codes[nan] = QNAN[dtype]
    return codes


def round_exact(q: Fraction, dtype) -> float:
    """Rational ``q`` rounded to nearest, ties to even, in ``dtype`` (float16/bfloat16/float32): a float."""
    p, qmin, top = {**FORMATS, np.dtype(np.float32): (24, -149, 2.0**128)}[np.dtype(dtype)]
    a = abs(q)
    if a == 0:
        return 0.0
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2**e <= a < 2**(e+1), after the fix-up
    e = e - 1 if Fraction(2) ** e > a else e
    e = e + 1 if Fraction(2) ** (e + 1) <= a else e
    quantum = Fraction(2) ** max(e + 1 - p, qmin)
    v = float(round(a / quantum) * quantum)  # Fraction.__round__ rounds half to even
    v = float("inf") if v >= top else v
    return -v if q < 0 else v


@pytest.fixture(scope="session")
def exact_round():
    """The :func:`round_exact` reference (exact rational arithmetic)."""
    return round_exact


@pytest.fixture(scope="session")
def ref16():
    """The :func:`round16` reference (a fixture so every test module shares one definition)."""
    return round16


#: the kernel backends every kernel test runs against: a test that takes ``backend`` gets its
#: family's module as ``codec.kernels.module(family, backend)``.  The CUDA twins are tested
#: by tests/cuda/ (small sizes: the simulator runs a few thousand threads a second).
BACKENDS = ["cpu"]

#: tests/cuda/ needs Numba's CUDA target chosen before it is imported: it runs in a process of
#: its own (tests/test_cuda_simulator.py starts it with NUMBA_ENABLE_CUDASIM=1), or on a GPU
#: with GRADCODEC_CUDA_TESTS=1
collect_ignore = [] if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("GRADCODEC_CUDA_TESTS") == "1" else ["cuda"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    """The name of a kernel backend ("cpu"; later also "cuda"), for
    ``codec.kernels.module(family, backend)``."""
    return request.param


def pytest_collection_modifyitems(session, config, items):
    """tests/test_cuda_simulator.py's tests wait for the simulator run of tests/cuda, a process
    of its own that goes on beside the rest of the suite (``test_cuda_simulator.start``).

    Run by pytest-xdist's workers (the suite's default, ``-n 2 --dist loadfile`` in
    pyproject.toml): the module goes first, so a worker takes it at once and starts the run
    in its fixture, while the other worker goes on with the rest (xdist's own order, by
    number of tests, would put this module near the end).  In one process
    (``-n 0``): the run starts now and the module goes last."""
    sim = [i for i in items if i.path.name == "test_cuda_simulator.py"]
    if not sim:
        return
    rest = [i for i in items if i.path.name != "test_cuda_simulator.py"]
    config.stash[_SIMULATOR] = sim[0].module
    if hasattr(config, "workerinput"):  # (xdist keeps this order: --no-loadscope-reorder)
        items[:] = sim + rest
    else:
        items[:] = rest + sim
        sim[0].module.start()


_SIMULATOR = pytest.StashKey()


def pytest_sessionfinish(session, exitstatus):
    """The simulator run ended (if the session stopped before its tests) and its folder gone."""
    module = session.config.stash.get(_SIMULATOR, None)
    if module is not None:
        module.stop()
