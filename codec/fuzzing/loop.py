"""The mutation loop (:func:`fuzz_loop`) and the supervised child that runs it
(:func:`child_main`, ``python -m codec.fuzzing --child``): input ``i`` is a deterministic
mutation (seed, i) of a seed; the input in flight is kept in a beacon file the parent reads.
"""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np

from codec.errors import CodecValueError
from codec.fuzzing.corpus import seed_corpus
from codec.fuzzing.findings import Outcome
from codec.fuzzing.stats import Stats, _outcome_key, input_name
from codec.fuzzing.targets import MUTATORS, TARGETS, check


class _Beacon:
    """The input in flight, in a file the parent maps: iteration, length, bytes (so a crash or
    hang is attributed to its input even when the child dies without a word)."""

    HEAD = struct.Struct("<QQdI")  # iteration + 1 (0: idle), length, start time, state (1 in call)
    SIZE = 1 << 24

    def __init__(self, path):
        import mmap

        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self.fd, self.SIZE)
        self.mm = mmap.mmap(self.fd, self.SIZE)

    def begin(self, i: int, data: bytes) -> None:
        n = min(len(data), self.SIZE - self.HEAD.size)
        self.mm[self.HEAD.size : self.HEAD.size + n] = data[:n]
        self.HEAD.pack_into(self.mm, 0, i + 1, n, time.time(), 1)

    def end(self) -> None:
        struct.pack_into("<I", self.mm, 24, 0)

    @classmethod
    def read(cls, path):
        try:
            with open(path, "rb") as fh:
                head = fh.read(cls.HEAD.size)
                it, n, t, busy = cls.HEAD.unpack(head)
                return it - 1, fh.read(n), t, busy
        except (OSError, struct.error):
            return -1, b"", 0.0, 0


#: memory checks: "all" (tracemalloc on every input: ~3-5x slower), "sample" (tracemalloc on
#: one input in MEMORY_SAMPLE, the peak RSS of every input), "off"
MEMORY_MODES = ("all", "sample", "off")
MEMORY_SAMPLE = 16
#: the odd-out checks (np.matrix, strided, Fortran ``out``) run on one frame in EXTRAS_SAMPLE
EXTRAS_SAMPLE = 8
#: growth of the process's peak RSS during one input that is a finding
RSS_BOUND = 256 << 20


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fuzz_loop(target: str, *, seconds: float = 60.0, iterations: int | None = None, seed: int = 0, start: int = 0,
              memory: str = "sample", findings_dir=None, beacon=None, report=None, full_seeds: bool = True,
              report_every: float = 1.0, log=None, deadline: float | None = None) -> Stats:
    """The mutation loop: input ``i`` is a deterministic mutation (seed, i) of a seed input
    (the first ``len(seeds)`` inputs are the seeds themselves); runs until ``seconds`` pass
    or input ``iterations`` is reached (counting from 0; this run starts at ``start``), and
    always runs its first input: CI once saw a child whose start-up (the seed corpus, the
    first compilations) took its whole share on a loaded machine and ran none."""
    if memory not in MEMORY_MODES:
        raise CodecValueError(f"memory: one of {MEMORY_MODES}, got {memory!r}")
    seeds = seed_corpus(full=full_seeds).of(target)
    stats = Stats(target)
    if findings_dir is not None:
        findings_dir = Path(findings_dir)
        findings_dir.mkdir(parents=True, exist_ok=True)
    bc = _Beacon(beacon) if beacon else None
    if memory == "all" and not tracemalloc.is_tracing():
        tracemalloc.start()
    if deadline is not None:  # an absolute end (time.time()): the parent's budget includes our start-up
        seconds = min(seconds, deadline - time.time())
    t0 = time.perf_counter()  # seed corpus generation is not counted
    last = t0
    i = start
    mutator = MUTATORS[target]
    rss = _maxrss()
    # self-test hooks (tests/test_fuzz.py): die or hang at a given input, to test supervise()
    crash_at = int(os.environ.get("GRADCODEC_FUZZ_SELFTEST_CRASH", -1))
    hang_at = int(os.environ.get("GRADCODEC_FUZZ_SELFTEST_HANG", -1))
    while True:
        if iterations is not None and i >= iterations:
            break
        now = time.perf_counter()
        if now - t0 >= seconds and i > start:  # (at least one input: a start-up that used the budget up, on a busy machine, still runs one)
            break
        rng = random.Random((seed << 40) ^ i)
        label, data = seeds[rng.randrange(len(seeds))] if i >= len(seeds) else seeds[i]
        if i >= len(seeds):
            try:
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")
                    for _ in range(1 + (rng.random() < 0.25)):
                        other = seeds[rng.randrange(len(seeds))][1]
                        data = mutator(rng, data, other)
            except Exception as e:  # noqa: BLE001 - a harness bug must not stop the run; it is counted
                k = f"invalid:mutator {type(e).__name__}"
                stats.outcomes[k] = stats.outcomes.get(k, 0) + 1
                if log is not None and stats.outcomes[k] == 1:
                    print(f"[{target}] mutator error at input {i}: {type(e).__name__}: {e}", file=log, flush=True)
                i += 1
                continue
        if bc:
            bc.begin(i, data)
        if i == crash_at:
            os.abort()
        if i == hang_at:
            time.sleep(3600)
        out = check(target, data, track_memory=memory == "all" or (memory == "sample" and i % MEMORY_SAMPLE == 0),
                    extras=i % EXTRAS_SAMPLE == 0)
        if memory != "off":
            grown = _maxrss()
            if grown - rss > RSS_BOUND and not out.finding:
                out = Outcome("finding", f"{target}: peak RSS grew by more than {RSS_BOUND >> 20} MiB in one input", f"{(grown - rss) >> 20} MiB")
            rss = grown
        if bc:
            bc.end()
        stats.inputs += 1
        k = _outcome_key(out)
        stats.outcomes[k] = stats.outcomes.get(k, 0) + 1
        stats.per_codec[label] = stats.per_codec.get(label, 0) + 1
        if out.finding:
            f = stats.findings.get(out.label)
            if f is None or len(data) < f["size"]:
                path = None
                if findings_dir is not None:
                    path = findings_dir / input_name("finding", data)
                    path.write_bytes(data)
                    if f is not None and f.get("file") and Path(f["file"]).exists() and f["file"] != str(path):
                        Path(f["file"]).unlink()
                if log is not None and f is None:
                    print(f"[{target}] finding: {out.label} ({out.detail[:120]})", file=log, flush=True)
                stats.findings[out.label] = {"count": (f or {"count": 0})["count"], "detail": out.detail, "size": len(data),
                                             "file": str(path) if path else None}
            stats.findings[out.label]["count"] += 1
        i += 1
        if report is not None and now - last > report_every:
            last = now
            stats.seconds = now - t0
            _write_json(report, {**stats.to_json(), "next": i})
    stats.seconds = time.perf_counter() - t0
    if report is not None:
        _write_json(report, {**stats.to_json(), "next": i, "done": True})
    return stats


def _write_json(path, obj) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def child_main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m codec.fuzzing")
    p.add_argument("--child", action="store_true")
    p.add_argument("--target", choices=TARGETS, required=True)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--iterations", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--deadline", type=float)
    p.add_argument("--beacon")
    p.add_argument("--report")
    p.add_argument("--findings-dir")
    p.add_argument("--memory", choices=MEMORY_MODES, default="sample")
    p.add_argument("--small-seeds", action="store_true")
    p.add_argument("--memory-limit", type=int)
    a = p.parse_args(argv)
    if a.memory_limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (a.memory_limit, a.memory_limit))
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    import faulthandler

    faulthandler.enable()
    fuzz_loop(a.target, seconds=a.seconds, iterations=a.iterations, seed=a.seed, start=a.start, beacon=a.beacon,
              report=a.report, findings_dir=a.findings_dir, memory=a.memory, full_seeds=not a.small_seeds,
              log=sys.stderr, deadline=a.deadline)
    return 0
