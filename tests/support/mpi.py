"""The one MPI harness of tests/mpi_*.py: every case runs on ``COMM_SELF`` inside pytest and on
``COMM_WORLD`` under ``mpiexec``.

In a rank (the scripts, and the pytest process for p = 1):

* a case is a function ``case(comm, ck)`` of a communicator and a :class:`Checks` (a script
  may subclass it for its own helpers);
* failed checks are collected, never raised (an assertion on one rank would leave the others
  waiting in a collective);
* :func:`main` runs the cases named on the command line on ``COMM_WORLD`` and prints, per case
  and rank, ``FAIL <case> rank r/p: <message>`` for each failed check or
  ``OK <case> rank r/p <seconds>s``; an unexpected exception prints
  ``ERROR <case> rank r/p:`` and its traceback, then ``comm.Abort(1)`` ends the whole job, so no
  rank is left waiting.  :func:`say` writes one line at a time, so ranks do not interleave.

In pytest: :func:`launch` runs a script under ``mpiexec -n P`` (the mpiexec next to the
interpreter, else on PATH; one thread per rank; the repository root on PYTHONPATH) with a
timeout that kills the whole process group, and returns a :class:`Launch`, which parses those
lines (:meth:`Launch.problems`).

Imports: pytest puts tests/ on sys.path, and so does running a script in tests/ (also as
``python -m mpi4py tests/mpi_x.py``), so ``from support.mpi import ...`` works in both.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reference.transport import digest

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["Checks", "same_state", "say", "run_case", "main", "Launch", "launch", "mpiexec", "ROOT", "TORCH_ENV", "TORCH_BACKEND_ENV", "torch_comm"]


# ====================================================================== in a rank
class Checks:
    """One case on one rank: the communicator, and the failed checks collected.

    Every check returns True when it passed and False when it recorded a failure, so
    ``return ck.fail(...)`` (or ``if not ck.same(...): return``) ends a check."""

    def __init__(self, comm, case: str):
        self.comm, self.case = comm, case
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.failures: list[str] = []

    def fail(self, msg) -> bool:
        """Record a failed check."""
        self.failures.append(str(msg))
        return False

    def true(self, cond, msg) -> bool:
        return True if cond else self.fail(msg)

    def same(self, got, want, what) -> bool:
        """``got`` is an ndarray with ``want``'s dtype, shape and every bit (NaN-safe: the bytes
        are compared, not the values); a failure names the first differing element."""
        if not isinstance(got, np.ndarray):
            return self.fail(f"{what}: got a {type(got).__name__}, want an ndarray")
        want = np.asarray(want)
        if got.dtype != want.dtype or got.shape != want.shape:
            return self.fail(f"{what}: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}")
        gb, wb = got.tobytes(), want.tobytes()  # C order, whatever the strides
        if gb == wb:
            return True
        diff = np.frombuffer(gb, np.uint8) != np.frombuffer(wb, np.uint8)
        bad = np.unique(np.flatnonzero(diff) // max(got.itemsize, 1))
        i = int(bad[0])
        g, w = got.reshape(-1), want.reshape(-1)
        return self.fail(f"{what}: {bad.size} of {got.size} elements differ in bits; first at {i}: got {g[i]!r}, want {w[i]!r}")

    def close(self, got, want, what, rtol) -> bool:
        """Same dtype and shape, and within ``rtol`` of ``want``'s largest magnitude."""
        got, want = np.asarray(got), np.asarray(want)
        if got.dtype != want.dtype or got.shape != want.shape:
            return self.fail(f"{what}: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}")
        g, w = got.astype(np.float64), want.astype(np.float64)
        scale = float(np.max(np.abs(w))) if w.size else 0.0
        err = float(np.max(np.abs(g - w))) if w.size else 0.0
        return self.true(err <= rtol * max(scale, 1e-30), f"{what}: max abs error {err:.3g} > {rtol:g} * max|want| {scale:.3g}")

    def agree(self, result, what) -> bool:
        """Every rank holds the same bits (keys in order, dtypes, shapes, bytes): a collective,
        so every rank must call it."""
        hashes = self.comm.allgather(digest(result))
        return self.true(len(set(hashes)) == 1, f"{what}: ranks disagree on the result: {hashes}")


def same_state(a, b) -> bool:
    """Two state dicts (nested dicts, lists, tuples, arrays, scalars) are equal, arrays bit for
    bit with their dtypes and shapes."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_state(u, v) for u, v in zip(a, b))
    return a == b


def say(line: str) -> None:
    """One write per line, so the ranks' lines do not interleave."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


def run_case(cases: dict, comm, name: str, checks=Checks) -> list[str]:
    """Run ``cases[name]`` on ``comm``; the failures on this rank."""
    ck = checks(comm, name)
    cases[name](comm, ck)
    return ck.failures


def main(cases: dict, argv, *, every=None, checks=Checks, run=None, abort=True, usage="CASE [CASE ...]") -> int:
    """Run the cases named in ``argv`` on ``COMM_WORLD`` ("all", or no name: the cases in
    ``every``, by default all of them) and print their OK / FAIL / ERROR lines; the exit status.

    ``run(comm, name) -> failures`` replaces :func:`run_case` (with ``checks``) for a script
    whose cases are not plain functions; ``abort=False`` lets an unexpected exception propagate
    (a script that means to show what an uncaught error does) instead of printing ERROR and
    calling ``comm.Abort(1)``."""
    from mpi4py import MPI

    world = comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if os.environ.get(TORCH_ENV):  # the cases on torch.distributed (gloo or NCCL), the ranks found by MPI
        comm = torch_comm(world)
    every = list(cases) if every is None else list(every)
    names = [c for a in argv for c in (every if a == "all" else [a])] or every
    unknown = [c for c in names if c not in cases]
    if unknown:
        raise SystemExit(f"usage: {Path(sys.argv[0]).name} {usage}; cases: all, {', '.join(cases)} (unknown: {unknown})")
    if run is None:
        def run(comm, name):
            return run_case(cases, comm, name, checks)
    bad = 0
    for name in names:
        t = time.perf_counter()
        try:
            failures = run(comm, name)
        except BaseException:
            if not abort:
                raise
            say(f"ERROR {name} rank {rank}/{size}:\n{traceback.format_exc()}")
            world.Abort(1)
            return 1
        world.Barrier()
        for f in failures:
            say(f"FAIL {name} rank {rank}/{size}: {f}")
        if not failures:
            say(f"OK {name} rank {rank}/{size} {time.perf_counter() - t:.2f}s")
        bad += len(failures)
    return 1 if bad else 0


#: set (to anything) to run a script's cases on torch.distributed instead of MPI (:func:`main`)
TORCH_ENV = "GRADCODEC_TORCH_COMM"
#: which torch.distributed backend those cases run on (gloo unless this says nccl)
TORCH_BACKEND_ENV = "GRADCODEC_TORCH_BACKEND"


def torch_comm(world, rank: int | None = None, size: int | None = None):
    """A :class:`transport.torchdist.TorchComm` over a gloo group of ``world``'s ranks (an
    mpi4py communicator: rank 0 picks a free port and tells the others), or, with ``world``
    None, of ``size`` 1 in this process (a ``HashStore``): the same cases on torch.distributed.
    With ``GRADCODEC_TORCH_BACKEND=nccl`` (a GPU run) the group is NCCL's, each rank on its
    GPU (torch's and Numba's current device alike)."""
    import socket

    import torch.distributed as dist

    from transport.torchdist import TorchComm

    if world is None:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return TorchComm()
    backend = os.environ.get(TORCH_BACKEND_ENV, "gloo")
    if backend == "nccl":
        import torch
        from numba import cuda

        gpu = world.Get_rank() % torch.cuda.device_count()
        torch.cuda.set_device(gpu)
        cuda.select_device(gpu)
    port = None
    if world.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = world.bcast(port, root=0)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=world.Get_rank(), world_size=world.Get_size())
    return TorchComm()


# ====================================================================== in pytest
#: one thread per rank (several ranks share the cores) and the repository importable
THREADS = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def mpiexec() -> str:
    """The mpiexec next to the interpreter (the ``mpich`` wheel of the test extra), else on PATH."""
    exe = Path(sys.executable).parent / "mpiexec"
    found = str(exe) if exe.exists() else shutil.which("mpiexec")
    assert found, "mpiexec not found next to the interpreter or on PATH (pip install mpich)"
    return found


@dataclass(frozen=True)
class Launch:
    """One finished (or killed) launch: the lines every rank printed, stdout and stderr together."""

    label: str  #: "mpiexec -n P script args", for messages
    ranks: int
    returncode: int | None  #: None: it hung, and was killed after ``timeout`` seconds
    output: str
    seconds: float
    timeout: float

    @property
    def hung(self) -> bool:
        return self.returncode is None

    def fails(self, case: str) -> list[str]:
        """The FAIL lines of ``case``."""
        return [ln for ln in self.output.splitlines() if ln.startswith(f"FAIL {case} ")]

    def oks(self, case: str) -> set[int]:
        """The ranks that printed ``OK <case> rank r/P`` for this launch's P."""
        pattern = rf"^OK {re.escape(case)} rank (\d+)/{self.ranks}(?: [\d.]+s)?$"
        return {int(r) for r in re.findall(pattern, self.output, re.M)}

    def problems(self, case: str) -> list[str]:
        """What went wrong for ``case``: a hang, any ERROR (an unexpected exception), its FAIL
        lines, ranks without an OK line."""
        out = []
        if self.hung:
            out.append(f"mpiexec -n {self.ranks} did not finish in {self.timeout:g} s (hung; killed)")
        if "ERROR" in self.output:
            out.append("a rank printed ERROR (an unexpected exception)")
        out += self.fails(case)[:40]
        missing = sorted(set(range(self.ranks)) - self.oks(case))
        if missing:
            out.append(f"case {case!r} on {self.ranks} ranks: no OK from ranks {missing}")
        return out

    def report(self, problems=(), tail: int = 6000) -> str:
        """An assertion message: the problems, the exit status and the end of the output."""
        status = "hung" if self.hung else f"exit {self.returncode}"
        return "\n".join([*problems, f"--- {self.label} ({status}, {self.seconds:.0f} s); output:", self.output[-tail:]])


def launch(script, ranks: int, *args: str, timeout: float, mpi4py: bool = True, env: dict | None = None) -> Launch:
    """Run ``script`` on ``ranks`` ranks (``python -m mpi4py script``, or plain ``python script``
    when ``mpi4py`` is False: no abort hook) with ``args``.  A launch that outlives ``timeout``
    is killed, process group and all, and returned with ``returncode`` None."""
    full = dict(os.environ, **THREADS, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    py = [sys.executable, "-m", "mpi4py"] if mpi4py else [sys.executable]
    cmd = (mpiexec(), "-n", str(ranks), *py, str(script), *args)
    t = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    label = " ".join(["mpiexec -n", str(ranks), *py[1:], Path(script).name, *args])
    return Launch(label, ranks, rc, out, time.monotonic() - t, timeout)
