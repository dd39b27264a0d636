"""Runs tests/cuda/ (the CUDA twins and device arrays through the codecs) in a process of its
own under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): the simulator is chosen when
numba.cuda is first imported, so it cannot share this process.  The same run records the
argument types of every kernel launch, and every twin kernel is then compiled for a real GPU
(PTX for sm_90, with NVVM from ``numba-cuda[cu13]``, no GPU needed) with exactly those types:
what the simulator cannot check (typing, device functions, libdevice calls) is checked here
(scripts/cuda_compile_check.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SCRIPT = HERE.parent / "scripts" / "cuda_compile_check.py"

#: the simulator run (about 9 minutes alone on a 2-core machine, the fixture's time counted in
#: the first test's) has its own limits, 900 s for each subprocess: pytest's 600 s default
#: would cut a run that a busy machine slows by a tenth
pytestmark = pytest.mark.timeout(2000)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """The simulator run of tests/cuda: ``(completed process, recorded signatures file)``."""
    sigs = tmp_path_factory.mktemp("cuda") / "signatures.json"
    env = dict(os.environ, PYTHONWARNINGS="ignore::RuntimeWarning")
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "record", str(sigs), "--", str(HERE / "cuda")],
        cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=900,
    )
    return run, sigs


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
    assert {"convert", "scatter", "select", "_segments", "adacomp", "_crc", "quantize", "bucket", "elias", "dequant", "lowrank", "spectral"} <= families, families
    assert any(module.endswith("test_cuda_rng_scatter.py") for module, _, _ in recorded)  # the rng twins' device functions
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    run = subprocess.run([sys.executable, str(SCRIPT), "compile", str(sigs)], cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert f"{len(recorded)} of {len(recorded)} kernel signatures compiled" in run.stdout, run.stdout
    print(run.stdout.strip().splitlines()[-1])
