"""The transport's scripts run under mpiexec: the example trains, the benchmark prints its tables."""

import os
import subprocess
import sys

import pytest

from support.mpi import ROOT, THREADS, mpiexec

pytest.importorskip("mpi4py")


def _launch(n, args, timeout=180):
    """stdout and stderr apart (the checks read the script's own output), one thread per rank."""
    env = dict(os.environ, **THREADS)
    return subprocess.run([mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("spec", ["topk(ratio=0.01)", "gtopk(ratio=0.01)", "powersgd(rank=2)"])
def test_example_trains_with_a_compressed_allreduce(spec):
    res = _launch(2, ["examples/allreduce_mpi.py", spec])
    assert res.returncode == 0, res.stderr[-2000:]
    losses = [float(line.split()[3]) for line in res.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 5 and losses[-1] < 0.3 * losses[0], res.stdout


def test_bench_prints_each_codec_against_dense():
    res = _launch(2, ["-m", "transport.bench", "--steps", "1", "--no-synthetic", "--codecs", "none;topk(ratio=0.01);gtopk(ratio=0.01);powersgd(rank=2)"])
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    for spec in ("none", "topk(ratio=0.01)", "gtopk(ratio=0.01)", "powersgd(rank=2)"):
        assert any(line.startswith(spec + " ") for line in out.splitlines()), out
    assert "error" not in out
