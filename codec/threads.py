"""The thread budget: how many threads gradcodec's parallel kernels use (docs/api.md, "Threads").

gradcodec runs beside other work: several MPI ranks on one node, a framework's own thread
pool.  Numba's OpenMP threads spin while they wait, so more busy threads than cores collapses:
four processes with two threads each on two cores took up to 32 ms per fp16 encode of 262,144
values instead of 0.33 ms with one thread each (benchmarks/bench_threads.py).  So, by default,
each process takes its share of the cores it may run on::

    threads = max(1, usable cores // ranks on this node)

* usable cores: ``len(os.sched_getaffinity(0))`` (what ``taskset``/cgroups leave), capped by
  Numba's pool (``NUMBA_NUM_THREADS``, which a user may set as before);
* ranks on this node: the largest of what the launcher says (MPICH and Intel MPI
  ``MPI_LOCALNRANKS``, Open MPI ``OMPI_COMM_WORLD_LOCAL_SIZE``, MVAPICH2
  ``MV2_COMM_WORLD_LOCAL_SIZE``, PMIx ``PMIX_LOCAL_SIZE``, torchrun ``LOCAL_WORLD_SIZE``) and
  what a transport reports with
  :func:`set_local_ranks` (``transport.Allreducer`` reports its communicator's shared-memory
  split), else 1;
* idle kernel threads spin only briefly before they sleep (``GOMP_SPINCOUNT=10000`` spin
  loops, tens of microseconds, instead of GNU OpenMP's 300,000; unless ``GOMP_SPINCOUNT`` or
  ``OMP_WAIT_POLICY`` is set), so threads beside them keep their cores: with the threads
  forced to 2 per process, four processes on two cores took 2.5 ms per encode instead of
  32 ms, while a process alone keeps the speed of spinning (a passive wait cost it 0.1 ms
  per parallel call).  This is GNU OpenMP's setting, for Numba's ``omp`` threading layer
  (the one here); with TBB installed Numba picks TBB, which this setting does not reach.

A parallel kernel asks :func:`budget` on every call and runs its serial twin when the budget
is one thread, so the budget holds in any calling thread.  ``GRADCODEC_THREADS=N`` fixes the
count (at most Numba's pool); ``GRADCODEC_THREADS=off`` leaves Numba's thread count and the
OpenMP defaults alone.  Results never depend on the thread count (the kernels cut work by
array length only).

This module imports nothing heavy: ``codec._jit`` calls :func:`prepare_numba` just before it
imports Numba.
"""

from __future__ import annotations

import os
import sys
import threading

from codec.errors import CodecValueError

__all__ = ["ENV", "LAUNCHER_VARS", "SPINCOUNT", "budget", "each", "local_ranks", "prepare_numba", "refresh", "set_local_ranks", "usable_cores"]

#: the one setting: a thread count, or "off"
ENV = "GRADCODEC_THREADS"
#: launcher variables that count the ranks on this node
LAUNCHER_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE", "LOCAL_WORLD_SIZE")

_reported = 1  # the most ranks a transport has reported on this node
_cached: int | None = None  # budget(), recomputed after set_local_ranks


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def _positive_int(text) -> int | None:
    try:
        v = int(str(text).strip())
    except ValueError:
        return None
    return v if v >= 1 else None


def local_ranks() -> int:
    """How many ranks share this node: the largest of the launcher's count and the transport's
    report (:func:`set_local_ranks`), at least 1."""
    counts = [_positive_int(os.environ[v]) for v in LAUNCHER_VARS if v in os.environ]
    return max([c for c in counts if c] + [_reported])


def set_local_ranks(n: int) -> None:
    """Report that ``n`` ranks share this node (a transport does, from its communicator).
    The budget only ever shrinks: the largest count reported or found in the environment wins."""
    global _reported, _cached
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise CodecValueError(f"n: expected an int >= 1, got {n!r}")
    _reported = max(_reported, n)
    _cached = None


def refresh() -> None:
    """Re-read the environment (``GRADCODEC_THREADS``, the launcher's variables) at the next
    kernel call; for a program that changes them after the first parallel kernel ran."""
    global _cached
    _cached = None


def _setting() -> str | None:
    v = os.environ.get(ENV, "").strip().lower()
    return v or None


def budget() -> int:
    """The threads a parallel kernel may use now (1: run the serial twin).  Called by the
    parallel kernels on every call, so it is cached; :func:`set_local_ranks` resets it."""
    global _cached
    if _cached is None:
        _cached = _compute()
    return _cached


def _pool() -> int:
    """Numba's thread pool: ``numba.config``'s when Numba is loaded, else what it will read
    (``NUMBA_NUM_THREADS``, else the cores of this process's affinity, as Numba counts them),
    so a caller that is not a kernel (the payload checksum, codec/checksum.py) does not load
    Numba to ask and gets the answer Numba would give."""
    numba = sys.modules.get("numba")
    if numba is not None:
        return numba.config.NUMBA_NUM_THREADS
    return _positive_int(os.environ.get("NUMBA_NUM_THREADS", "")) or usable_cores()


def _compute() -> int:
    pool = _pool()
    setting = _setting()
    if setting == "off":
        return pool
    fixed = _positive_int(setting) if setting else None
    if setting and fixed is None:
        raise CodecValueError(f"{ENV}: expected a thread count >= 1 or 'off', got {os.environ[ENV]!r}")
    if fixed is not None:
        return min(fixed, pool)
    return max(1, min(pool, usable_cores() // local_ranks()))


#: how long an idle kernel thread spins before it sleeps (GNU OpenMP's unit: spin-loop turns)
SPINCOUNT = "10000"


def each(count: int, work, scratch=lambda: None) -> None:
    """``work(i, s)`` for every ``i`` in ``range(count)``, on up to :func:`budget` threads (the
    calling thread one of them), ``s`` each thread's own ``scratch()``: for work that
    releases the GIL (NumPy, the ``nogil`` kernels, scipy's FFT) in items too small for a
    parallel kernel of their own.  Each thread takes the next item as it finishes one, so a
    descheduled thread holds back only the item in its hands: no barrier between items and
    nothing spinning.
    Items run in any order, so each must write its own part of the output.  The first
    exception an item raises is raised once every thread has stopped (the others stop
    taking items).  Serial (in order, one ``scratch()``) with a budget of one thread, one
    item, or from inside another call's item.

    The helpers are threads of one small pool kept by the process (:func:`_helpers`: a
    thread started for each call cost ~0.08 ms more per 9 MB checksum); a helper still
    queued behind another caller's when the items run out is cancelled, not waited for, and
    an item never waits on the pool (a nested call runs serially), so callers in several
    threads cannot deadlock it."""
    n = min(budget(), count)
    if n <= 1 or getattr(_inside, "item", False):
        s = scratch()
        for i in range(count):
            work(i, s)
        return
    items = iter(range(count))
    lock = threading.Lock()
    errors: list = []

    def loop():
        _inside.item = True
        try:
            s = scratch()
            while not errors:
                with lock:
                    i = next(items, None)
                if i is None:
                    return
                work(i, s)
        except BaseException as e:  # (stops every thread; raised by the caller)
            errors.append(e)
        finally:
            _inside.item = False

    helpers = [_helpers().submit(loop) for _ in range(n - 1)]
    loop()
    for f in helpers:
        if not f.cancel():  # (started: wait until it stops taking items)
            f.result()
    if errors:
        raise errors[0]


_executor = None
_executor_lock = threading.Lock()


def _helpers():
    """The pool :func:`each`'s helpers run in (as many threads as usable cores, started as
    they are needed); a forked child starts its own (:func:`_forget_pool`)."""
    global _executor
    if _executor is None:
        from concurrent.futures import ThreadPoolExecutor

        with _executor_lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(max_workers=usable_cores(), thread_name_prefix="gradcodec")
    return _executor


def _forget_pool() -> None:
    """In a forked child the pool's threads are gone: start a new pool there on first use."""
    global _executor, _executor_lock
    _executor, _executor_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


#: whether this thread is running an item of :func:`each` (a nested call runs serially)
_inside = threading.local()


def prepare_numba() -> None:
    """Before Numba (and its OpenMP runtime) loads: idle threads spin briefly, then sleep
    (``GOMP_SPINCOUNT``), unless the user chose ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``, or
    ``GRADCODEC_THREADS=off``.  The runtime reads them once, when the first parallel kernel
    starts the thread pool; they are process-wide, so an OpenMP library loaded later in this
    process reads them too."""
    if _setting() != "off" and "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", SPINCOUNT)
