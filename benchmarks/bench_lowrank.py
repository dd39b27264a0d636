"""PowerSGD's products on the CPU: the fixed-order kernels (``lowrank.project`` /
``back_project``, what frames are made of since 2026-11-29) next to NumPy's BLAS calls they
replaced (``M @ Q``, ``M.T @ P``) and a plain copy of the matrix, in the same run, and the
whole ``powersgd(rank=4)`` encode and decode.

    python benchmarks/bench_lowrank.py [--repeat 5] [--markdown]

Shapes: ResNet-50's largest weight matrices (as PowerSGD views them: out x in*kh*kw) and a
square one; rank 4.  Times are the best of ``--repeat`` after a warm-up call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import best as best_of, bullets, footer, heading, machine_info, render  # noqa: E402

SHAPES = [(2048, 4608), (512, 4608), (2048, 512), (1000, 1000), (1000, 2048)]


def best(fn, repeat):
    """The best of ``repeat`` calls after a warm-up one (the first compiles)."""
    fn()
    return best_of(fn, repeat)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    import codec
    from codec.kernels import module
    from codec.layout import LANES

    t_run = time.perf_counter()
    md = args.markdown
    bullets(machine_info(), md)
    k = module("lowrank")
    r = args.rank
    rows = []
    for n, m in SHAPES:
        rng = np.random.default_rng(0)
        mat = (rng.standard_t(3, (n, m)) * 1e-3).astype(np.float32)
        q = rng.standard_normal((m, r)).astype(np.float32)
        qt = np.ascontiguousarray(q.T)
        p = np.empty((n, r), np.float32)
        qq = np.empty((m, r), np.float32)
        dst = np.empty_like(mat)
        t_copy = best(lambda: np.copyto(dst, mat), args.repeat)
        # the kernels first: OpenBLAS's threads spin for a while after a call, taking the cores
        t_p = best(lambda: k.project(mat, qt, p, LANES), args.repeat)
        t_q = best(lambda: k.back_project(mat, p, qq), args.repeat)
        c = codec.get_codec(f"powersgd(rank={r})")
        t_enc = best(lambda: c.encode(mat), args.repeat)
        frame = c.encode(mat)
        out = np.empty_like(mat)
        t_dec = best(lambda: c.decode(frame, out=out), args.repeat)
        pp, qv = p.copy(), rng.standard_normal((m, r)).astype(np.float32)
        t_blas_p = best(lambda: mat @ q, args.repeat)
        t_blas_q = best(lambda: mat.T @ p, args.repeat)
        t_blas_dec = best(lambda: np.matmul(pp, qv.T, out=out), args.repeat)
        for what, t, ref in (("M Q: lowrank.project", t_p, t_blas_p), ("M^T P: lowrank.back_project", t_q, t_blas_q),
                             ("P Q^T: lowrank.expand (decode)", t_dec, t_blas_dec)):
            rows.append([f"{n} x {m}", what, f"{t * 1e3:.2f}", f"{ref * 1e3:.2f}", f"{ref / t:.2f}x", f"{t_copy / t:.2f}x"])
        rows.append([f"{n} x {m}", f"powersgd(rank={r}) encode (whole step)", f"{t_enc * 1e3:.2f}", f"{(t_blas_p + t_blas_q) * 1e3:.2f}", f"{(t_blas_p + t_blas_q) / t_enc:.2f}x", f"{t_copy / t_enc:.2f}x"])
    heading(f"PowerSGD rank {r}, float32, best of {args.repeat}: the fixed-order kernels against NumPy's BLAS", md)
    print(render(["matrix", "what", "ms", "BLAS ms", "x BLAS (> 1: faster)", "x copy of M"], rows, md))
    footer(["BLAS: NumPy's OpenBLAS with its default threads; the kernels on Numba's thread budget (codec.threads)"], t_run, [], md)


if __name__ == "__main__":
    main()
