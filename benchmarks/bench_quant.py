"""Quantizer benchmark: encode, decode and decode_add speed next to memcpy, bytes on the wire and
error of the quantizer value stages; and QSGD's level coding (zstd against the paper's Elias codes).

    python benchmarks/bench_quant.py [--n 25000000] [--repeat 9] [--passes 3] [--codecs SPEC;SPEC;...]
                                     [--budget 8] [--parts speed,sample,coding] [--slow] [--markdown]

Codecs (default ``--codecs``: all of DEFAULT_CODECS below; any spec string works, separated by
``;`` or by commas outside parentheses): fp16 and bf16 (existing, for reference), the seven
quantizers (rangefloat, fp8, qsgd, terngrad, sign/efsign, onebit, minmax) as dense codecs with
their defaults and a stochastic / wide-range variant each, ``qsgd+zstd`` and the sparse
composition ``topk(ratio=0.01)+rangefloat(bits=8)``.  A codec that is not registered is listed
as skipped; one that raises is listed with its error.

Data: a heavy-tailed synthetic gradient (Student-t, df=2, scaled to 1e-3, seeded) of --n
float32 elements, and the bundled real sample (codec.sample.load_sample(): 4 recorded steps x
8 tensors, 35,434 elements per step, one frame per tensor).

Speed method (as benchmarks/bench_sparse.py).  Every speed is GB/s of float32 source bytes
(n * 4 / seconds) and a ratio to a memcpy of the same buffer (np.copyto into a preallocated
array) measured in the same run, because the machine is shared and noisy.  Every figure is the
best (minimum time) of --repeat samples, taken in --passes passes over all codecs, so that a
burst of load from another process hits one pass, not all of one codec's samples.  Within a
pass each sample is one memcpy, one encode (``encode(x, key="g", step=s)``, a fresh random
stream each sample), one encode into a reused buffer (``encode(..., out=buf)``: no fresh
frame to page-fault, as a training loop that keeps its send buffer), then three each of decode (``codec.decode(frame, out=out)``, preallocated)
and decode_add (into a dense float32 accumulator).  The memcpy rate is the best of all memcpy
samples of the run.  The very first call of each operation (Numba compile, or cache load when
the on-disk cache is warm) is timed separately and excluded; each pass also makes one untimed
warm-up encode/decode/decode_add.

Quality: the frame of ``encode(x, key="g", step=0)`` decoded; relative L2 error
``||dec - x|| / ||x||`` and cosine similarity ``<dec, x> / (||dec|| ||x||)``, in float64.  For a
stochastic codec that is one draw.  Bytes per element: ``len(frame) / n``, headers included.

Targets: deterministic dense quantizers encode and decode at >= 0.5x memcpy, stochastic ones at
>= 0.3x (a codec is stochastic when one of its stages draws random numbers).  Compositions
(``+zstd``, a select stage) are reported but have no target; fp16/bf16 are listed for reference.

QSGD coding (``--parts coding``): QSGD's levels coded by zstd against the paper's Elias codes,
in bytes; what is counted is described in benchmarks/qsgd_coding.py.
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
    Samples, bullets, footer, heading, job_pass, load_steps, log, machine_info, memcpy_line, rate_cell, render, step_number,
    synthetic, timed,
)
from qsgd_coding import ELIAS, best_of, coding_table  # noqa: E402

DEFAULT_CODECS = (
    "fp16",
    "bf16",
    "rangefloat(bits=8)",
    "rangefloat(bits=8,rounding=stochastic)",
    "fp8",
    "fp8(format=e5m2,scale=true)",
    "qsgd",
    "qsgd(rounding=nearest)",
    "terngrad",
    "sign",
    "efsign",
    "onebit",
    "minmax",
    "minmax(bits=4,rounding=stochastic)",
    "qsgd+zstd",
    "qsgd(coding=elias)",
    "topk(ratio=0.01)+rangefloat(bits=8)",
)
REFERENCE = ("none", "fp16", "bf16")  # value stages that are not quantizers
DECODE_SAMPLES = 3  # decode and decode_add samples per encode sample
TARGET = {"deterministic": 0.5, "stochastic": 0.3}
CHUNK = 1 << 20  # elements per float64 chunk of the error sums


# --------------------------------------------------------------------------- helpers


def split_specs(text: str) -> list[str]:
    """Spec strings separated by ';' or by commas outside parentheses."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in ",;" and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        depth += (ch == "(") - (ch == ")")
        cur.append(ch)
    out.append("".join(cur).strip())
    return [s for s in out if s]


def classify(c) -> dict:
    """What a codec is: dense / dense+bytes / sparse, stochastic or not, a reference (fp16, bf16)."""
    stochastic = any(
        "seed" in {p.name for p in s.params} and getattr(s, "rounding", "stochastic") == "stochastic" for s in c.stages
    )
    kind = "sparse" if c.select is not None else "dense+bytes" if c.post else "dense"
    return {"kind": kind, "stochastic": stochastic, "reference": c.value.name in REFERENCE}


def quality(dec, x) -> tuple[float, float]:
    """(relative L2 error, cosine similarity) of ``dec`` against ``x``, in float64, chunked."""
    d2 = x2 = y2 = xy = 0.0
    a, b = dec.reshape(-1), x.reshape(-1)
    for lo in range(0, b.size, CHUNK):
        y = a[lo:lo + CHUNK].astype(np.float64)
        v = b[lo:lo + CHUNK].astype(np.float64)
        d = y - v
        d2 += float(d @ d)
        x2 += float(v @ v)
        y2 += float(y @ y)
        xy += float(y @ v)
    err = math.sqrt(d2 / x2) if x2 else 0.0
    cos = xy / math.sqrt(x2 * y2) if x2 and y2 else 0.0
    return err, cos


def target_of(info) -> float | None:
    if info["kind"] != "dense":
        return None
    return TARGET["stochastic" if info["stochastic"] else "deterministic"]


# --------------------------------------------------------------------------- synthetic speed


class CodecJob:
    """One codec on the synthetic gradient, measured over several passes (see ``run_pass``)."""

    def __init__(self, spec):
        import codec

        self.spec = spec
        self.c = codec.get_codec(spec)
        self.info = classify(self.c)
        self.s = Samples()
        self.first = None
        self.spent = 0.0
        self.step = 0

    def run_pass(self, x, out, acc, dst, memcpy, count, budget):
        import codec

        start = time.perf_counter()
        c = self.c
        if self.first is None:  # the very first calls: timed apart, never in the figures
            first = {}
            frame, first["enc"] = timed(lambda: c.encode(x, key="g", step=0))
            _, first["dec"] = timed(lambda: codec.decode(frame, out=out))
            _, first["add"] = timed(lambda: c.decode_add(frame, acc))
            self.first = first
            self.wire = len(frame)
            self.sendbuf = np.zeros(2 * len(frame) + 4096, np.uint8)  # encode(out=): one buffer reused, as a training loop would
            self.canonical = c.spec
            self.err, self.cos = quality(out, x)  # out holds decode(encode(x, key="g", step=0))
        # untimed warm-up of this pass
        self.step += 1
        c.encode(x, key="g", step=self.step)
        c.encode(x, key="g", step=self.step, out=self.sendbuf)
        frame = c.encode(x, key="g", step=0)
        codec.decode(frame, out=out)
        c.decode_add(frame, acc)
        t0 = time.perf_counter()
        for _ in range(count):
            self.step += 1
            st = self.step
            memcpy.time("memcpy", lambda: np.copyto(dst, x))
            self.s.time("enc", lambda: c.encode(x, key="g", step=st))
            self.s.time("encout", lambda: c.encode(x, key="g", step=st, out=self.sendbuf))
            for _ in range(DECODE_SAMPLES):
                self.s.time("dec", lambda: codec.decode(frame, out=out))
                self.s.time("add", lambda: c.decode_add(frame, acc))
            if time.perf_counter() - t0 > budget:
                break
        self.spent += time.perf_counter() - start

    def result(self):
        return {"spec": self.spec, "canonical": self.canonical, **self.info, "wire": self.wire, "err": self.err,
                "cos": self.cos, "first": self.first, "samples": self.s.count("enc"),
                **{op: self.s.best(op) for op in ("enc", "encout", "dec", "add")}}


# --------------------------------------------------------------------------- real sample


def bench_sample(spec, steps, repeat):
    """Per recorded step: every tensor encoded on its own (``encode(v, key=layer, step=N)``);
    wire bytes, relative L2 error and cosine of the step's decoded tensors against its inputs;
    then ``repeat`` timed encodes and decodes of the whole step (best of them).  Figures are
    means over the steps."""
    import codec

    c = codec.get_codec(spec)
    res = {"enc": [], "dec": [], "wire": [], "err": [], "cos": []}
    n = 0
    for st in sorted(steps):
        grads, num = steps[st], step_number(st)
        n = sum(v.size for v in grads.values())
        outs = {k: np.empty_like(v) for k, v in grads.items()}
        frames = {k: c.encode(v, key=k, step=num) for k, v in grads.items()}
        for k, f in frames.items():
            codec.decode(f, out=outs[k])
        err, cos = quality(np.concatenate([outs[k].ravel() for k in grads]), np.concatenate([v.ravel() for v in grads.values()]))
        res["err"].append(err)
        res["cos"].append(cos)
        res["wire"].append(sum(len(f) for f in frames.values()))
        s = Samples()
        for _ in range(repeat):
            s.time("enc", lambda: {k: c.encode(v, key=k, step=num) for k, v in grads.items()})
            s.time("dec", lambda: [codec.decode(f, out=outs[k]) for k, f in frames.items()])
        res["enc"].append(s.best("enc"))
        res["dec"].append(s.best("dec"))
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    return {"spec": spec, **classify(c), "n": n, "wire": mean(res["wire"]), "enc_ms": 1e3 * mean(res["enc"]),
            "dec_ms": 1e3 * mean(res["dec"]), "err": mean(res["err"]), "cos": mean(res["cos"])}


# --------------------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=25_000_000, help="synthetic gradient elements (default 25,000,000)")
    ap.add_argument("--repeat", type=int, default=9, help="samples per figure, the best is kept (default 9)")
    ap.add_argument("--passes", type=int, default=3,
                    help="the synthetic samples are taken in this many passes over all codecs (default 3)")
    ap.add_argument("--codecs", default=";".join(DEFAULT_CODECS),
                    help="spec strings separated by ';' (or commas outside parentheses); default: " + "; ".join(DEFAULT_CODECS))
    ap.add_argument("--budget", type=float, default=8.0,
                    help="seconds after which a slow codec stops taking samples (at least 1 is taken; default 8)")
    ap.add_argument("--parts", default="speed,sample,coding",
                    help="comma-separated subset of speed (synthetic), sample (bundled), coding (QSGD zstd vs Elias)")
    ap.add_argument("--slow", action="store_true", help="coding: also zstd level 19 on the synthetic array (~2 min)")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables for docs/benchmarks.md")
    args = ap.parse_args(argv)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not parts <= {"speed", "sample", "coding"} or not parts:
        ap.error("--parts: choose from speed, sample, coding")
    wanted = split_specs(args.codecs)
    if args.repeat < 1 or args.n < 1 or args.passes < 1:
        ap.error("--repeat, --passes and --n must be >= 1")

    t_run = time.perf_counter()
    import codec

    md = args.markdown
    results, notes, jobs = [], [], []
    x = None
    if "speed" in parts or "coding" in parts:
        log("generating data ...")
        x = synthetic(args.n)

    # ---- synthetic speed, in passes (each codec's samples spread over the run)
    mc = None
    if "speed" in parts:
        out, acc, dst = np.empty_like(x), np.zeros_like(x), np.empty_like(x)
        memcpy = Samples()
        for _ in range(3):
            memcpy.time("memcpy", lambda: np.copyto(dst, x))
        for spec in wanted:
            try:
                jobs.append(CodecJob(spec))
                results.append(jobs[-1])
            except Exception as e:  # not registered, bad spec
                results.append({"spec": spec, "skip": "skipped (see notes)"})
                notes.append(f"{spec}: {type(e).__name__}: {e}")
        per_pass = -(-args.repeat // args.passes)
        for p in range(args.passes):
            job_pass(jobs, p, args.passes, args.budget, notes,
                     lambda job: job.run_pass(x, out, acc, dst, memcpy, per_pass, args.budget / args.passes),
                     lambda e: "error (see notes)")
        results = [r if isinstance(r, dict) else {"spec": r.spec, "skip": r.error} if getattr(r, "error", None)
                   else r.result() for r in results]
        mc = memcpy.best("memcpy")
        del out, acc, dst

    # ---- real sample
    sample_rows = []
    steps = load_steps() if ("sample" in parts or "coding" in parts) else {}
    if "sample" in parts:
        for spec in wanted:
            log(f"sample: {spec} ...")
            try:
                sample_rows.append(bench_sample(spec, steps, args.repeat))
            except Exception as e:
                sample_rows.append({"spec": spec, "skip": "error (see notes)"})
                notes.append(f"sample, {spec}: {type(e).__name__}: {e}")

    # ---- QSGD level coding
    coding = None
    if "coding" in parts:
        log("coding: bundled sample ...")
        try:
            coding = coding_table(x, steps, (1, 3, 19), (1, 3, 19) if args.slow else (1, 3), md)
        except Exception as e:
            notes.append(f"coding: {type(e).__name__}: {e}")

    # ---- report
    lines = machine_info()
    lines.append(f"codec imported from {os.path.dirname(os.path.dirname(os.path.abspath(codec.__file__)))}")
    if mc is not None:
        per_pass = -(-args.repeat // args.passes)
        nbytes = x.nbytes
        lines.append(f"method: best (minimum time) of {per_pass * args.passes} samples per figure, taken in {args.passes} "
                     f"passes over all codecs with memcpy interleaved (fewer for a codec slower than --budget "
                     f"{args.budget:g} s; see 'samples'; decode and decode_add take {DECODE_SAMPLES}x as many); first "
                     f"calls excluded; ratios are to the best memcpy of the run")
        lines.append(memcpy_line(nbytes, memcpy))
    bullets(lines, md)

    if mc is not None:
        print()
        title = (f"Synthetic gradient: {args.n:,} float32 (Student-t df=2 x 1e-3); speed cells are GB/s (x memcpy); "
                 f"err and cosine of one frame (key 'g', step 0)")
        heading(title, md)
        hdr = ["codec", "rounding", "B/elem", "x smaller", "encode", "encode (out=)", "decode", "decode_add", "rel L2 err", "cosine",
               "first call s (enc/dec/add)", "samples"]
        rows = []
        for r in results:
            if "skip" in r:
                rows.append([r["spec"], r["skip"]] + [""] * (len(hdr) - 2))
                continue
            f = r["first"]
            kind = "stochastic" if r["stochastic"] else "deterministic"
            rows.append([
                r["spec"], kind, f"{r['wire'] / args.n:.4f}", f"{nbytes / r['wire']:.1f}", rate_cell(nbytes, r["enc"], mc),
                rate_cell(nbytes, r["encout"], mc), rate_cell(nbytes, r["dec"], mc), rate_cell(nbytes, r["add"], mc), f"{r['err']:.4g}", f"{r['cos']:.4f}",
                f"{f['enc']:.2f}/{f['dec']:.2f}/{f['add']:.2f}", r["samples"],
            ])
        print(render(hdr, rows, md))

        print()
        title = ("Targets: dense quantizers encode and decode >= 0.5x memcpy (deterministic), >= 0.3x (stochastic); "
                 "'needs' = how much faster it must get")
        heading(title, md)
        rows = []
        for r in results:
            if "skip" in r:
                continue
            goal = target_of(r)
            if goal is None:
                continue
            for op, what in (("enc", "encode"), ("dec", "decode")):
                v = mc / r[op]
                name = f"{r['spec']} {what}" + (" (reference)" if r["reference"] else "")
                status = "met" if v >= goal else f"MISSED (needs {goal / v:.2f}x)"
                rows.append([name, "stochastic" if r["stochastic"] else "deterministic", f">= {goal:g}x", f"{v:.2f}x",
                             f"{r[op] * 1e3:.1f}", status])
        print(render(["target", "rounding", "goal", "measured", "ms", "status"], rows, md))

    if sample_rows:
        print()
        n = next((r["n"] for r in sample_rows if "n" in r), 0)
        title = (f"Bundled real sample: 4 recorded steps x 8 tensors ({n:,} elements, {4 * n:,} B per step), one frame per "
                 f"tensor (key = tensor name, step = recorded step); time: best of {args.repeat} encodes / decodes of a "
                 f"whole step; all means over the 4 steps")
        heading(title, md)
        hdr = ["codec", "rounding", "wire B/step", "B/elem", "x smaller", "encode ms/step", "decode ms/step", "rel L2 err",
               "cosine"]
        rows = []
        for r in sample_rows:
            if "skip" in r:
                rows.append([r["spec"], r["skip"]] + [""] * (len(hdr) - 2))
                continue
            rows.append([r["spec"], "stochastic" if r["stochastic"] else "deterministic", f"{r['wire']:,.0f}",
                         f"{r['wire'] / r['n']:.3f}", f"{4 * r['n'] / r['wire']:.1f}", f"{r['enc_ms']:.2f}",
                         f"{r['dec_ms']:.2f}", f"{r['err']:.4g}", f"{r['cos']:.4f}"])
        print(render(hdr, rows, md))

    if coding is not None:
        hdr, rows, totals = coding
        print()
        title = ("QSGD level coding: payload bytes (frame minus header) of qsgd(levels=L) (bucket 512, stochastic), of "
                 "qsgd+zstd(level=Z), and of the Elias codes of the same levels (ceil(bits/8) per tensor); sample: one "
                 "frame per tensor, summed; the last column is the qsgd frames' headers (a +zstd frame's header is longer "
                 "by its spec text, '+zstd' or '+zstd(level=Z)')")
        heading(title, md)
        print(render(hdr, rows, md))
        print()
        for data, L, r, zl in totals:
            bz, be = best_of(r, zl)
            who = f"zstd(level={bz[1]})" if bz[0] < be[0] else ELIAS[be[1]]
            z3 = r[("zstd", 3)] if ("zstd", 3) in r else None
            line = (f"{data}, levels={L}: {who} is smallest (best zstd {bz[0]:,} B = {8 * bz[0] / r['n']:.3f} bits/value, "
                    f"best Elias {be[0]:,} B = {8 * be[0] / r['n']:.3f} bits/value, ratio {bz[0] / be[0]:.3f}"
                    + (f"; the default qsgd+zstd (level 3) is {z3 / be[0]:.3f}x the best Elias" if z3 else "") + ")")
            print(("- " + line) if md else line)

    footer(["B/elem = frame bytes / n, headers included; x smaller = n*4 / frame bytes",
            "rounding: 'stochastic' when a stage of the codec draws random numbers (stochastic rounding, TernGrad)"],
           t_run, notes, md)


if __name__ == "__main__":
    main()
