"""Compressed allreduce against dense MPI Allreduce, in one run, plus an alpha-beta projection.

    mpiexec -n 4 python -m transport.bench [--steps 3] [--codecs SPEC;SPEC;...] [--no-sample]
                                           [--no-synthetic] [--bucket-bytes B] [--markdown]

Two gradient sets, each reduced by every codec and by ``none`` (MPI Allreduce, the baseline)
in the same run:

* ``sample``: the bundled real gradients (codec.sample: a small CNN, 8 tensors, 35,434
  elements); rank r reduces recorded step r mod 4, so ranks hold different real gradients;
* ``synthetic``: a ResNet-50-shaped model (161 tensors, 25,557,032 float32 elements), every
  tensor heavy-tailed (Student-t, df=2, scaled 1e-3), seeded by rank.

Method: one untimed warm-up step per codec (Numba loads or compiles its kernels), then
``--steps`` timed steps; a step's time is the slowest rank's ``reduce()`` after a Barrier,
and the table shows the best step (its stats are that step's, of rank 0).  Bytes are this rank's ``stats.bytes_sent`` (its message,
headers included; for gTop-k every round's sends, for PowerSGD both rounds), averaged over
ranks; ``x smaller`` is dense bytes over that.  ``speedup`` is the dense Allreduce's step
time over the codec's, both measured in this run.  The cores are divided among the ranks that
share a node: gradcodec's kernels by its thread budget (codec/threads.py; run with
``GRADCODEC_THREADS=off`` to see the machine without it), NumPy's BLAS
by the BLAS thread variables, which default here to cores // ranks per node (from the
launcher's environment), at least 1.

The projection applies transport.costmodel to the synthetic model's measured message sizes
and compute times (encode, decode of one frame or one gTop-k merge) for 1, 10 and 100 Gbit/s
links and 8 to 1024 ranks.
"""

from __future__ import annotations

import os


def _threads_per_rank() -> str:
    """cores // ranks on this node (MPICH's MPI_LOCALNRANKS or Open MPI's local size), at least 1:
    the BLAS share, set before NumPy loads, so before ``codec`` (and its ``codec.threads``,
    which budgets gradcodec's own kernels) can be imported."""
    local = os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or "1"
    return str(max(1, (os.cpu_count() or 1) // max(1, int(local))))


# before NumPy loads its BLAS: ranks sharing a node share its cores (gradcodec's own kernels
# follow codec/threads.py, which needs no variable set here)
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _threads_per_rank())

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

DEFAULT_CODECS = (
    "none",
    "fp16",
    "qsgd(levels=16)",
    "sign",
    "topk(ratio=0.001)",
    "topk(ratio=0.001)+fp16",
    "gtopk(ratio=0.001)",
    "randomk(ratio=0.001)",
    "powersgd(rank=4)",
)
#: codecs of the projection table (the synthetic model's measurements)
PROJECTED = ("none", "fp16", "topk(ratio=0.001)", "gtopk(ratio=0.001)", "powersgd(rank=4)")


def resnet50_shapes() -> dict[str, tuple]:
    """Parameter shapes of torchvision's ResNet-50 (25,557,032 elements), PyTorch names."""
    shapes = {"conv1.weight": (64, 3, 7, 7), "bn1.weight": (64,), "bn1.bias": (64,)}
    inplanes = 64
    for li, (planes, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), 1):
        for b in range(blocks):
            pre = f"layer{li}.{b}"
            cin = inplanes if b == 0 else planes * 4
            convs = ((cin, planes, 1), (planes, planes, 3), (planes, planes * 4, 1))
            for ci, (i, o, ks) in enumerate(convs, 1):
                shapes[f"{pre}.conv{ci}.weight"] = (o, i, ks, ks)
                shapes[f"{pre}.bn{ci}.weight"] = (o,)
                shapes[f"{pre}.bn{ci}.bias"] = (o,)
            if b == 0:
                shapes[f"{pre}.downsample.0.weight"] = (planes * 4, cin, 1, 1)
                shapes[f"{pre}.downsample.1.weight"] = (planes * 4,)
                shapes[f"{pre}.downsample.1.bias"] = (planes * 4,)
        inplanes = planes * 4
    shapes["fc.weight"] = (1000, 2048)
    shapes["fc.bias"] = (1000,)
    return shapes


def synthetic(rank: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([2026, rank])
    return {k: (rng.standard_t(2, size=s) * 1e-3).astype(np.float32) for k, s in resnet50_shapes().items()}


def sample(rank: int) -> dict[str, np.ndarray]:
    from codec.sample import load_sample

    grads = load_sample()
    steps = sorted({k.split("/")[0] for k in grads})
    mine = steps[rank % len(steps)]
    return {k.split("/", 1)[1]: v for k, v in grads.items() if k.startswith(mine + "/")}


def run(comm, spec, tensors, steps, bucket_bytes=0, out=False):
    """(best step seconds over ranks, mean bytes sent per rank, stats of the best step);
    ``out``: every step writes its result into the same preallocated arrays (``reduce(out=)``)."""
    from transport import Allreducer

    red = Allreducer(spec, comm, bucket_bytes=0 if spec.startswith("powersgd") else bucket_bytes)
    into = {k: np.empty_like(v) for k, v in tensors.items()} if out else None
    red.reduce(tensors, out=into)  # warm-up: kernels load or compile
    best, best_stats = float("inf"), None
    for _ in range(steps):
        comm.Barrier()
        t = time.perf_counter()
        red.reduce(tensors, out=into)
        dt = comm.allreduce(time.perf_counter() - t, op=_max())
        if dt < best:
            best, best_stats = dt, red.stats
    sent = comm.allreduce(best_stats.bytes_sent) / comm.Get_size()
    return best, sent, best_stats


def _max():
    from mpi4py import MPI

    return MPI.MAX


def render(headers, rows, markdown):
    if markdown:
        out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def table(comm, name, tensors, codecs, steps, markdown, say, bucket_bytes=0, out=False):
    dense = sum(a.nbytes for a in tensors.values())
    n = sum(a.size for a in tensors.values())
    fused = f", buckets of {bucket_bytes:,} bytes (powersgd: per tensor)" if bucket_bytes else ", each tensor coded alone"
    into = ", results into preallocated arrays (out=)" if out else ""
    say(f"\n{name}: {len(tensors)} tensors, {n:,} elements, {dense / 1e6:.2f} MB per rank, {comm.Get_size()} ranks{fused}{into}, best of {steps} steps\n")
    results, rows = {}, []
    for spec in codecs:
        try:
            results[spec] = run(comm, spec, tensors, steps, bucket_bytes, out)
        except Exception as e:  # a codec that fails is listed with its error, the rest still run
            rows.append([spec, "error", "", "", "", "", "", f"{type(e).__name__}: {e}"[:60]])
            continue
    base = results.get("none", (None,))[0]
    for spec, (t, sent, st) in results.items():
        rows.append(
            [
                spec,
                f"{t * 1e3:.1f}",
                f"{sent / 1e6:.3f}",
                f"{dense / sent:.1f}" if sent else "-",
                f"{base / t:.2f}" if base else "-",
                f"{st.encode_s * 1e3:.1f}",
                f"{st.communicate_s * 1e3:.1f}",
                f"{st.decode_s * 1e3:.1f}",
            ]
        )
    say(render(["codec", "ms/step", "MB sent/rank", "x smaller", "speedup vs none", "encode ms", "comm ms", "decode ms"], rows, markdown))
    return results


def project(comm, results, tensors, markdown, say):
    from transport import costmodel as cm

    p_now = comm.Get_size()
    schemes = []
    for spec in PROJECTED:
        if spec not in results:
            continue
        t, sent, st = results[spec]
        if spec == "none":
            schemes.append(cm.Scheme(spec, "allreduce", sum(a.nbytes for a in tensors.values())))
        elif spec.startswith("gtopk"):
            rounds = max(1, cm.tree_rounds(p_now))
            k = int((sent / rounds - 8) // 8)  # pairs per round, as measured (8-byte status, then uint32 + float32 each)
            merge = st.decode_s / rounds
            schemes.append(cm.Scheme(spec, "gtopk", 8 * k, k=k, encode_s=st.encode_s, decode_s=merge))
        elif spec.startswith("powersgd"):
            schemes.append(cm.Scheme(spec, "powersgd", sent / 2, q_bytes=sent / 2, encode_s=st.encode_s, decode_s=st.decode_s))
        else:
            schemes.append(cm.Scheme(spec, "allgather", sent, encode_s=st.encode_s, decode_s=st.decode_s / p_now))
    names = [s.name for s in schemes]
    say(
        "\nalpha-beta projection for the synthetic model (ms per step; compute measured here, "
        "communication modelled; docs/transport.md):\n"
    )
    rows = []
    for link, p, times in cm.projection(schemes):
        best = min(times, key=times.get)
        rows.append([link, str(p)] + [f"{times[nm] * 1e3:.1f}" for nm in names] + [best])
    say(render(["link", "ranks"] + names + ["fastest"], rows, markdown))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m transport.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per codec (best is shown)")
    ap.add_argument("--codecs", default=";".join(DEFAULT_CODECS), help="specs separated by ';' ('none' is the baseline)")
    ap.add_argument("--no-sample", action="store_true", help="skip the bundled real gradients")
    ap.add_argument("--no-synthetic", action="store_true", help="skip the 25M-element synthetic model")
    ap.add_argument("--bucket-bytes", type=int, default=0, help="Allreducer(bucket_bytes=): fuse tensors into buckets (not powersgd)")
    ap.add_argument("--out", action="store_true", help="reduce(tensors, out=...) into preallocated arrays")
    ap.add_argument("--markdown", action="store_true", help="markdown tables")
    args = ap.parse_args(argv)
    from mpi4py import MPI

    import codec._jit  # noqa: F401  (Numba as the kernels load it, for the thread budget below)
    from codec import threads

    from transport.allreduce import node_ranks

    comm = MPI.COMM_WORLD
    local = node_ranks(comm)
    threads.set_local_ranks(local)  # as an Allreducer does at its first step: the header shows the budget
    rank = comm.Get_rank()

    def say(text):
        if rank == 0:
            print(text, flush=True)

    codecs = [c.strip() for c in args.codecs.split(";") if c.strip()]
    if "none" not in codecs:
        codecs.insert(0, "none")
    say(
        f"python -m transport.bench: {comm.Get_size()} ranks ({local} on this node; each: {threads.budget()} gradcodec threads"
        f" ({os.environ.get(threads.ENV) or 'budget'}), {os.environ['OPENBLAS_NUM_THREADS']} BLAS threads), "
        f"{MPI.Get_library_version().splitlines()[0].strip()}, mpi4py {__import__('mpi4py').__version__}, {sys.platform}"
    )
    if not args.no_sample:
        table(comm, "sample (bundled real gradients)", sample(rank), codecs, args.steps, args.markdown, say, args.bucket_bytes, args.out)
    if not args.no_synthetic:
        tensors = synthetic(rank)
        results = table(comm, "synthetic (ResNet-50 shapes, Student-t)", tensors, codecs, args.steps, args.markdown, say, args.bucket_bytes, args.out)
        project(comm, results, tensors, args.markdown, say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
