#!/usr/bin/env python
"""Fuzz gradcodec's parsers (docs/robustness.md).

    python scripts/fuzz.py --target frame --seconds 60            # structure-aware mutation loop
    python scripts/fuzz.py --target all --seconds 300             # every target, time split evenly
    python scripts/fuzz.py --target frame --iterations 1000000 --seconds 36000   # a long run
    python scripts/fuzz.py --target spec --atheris --seconds 600  # coverage-guided (atheris, optional)
    python scripts/fuzz.py --replay tests/fuzz_corpus             # the regression corpus through the oracle
    python scripts/fuzz.py --write-seeds DIR                      # the seed corpus as files (DIR/<target>/)

The mutation loop runs in a child process: when it dies (SIGSEGV, abort, killed for a hang or
for memory) the input it was running is saved to ``<corpus>/<target>/crash-<hash>`` (or
``hang-<hash>``) and a new child goes on with the next input.  With ``--save-findings`` the
smallest input of every finding class is kept as ``<dir>/<target>/finding-<hash>``.  The
summary gives the inputs, the outcomes by kind, the findings and the time; ``--json`` writes
it as JSON too.  Exit status: 0 when no outcome fell outside the promise, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if "--atheris-child" in sys.argv:  # instrument gradcodec for coverage before anything imports it
    import atheris

    with atheris.instrument_imports(include=["codec", "transport"]):
        import codec  # noqa: F401
        import codec.container  # noqa: F401
        import codec.manyframe  # noqa: F401
        from codec import fuzzing  # noqa: F401

from codec import fuzzing  # noqa: E402


def _atheris(target: str, seconds: float, corpus: Path, seed: int, extra, ignore_known: bool = False) -> int:
    """Run atheris (libFuzzer) on ``target`` in a child process with the structure-aware
    mutator as its custom mutator; crashes go to ``corpus/<target>/`` (libFuzzer's crash-<sha1>)."""
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("atheris is not installed (pip install atheris); it is optional", file=sys.stderr)
        return 2
    out = corpus / target
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gcfuzz-atheris-") as tmp:
        seeds = Path(tmp) / "seeds"
        write_seeds(seeds, [target])
        known = ["--ignore-known", "--corpus", str(corpus)] if ignore_known else []
        args = [sys.executable, str(Path(__file__).resolve()), "--atheris-child", "--target", target, "--seed", str(seed), *known, "--",
                str(seeds / target), f"-artifact_prefix={out}/", f"-max_total_time={int(seconds)}", "-timeout=60",
                "-rss_limit_mb=4096", "-max_len=65536", "-print_final_stats=1", f"-seed={seed}", *extra]
        env = dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        return subprocess.call(args, env=env, cwd=str(ROOT))


def _atheris_child(target: str, seed: int, libfuzzer_args, known=frozenset()) -> None:
    import random

    import atheris

    if known:
        print(f"ignoring {len(known)} known finding class(es): {sorted(known)}", file=sys.stderr)
    one = fuzzing.target_function(target, track_memory=False, ignore=frozenset(known))
    seeds = fuzzing.seed_corpus(full=False).of(target)

    def mutator(data: bytes, max_size: int, mseed: int) -> bytes:
        rng = random.Random(mseed)
        if not data or rng.random() < 0.05:
            data = seeds[rng.randrange(len(seeds))][1]
        try:
            out = fuzzing.mutate(target, rng, bytes(data), seeds[rng.randrange(len(seeds))][1])
        except Exception:  # noqa: BLE001 - a mutator bug must not stop libFuzzer: start from a seed
            out = seeds[rng.randrange(len(seeds))][1]
        return out[:max_size]

    def crossover(a: bytes, b: bytes, max_size: int, mseed: int) -> bytes:
        rng = random.Random(mseed)
        try:
            return fuzzing.mutate(target, rng, bytes(a), bytes(b))[:max_size]
        except Exception:  # noqa: BLE001
            return bytes(a)[:max_size]

    atheris.Setup([sys.argv[0], *libfuzzer_args], one, custom_mutator=mutator, custom_crossover=crossover)
    atheris.Fuzz()


def write_seeds(directory: Path, targets) -> None:
    corpus = fuzzing.seed_corpus(full=True)
    for t in targets:
        d = Path(directory) / t
        d.mkdir(parents=True, exist_ok=True)
        for _, data in corpus.of(t):
            (d / fuzzing.input_name("seed", data)).write_bytes(data)


def replay(corpus: Path) -> int:
    bad = 0
    for t in fuzzing.TARGETS:
        d = corpus / t
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.name.startswith(".") or p.suffix in (".md", ".txt", ".json"):
                continue
            out = fuzzing.check(t, p.read_bytes())
            mark = "FINDING" if out.finding else "ok"
            bad += out.finding
            print(f"{mark:8} {t}/{p.name}: {out.kind} {out.label} {out.detail[:120]}")
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="frame", help=f"one of {', '.join(fuzzing.TARGETS)}, a comma-separated list, or all")
    p.add_argument("--seconds", type=float, default=60.0, help="wall-clock budget (split evenly with --target all)")
    p.add_argument("--iterations", type=int, help="stop after this many inputs per target")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--atheris", action="store_true", help="coverage-guided with atheris (optional package)")
    p.add_argument("--ignore-known", action="store_true",
                   help="with --atheris: do not stop on finding classes the regression corpus already shows")
    p.add_argument("--corpus", type=Path, default=ROOT / "tests" / "fuzz_corpus", help="where crashing inputs go")
    p.add_argument("--save-findings", type=Path, metavar="DIR", help="keep the smallest input of each finding class in DIR/<target>/")
    p.add_argument("--memory", choices=fuzzing.MEMORY_MODES, default="sample", help="tracemalloc on every input, a sample (default), or off")
    p.add_argument("--small-seeds", action="store_true", help="fewer seed arrays (faster start)")
    p.add_argument("--json", type=Path, help="write the summary as JSON")
    p.add_argument("--replay", type=Path, metavar="CORPUS", help="run every file of CORPUS/<target>/ through the oracle")
    p.add_argument("--write-seeds", type=Path, metavar="DIR", help="write the seed corpus to DIR/<target>/ and stop")
    p.add_argument("--atheris-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("rest", nargs="*", help="(after --) extra libFuzzer arguments with --atheris")
    a = p.parse_args(argv)
    if a.atheris_child:
        _atheris_child(a.target, a.seed, a.rest, fuzzing.known_labels(a.corpus, a.target) if a.ignore_known else ())
        return 0
    if a.replay:
        return replay(a.replay)
    targets = list(fuzzing.TARGETS) if a.target == "all" else a.target.split(",")
    for t in targets:
        if t not in fuzzing.TARGETS:
            p.error(f"--target: {t!r} is not one of {', '.join(fuzzing.TARGETS)} or all")
    if a.write_seeds:
        write_seeds(a.write_seeds, targets)
        return 0
    if a.atheris:
        rc = 0
        for t in targets:
            rc |= _atheris(t, a.seconds / len(targets), a.corpus, a.seed, a.rest, a.ignore_known)
        return rc
    summary = []
    t0 = time.time()
    for t in targets:
        st = fuzzing.supervise(t, seconds=a.seconds / len(targets), iterations=a.iterations, seed=a.seed, corpus_dir=a.corpus,
                               findings_dir=a.save_findings, memory=a.memory, full_seeds=not a.small_seeds)
        print(fuzzing.format_stats(st), flush=True)
        summary.append(st)
    total_inputs = sum(s.inputs for s in summary)
    total_bad = sum(s.n_findings for s in summary)
    print(f"all: {total_inputs} inputs, {total_bad} outside the promise, {time.time() - t0:.0f} s wall-clock")
    if a.json:
        a.json.write_text(json.dumps({"targets": [s.to_json() for s in summary], "wall_seconds": round(time.time() - t0, 1),
                                      "seed": a.seed, "memory": a.memory}, indent=1) + "\n")
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
