"""Thread budget benchmark: several processes encoding at once, with gradcodec's thread budget
(codec/threads.py) and without it (``GRADCODEC_THREADS=off``: Numba's pool of every core,
OpenMP's default spinning waits).

    python benchmarks/bench_threads.py [--procs 1,2,4] [--sizes 262144,4000000]
                                       [--codecs fp16;topk(ratio=0.001)] [--seconds 3]

Each of P processes (as P MPI ranks on one node would) encodes the same kind of array in a
loop for --seconds and reports its median encode time and, measured in the same process, the
median np.copyto of the same buffer; the table shows the slowest process.  The budget is told
the process count the way a launcher tells it (``MPI_LOCALNRANKS``), so P processes on C cores
get max(1, C // P) threads each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import machine_info, render  # noqa: E402

WORKER = r"""
import json, sys, time
import numpy as np
import codec
spec, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
x = (np.random.default_rng(0).standard_t(2, n) * 1e-3).astype(np.float32)
dst = np.empty_like(x)
c = codec.get_codec(spec)
for _ in range(5):
    c.encode(x)
from codec import threads
enc, cpy = [], []
end = time.perf_counter() + seconds
while time.perf_counter() < end:
    t = time.perf_counter(); c.encode(x); enc.append(time.perf_counter() - t)
    t = time.perf_counter(); np.copyto(dst, x); cpy.append(time.perf_counter() - t)
print(json.dumps({"enc": sorted(enc)[len(enc) // 2], "copy": sorted(cpy)[len(cpy) // 2], "threads": threads.budget()}))
"""

MODES = {"budget": {}, "off": {"GRADCODEC_THREADS": "off"}}


def run(procs, spec, n, seconds, mode):
    env = {k: v for k, v in os.environ.items() if k not in ("GRADCODEC_THREADS", "OMP_WAIT_POLICY", "NUMBA_NUM_THREADS")}
    env.update(MODES[mode], MPI_LOCALNRANKS=str(procs))
    ps = [subprocess.Popen([sys.executable, "-c", WORKER, spec, str(n), str(seconds)], env=env, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    out = [json.loads(p.communicate()[0]) for p in ps]
    if any(p.returncode for p in ps):
        raise SystemExit(f"a worker failed: {spec} n={n} procs={procs} {mode}")
    return max(out, key=lambda r: r["enc"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", default="1,2,4", help="process counts (default 1,2,4)")
    ap.add_argument("--sizes", default="262144,4000000", help="float32 elements per array (default 262144,4000000)")
    ap.add_argument("--codecs", default="fp16;topk(ratio=0.001)", help="';'-separated specs")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds of encoding per process (default 3)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    for line in machine_info():
        print(line)
    rows = []
    for spec in [s for s in args.codecs.split(";") if s]:
        for n in [int(v) for v in args.sizes.split(",")]:
            for p in [int(v) for v in args.procs.split(",")]:
                cells = {m: run(p, spec, n, args.seconds, m) for m in MODES}
                b, o = cells["budget"], cells["off"]
                rows.append([spec, f"{n:,}", p, b["threads"], f"{b['enc'] * 1e3:.3f} ({b['copy'] / b['enc']:.2f}x)",
                             o["threads"], f"{o['enc'] * 1e3:.3f} ({o['copy'] / o['enc']:.2f}x)", f"{o['enc'] / b['enc']:.1f}x"])
    print("\nslowest process's median encode, ms (x its own memcpy of the buffer); 'off' = GRADCODEC_THREADS=off")
    print(render(["codec", "elements", "procs", "threads", "budget ms", "threads (off)", "off ms", "off / budget"], rows, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
