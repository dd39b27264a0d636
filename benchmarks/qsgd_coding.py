"""QSGD level coding for ``benchmarks/bench_quant.py --parts coding``: the bytes of qsgd frames,
of qsgd+zstd frames and of the paper's Elias codes of the same levels.  Not a script: run it as

    python benchmarks/bench_quant.py --parts coding [--n 25000000] [--slow] [--markdown]

For qsgd(levels=L) (bucket 512, stochastic) with L = 4, 16, 256, on the bundled sample (every
tensor of every step, one frame each) and on the synthetic array: the bytes of the ``qsgd`` frame, of ``qsgd+zstd(level=Z)`` (Z = 1, 3, 19; 19 on the
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

import math

import numpy as np

from harness import log, step_number

QSGD_LEVELS = (4, 16, 256)


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
