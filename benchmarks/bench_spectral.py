"""Spectral and low-rank benchmark: ``fft`` and ``powersgd`` speed next to memcpy and to the
transforms they are built on, bytes on the wire and error, on a synthetic and the bundled sample.

    python benchmarks/bench_spectral.py [--n 25000000] [--repeat 5] [--passes 3] [--parts speed,lowrank,sample]
                                        [--markdown]

Speed (``--parts speed``): a heavy-tailed synthetic gradient (Student-t, df=2, scaled to 1e-3,
seeded) of --n float32 elements.  References measured in the same run: memcpy of the buffer
(np.copyto into a preallocated array), ``numpy.fft.rfft`` of the whole array (what a naive FFT
codec does; one sample per pass, it is slow) and ``scipy.fft.rfft`` over 4096-element rows
(the transform the codec runs, workers=-1).  Each codec: ``encode(x, step=s)``, ``decode(frame,
out=)`` and ``decode_add`` into a float32 accumulator; every figure is GB/s of float32 source
bytes (n*4 / seconds) and a ratio to memcpy, best of --repeat samples taken over --passes
passes (so a burst of load from another process hits one pass).  First calls (Numba compile or
cache load) are excluded.  Target (issue 5): ``fft(theta=0.9)+rangefloat(bits=8)`` encodes at
>= 1 GB/s on the 2-core machine.

Low rank (``--parts lowrank``): ``powersgd(rank=r)`` on a float32 matrix of about --n elements
(square), encode and decode time next to memcpy and one ``M @ Q`` product (BLAS sgemm with
r columns, the floor of a power iteration, which needs two such products).

Sample (``--parts sample``): the bundled real gradients (codec.sample.load_sample(); 4 steps x
8 tensors): bytes per step (headers included) and error of fft at several theta, and
PowerSGD's error against the truncated-SVD optimum ||M - M_r||_F per weight matrix, for one
cold step and after 5 warm-started steps on the same gradient.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Samples, log, machine_info, rate_cell, render, synthetic  # noqa: E402

FFT_CODECS = (
    "fft(theta=0.9)+rangefloat(bits=8)",
    "fft(theta=0.9)+none",
    "fft(theta=0.99)",
    "fft(theta=0.9,block=1024)",
    "fft(theta=0.9,block=16384)",
    "fft(theta=0.9,keep=global)",
)
POWERSGD_CODECS = ("powersgd(rank=1)", "powersgd(rank=2)", "powersgd(rank=4)")


def error(dec, x):
    d, v = dec.astype(np.float64).ravel(), x.astype(np.float64).ravel()
    return float(np.linalg.norm(d - v) / np.linalg.norm(v))


def bench_speed(x, specs, repeat, passes, s: Samples):
    import scipy.fft

    import codec

    n = x.size
    dst = np.empty_like(x)
    acc = np.zeros_like(x)
    blocks = x[: n // 4096 * 4096].reshape(-1, 4096)
    codecs = [codec.get_codec(sp) for sp in specs]
    frames = {}
    for c in codecs:  # first calls: compile or load the cache
        frames[c.spec] = c.encode(x)
        c.decode(frames[c.spec], out=dst)
        c.decode_add(frames[c.spec], acc)
    scipy.fft.rfft(blocks, axis=1, workers=-1)
    for p in range(passes):
        log(f"pass {p + 1}/{passes}")
        s.time("numpy.fft.rfft (whole array)", lambda: np.fft.rfft(x))
        for i in range(repeat):
            s.time("memcpy", lambda: np.copyto(dst, x))
            s.time("scipy.fft.rfft (4096-rows)", lambda: scipy.fft.rfft(blocks, axis=1, workers=-1))
            for c in codecs:
                frames[c.spec] = s.time(c.spec + " enc", lambda c=c: c.encode(x, step=p * repeat + i))
                s.time(c.spec + " dec", lambda c=c: c.decode(frames[c.spec], out=dst))
                s.time(c.spec + " add", lambda c=c: c.decode_add(frames[c.spec], acc))
    mem = s.best("memcpy")
    nb = x.nbytes
    rows = [
        ["memcpy", rate_cell(nb, mem, mem), "", "", "", ""],
        ["numpy.fft.rfft, whole array", rate_cell(nb, s.best("numpy.fft.rfft (whole array)"), mem), "", "", "", ""],
        ["scipy.fft.rfft, 4096-element rows", rate_cell(nb, s.best("scipy.fft.rfft (4096-rows)"), mem), "", "", "", ""],
    ]
    for c in codecs:
        f = frames[c.spec]
        rows.append(
            [
                c.spec,
                rate_cell(nb, s.best(c.spec + " enc"), mem),
                rate_cell(nb, s.best(c.spec + " dec"), mem),
                rate_cell(nb, s.best(c.spec + " add"), mem),
                f"{len(f):,} ({nb / len(f):.1f}x)",
                f"{error(codec.decode(f), x):.3f}",
            ]
        )
    numpy_s = s.best("numpy.fft.rfft (whole array)")
    enc = s.best(codecs[0].spec + " enc")
    note = f"{codecs[0].spec} encode is {numpy_s / enc:.1f}x numpy.fft.rfft of the whole array"
    return ["", "encode GB/s (x memcpy)", "decode", "decode_add", "bytes (ratio)", "rel. L2 error"], rows, note


def bench_lowrank(n, repeat, passes, s: Samples):
    import codec

    side = int(np.sqrt(n))
    rng = np.random.default_rng(1)
    M = (rng.standard_t(2, (side, side)) * 1e-3).astype(np.float32)
    dst = np.empty_like(M)
    codecs = [codec.get_codec(sp) for sp in POWERSGD_CODECS]
    frames = {c.spec: c.encode(M) for c in codecs}
    for c in codecs:
        c.decode(frames[c.spec], out=dst)
    for p in range(passes):
        log(f"low-rank pass {p + 1}/{passes}")
        for _ in range(repeat):
            s.time("memcpy M", lambda: np.copyto(dst, M))
            for c in codecs:
                r = c.stages[0].rank
                q = rng.standard_normal((side, r)).astype(np.float32)
                s.time(f"M@Q r={r}", lambda q=q: M @ q)
                frames[c.spec] = s.time(c.spec + " enc", lambda c=c: c.encode(M))
                s.time(c.spec + " dec", lambda c=c: c.decode(frames[c.spec], out=dst))
    mem = s.best("memcpy M")
    rows = []
    for c in codecs:
        r = c.stages[0].rank
        f = frames[c.spec]
        rows.append(
            [
                c.spec,
                rate_cell(M.nbytes, s.best(c.spec + " enc"), mem),
                f"{s.best(c.spec + ' enc') / s.best(f'M@Q r={r}'):.1f}",
                rate_cell(M.nbytes, s.best(c.spec + " dec"), mem),
                f"{len(f):,} ({M.nbytes / len(f):.0f}x)",
            ]
        )
    head = [f"{side}x{side} float32", "encode GB/s (x memcpy)", "encode / (M@Q)", "decode", "bytes (ratio)"]
    return head, rows


def bench_sample():
    import codec
    from codec.sample import load_sample
    from codec.stage import Context

    grads = load_sample()
    steps = sorted({k.split("/")[0] for k in grads})
    raw = sum(v.nbytes for v in grads.values()) / len(steps)
    rows = []
    for spec in ("fft(theta=0.5)+none", "fft(theta=0.9)+none", "fft(theta=0.9)", "fft(theta=0.99)", "powersgd(rank=2)", "powersgd(rank=4)"):
        c = codec.get_codec(spec)
        size, errs = 0, []
        for k, g in grads.items():
            f = c.encode(g, key=k)
            size += len(f)
            errs.append(error(codec.decode(f), g))
        rows.append([spec, f"{size / len(steps):,.0f}", f"{raw / (size / len(steps)):.1f}x", f"{np.median(errs):.3f}", f"{max(errs):.3f}"])
    table1 = (["bundled sample", "bytes/step", "ratio", "median rel. error", "max rel. error"], rows)
    rows = []
    for rank in (1, 2, 4):
        c = codec.get_codec(f"powersgd(rank={rank})")
        cold, warm = [], []
        for k, g in grads.items():
            if g.ndim < 2 or c.stages[0].matrix(g.shape) is None:
                continue
            sv = np.linalg.svd(g.reshape(g.shape[0], -1).astype(np.float64), compute_uv=False)
            opt = float(np.sqrt(np.sum(sv[rank:] ** 2)))
            state = {}  # the key's warm-start state, as ErrorFeedback keeps it
            for it in range(5):
                dec = codec.decode(c.encode_with(g, Context(g.shape, g.dtype, key=k, state=state)))
                e = float(np.linalg.norm(dec.astype(np.float64) - g) / opt)
                if it == 0:
                    cold.append(e)
            warm.append(e)
        rows.append([f"powersgd(rank={rank})", f"{np.median(cold):.2f} / {max(cold):.2f}", f"{np.median(warm):.3f} / {max(warm):.3f}", str(len(cold))])
    table2 = (["error / SVD optimum", "cold step (median / max)", "after 5 warm steps (median / max)", "matrices"], rows)
    return table1, table2


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=25_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--parts", default="speed,lowrank,sample")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    parts = set(a.parts.split(","))
    print("\n".join(machine_info()))
    s = Samples()
    if "speed" in parts:
        x = synthetic(a.n)
        head, rows, note = bench_speed(x, FFT_CODECS, a.repeat, a.passes, s)
        print(f"\nfft on {a.n:,} float32 (Student-t df=2)\n")
        print(render(head, rows, a.markdown))
        print(f"\n{note}")
    if "lowrank" in parts:
        head, rows = bench_lowrank(a.n, a.repeat, a.passes, s)
        print("\nPowerSGD\n")
        print(render(head, rows, a.markdown))
    if "sample" in parts:
        for head, rows in bench_sample():
            print()
            print(render(head, rows, a.markdown))


if __name__ == "__main__":
    main()
