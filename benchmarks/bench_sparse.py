"""Sparsifier benchmark: error-feedback encode, decode and decode_add speed next to memcpy and top-k baselines.

    python benchmarks/bench_sparse.py [--n 25000000] [--ratios 0.001,0.01] [--repeat 9] [--passes 3]
                                      [--codecs topk,gaussiank,...] [--budget 8] [--no-sample] [--markdown]

Codecs: topk(ratio=R), gaussiank(ratio=R), dgc(ratio=R), randomk(ratio=R), threshold(value=T)
with T the (1-R) quantile of |x| (so a bare encode keeps ~R), and adacomp (adaptive: its kept
fraction is reported).  A codec that is not registered yet is listed as skipped; one that
raises is listed with its error.  Baselines on the same array: memcpy, numpy.argpartition
top-k (``np.argpartition(np.abs(x), n-k)[n-k:]``) and ``torch.topk(t.abs(), k)`` with 2 threads
when torch is importable (it is optional, not a dependency).

Data: a heavy-tailed synthetic gradient (Student-t, df=2, scaled to 1e-3, seeded) of --n
float32 elements, and the bundled real sample (codec.sample.load_sample(): 4 recorded steps x
8 tensors, 35,434 elements per step; see ``bench_sample`` for how it is run).

Method.  Every speed is GB/s of float32 source bytes (n * 4 / seconds) and a ratio to a memcpy
of the same buffer (np.copyto into a preallocated array) measured in the same run, because the
machine is shared and noisy.  Every figure is the best (minimum time) of --repeat samples,
taken in --passes passes over all codecs, so that a burst of load from another process hits
one pass, not all of one codec's samples.  Within a pass each sample is one memcpy, one EF
encode, one bare encode, then three each of decode (into a preallocated array) and decode_add
(into a dense accumulator), which are cheap; the memcpy rate is the best of all memcpy
samples of the run.  Each pass starts a fresh ErrorFeedback and makes two untimed warm-up steps; the very first call of
each operation (Numba compile, or cache load when the on-disk cache is warm) is reported
separately.  EF steps cycle through three gradients (the synthetic array and two rotations of
it, so every position sees a fresh value each step); the latest EF frame is the one decoded
and counted on the wire (kept count, bytes, headers included).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (  # noqa: E402
    Samples, bullets, footer, heading, job_pass, load_steps, log, machine_info, memcpy_line, rate_cell, render, synthetic,
    timed,
)

SPARSIFIERS = ("topk", "gaussiank", "dgc", "randomk", "threshold", "adacomp")
POOL = 3  # distinct gradients cycled through the error-feedback steps
DECODE_SAMPLES = 3  # decode and decode_add samples per encode sample


# --------------------------------------------------------------------------- frames


def kept_count(frame) -> int:
    """Kept elements of a sparse frame: the values section's count, else the index section's."""
    import codec

    secs = codec.inspect(frame)["sections"]
    for kind in ("values", "index_delta", "index_bitmap"):
        for s in secs:
            if s["kind"] == kind:
                return int(s["count"])
    return 0


def k_of(ratio, n):
    return 0 if n == 0 else min(n, max(1, math.floor(ratio * n)))


def display(name, ratio, spec):
    """What the tables show: the canonical spec drops parameters at their default
    (``topk(ratio=0.01)`` is ``topk``), so ratio codecs show their ratio explicitly."""
    if ratio is None or name == "threshold":
        return spec
    return f"{name}(ratio={ratio:g})" if spec == name else spec


def skip_row(r, width):
    """The row of a codec that was skipped or failed: its name, the reason, blanks."""
    shown = r["name"] if r["ratio"] is None else f"{r['name']}(ratio={r['ratio']:g})"
    return [shown, r["skip"]] + [""] * (width - 2)


def specs_for(name, ratio, absx):
    """Spec string for codec ``name`` at target density ``ratio`` (threshold: quantile of |x|)."""
    if name == "threshold":
        t = float(np.quantile(absx, 1.0 - ratio)) if absx.size else 0.0
        return f"threshold(value={t:.6g})"
    if name == "adacomp":
        return "adacomp"
    return f"{name}(ratio={ratio:g})"


# --------------------------------------------------------------------------- synthetic


class CodecJob:
    """One codec on the synthetic gradient, measured over several passes (see ``run_pass``)."""

    def __init__(self, name, ratio, spec):
        self.name, self.ratio, self.spec = name, ratio, spec
        self.s = Samples()
        self.first = None
        self.spent = 0.0

    def run_pass(self, pool, x, out, acc, dst, memcpy, count, budget):
        """A fresh ErrorFeedback, two untimed warm-up steps (the very first calls of each
        operation are timed as 'first'), then up to ``count`` interleaved samples."""
        import codec

        start = time.perf_counter()
        ef = codec.ErrorFeedback(self.spec)
        c = ef.codec
        if self.first is None:
            first = {}
            frame, first["ef"] = timed(lambda: ef.encode(pool[0], key="g"))
            _, first["enc"] = timed(lambda: c.encode(x))
            _, first["dec"] = timed(lambda: codec.decode(frame, out=out))
            _, first["add"] = timed(lambda: c.decode_add(frame, acc))
            self.first = first
        else:
            ef.encode(pool[0], key="g")
        frame = ef.encode(pool[1], key="g")  # second warm-up step (double-buffered kernels allocate here)
        t0 = time.perf_counter()
        for r in range(count):
            memcpy.time("memcpy", lambda: np.copyto(dst, x))
            frame = self.s.time("ef", lambda: ef.encode(pool[(r + 2) % len(pool)], key="g"))
            self.s.time("enc", lambda: c.encode(x))
            for _ in range(DECODE_SAMPLES):  # cheap next to the encodes: more samples against noise
                self.s.time("dec", lambda: codec.decode(frame, out=out))
                self.s.time("add", lambda: c.decode_add(frame, acc))
            if time.perf_counter() - t0 > budget:
                break
        self.canonical = c.spec
        self.kept = kept_count(frame)
        self.wire = len(frame)
        self.spent += time.perf_counter() - start

    def result(self):
        return {"name": self.name, "ratio": self.ratio, "spec": display(self.name, self.ratio, self.canonical),
                "kept": self.kept, "wire": self.wire, "first": self.first, "samples": self.s.count("ef"),
                **{op: self.s.best(op) for op in ("ef", "enc", "dec", "add")}}


def baselines_pass(x, ks, dst, memcpy, count, torch, s):
    """``count`` interleaved samples of memcpy, argpartition and torch.topk for every k."""
    n = x.size
    tx = torch.from_numpy(x) if torch is not None else None
    for k in ks:
        if s.count(("argpartition", k)) == 0:  # first calls, untimed
            np.argpartition(np.abs(x), n - k)[n - k:]
            if torch is not None:
                torch.topk(tx.abs(), k)
    for _ in range(count):
        for k in ks:
            memcpy.time("memcpy", lambda: np.copyto(dst, x))
            s.time(("argpartition", k), lambda: np.argpartition(np.abs(x), n - k)[n - k:])
            if torch is not None:
                s.time(("torch", k), lambda: torch.topk(tx.abs(), k))


# --------------------------------------------------------------------------- real sample


def bench_sample(name, ratio, steps, repeat):
    """Each recorded step on its own, under a fresh ErrorFeedback keyed by tensor name.

    The recorded steps (0, 20, 220, 439) are snapshots, not consecutive steps, and gradients
    shrink ~100x between them: a residual carried from step 0 into step 20 would swamp it.  So
    per step: the first frame of each tensor gives wire bytes, kept count and the relative L2
    error of decoded vs input; then ``repeat`` further EF steps on the same tensors (residual
    now non-zero) are timed, encode and decode separately, best of them.  Threshold's T is the
    (1-R) quantile of |x| over that step's tensors.  Figures are means over the steps."""
    import codec

    names = sorted(steps)
    res = {"enc": [], "dec": [], "wire": [], "kept": [], "err": []}
    spec = None
    for st in names:
        grads = steps[st]
        absx = np.abs(np.concatenate([v.ravel() for v in grads.values()]))
        ef = codec.ErrorFeedback(specs_for(name, ratio, absx))
        spec = ef.codec.spec
        outs = {k: np.empty_like(v) for k, v in grads.items()}
        frames = {k: ef.encode(v, key=k) for k, v in grads.items()}
        for k, f in frames.items():
            codec.decode(f, out=outs[k])
        err2 = sum(float(np.sum((outs[k].astype(np.float64) - v) ** 2)) for k, v in grads.items())
        ref2 = sum(float(np.sum(v.astype(np.float64) ** 2)) for v in grads.values())
        res["err"].append(math.sqrt(err2 / ref2) if ref2 else 0.0)
        res["wire"].append(sum(len(f) for f in frames.values()))
        res["kept"].append(sum(kept_count(f) for f in frames.values()) / absx.size)
        s = Samples()
        for _ in range(repeat):
            frames = s.time("enc", lambda: {k: ef.encode(v, key=k) for k, v in grads.items()})
            s.time("dec", lambda: [codec.decode(f, out=outs[k]) for k, f in frames.items()])
        res["enc"].append(s.best("enc"))
        res["dec"].append(s.best("dec"))
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    return {
        "spec": display(name, ratio, spec) if name != "threshold" else f"threshold(value=q{1 - ratio:g} per step)",
        "kept": mean(res["kept"]),
        "wire": mean(res["wire"]),
        "n": absx.size,
        "enc_ms": 1e3 * mean(res["enc"]),
        "dec_ms": 1e3 * mean(res["dec"]),
        "rel_err": mean(res["err"]),
    }


# --------------------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=25_000_000, help="synthetic gradient elements (default 25,000,000)")
    ap.add_argument("--ratios", default="0.001,0.01", help="comma-separated target densities (default 0.001,0.01)")
    ap.add_argument("--repeat", type=int, default=9, help="samples per figure, the best is kept (default 9)")
    ap.add_argument("--passes", type=int, default=3,
                    help="the synthetic samples are taken in this many passes over all codecs (default 3)")
    ap.add_argument("--codecs", default=",".join(SPARSIFIERS), help=f"comma-separated subset of {','.join(SPARSIFIERS)}")
    ap.add_argument("--budget", type=float, default=8.0,
                    help="seconds after which a slow codec stops taking samples (at least 1 is taken; default 8)")
    ap.add_argument("--no-sample", action="store_true", help="skip the bundled real sample")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables for docs/benchmarks.md")
    args = ap.parse_args(argv)
    ratios = [float(r) for r in args.ratios.split(",") if r.strip()]
    if not ratios or not all(0 < r <= 1 for r in ratios):
        ap.error("--ratios: values in (0, 1]")
    wanted = [c.strip() for c in args.codecs.split(",") if c.strip()]
    bad = [c for c in wanted if c not in SPARSIFIERS]
    if bad:
        ap.error(f"--codecs: unknown {', '.join(bad)}; choose from {', '.join(SPARSIFIERS)}")
    if args.repeat < 1 or args.n < 1 or args.passes < 1:
        ap.error("--repeat, --passes and --n must be >= 1")

    t_run = time.perf_counter()
    import codec

    try:
        import torch

        torch.set_num_threads(2)
    except ImportError:
        torch = None
    registered = {d["id"] for d in codec.list_codecs()}
    md = args.markdown

    log("generating data ...")
    x = synthetic(args.n)
    pool = [x] + [np.roll(x, (i * args.n) // POOL + 1) for i in range(1, POOL)]
    absx = np.abs(x)
    out, acc, dst = np.empty_like(x), np.zeros_like(x), np.empty_like(x)
    memcpy = Samples()
    for _ in range(3):
        memcpy.time("memcpy", lambda: np.copyto(dst, x))

    # ---- synthetic: codecs and baselines, in passes (each codec's samples spread over the run)
    results, notes, jobs = [], [], []
    for name in wanted:
        for ratio in ([None] if name == "adacomp" else ratios):
            if name not in registered:
                results.append({"name": name, "ratio": ratio, "skip": "not registered"})
            else:
                jobs.append(CodecJob(name, ratio, specs_for(name, ratio, absx)))
                results.append(jobs[-1])
    del absx
    per_pass = -(-args.repeat // args.passes)
    base_s = Samples()
    ks = [k_of(r, args.n) for r in ratios]
    for p in range(args.passes):
        job_pass(jobs, p, args.passes, args.budget, notes,
                 lambda job: job.run_pass(pool, x, out, acc, dst, memcpy, per_pass, args.budget / args.passes),
                 lambda e: f"error: {type(e).__name__}: {str(e)[:80]}")
        log(f"pass {p + 1}/{args.passes}: baselines ...")
        baselines_pass(x, ks, dst, memcpy, per_pass, torch, base_s)
    results = [r if isinstance(r, dict) else {"name": r.name, "ratio": r.ratio, "skip": r.error}
               if getattr(r, "error", None) else r.result() for r in results]
    base = {r: {"argpartition": base_s.best(("argpartition", k)),
                "torch": base_s.best(("torch", k)) if torch is not None else None} for r, k in zip(ratios, ks)}
    mc = memcpy.best("memcpy")
    nbytes = x.nbytes

    # ---- real sample
    sample_rows = []
    if not args.no_sample:
        steps = load_steps()
        for name in wanted:
            for ratio in ([None] if name == "adacomp" else ratios):
                if name not in registered:
                    sample_rows.append({"name": name, "ratio": ratio, "skip": "not registered"})
                    continue
                log(f"sample: {name} {'' if ratio is None else ratio} ...")
                try:
                    sample_rows.append({"name": name, "ratio": ratio, **bench_sample(name, ratio, steps, args.repeat)})
                except Exception as e:
                    sample_rows.append({"name": name, "ratio": ratio, "skip": f"error: {type(e).__name__}: {str(e)[:80]}"})

    # ---- report
    lines = machine_info()
    lines.append(f"method: best (minimum time) of {per_pass * args.passes} samples per figure, taken in {args.passes} passes "
                 f"over all codecs with memcpy interleaved (fewer for a codec slower than --budget {args.budget:g} s; see "
                 f"'samples (enc)'; decode and decode_add take {DECODE_SAMPLES}x as many); ratios are to the best memcpy of the run")
    lines.append(memcpy_line(nbytes, memcpy))
    bullets(lines, md)

    print()
    title = f"Synthetic gradient: {args.n:,} float32 (Student-t df=2 x 1e-3); cells are GB/s (x memcpy)"
    heading(title, md)
    hdr = ["codec", "kept", "wire bytes", "B/elem", "x smaller", "EF encode", "encode", "decode", "decode_add",
           "first call s (ef/enc/dec/add)", "samples (enc)"]
    rows = []
    for r in results:
        if "skip" in r:
            rows.append(skip_row(r, len(hdr)))
            continue
        f = r["first"]
        rows.append([
            r["spec"], f"{r['kept'] / args.n:.5f}", f"{r['wire']:,}", f"{r['wire'] / args.n:.4f}", f"{nbytes / r['wire']:.1f}",
            rate_cell(nbytes, r["ef"], mc), rate_cell(nbytes, r["enc"], mc), rate_cell(nbytes, r["dec"], mc),
            rate_cell(nbytes, r["add"], mc), f"{f['ef']:.2f}/{f['enc']:.2f}/{f['dec']:.2f}/{f['add']:.2f}", r["samples"],
        ])
    print(render(hdr, rows, md))

    print()
    title = "Top-k baselines on the same array (exact top-k by |x|); topk columns: how many times faster codec topk is"
    heading(title, md)
    topk = {r["ratio"]: r for r in results if r["name"] == "topk" and "skip" not in r}
    hdr = ["ratio", "k", "np.argpartition", "torch.topk (2 threads)", "topk enc / argpart", "topk enc / torch",
           "topk+EF / argpart", "topk+EF / torch"]
    rows = []
    for ratio in ratios:
        b, t = base[ratio], topk.get(ratio)
        tor = b["torch"]
        rows.append([
            f"{ratio:g}", f"{k_of(ratio, args.n):,}", rate_cell(nbytes, b["argpartition"], mc),
            rate_cell(nbytes, tor, mc) if tor else "torch not installed",
            f"{b['argpartition'] / t['enc']:.1f}x" if t else "-", f"{tor / t['enc']:.1f}x" if t and tor else "-",
            f"{b['argpartition'] / t['ef']:.1f}x" if t else "-", f"{tor / t['ef']:.1f}x" if t and tor else "-",
        ])
    print(render(hdr, rows, md))

    print()
    heading("Targets", md)
    rows = []

    def why(name, ratio):
        r = by.get((name, ratio))
        return "not run (--codecs)" if r is None else r.get("skip", "").split(":")[0]

    def target(what, value, goal, reason="", suffix="x"):
        if value is None:
            rows.append([what, f">= {goal:g}{suffix}", "-", f"n/a ({reason or 'not measured'})"])
        else:
            rows.append([what, f">= {goal:g}{suffix}", f"{value:.2f}{suffix}", "met" if value >= goal else "MISSED"])

    by = {(r["name"], r["ratio"]): r for r in results}
    for ratio in ratios:
        g = by.get(("gaussiank", ratio))
        target(f"gaussiank({ratio:g})+EF encode vs memcpy", mc / g["ef"] if g and "skip" not in g else None, 0.35,
               why("gaussiank", ratio))
    a = by.get(("adacomp", None))
    target("adacomp+EF encode vs memcpy", mc / a["ef"] if a and "skip" not in a else None, 0.3, why("adacomp", None))
    for ratio in ratios:
        t, b = topk.get(ratio), base[ratio]
        no = why("topk", ratio) if t is None else "torch not installed"
        target(f"topk({ratio:g}) encode vs torch.topk", b["torch"] / t["enc"] if t and b["torch"] else None, 10, no)
        target(f"topk({ratio:g}) encode vs np.argpartition", b["argpartition"] / t["enc"] if t else None, 5, no)
        target(f"topk({ratio:g})+EF encode vs torch.topk", b["torch"] / t["ef"] if t and b["torch"] else None, 10, no)
        target(f"topk({ratio:g})+EF encode vs np.argpartition", b["argpartition"] / t["ef"] if t else None, 5, no)
    for r in results:
        if "skip" not in r:
            target(f"{r['spec']} decode vs memcpy", mc / r["dec"], 0.5)
    print(render(["target", "goal", "measured", "status"], rows, md))

    if sample_rows:
        print()
        n = next((r["n"] for r in sample_rows if "n" in r), 0)
        title = (f"Bundled real sample: 4 recorded steps x 8 tensors ({n:,} elements, {4 * n:,} B per step), each step under a "
                 f"fresh ErrorFeedback keyed by tensor name; wire, kept and error of its first frames; time: best of "
                 f"{args.repeat} further EF steps; all means over the 4 steps")
        heading(title, md)
        hdr = ["codec", "kept", "wire B/step", "B/elem", "x smaller", "EF encode ms/step", "decode ms/step", "rel L2 err"]
        rows = []
        for r in sample_rows:
            if "skip" in r:
                rows.append(skip_row(r, len(hdr)))
                continue
            rows.append([r["spec"], f"{r['kept']:.4f}", f"{r['wire']:,.0f}", f"{r['wire'] / r['n']:.3f}",
                         f"{4 * r['n'] / r['wire']:.1f}", f"{r['enc_ms']:.2f}", f"{r['dec_ms']:.2f}", f"{r['rel_err']:.3f}"])
        print(render(hdr, rows, md))

    footer(["kept: fraction of elements in the latest EF frame (threshold's T is the (1-R) quantile of |x| of the input, "
            "so it keeps ~R on a bare encode and more under EF as the residual grows; adacomp is adaptive); "
            "x smaller = n*4 / frame bytes, headers included"], t_run, notes, md)


if __name__ == "__main__":
    main()
