"""Runs tests/cuda/ (the CUDA twins and device arrays through the codecs) in a process of its
own under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): the simulator is chosen when
numba.cuda is first imported, so it cannot share this process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_cuda_suite_passes_in_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONWARNINGS="ignore::RuntimeWarning")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "cuda")],
        cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=900,
    )
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout and "no tests ran" not in run.stdout, tail
    print(run.stdout.strip().splitlines()[-1])
