"""Error-feedback steps in steady state: ``ErrorFeedback.encode`` next to a memcpy of the same array.

    python benchmarks/bench_feedback.py [--n 25000000] [--repeat 9] [--codecs "fp16;adacomp"] [--df 2,3] [--steady] [--markdown]

Issue 15's targets are about an error-feedback step that has run for a while (the residual
has grown to its typical size): AdaComp's work grows with the candidates per bin, and a dense
codec's fused step reads x and the residual and writes the codes and the new residual. For
each codec and each Student-t degree of freedom (``--df``; x 1e-3, three inputs in rotation
so no input stays in cache), eight untimed steps first, then ``--repeat`` timed steps of each
way of calling it, interleaved with a memcpy of the same array (np.copyto into a
preallocated array), whose best time is the reference:

- ``new frame``: ``ef.encode(x)``, a fresh frame each step (its pages faulted as it is written);
- ``out=``: ``ef.encode(x, out=buf)`` into one reused buffer, as a training loop that keeps its
  send buffer does;

each with the payload CRC-32C (the default) and without (``checksum=False``).

The three inputs are independent draws (their largest magnitudes' binades differ, so a
rangefloat window guessed from the last step often fails), or with ``--steady`` one draw
scaled by 1.00, 1.03 and 0.97 (the window holds, as it does from one training step to the
next most of the time).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Samples, bullets, footer, heading, log, machine_info, render  # noqa: E402

SPECS = "fp16;bf16;adacomp;topk(ratio=0.01);rangefloat(bits=8);minmax"
WARM = 8


def inputs(n, df, steady=False):
    """Three inputs of Student-t(``df``) x 1e-3: independent draws, or (``steady``) one draw
    times 1.00, 1.03 and 0.97 (a gradient whose largest magnitude stays in its binade, so a
    rangefloat window holds from step to step)."""
    rng = np.random.default_rng(0)
    if steady:
        x = rng.standard_t(df, n) * 1e-3
        return [(x * f).astype(np.float32) for f in (1.0, 1.03, 0.97)]
    return [(rng.standard_t(df, n) * 1e-3).astype(np.float32) for _ in range(3)]


def bench(spec, xs, repeat):
    import codec

    out = {}
    dst = np.empty_like(xs[0])
    mc = Samples()
    for checksum in (True, False):
        c = codec.get_codec(spec, checksum=checksum)
        efs = {"new frame": codec.ErrorFeedback(c), "out=": codec.ErrorFeedback(c)}
        size = 0
        for i in range(WARM):
            size = max(size, len(efs["new frame"].encode(xs[i % 3])))
        buf = np.zeros(2 * size + 4096, np.uint8)  # room for a sparse codec's varying frames
        for i in range(WARM):
            efs["out="].encode(xs[i % 3], out=buf)
        s = Samples()
        for r in range(repeat):
            x = xs[r % 3]
            mc.time("memcpy", lambda: np.copyto(dst, x))
            s.time("new frame", lambda: efs["new frame"].encode(x))
            s.time("out=", lambda: efs["out="].encode(x, out=buf))
        for way in efs:
            out[(way, checksum)] = s.best(way)
    return out, mc.best("memcpy")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=25_000_000)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--codecs", default=SPECS, help=f"specs separated by ';' (default {SPECS})")
    ap.add_argument("--df", default="2,3", help="Student-t degrees of freedom of the data, comma-separated (default 2,3)")
    ap.add_argument("--steady", action="store_true", help="one draw scaled by 1.00/1.03/0.97 instead of three draws")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    t_run = time.perf_counter()
    md = args.markdown
    bullets(machine_info(), md)
    specs = [s.strip() for s in args.codecs.split(";") if s.strip()]
    rows = []
    for df in [float(d) for d in args.df.split(",")]:
        xs = inputs(args.n, df, args.steady)
        binades = [int(np.floor(np.log2(np.abs(x).max()))) for x in xs]
        log(f"t({df:g}): floor(log2 max|x|) of the three inputs: {binades}")
        for spec in specs:
            log(f"t({df:g}): {spec} ...")
            res, mc = bench(spec, xs, args.repeat)
            cells = [f"{res[(way, ck)] * 1e3:.2f} ({mc / res[(way, ck)]:.2f}x)" for ck in (True, False) for way in ("new frame", "out=")]
            rows.append([spec, f"t({df:g})", f"{mc * 1e3:.2f}"] + cells)
    print()
    heading(f"ErrorFeedback step on {args.n:,} float32 (Student-t x 1e-3), steady state; ms (x memcpy); best of {args.repeat}", md)
    hdr = ["codec", "data", "memcpy ms", "new frame", "out=", "new frame, no CRC", "out=, no CRC"]
    print(render(hdr, rows, md))
    footer([f"{WARM} untimed steps first; three inputs in rotation; memcpy: np.copyto into a preallocated array, interleaved"], t_run, [], md)


if __name__ == "__main__":
    main()
