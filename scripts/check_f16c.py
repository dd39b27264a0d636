"""Check the fp16 kernels exhaustively against NumPy (about 2 minutes on 2 cores):

    python scripts/check_f16c.py

Every one of the 2**32 float32 bit patterns goes through ``convert.narrow_codes`` in
chunks of 2**26 (a chunk's blocks without a NaN or an infinity take the CPU's F16C
instructions, ``codec/kernels/cpu/_f16c.py``; the others the integer code) and must give
NumPy's float16 bits (every value but NaN, whose code is the integer code's own rule); every fp16 code goes through
``convert.half_decode`` in each mode (set, add, subtract) into float32 and float64 and must
give NumPy's value, bit for bit, except that a signalling NaN code written into float64 comes
back quiet (the integer code widens through float32, whose conversion to float64 quiets it;
the 1,022 such codes are counted apart).  Prints whether F16C was used and the mismatches;
exits 1 on any.  The test suite checks the same on samples (tests/test_convert.py); this is the proof
for a new CPU or a new Numba."""

from __future__ import annotations

import sys
import time

import numpy as np


def main() -> int:
    from codec.kernels.cpu import _f16c, convert

    print(f"F16C instructions: {_f16c.HARDWARE}")
    t0, bad, step = time.time(), 0, 1 << 26
    out = np.empty(step, np.uint16)
    for lo in range(0, 1 << 32, step):
        x = np.arange(lo, lo + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        convert.narrow_codes(x, out, False, -1)
        keep = ~np.isnan(x)  # (NaN codes are the integer code's own rule, tested in the suite)
        with np.errstate(over="ignore"):  # (NumPy's cast warns where a value becomes inf)
            want = x[keep].astype(np.float16).view(np.uint16)
        bad += int(np.count_nonzero(out[keep] != want))
    print(f"float32 -> fp16: {bad} mismatches in the 2**32 - 2**24 + 2 values that are not NaN ({time.time() - t0:.0f} s)")
    codes = np.arange(1 << 16, dtype=np.uint64).astype(np.uint16)
    snan = ((codes & 0x7C00) == 0x7C00) & ((codes & 0x3FF) != 0) & ((codes & 0x200) == 0)
    rng = np.random.default_rng(1)
    for dt in (np.float32, np.float64):
        for mode, op in ((convert.SET, lambda o, v: v), (convert.ADD, lambda o, v: o + v), (convert.SUB, lambda o, v: o - v)):
            o = rng.standard_normal(codes.size).astype(dt)
            with np.errstate(invalid="ignore"):
                want = op(o.copy(), codes.view(np.float16).astype(dt))
            convert.half_decode(codes, o, mode, False, -1)
            differ = o.view(np.uint8).reshape(codes.size, -1) != want.view(np.uint8).reshape(codes.size, -1)
            differ = differ.any(axis=1)
            quieted = int(np.count_nonzero(differ & snan))
            bad += int(np.count_nonzero(differ & ~snan))
            print(f"fp16 -> {np.dtype(dt).name}, mode {mode}: {int(np.count_nonzero(differ & ~snan))} mismatches; {quieted} signalling NaNs come back quiet")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
