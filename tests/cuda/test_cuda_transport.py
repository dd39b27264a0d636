"""The transport with device tensors (transport/device.py), in the simulator: the cases of
tests/mpi_device.py on ``COMM_SELF`` in this process, and launched under ``mpiexec -n 2``
(every case, the bytes crossing between host and device counted) and ``-n 4`` (the device
results of a codec of each scheme equal the host's bit for bit)."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numba
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: reference, support, the script

import mpi_device  # noqa: E402
from support.mpi import launch  # noqa: E402

SCRIPT = HERE.parent / "mpi_device.py"
#: the cases each launch runs (each rank pays the simulator's start; 4 ranks share 2 cores)
PLAN = {2: ["codecs", "out", "crossing"], 4: ["schemes"]}

pytestmark = pytest.mark.skipif(not numba.config.ENABLE_CUDASIM, reason="the launched ranks run the simulator (a GPU run: bench_cuda.py)")


@pytest.mark.parametrize("case", ["codecs", "out"])
def test_self(case):
    from mpi4py import MPI

    failures = mpi_device.run_case(MPI.COMM_SELF, case)
    assert not failures, "\n".join(failures)


@functools.lru_cache(maxsize=1)
def _cache_dir() -> str:
    """The launched ranks' own Numba cache, shared by the launches only.  Numba's cache is not
    safe for processes that compile different signatures of one function at once (two
    writers can give one cache file number to two signatures, and a reader then loads the
    other's code): this process's test suite, and the host suite beside it in CI, compile
    other signatures while the ranks start.  It starts as a copy of this process's cache
    (:func:`_seed`), which :func:`test_self` has just filled with the kernels the ranks run:
    unseeded, each rank compiled them all again (the ``-n 2`` launch took 359 s of the
    simulator run's 1,730 beside the host suite, 2026-12-03)."""
    where = tempfile.mkdtemp(prefix="gradcodec-ranks-numba-")
    _seed(Path(where))
    return where


def _seed(dest: Path) -> None:
    """Copy this process's Numba cache into ``dest``, laid out as Numba reads a
    ``NUMBA_CACHE_DIR``: the whole of this process's own ``NUMBA_CACHE_DIR`` when it has one,
    else every ``__pycache__`` of the project's packages and tests that holds cache files, each into the folder
    Numba names for its source folder.  The files are the ones Numba wrote (their source
    stamps still match); one being written meanwhile at worst makes a rank compile it."""
    if numba.config.CACHE_DIR:
        shutil.copytree(numba.config.CACHE_DIR, dest, dirs_exist_ok=True)
        return
    from numba.core.caching import UserProvidedCacheLocator

    root = HERE.parents[1]
    for folder in {i.parent for top in ("codec", "transport", "tests") for i in (root / top).glob("**/__pycache__/*.nbi")}:
        into = dest / UserProvidedCacheLocator.get_suitable_cache_subpath(str(folder.parent / "x.py"))
        into.mkdir()
        for f in folder.glob("*.nb[ic]"):
            shutil.copy2(f, into / f.name)


@functools.lru_cache(maxsize=None)
def launched(p: int):
    env = {"NUMBA_ENABLE_CUDASIM": "1", "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", ""), "NUMBA_CACHE_DIR": _cache_dir()}
    run = launch(SCRIPT, p, *PLAN[p], timeout=600, env=env)
    if run.hung:
        pytest.fail(run.report(["did not finish in 600 s (hung)"], tail=4000))
    return run


@pytest.mark.parametrize("p,case", [(p, c) for p, cases in PLAN.items() for c in cases], ids=lambda v: f"np{v}" if isinstance(v, int) else v)
def test_launched(p, case):
    run = launched(p)
    problems = run.problems(case)
    assert not problems, run.report(problems)
