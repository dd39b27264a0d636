"""Runs tests/cuda/ (the CUDA twins and device arrays through the codecs) in a process of its
own under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): the simulator is chosen when
numba.cuda is first imported, so it cannot share this process.  The same run records the
argument types of every kernel launch, and every twin kernel is then compiled for a real GPU
(PTX for sm_90, with NVVM from ``numba-cuda[cu13]``, no GPU needed) with exactly those types:
what the simulator cannot check (typing, device functions, libdevice calls) is checked here
(scripts/cuda_compile_check.py).  The simulator run goes on beside the rest of the suite
(:func:`start`; tests/conftest.py orders this module)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SCRIPT = HERE.parent / "scripts" / "cuda_compile_check.py"

#: the simulator run's limit (22 minutes beside a pytest-xdist worker in a fresh clone's
#: `.ci/run` on a 2-core machine, 2026-12-01): a run twice as long still finishes
TIMEOUT = 2700
pytestmark = pytest.mark.timeout(TIMEOUT + 300)

_run: dict = {}


def start() -> None:
    """Start the simulator run of tests/cuda in a process of its own, once: in one pytest
    process tests/conftest.py calls this when collection ends and moves this module's tests to
    the end; under pytest-xdist the module goes first and its fixture calls this, so one worker
    waits for the run while the other goes on.  Either way the run (one Python process) goes
    on beside the rest of the suite."""
    if _run:
        return
    where = Path(tempfile.mkdtemp(prefix="gradcodec-cudasim-"))
    log = open(where / "output.txt", "w")
    env = dict(os.environ, PYTHONWARNINGS="ignore::RuntimeWarning")
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "record", str(where / "signatures.json"), "--", str(HERE / "cuda")],
        cwd=HERE.parent, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    _run.update(proc=proc, where=where, log=log)


def stop() -> None:
    """End the run if it still goes (a session stopped early), its pytest process included
    (the script's child: the run is a process group of its own), and remove its folder."""
    if not _run:
        return
    proc = _run["proc"]
    if proc.poll() is None:
        _kill(proc)
    _run["log"].close()
    shutil.rmtree(_run["where"], ignore_errors=True)
    _run.clear()


def _kill(proc) -> None:
    """Kill the run's process group (the script and the pytest it started) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture(scope="module")
def simulated():
    """The simulator run of tests/cuda: ``(completed process, recorded signatures file)``."""
    start()  # (already started unless this module was collected some other way)
    proc = _run["proc"]
    try:
        proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill(proc)
    _run["log"].flush()
    out = (_run["where"] / "output.txt").read_text()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, ""), _run["where"] / "signatures.json"


def test_cuda_suite_passes_in_the_simulator(simulated):
    run, _ = simulated
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout and "no tests ran" not in run.stdout, tail
    print(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(sys.platform != "linux", reason="NVVM's wheels (nvidia-nvvm, numba-cuda[cu13]) are for Linux")
def test_every_launched_kernel_compiles_for_a_gpu(simulated):
    _, sigs = simulated
    recorded = json.loads(sigs.read_text())
    families = {module.rsplit(".", 1)[1] for module, _, _ in recorded if module.startswith("codec.")}
    assert {"convert", "scatter", "select", "_segments", "adacomp", "_crc", "quantize", "bucket", "elias", "dequant", "lowrank", "spectral", "randomk"} <= families, families
    assert any(module.endswith("test_cuda_rng_scatter.py") for module, _, _ in recorded)  # the rng twins' device functions
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    run = subprocess.run([sys.executable, str(SCRIPT), "compile", str(sigs)], cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert f"{len(recorded)} of {len(recorded)} kernel signatures compiled" in run.stdout, run.stdout
    print(run.stdout.strip().splitlines()[-1])
