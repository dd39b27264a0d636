"""What the benchmark scripts share: timers, the synthetic gradient, the bundled sample by step,
the machine/version header, plain or markdown tables, the closing notes, and the pass loop.

Not a script: ``bench_*.py`` import it (``from harness import ...``; each script puts its own
folder on ``sys.path`` first, so it runs as ``python benchmarks/bench_X.py`` from anywhere).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import shlex
import subprocess
import sys
import time

import numpy as np

# --------------------------------------------------------------------------- timing


class Samples:
    """Wall-clock samples per name; ``best`` is the minimum."""

    def __init__(self):
        self.t: dict[str, list[float]] = {}

    def time(self, name, fn):
        t = time.perf_counter()
        r = fn()
        self.t.setdefault(name, []).append(time.perf_counter() - t)
        return r

    def best(self, name) -> float:
        return min(self.t[name])

    def count(self, name) -> int:
        return len(self.t.get(name, ()))


def timed(fn):
    """``(fn(), seconds it took)``: for a call timed once, such as the first (compiling) one."""
    t = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t


def best(fn, repeat, stat=min):
    """The minimum wall-clock time of ``repeat`` calls of ``fn`` (``stat``: another summary of
    the times, such as ``statistics.median``, for a machine under load)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return stat(times)


@contextlib.contextmanager
def busy(count: int):
    """``count`` other processes spinning on the CPU while the block runs: a machine under
    load, as a training job's data loaders or a neighbour's job make it (killed on exit)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5 if count else 0)  # (scheduled before the first figure)
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def rate_cell(nbytes, seconds, memcpy_s):
    """'GB/s (x memcpy)'."""
    return f"{gbps(nbytes, seconds):.2f} ({memcpy_s / seconds:.2f}x)"


def memcpy_line(nbytes, memcpy: Samples) -> str:
    """The report line of the run's memcpy samples (named "memcpy" in ``memcpy``)."""
    mc = memcpy.best("memcpy")
    mc_med = float(np.median(memcpy.t["memcpy"]))
    return (f"memcpy (np.copyto, {nbytes / 1e6:.0f} MB): best {mc * 1e3:.1f} ms = {gbps(nbytes, mc):.2f} GB/s "
            f"(median {mc_med * 1e3:.1f} ms over {memcpy.count('memcpy')} samples)")


def job_pass(jobs, p, passes, budget, notes, run, error):
    """Pass ``p`` of ``passes`` over ``jobs``: ``run(job)`` for each job that has not failed and,
    after the first pass, has not spent more than ``budget`` seconds (it keeps the samples it
    has).  A job that raises gets ``job.error = error(e)`` and a line in ``notes``; the others go on."""
    for job in jobs:
        if getattr(job, "error", None) or (p and job.spent > budget):
            continue  # failed, or slow: keep the samples it has
        log(f"pass {p + 1}/{passes}: {job.spec} ...")
        try:
            run(job)
        except Exception as e:  # a codec being written may fail: report it, go on
            job.error = error(e)
            notes.append(f"{job.spec}: {type(e).__name__}: {e}")


# --------------------------------------------------------------------------- data


def synthetic(n):
    """The synthetic gradient: ``n`` float32, Student-t (df=2) x 1e-3, seed 0."""
    return (np.random.default_rng(0).standard_t(2, n) * 1e-3).astype(np.float32)


def load_steps():
    """The bundled sample as {step: {tensor name: array}} (keys 'stepN/name')."""
    from codec.sample import load_sample

    steps: dict[str, dict[str, np.ndarray]] = {}
    for key, v in load_sample().items():
        st, layer = key.split("/", 1)
        steps.setdefault(st, {})[layer] = v
    return steps


def step_number(name: str) -> int:
    return int(name.replace("step", ""))


# --------------------------------------------------------------------------- environment


def machine_info() -> list[str]:
    import numba

    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        import torch

        tv = torch.__version__
    except ImportError:
        tv = "not installed"
    here = os.path.dirname(os.path.abspath(__file__))
    git = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--", "../codec"], capture_output=True, text=True).stdout
    return [
        f"command: {' '.join(shlex.quote(a) for a in [os.path.basename(sys.executable)] + sys.argv)}",
        f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"machine: {cpu}; {os.cpu_count()} cores ({usable} usable); numba threads {numba.get_num_threads()}",
        f"versions: python {platform.python_version()}, numpy {np.__version__}, numba {numba.__version__}, torch {tv}; "
        f"git {git or '?'}{' (codec/ has uncommitted changes)' if dirty.strip() else ''}",
    ]


# --------------------------------------------------------------------------- output


def render(headers, rows, markdown):
    rows = [[str(c) for c in r] for r in rows]
    if markdown:
        out = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(headers), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows])


def bullets(lines, md):
    """Print ``lines``, one a line; a markdown list with ``md``."""
    print("\n".join(("- " + s if md else s) for s in lines))


def heading(title, md):
    """Print a table's title (bold, then a blank line, with ``md``)."""
    print(f"**{title}**\n" if md else title)


FIRST_CALL = (
    "first call: the first call of each operation in this process (Numba compile, or cache load with a warm "
    "on-disk cache; kernels shared by several codecs are paid by the first of them); never in the figures"
)


def footer(lines, t_run, notes, md):
    """The closing list of a benchmark, after a blank line: ``lines``, FIRST_CALL, the total run
    time since ``t_run``, ``notes``."""
    print()
    bullets(lines + [FIRST_CALL, f"total run time {time.perf_counter() - t_run:.0f} s"] + [f"note: {s}" for s in notes], md)


def log(msg):
    print(msg, file=sys.stderr, flush=True)
