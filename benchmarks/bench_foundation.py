"""Foundation benchmark: import cost, first-call cost, and encode/decode speed next to memcpy.

    python benchmarks/bench_foundation.py [--n 25000000] [--repeat 7] [--json]

Every speed is given as GB/s of source bytes and as a ratio to a memcpy of the same buffer
measured in the same run (np.copyto of the float32 input), because these machines are shared
and noisy.  Data: a heavy-tailed synthetic gradient (Student-t, df=2, scaled to 1e-3), and
the bundled real sample (all tensors concatenated).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import best  # noqa: E402


def subprocess_time(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=dict(os.environ))
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=25_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    rows = []
    imp = min(subprocess_time("import time; t=time.perf_counter(); import codec; print(time.perf_counter()-t)") for _ in range(5))
    first = subprocess_time(
        "import numpy as np, codec, time; x=np.ones(1000, np.float32); c=codec.get_codec('fp16');"
        "t=time.perf_counter(); f=c.encode(x); a=time.perf_counter()-t;"
        "t=time.perf_counter(); codec.decode(f); print(a); print(time.perf_counter()-t)"
    )  # run once to fill the on-disk cache ...
    first = subprocess_time(
        "import numpy as np, codec, time; x=np.ones(1000, np.float32); c=codec.get_codec('fp16');"
        "t=time.perf_counter(); f=c.encode(x); print(time.perf_counter()-t)"
    )  # ... then measure a fresh process with a warm cache

    import codec

    rng = np.random.default_rng(0)
    synthetic = (rng.standard_t(2, args.n) * 1e-3).astype(np.float32)
    from codec.sample import load_sample

    real = np.concatenate([v.ravel() for v in load_sample().values()])
    specs = ["none", "fp16", "bf16", "fp16(nonfinite=keep)", "fp16+zstd(level=1)", "none+zstd(level=1)",
             "threshold(value=0.05)", "threshold(value=0.05)+fp16"]
    for label, x in (("synthetic 25M t(2)", synthetic), ("bundled sample", real)):
        out = np.empty_like(x)
        memcpy = best(lambda: np.copyto(out, x), args.repeat)
        for spec in specs:
            c = codec.get_codec(spec)
            frame = c.encode(x)
            c.decode(frame, out=out)
            enc = best(lambda: c.encode(x), args.repeat)
            dec = best(lambda: c.decode(frame, out=out), args.repeat)
            acc = np.zeros_like(x)
            add = best(lambda: c.decode_add(frame, acc), args.repeat)
            rows.append({
                "data": label, "codec": c.spec, "elements": x.size, "frame_bytes": len(frame),
                "ratio": x.nbytes / len(frame),
                "memcpy_ms": memcpy * 1e3, "encode_ms": enc * 1e3, "decode_ms": dec * 1e3, "decode_add_ms": add * 1e3,
                "encode_GBps": x.nbytes / enc / 1e9, "decode_GBps": x.nbytes / dec / 1e9,
                "encode_vs_memcpy": memcpy / enc, "decode_vs_memcpy": memcpy / dec, "decode_add_vs_memcpy": memcpy / add,
            })
    # error feedback step (encode + residual update) for fp16 on the synthetic gradient
    ef = codec.ErrorFeedback("fp16")
    ef.encode(synthetic, key="g")
    out = np.empty_like(synthetic)
    memcpy = best(lambda: np.copyto(out, synthetic), args.repeat)
    efstep = best(lambda: ef.encode(synthetic, key="g"), args.repeat)
    # packing kernels
    from codec.pack import pack_bits

    codes = rng.integers(0, 1 << 16, args.n, dtype=np.uint64).astype(np.uint16)
    pack = {}
    for bits in (1, 3, 8, 16):
        packed = np.empty((args.n * bits + 7) // 8, np.uint8)
        src = np.empty_like(packed)
        mc = best(lambda: np.copyto(packed, src), args.repeat)
        t = best(lambda: pack_bits(codes, bits), args.repeat)
        pack[bits] = {"ms": t * 1e3, "memcpy_ms": mc * 1e3, "vs_memcpy_of_output": mc / t, "Mcodes_per_s": args.n / t / 1e6}

    result = {"import_codec_s": imp, "first_fp16_encode_warm_cache_s": first, "rows": rows,
              "ef_fp16_step_ms": efstep * 1e3, "ef_fp16_vs_memcpy": memcpy / efstep, "memcpy_ms": memcpy * 1e3,
              "pack_bits": pack, "threads": __import__("numba").get_num_threads()}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"import codec: {imp * 1e3:.0f} ms;  first fp16 encode in a fresh process (warm cache): {first * 1e3:.0f} ms;  numba threads: {result['threads']}")
    print(f"{'data':<20} {'codec':<24} {'ratio':>7} {'enc GB/s':>9} {'enc/memcpy':>10} {'dec GB/s':>9} {'dec/memcpy':>10} {'add/memcpy':>10}")
    for r in rows:
        print(f"{r['data']:<20} {r['codec']:<24} {r['ratio']:7.2f} {r['encode_GBps']:9.2f} {r['encode_vs_memcpy']:10.2f} "
              f"{r['decode_GBps']:9.2f} {r['decode_vs_memcpy']:10.2f} {r['decode_add_vs_memcpy']:10.2f}")
    print(f"ErrorFeedback(fp16) step: {efstep * 1e3:.1f} ms = {memcpy / efstep:.2f}x memcpy ({memcpy * 1e3:.1f} ms)")
    for bits, p in pack.items():
        print(f"pack_bits {bits:2d}-bit: {p['ms']:.1f} ms, {p['Mcodes_per_s']:.0f} Mcodes/s, {p['vs_memcpy_of_output']:.2f}x memcpy of the packed bytes")


if __name__ == "__main__":
    main()
