"""What the default payload checksum costs: every codec's encode and decode with and without it.

    python benchmarks/bench_checksum.py [--n 25000000] [--repeat 7] [--markdown]

Frames carry a CRC-32C of their payload by default (issue 13); ``get_codec(spec,
checksum=False)`` leaves it out.  For each spec this times encode and decode of the same
heavy-tailed float32 gradient both ways, interleaved (so machine noise hits both alike), and
reports the checksum's share of the encode.  The checksum candidates themselves are timed on
the largest frame next to a memcpy of it: zlib's CRC32 (the ``crc32`` stage), CRC-32C (the
default: the ``crc32c`` package's one call, and ``codec.checksum.crc32c``, on the thread
budget and folded where the CPU can) and, when installed, xxHash's XXH3-64.
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import best, synthetic  # noqa: E402

SPECS = ["fp16", "bf16", "none", "topk(ratio=0.001)", "topk(ratio=0.01)+fp16", "qsgd", "rangefloat", "adacomp", "efsign"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=25_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)

    import crc32c

    import codec
    from codec import checksum

    x = synthetic(args.n)
    rows = []
    largest = b""
    for spec in SPECS:
        on, off = codec.get_codec(spec), codec.get_codec(spec, checksum=False)
        f_on, f_off = on.encode(x), off.encode(x)  # warm (compile) both
        codec.decode(f_on), codec.decode(f_off)
        largest = max(largest, f_on, key=len)
        t = {"enc_on": [], "enc_off": [], "dec_on": [], "dec_off": []}
        for _ in range(args.repeat):
            t["enc_on"].append(best(lambda: on.encode(x), 1))
            t["enc_off"].append(best(lambda: off.encode(x), 1))
            t["dec_on"].append(best(lambda: codec.decode(f_on), 1))
            t["dec_off"].append(best(lambda: codec.decode(f_off), 1))
        m = {k: min(v) * 1e3 for k, v in t.items()}
        rows.append((spec, len(f_on), m["enc_off"], m["enc_on"], m["dec_off"], m["dec_on"]))

    buf = np.frombuffer(largest, np.uint8)
    dst = np.empty_like(buf)
    hashes = [("memcpy", lambda: np.copyto(dst, buf)), ("zlib crc32", lambda: zlib.crc32(largest)),
              ("crc32c", lambda: crc32c.crc32c(largest)), ("codec.checksum.crc32c", lambda: checksum.crc32c(largest))]
    try:
        import xxhash

        hashes.append(("xxh3_64", lambda: xxhash.xxh3_64_intdigest(largest)))
    except ImportError:
        pass
    speeds = [(name, len(largest) / best(fn, args.repeat) / 1e9) for name, fn in hashes]

    cached = _from_cache(args.repeat)

    if args.markdown:
        print(f"n = {args.n:,} float32 (t(2) * 1e-3); best of {args.repeat}, interleaved; times in ms\n")
        print("| spec | frame bytes | encode, no checksum | encode, CRC-32C | cost | decode, no checksum | decode, CRC-32C | cost |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for spec, size, eo, ei, do, di in rows:
            print(f"| {spec} | {size:,} | {eo:.2f} | {ei:.2f} | {100 * (ei - eo) / eo:+.1f}% | {do:.2f} | {di:.2f} | {100 * (di - do) / do:+.1f}% |")
        print(f"\nchecksums over the largest frame ({len(largest):,} bytes):\n")
        print("| function | GB/s | x memcpy |")
        print("|---|---:|---:|")
        for name, gbs in speeds:
            print(f"| {name} | {gbs:.2f} | {gbs / speeds[0][1]:.2f} |")
        print("\nthe kernels' CRC-32C on one thread, from cache (what a kernel checksums each chunk it just wrote with), µs:\n")
        print("| bytes | `crc_bytes` (folded where the CPU can) | `_streams` (the register steps alone) | `crc32c` package | fold / streams |")
        print("|---:|---:|---:|---:|---:|")
        for size, fold, steps, package in cached:
            print(f"| {size:,} | {fold:.2f} | {steps:.2f} | {package:.2f} | {steps / fold:.2f}x |")
    else:
        for r in rows:
            print(*r)
        for r in speeds:
            print(*r)
        for r in cached:
            print(*r)


def _from_cache(repeat: int) -> list:
    """``(bytes, crc_bytes µs, _streams µs, crc32c package µs)`` for buffers that stay in cache
    (the best of many calls): the kernels' CRC (codec/kernels/cpu/_crc.py), folded 256 bytes at
    a time where the CPU has VPCLMULQDQ, against its register steps alone and the package."""
    import crc32c

    from codec.kernels.cpu import _crc

    rows = []
    for size in (4096, 70_868, 1 << 20):
        buf = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
        calls = max(10, (50 << 20) // size)  # ~50 MB of work per figure

        def many(fn):
            fn()
            return best(lambda: [fn() for _ in range(calls)], repeat) / calls * 1e6

        rows.append((size, many(lambda: _crc.crc_bytes(buf, 0, size, 0)), many(lambda: _crc._streams(buf, 0, size, np.uint32(0))),
                     many(lambda: crc32c.crc32c(buf))))
    return rows


if __name__ == "__main__":
    main()
