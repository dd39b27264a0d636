"""One transport step with device gradients (bench_cuda.py launches it; docs/benchmarks.md):

    mpiexec -n 2 python -m mpi4py benchmarks/bench_cuda_transport.py [--n 25000000] [--repeat 5] [--markdown]

Every rank holds ``--n`` float32 gradient values on the GPU (two tensors: 80% and 20%) and
runs ``Allreducer.reduce`` on them, for fp16, top-k at 1% and ``none``; the ranks share the
machine's GPU.  Each row: the best step time over ``--repeat`` after a warm-up (the device
synchronized and the ranks at a barrier around each step), the bytes this rank's frames
moved across the link (``bytes_sent + bytes_received``: its own frame down, the others'
up; a CUDA-aware MPI moves none), the gradient's own bytes, and the same step done densely
by hand (the gradient copied to pinned host memory, MPI Allreduce there, the sum copied back:
what a transport that stages gradients moves).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import heading, render  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=25_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--specs", default="fp16;topk(ratio=0.01);none;powersgd(rank=4)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    from mpi4py import MPI
    from numba import cuda

    from transport import Allreducer
    from transport.device import cuda_aware

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(rank)
    rows_w = max(1, int(np.sqrt(args.n * 0.8)))  # a weight matrix (PowerSGD's P and Q) and a 1-D rest
    a = rows_w * int(args.n * 0.8 / rows_w)
    grads = {"w": cuda.to_device(rng.standard_normal((rows_w, a // rows_w)).astype(np.float32)), "b": cuda.to_device(rng.standard_normal(args.n - a).astype(np.float32))}
    dense = sum(g.nbytes for g in grads.values())

    def best(fn):
        fn()
        times = []
        for _ in range(args.repeat):
            cuda.synchronize()
            comm.Barrier()
            t = time.perf_counter()
            fn()
            cuda.synchronize()
            times.append(comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
        return min(times)

    pinned = {k: cuda.pinned_array(g.shape, np.float32) for k, g in grads.items()}

    def staged():  # the dense step a staging transport takes: down, MPI Allreduce, up
        for k, g in grads.items():
            g.copy_to_host(pinned[k])
            comm.Allreduce(MPI.IN_PLACE, pinned[k])
            g.copy_to_device(pinned[k])

    t_dense = best(staged)
    rows = [["dense, staged by hand: D2H, MPI Allreduce, H2D (reference)", f"{t_dense * 1e3:.2f}", f"{2 * dense / 1e6:.1f}", f"{dense / 1e6:.1f}", "1.00x"]]
    for spec in [s.strip() for s in args.specs.split(";") if s.strip()]:
        red = Allreducer(spec, comm)
        t = best(lambda: red.reduce(grads))
        moved = 0 if cuda_aware() else red.stats.bytes_sent + red.stats.bytes_received
        rows.append([f"Allreducer({spec!r}).reduce(device gradients)", f"{t * 1e3:.2f}", f"{moved / 1e6:.1f}", f"{dense / 1e6:.1f}", f"{t_dense / t:.2f}x"])
    if rank == 0:
        heading(f"A transport step with device gradients on {size} ranks sharing one GPU ({args.n:,} float32 a rank; MPI CUDA-aware: {cuda_aware()}); best of {args.repeat}", args.markdown)
        print(render(["step", "ms", "MB across the link (a rank)", "gradient MB", "x dense staged (time)"], rows, args.markdown))


if __name__ == "__main__":
    main()
