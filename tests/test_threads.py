"""The thread budget (codec/threads.py): each process takes its share of the cores, idle
threads spin only briefly, one setting overrides, and the parallel kernels obey it in any thread.

The environment is read in fresh processes (the budget is cached, Numba reads its pool size
and the OpenMP runtime its wait policy once), except where the test drives the module itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from codec import threads
from codec._jit import jit, prange

CLEAN = {k: v for k, v in os.environ.items() if k not in (threads.ENV, "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", *threads.LAUNCHER_VARS)}
PROBE = """
import json, os, codec._jit, numba
from codec import threads
print(json.dumps({"budget": threads.budget(), "pool": numba.config.NUMBA_NUM_THREADS, "cores": threads.usable_cores(),
                  "local": threads.local_ranks(), "wait": os.environ.get("OMP_WAIT_POLICY"), "spin": os.environ.get("GOMP_SPINCOUNT")}))
"""


def probe(**env) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE], env={**CLEAN, **env}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_alone_a_process_takes_its_cores_and_spins_briefly():
    p = probe(NUMBA_NUM_THREADS="4")
    assert p["local"] == 1
    assert p["budget"] == max(1, min(4, p["cores"]))
    assert p["spin"] == threads.SPINCOUNT and p["wait"] is None


@pytest.mark.parametrize("var", threads.LAUNCHER_VARS)
def test_ranks_on_a_node_share_its_cores(var):
    p = probe(NUMBA_NUM_THREADS="8", **{var: "4"})
    assert p["local"] == 4
    assert p["budget"] == max(1, min(8, p["cores"] // 4))
    assert probe(NUMBA_NUM_THREADS="8", **{var: "1000"})["budget"] == 1


def test_the_largest_launcher_count_wins_and_junk_is_ignored():
    p = probe(MPI_LOCALNRANKS="2", OMPI_COMM_WORLD_LOCAL_SIZE="3", PMIX_LOCAL_SIZE="x", MV2_COMM_WORLD_LOCAL_SIZE="-4")
    assert p["local"] == 3


def test_one_setting_fixes_the_count_within_the_pool():
    assert probe(NUMBA_NUM_THREADS="3", GRADCODEC_THREADS="2", MPI_LOCALNRANKS="64")["budget"] == 2
    assert probe(NUMBA_NUM_THREADS="3", GRADCODEC_THREADS="16")["budget"] == 3
    assert probe(NUMBA_NUM_THREADS="2", GRADCODEC_THREADS="1")["budget"] == 1


def test_off_leaves_numba_and_openmp_alone():
    p = probe(NUMBA_NUM_THREADS="3", GRADCODEC_THREADS="off", MPI_LOCALNRANKS="64")
    assert p["budget"] == 3 and p["wait"] is None and p["spin"] is None


def test_a_chosen_wait_policy_or_spin_count_is_kept():
    p = probe(OMP_WAIT_POLICY="active")
    assert p["wait"] == "active" and p["spin"] is None
    assert probe(GOMP_SPINCOUNT="5")["spin"] == "5"


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_a_bad_setting_is_an_error_naming_it(bad):
    r = subprocess.run(
        [sys.executable, "-c", "import codec._jit; from codec import threads; threads.budget()"],
        env={**CLEAN, "GRADCODEC_THREADS": bad}, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode != 0 and "GRADCODEC_THREADS" in r.stderr and "ValueError" in r.stderr


def test_import_codec_touches_no_thread_setting():
    r = subprocess.run(
        [sys.executable, "-c", "import os, sys, codec; print(os.environ.get('GOMP_SPINCOUNT'), 'numba' in sys.modules)"],
        env=CLEAN, capture_output=True, text=True, timeout=120,
    )
    assert r.stdout.split() == ["None", "False"], r.stderr


# ---------------------------------------------------------------- in this process


@pytest.fixture
def fresh(monkeypatch):
    """The module's state saved and restored; the environment's budget variables cleared."""
    for k in (threads.ENV, *threads.LAUNCHER_VARS):
        monkeypatch.delenv(k, raising=False)
    saved = threads._reported
    threads.refresh()
    yield
    threads._reported = saved
    threads.refresh()


def test_reports_only_ever_shrink_the_budget(fresh):
    import numba

    pool = numba.config.NUMBA_NUM_THREADS
    alone = threads.budget()
    assert alone == max(1, min(pool, threads.usable_cores()))
    threads.set_local_ranks(threads.usable_cores() * 2)
    assert threads.budget() == 1
    threads.set_local_ranks(1)  # a smaller report does not raise it again
    assert threads.budget() == 1 and threads.local_ranks() == threads.usable_cores() * 2
    for bad in (0, -1, 1.5, True, "2", None):
        with pytest.raises(ValueError, match="n:"):
            threads.set_local_ranks(bad)


@jit(parallel=True)
def _double(x, out):
    for i in prange(out.size):
        out[i] = x[i] * 2.0


def test_parallel_kernels_obey_the_budget_in_any_thread(fresh, monkeypatch):
    """Budget 1: the serial twin runs; a lower budget: the calling thread's Numba setting is
    lowered for the call and restored; never raised."""
    import numba

    from codec._jit import PARALLEL_MIN

    k = _double
    calls = []
    for name in ("serial", "parallel"):
        fn = getattr(k, name)
        monkeypatch.setattr(k, name, lambda *a, _fn=fn, _name=name: (calls.append((_name, numba.get_num_threads())), _fn(*a))[1])
    x = np.arange(PARALLEL_MIN + 5, dtype=np.float64)
    out = np.empty_like(x)

    monkeypatch.setenv(threads.ENV, "1")
    threads.refresh()
    k(x, out)
    assert calls[-1][0] == "serial" and np.array_equal(out, 2 * x)

    if numba.config.NUMBA_NUM_THREADS >= 2:
        monkeypatch.setenv(threads.ENV, "2")
        threads.refresh()
        seen = {}

        def worker():
            before = numba.get_num_threads()
            k(x, out)
            seen["after"], seen["before"] = numba.get_num_threads(), before

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert calls[-1] == ("parallel", 2) and seen["after"] == seen["before"]
        numba.set_num_threads(1)  # the caller's own limit is lower: kept
        try:
            k(x, out)
            assert calls[-1][0] == "serial" or calls[-1] == ("parallel", 1)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    small = np.arange(10, dtype=np.float64)
    k(small, np.empty_like(small))
    assert calls[-1][0] == "serial"


def test_the_transport_reports_the_ranks_on_its_node(fresh, monkeypatch):
    MPI = pytest.importorskip("mpi4py.MPI")
    from transport import Allreducer

    reports = []
    monkeypatch.setattr(threads, "set_local_ranks", lambda n: reports.append(n))
    red = Allreducer("topk(ratio=0.5)", MPI.COMM_SELF)
    assert reports == []  # nothing before the first (collective) step
    red.reduce({"w": np.ones(8, np.float32)})
    red.reduce({"w": np.ones(8, np.float32)})
    assert reports == [1]  # once, from the shared-memory split of COMM_SELF


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_pool_asked_before_numba_loads_is_the_pool_numba_makes():
    """The payload checksum asks for the budget before any kernel has loaded Numba: the pool
    it is told is the one Numba then makes (the cores of the process's affinity), not the
    machine's CPU count."""
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from codec import threads; before = threads._pool(); "
        "import numba; print(before, numba.config.NUMBA_NUM_THREADS)"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True).stdout.split()
    assert out == ["1", "1"], out


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_each_runs_every_item_once_on_the_budgets_threads(budget, monkeypatch):
    """``each``: every item once, each thread with its own scratch, at most the budget's
    threads (the caller's among them); serial in order with a budget of one, one item, or
    from inside another call's item; the first exception raised after every thread stops,
    the other threads taking no item after it."""
    monkeypatch.setattr(threads, "budget", lambda: budget)
    done, names, scratches = [], set(), []

    def work(i, s):
        s.append(i)
        done.append(i)
        names.add(threading.current_thread().name)

    def scratch():
        scratches.append([])
        return scratches[-1]

    threads.each(40, work, scratch)
    assert sorted(done) == list(range(40)) and len(names) <= budget
    assert sorted(i for s in scratches for i in s) == list(range(40)) and len(scratches) <= budget
    if budget == 1:
        assert done == list(range(40)) and names == {threading.current_thread().name}
    done.clear()
    threads.each(3, lambda i, s: threads.each(4, lambda j, t: done.append((i, j))))  # (nested: serial inside an item)
    assert sorted(done) == [(i, j) for i in range(3) for j in range(4)]
    for i in range(3):  # (each nested call in order, on its item's thread)
        assert [j for a, j in done if a == i] == [0, 1, 2, 3]
    done.clear()

    def fail(i, s):
        done.append(i)
        if i == 5:
            raise KeyError("five")

    with pytest.raises(KeyError, match="five"):
        threads.each(10_000, fail)
    assert 5 in done and len(done) < 10_000
    threads.each(0, fail)  # (no items: nothing runs)
