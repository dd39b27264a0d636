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
stream each sample), then three each of decode (``codec.decode(frame, out=out)``, preallocated)
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

QSGD coding (``--parts coding``).  For qsgd(levels=L) (bucket 512, stochastic) with L = 4, 16,
256, on the bundled sample (every tensor of every step, one frame each) and on the synthetic
array: the bytes of the ``qsgd`` frame, of ``qsgd+zstd(level=Z)`` (Z = 1, 3, 19; 19 on the
synthetic array only with --slow, ~2 min), and the exact size of three Elias codings of the
same levels (read back from the frame), each counted as the qsgd frame's header plus one
bit-stream of ceil(bits / 8) bytes per tensor:

* Elias-gamma, dense: per bucket a 32-bit norm; per value gamma(level + 1), plus one sign bit
  when level > 0.  (gamma(m) takes 2 * floor(log2 m) + 1 bits.)
* Elias-gamma, run-length: per bucket a 32-bit norm and gamma(nnz + 1) (the bucket's count
  of non-zero levels); per non-zero value gamma(z + 1) with z the zeros since the previous
  non-zero of the bucket (or since the bucket's start), one sign bit and gamma(level).
* Elias-omega, run-length: the same with Elias's recursive (omega) code, the QSGD paper's
  choice (Alistarh et al. 2017, section 3.2 / appendix, "Elias recursive coding").

and the order-0 entropy of the codes (level and sign; per frame) plus 32 bits per norm, a
floor for any coder that codes values independently.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sparse import FIRST_CALL, Samples, footer, gbps, log, machine_info, rate_cell, render  # noqa: E402

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
QSGD_LEVELS = (4, 16, 256)
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
            t = time.perf_counter()
            frame = c.encode(x, key="g", step=0)
            first["enc"] = time.perf_counter() - t
            t = time.perf_counter()
            codec.decode(frame, out=out)
            first["dec"] = time.perf_counter() - t
            t = time.perf_counter()
            c.decode_add(frame, acc)
            first["add"] = time.perf_counter() - t
            self.first = first
            self.wire = len(frame)
            self.canonical = c.spec
            self.err, self.cos = quality(out, x)  # out holds decode(encode(x, key="g", step=0))
        # untimed warm-up of this pass
        self.step += 1
        c.encode(x, key="g", step=self.step)
        frame = c.encode(x, key="g", step=0)
        codec.decode(frame, out=out)
        c.decode_add(frame, acc)
        t0 = time.perf_counter()
        for _ in range(count):
            self.step += 1
            st = self.step
            memcpy.time("memcpy", lambda: np.copyto(dst, x))
            self.s.time("enc", lambda: c.encode(x, key="g", step=st))
            for _ in range(DECODE_SAMPLES):
                self.s.time("dec", lambda: codec.decode(frame, out=out))
                self.s.time("add", lambda: c.decode_add(frame, acc))
            if time.perf_counter() - t0 > budget:
                break
        self.spent += time.perf_counter() - start

    def result(self):
        return {"spec": self.spec, "canonical": self.canonical, **self.info, "wire": self.wire, "err": self.err,
                "cos": self.cos, "first": self.first, "samples": self.s.count("enc"),
                **{op: self.s.best(op) for op in ("enc", "dec", "add")}}


# --------------------------------------------------------------------------- real sample


def load_steps():
    from codec.sample import load_sample

    steps: dict[str, dict[str, np.ndarray]] = {}
    for key, v in load_sample().items():
        st, layer = key.split("/", 1)
        steps.setdefault(st, {})[layer] = v
    return steps


def step_number(name: str) -> int:
    return int(name.replace("step", ""))


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


# --------------------------------------------------------------------------- QSGD level coding


def gamma_bits(m: np.ndarray) -> np.ndarray:
    """Elias-gamma code length of integers ``m >= 1``: 2 * floor(log2 m) + 1."""
    m = np.asarray(m, np.int64)
    return 2 * (np.frexp(m.astype(np.float64))[1].astype(np.int64) - 1) + 1


def omega_table(top: int) -> np.ndarray:
    """Elias-omega (recursive) code length of every integer 1..top (index 0 unused)."""
    t = np.zeros(top + 1, np.int64)
    for m in range(1, top + 1):
        bits, v = 1, m  # the final '0'
        while v > 1:
            nb = v.bit_length()
            bits += nb
            v = nb - 1
        t[m] = bits
    return t


def coding_sizes(frame, c) -> dict:
    """Payload sizes (bytes, the frame header not included) of the Elias codings of a qsgd
    frame's levels, and the order-0 entropy floor; all from the frame's own codes and norms."""
    from codec.frame import SectionKind, parse_frame
    from codec.pack import unpack_bits

    rd = parse_frame(frame).reader()  # a plain qsgd frame: a scalars section (norms), a values section (codes)
    norms, _ = rd.take(SectionKind.SCALARS)
    info, raw = rd.take(SectionKind.VALUES)
    codes = unpack_bits(raw, info.bits, info.count).astype(np.int64)  # level << 1 | sign
    level = codes >> 1
    n, nb, bucket = codes.size, norms.count, int(c.value.bucket)
    norm_bits = 32 * nb
    nz = np.flatnonzero(level)
    lv = level[nz]
    # dense gamma: gamma(level + 1) per value, a sign bit per non-zero level
    dense = norm_bits + int(gamma_bits(level + 1).sum()) + nz.size
    # run-length: per bucket a count; per non-zero: zeros since the previous non-zero of the bucket, sign, level
    bid = nz // bucket
    prev = np.empty_like(nz)
    prev[1:] = nz[:-1]
    first = np.ones(nz.size, bool)
    first[1:] = bid[1:] != bid[:-1]
    prev[first] = bid[first] * bucket - 1
    zeros = nz - prev - 1
    counts = np.bincount(bid, minlength=nb) if nb else np.zeros(0, np.int64)
    rl_gamma = norm_bits + int(gamma_bits(counts + 1).sum()) + int(gamma_bits(zeros + 1).sum()) + nz.size + int(gamma_bits(lv).sum())
    om = omega_table(int(max(bucket + 1, c.value.levels)))
    rl_omega = norm_bits + int(om[counts + 1].sum()) + int(om[zeros + 1].sum()) + nz.size + int(om[lv].sum())
    freq = np.bincount(codes)
    freq = freq[freq > 0] / n
    h0 = norm_bits + float(-(freq * np.log2(freq)).sum()) * n
    return {"gamma": math.ceil(dense / 8), "rl_gamma": math.ceil(rl_gamma / 8), "rl_omega": math.ceil(rl_omega / 8),
            "h0": h0 / 8}


ELIAS = {"gamma": "Elias-γ dense", "rl_gamma": "Elias-γ run-length", "rl_omega": "Elias-ω run-length"}


def coding_row(arrays, levels, zlevels, seeds) -> dict:
    """Totals over ``arrays`` ({key: array}, one frame each) for qsgd(levels=...): frame header
    and payload bytes of qsgd and qsgd+zstd(level=Z), payload bytes of the Elias codings."""
    import codec

    c = codec.get_codec(f"qsgd(levels={levels})")
    row = {"n": 0, "frames": 0, "head": 0, "qsgd": 0, "gamma": 0, "rl_gamma": 0, "rl_omega": 0, "h0": 0.0,
           **{("zstd", z): 0 for z in zlevels}, **{("zhead", z): 0 for z in zlevels}}
    for k, v in arrays.items():
        key, step = seeds(k)
        f = c.encode(v, key=key, step=step)
        head = codec.inspect(f)["header_bytes"]
        sz = coding_sizes(f, c)
        dec = codec.decode(f)
        row["n"] += v.size
        row["frames"] += 1
        row["head"] += head
        row["qsgd"] += len(f) - head
        for name in ("gamma", "rl_gamma", "rl_omega", "h0"):
            row[name] += sz[name]
        for z in zlevels:
            cz = codec.get_codec(f"qsgd(levels={levels})+zstd(level={z})")
            fz = cz.encode(v, key=key, step=step)
            if not np.array_equal(codec.decode(fz), dec):  # same levels, only the bytes differ
                raise AssertionError(f"qsgd+zstd(level={z}) decodes differently from qsgd for {k}")
            zh = codec.inspect(fz)["header_bytes"]
            row[("zstd", z)] += len(fz) - zh
            row[("zhead", z)] += zh
    return row


def best_of(r, zl):
    bz = min((r[("zstd", z)], z) for z in zl)
    be = min((r[k], k) for k in ELIAS)
    return bz, be


def coding_table(x, steps, zlevels_sample, zlevels_synth, md):
    rows_out = []
    totals = []
    for L in QSGD_LEVELS:
        mine = []
        for st in sorted(steps):
            num = step_number(st)
            log(f"coding: sample {st}, qsgd(levels={L}) ...")
            r = coding_row(steps[st], L, zlevels_sample, lambda k, num=num: (k, num))
            mine.append(r)
            rows_out.append((f"sample {st}", L, r, zlevels_sample))
        tot = {k: sum(r[k] for r in mine) for k in mine[0]}
        rows_out.append(("**sample, all 4 steps**" if md else "sample, all 4 steps", L, tot, zlevels_sample))
        totals.append(("bundled sample (4 steps x 8 tensors)", L, tot, zlevels_sample))
        if x is not None:
            log(f"coding: synthetic, qsgd(levels={L}) ...")
            r = coding_row({"g": x}, L, zlevels_synth, lambda k: (None, 0))
            rows_out.append((f"synthetic {x.size:,}", L, r, zlevels_synth))
            totals.append((f"synthetic {x.size:,}", L, r, zlevels_synth))
    zall = sorted(set(zlevels_sample) | set(zlevels_synth))
    hdr = (["data", "levels (bits/code)", "elements", "frames", "qsgd payload"] + [f"+zstd({z})" for z in zall]
           + [ELIAS[k] for k in ELIAS] + ["order-0 entropy", "smaller", "best zstd / best Elias", "qsgd header"])
    rows = []
    for data, L, r, zl in rows_out:
        bz, be = best_of(r, zl)
        win = f"zstd({bz[1]})" if bz[0] < be[0] else ELIAS[be[1]]
        cell = lambda v: f"{v:,}"  # noqa: E731
        rows.append([data, f"{L} ({1 + L.bit_length()})", f"{r['n']:,}", r["frames"], cell(r["qsgd"])]
                    + [cell(r[("zstd", z)]) if z in zl else "-" for z in zall]
                    + [cell(r[k]) for k in ELIAS] + [f"{r['h0']:,.0f}", win, f"{bz[0] / be[0]:.3f}", cell(r["head"])])
    return hdr, rows, totals


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
        rng = np.random.default_rng(0)
        x = (rng.standard_t(2, args.n) * 1e-3).astype(np.float32)

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
            for job in jobs:
                if getattr(job, "error", None) or (p and job.spent > args.budget):
                    continue
                log(f"pass {p + 1}/{args.passes}: {job.spec} ...")
                try:
                    job.run_pass(x, out, acc, dst, memcpy, per_pass, args.budget / args.passes)
                except Exception as e:  # a codec being written may fail: report it, go on
                    job.error = "error (see notes)"
                    notes.append(f"{job.spec}: {type(e).__name__}: {e}")
        results = [r if isinstance(r, dict) else {"spec": r.spec, "skip": r.error} if getattr(r, "error", None)
                   else r.result() for r in results]
        mc = memcpy.best("memcpy")
        mc_med = float(np.median(memcpy.t["memcpy"]))
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
        lines.append(f"memcpy (np.copyto, {nbytes / 1e6:.0f} MB): best {mc * 1e3:.1f} ms = {gbps(nbytes, mc):.2f} GB/s "
                     f"(median {mc_med * 1e3:.1f} ms over {memcpy.count('memcpy')} samples)")
    print("\n".join(("- " + s if md else s) for s in lines))

    if mc is not None:
        print()
        title = (f"Synthetic gradient: {args.n:,} float32 (Student-t df=2 x 1e-3); speed cells are GB/s (x memcpy); "
                 f"err and cosine of one frame (key 'g', step 0)")
        print(f"**{title}**\n" if md else title)
        hdr = ["codec", "rounding", "B/elem", "x smaller", "encode", "decode", "decode_add", "rel L2 err", "cosine",
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
                rate_cell(nbytes, r["dec"], mc), rate_cell(nbytes, r["add"], mc), f"{r['err']:.4g}", f"{r['cos']:.4f}",
                f"{f['enc']:.2f}/{f['dec']:.2f}/{f['add']:.2f}", r["samples"],
            ])
        print(render(hdr, rows, md))

        print()
        title = ("Targets: dense quantizers encode and decode >= 0.5x memcpy (deterministic), >= 0.3x (stochastic); "
                 "'needs' = how much faster it must get")
        print(f"**{title}**\n" if md else title)
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
        print(f"**{title}**\n" if md else title)
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
        print(f"**{title}**\n" if md else title)
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

    print()
    footer(
        [
            "B/elem = frame bytes / n, headers included; x smaller = n*4 / frame bytes",
            "rounding: 'stochastic' when a stage of the codec draws random numbers (stochastic rounding, TernGrad)",
            FIRST_CALL,
        ],
        t_run,
        notes,
        md,
    )


if __name__ == "__main__":
    main()
