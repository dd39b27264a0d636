"""Whole-model steps on fresh gradients: ``encode_many`` and ``decode_many(out=)`` cycling
through several sets of the same tensors, as a training loop sees them.

    python benchmarks/bench_fresh.py [--models sample,small200] [--codecs "topk(ratio=0.01);..."]
                                     [--sets 16] [--calls 400] [--repeat 7] [--step 3] [--markdown]

Every other benchmark times the same tensors again and again, and a selection's branches,
learned by the CPU's predictor on the first calls, then cost almost nothing
(docs/benchmarks.md, "Repeated data flatters a selection": the sample's top-k selection
38-44 µs on the same data, 96-132 µs on fresh data).  Here each codec encodes ``--sets``
sets of the model's tensors in turn (Student-t factors of 3, 2 and 5 degrees of freedom
over its shapes, all at ``--step``), and decodes their frames in turn into the same arrays:
each figure is the best of ``--repeat`` batches of ``--calls`` calls, per call.  Frames of
one step share their keys (random-k), as the frames an allreduce decodes do.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import bullets, footer, heading, log, machine_info, render  # noqa: E402

CODECS = "topk(ratio=0.01);randomk(ratio=0.01);qsgd(levels=16);powersgd(rank=4);fp16"


def sets_of(tensors: dict, count: int) -> list[dict]:
    """``count`` sets of ``tensors``' shapes and dtypes: each value times a Student-t draw
    (3, 2, 5 degrees of freedom in turn), so magnitudes and their order change from set to
    set while the tensors' scales stay."""
    rng = np.random.default_rng(7)
    dfs = (3, 2, 5)
    return [{k: (v * rng.standard_t(dfs[i % 3], v.shape)).astype(v.dtype) for k, v in tensors.items()} for i in range(count)]


def per_call(fn, sets: list, calls: int, repeat: int) -> float:
    """The best of ``repeat`` batches of ``calls`` calls ``fn(sets[i % len(sets)])``, per call."""
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        for i in range(calls):
            fn(sets[i % len(sets)])
        best = min(best, (time.perf_counter() - t) / calls)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="sample,small200")
    ap.add_argument("--codecs", default=CODECS, help="specs separated by ';'")
    ap.add_argument("--sets", type=int, default=16)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--step", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    import codec
    from bench_model import model

    t_run = time.perf_counter()
    md = args.markdown
    bullets(machine_info() + [f"{args.sets} sets cycled, best of {args.repeat} batches of {args.calls} calls, step {args.step}"], md)
    rows = []
    for name in args.models.split(","):
        sets = sets_of(model(name), args.sets)
        outs = {k: np.empty_like(v) for k, v in sets[0].items()}
        for spec in args.codecs.split(";"):
            log(f"{name}: {spec} ...")
            c = codec.get_codec(spec)
            frames = [c.encode_many(s, step=args.step) for s in sets]
            for f in frames:  # (first calls: compiled, plans learned)
                codec.decode_many(f, out=outs)
            enc = per_call(lambda s: c.encode_many(s, step=args.step), sets, args.calls, args.repeat)
            dec = per_call(lambda f: codec.decode_many(f, out=outs), frames, args.calls, args.repeat)
            rows.append([name, f"{len(outs)}", spec, f"{enc * 1e6:.1f}", f"{dec * 1e6:.1f}", f"{enc * 1e6 / len(outs):.2f}", f"{dec * 1e6 / len(outs):.2f}"])
    print()
    heading("Whole-model steps on fresh gradients, µs per call", md)
    print(render(["model", "tensors", "codec", "encode_many", "decode_many(out=)", "encode µs/tensor", "decode µs/tensor"], rows, md))
    footer([f"each call takes the next of {args.sets} sets of the model's tensors (encode) or of their frames (decode)"], t_run, [], md)


if __name__ == "__main__":
    main()
