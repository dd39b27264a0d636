"""The first call's cost: a fresh process's import, first and second ``decode_many`` of a small
many-tensor frame, first and second ``encode_many`` (docs/robustness.md, "The first call").

    python benchmarks/first_call.py [--codecs "fp16;topk(ratio=0.5);qsgd"] [--repeat 2] [--cold]

The parent writes one frame per codec (two float32 tensors of 10 and 3 elements) and runs a
fresh child process per codec and repeat, which times its own calls.  ``--cold`` gives each
child an empty ``NUMBA_CACHE_DIR``, so its kernels compile instead of loading from the cache
(as after a fresh install or a changed source).  Run it pinned (``taskset -c 0``) and say how
busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np, codec
t1 = time.perf_counter()
spec, path = sys.argv[1], sys.argv[2]
frame = open(path, "rb").read()
t2 = time.perf_counter(); codec.decode_many(frame); t3 = time.perf_counter()
codec.decode_many(frame); t4 = time.perf_counter()
c = codec.get_codec(spec)
x = {"a": np.ones(10, np.float32), "b": np.ones(3, np.float32)}
t5 = time.perf_counter(); c.encode_many(x); t6 = time.perf_counter()
c.encode_many(x); t7 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "decode_first_s": t3 - t2, "decode_second_ms": 1e3 * (t4 - t3),
                  "encode_first_s": t6 - t5, "encode_second_ms": 1e3 * (t7 - t6)}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codecs", default="fp16;topk(ratio=0.5);qsgd", help="specs separated by ';'")
    ap.add_argument("--repeat", type=int, default=2, help="fresh processes per codec")
    ap.add_argument("--cold", action="store_true", help="an empty Numba cache per child: its kernels compile")
    args = ap.parse_args(argv)
    import numpy as np

    import codec

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.codecs.split(";"):
            path = os.path.join(tmp, "frame.gcf")
            with open(path, "wb") as f:
                f.write(codec.get_codec(spec).encode_many({"a": np.ones(10, np.float32), "b": np.ones(3, np.float32)}))
            for _ in range(args.repeat):
                env = dict(os.environ)
                if args.cold:
                    env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(dir=tmp)
                out = subprocess.run([sys.executable, "-c", CHILD, spec, path], env=env, capture_output=True, text=True, check=True)
                rows.append({"codec": spec, "cache": "cold" if args.cold else "warm", **json.loads(out.stdout)})
    print(f"{'codec':20s} {'cache':5s} {'import':>8s} {'1st decode_many':>16s} {'2nd':>9s} {'1st encode_many':>16s} {'2nd':>9s}")
    for r in rows:
        print(f"{r['codec']:20s} {r['cache']:5s} {r['import_s']:7.2f}s {r['decode_first_s']:15.2f}s {r['decode_second_ms']:7.2f}ms"
              f" {r['encode_first_s']:15.2f}s {r['encode_second_ms']:7.2f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
