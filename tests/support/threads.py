"""The one thread-count determinism harness: run the same script in fresh processes with
different ``NUMBA_NUM_THREADS`` and require the same output.

Numba fixes its thread pool at first use, so a thread count can only be changed for a new
process; the script prints a digest (e.g. a SHA-256 of frames and residuals) to stdout."""

from __future__ import annotations

import os
import subprocess
import sys


def run_with_threads(script: str, threads: int, *args: str, timeout: float = 300) -> str:
    """stdout of ``python -c script *args`` under ``NUMBA_NUM_THREADS=threads`` (stripped);
    a failing script fails the test with its stderr."""
    # the pool and the thread budget (codec/threads.py) both set, so the kernels use exactly
    # ``threads`` threads whatever the machine's core count or the launcher says
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), GRADCODEC_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"the script failed with {threads} thread(s):\n{r.stderr[-3000:]}"
    return r.stdout.strip()


def same_across_threads(script: str, *args: str, counts=(1, 2), timeout: float = 300) -> str:
    """Run ``script`` once per thread count in ``counts``; assert the outputs are non-empty and
    identical, and return that output (so a caller can also compare it with this process)."""
    outs = {t: run_with_threads(script, t, *args, timeout=timeout) for t in counts}
    first = outs[counts[0]]
    assert first, "the determinism script printed nothing"
    assert all(o == first for o in outs.values()), "results depend on NUMBA_NUM_THREADS: " + ", ".join(
        f"{t} thread(s): {o[:80]}" for t, o in outs.items()
    )
    return first


#: the ways :func:`host_twins` runs a host kernel: each compilation with each zeroing
HOST_TWINS = (("serial", "kernel"), ("parallel", "spans"), ("parallel", "kernel"), ("serial", "spans"))


def host_twins(monkeypatch, twin) -> None:
    """Run a host kernel that is several steps (parallel kernels, then work on
    ``codec.threads.each``, as ``scatter.index_scatter_segments``) one of the ways of
    :data:`HOST_TWINS`, so a test's small arrays take the paths a large run takes:
    ``(compilation, zeroing)``, the compilation ``"serial"`` (a budget of one thread: every
    serial compilation, ``each`` serial) or ``"parallel"`` (a budget of two: every parallel
    kernel's parallel compilation whatever its size), the zeroing of SET ``"kernel"`` (by
    the kernel, on the calling thread, as a small run's) or ``"spans"`` (on ``threads.each``
    in spans of 21 elements, streamed: ``_stream.pairs_threads``, as a large run's)."""
    from codec import _jit, threads
    from codec.kernels.cpu import _stream

    compilation, zeroing = twin
    parallel, spans = compilation == "parallel", zeroing == "spans"
    monkeypatch.setattr(threads, "budget", lambda: 2 if parallel else 1)
    monkeypatch.setattr(_jit, "PARALLEL_MIN", 0 if parallel else 1 << 62)
    monkeypatch.setattr(_stream, "ZERO_SPAN", 21 if spans else 1 << 62)
    monkeypatch.setattr(_stream, "STREAM_MIN", 0 if spans else 1 << 62)
