"""The supervisor (:func:`supervise`): runs the loop in a child process, saves the input a
crashing or hanging child was running, and starts a new child at the next input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from codec.fuzzing.findings import _ROOT
from codec.fuzzing.loop import _Beacon
from codec.fuzzing.stats import Stats, input_name


def _child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("NUMBA_NUM_THREADS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def supervise(target: str, *, seconds: float = 60.0, iterations: int | None = None, seed: int = 0,
              corpus_dir=None, findings_dir=None, memory: str = "sample", hang_seconds: float = 60.0,
              memory_limit: int | None = 3 << 30, full_seeds: bool = True, log=sys.stderr) -> Stats:
    """Run :func:`fuzz_loop` in a child process; when the child dies (SIGSEGV, abort, killed
    for a hang or for memory) save the input it was running to ``corpus_dir/<target>/crash-<hash>``
    (``hang-<hash>``) and start a new child at the next input, until the time or the
    iterations are used up.  Returns the merged :class:`Stats`."""
    total = Stats(target)
    corpus = Path(corpus_dir) / target if corpus_dir is not None else None
    start = 0
    deadline = time.monotonic() + seconds
    with tempfile.TemporaryDirectory(prefix="gcfuzz-") as tmp:
        beacon = os.path.join(tmp, "beacon")
        n_child = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0.5 or (iterations is not None and start >= iterations):
                break
            report = os.path.join(tmp, f"report{n_child}.json")
            n_child += 1
            args = [sys.executable, "-m", "codec.fuzzing", "--child", "--target", target, "--seconds", str(left),
                    "--deadline", repr(time.time() + left),
                    "--seed", str(seed), "--start", str(start), "--beacon", beacon, "--report", report]
            if iterations is not None:
                args += ["--iterations", str(iterations)]
            if findings_dir is not None:
                args += ["--findings-dir", str(Path(findings_dir) / target)]
            args += ["--memory", memory]
            if not full_seeds:
                args.append("--small-seeds")
            if memory_limit:
                args += ["--memory-limit", str(memory_limit)]
            errpath = os.path.join(tmp, f"stderr{n_child}")
            with open(errpath, "wb") as errfh:
                proc = subprocess.Popen(args, env=_child_env(), cwd=str(_ROOT), stderr=errfh)
            hung = None
            while proc.poll() is None:
                time.sleep(0.2)
                it, data, t, busy = _Beacon.read(beacon)
                if busy and it >= 0 and time.time() - t > hang_seconds:
                    hung = (it, data)
                    proc.kill()
                    proc.wait()
                    break
                if time.monotonic() > deadline + hang_seconds + 120:  # the child ignores its own clock
                    proc.kill()
                    proc.wait()
                    break
            rc = proc.returncode
            with open(errpath, "rb") as fh:
                err_text = fh.read().decode("utf-8", "replace")
            if log is not None and err_text.strip():
                print(err_text[-4000:], file=log, end="", flush=True)
            part, nxt = None, start
            if os.path.exists(report):
                with open(report) as fh:
                    d = json.load(fh)
                part, nxt = Stats.from_json(d), d.get("next", start)
                total.add(part)
            it, data, _, busy = _Beacon.read(beacon)
            if rc == 0 and hung is None:
                break
            if busy and it > nxt:  # inputs run after the child's last report: counted, outcomes unknown
                total.inputs += it - nxt
                total.outcomes["unreported (child died)"] = total.outcomes.get("unreported (child died)", 0) + it - nxt
            # the child died in a call: the beacon holds the input
            if hung is not None:
                kind, (it, data) = "hang", hung
            else:
                kind = "crash"
            if busy and it >= 0:
                entry = {"kind": kind, "signal": -rc if rc and rc < 0 else None, "rc": rc, "iteration": it, "file": None, "size": len(data),
                         "stderr_tail": err_text[-2000:]}
                if corpus is not None:
                    corpus.mkdir(parents=True, exist_ok=True)
                    path = corpus / input_name(kind, data)
                    path.write_bytes(data)
                    entry["file"] = str(path)
                total.crashes.append(entry)
                total.inputs += 1
                total.outcomes["FINDING"] = total.outcomes.get("FINDING", 0) + 1
                if log is not None:
                    print(f"[{target}] {kind} at input {it} (rc {rc}); saved {entry['file']}", file=log, flush=True)
                start = max(nxt, it + 1)
            else:
                if log is not None:
                    print(f"[{target}] child exited with rc {rc} outside a call", file=log, flush=True)
                total.crashes.append({"kind": "child-exit", "rc": rc, "iteration": nxt, "file": None, "size": 0, "stderr_tail": err_text[-2000:]})
                start = nxt + 1
            try:
                os.unlink(beacon)
            except OSError:
                pass
    return total
