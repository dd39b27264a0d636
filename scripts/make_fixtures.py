"""Freeze one frame per registered codec under tests/fixtures/ (run once per format change).

    python scripts/make_fixtures.py [--force]

The tests never regenerate these files: they check that frames written by an older version
still decode to the stored arrays.  Existing fixtures are kept unless --force is given, so
adding a codec adds its fixture without touching the others.
"""

import sys
from pathlib import Path

import numpy as np

import codec
from codec.dtypes import bfloat16
from codec.testing import write_fixture

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures"

# name -> (spec, array); names start with the codec id the fixture covers
rng = np.random.default_rng(20261122)
heavy = (rng.standard_t(2, size=(6, 7)) * 1e-2).astype(np.float32)
FIXTURES = {
    "none-f32": ("none", heavy),
    "none-bf16": ("none", heavy.astype(bfloat16)),
    "fp16-f32": ("fp16", heavy),
    "fp16-f64": ("fp16", heavy.astype(np.float64)),
    "bf16-f32": ("bf16", heavy),
    "zstd-f32": ("zstd", np.repeat(heavy, 8, axis=0)),
    "crc32-f32": ("fp16+crc32", heavy),
    "threshold-f32": ("threshold(value=0.01)", heavy),
    "threshold-bitmap-f16": ("threshold(value=0.001)+fp16+zstd", heavy.astype(np.float16)),
    "topk-f32": ("topk(ratio=0.2)", heavy),
    "topk-k-f64": ("topk(k=5)+bf16", heavy.astype(np.float64)),
    "gaussiank-f32": ("gaussiank(ratio=0.1)", heavy),
    "dgc-f32": ("dgc(ratio=0.1)+fp16", heavy),
    "randomk-f32": ("randomk(ratio=0.25,seed=7)", heavy),
    "randomk-scale-bf16": ("randomk(ratio=0.5,scale=true)", heavy.astype(bfloat16)),
    "adacomp-f32": ("adacomp(bin=8)", heavy),
    "adacomp-conv-f32": ("adacomp", np.repeat(heavy, 10, axis=0).reshape(6, 10, 7)),
    "adacomp-fp16-f32": ("adacomp+fp16", heavy),
    "rangefloat-f32": ("rangefloat", heavy),
    "rangefloat-block-stochastic-f64": ("rangefloat(bits=6,block=8,rounding=stochastic)", heavy.astype(np.float64)),
    "fp8-f32": ("fp8", heavy * 100),
    "fp8-e5m2-scale-bf16": ("fp8(format=e5m2,scale=true)", heavy.astype(bfloat16)),
    "qsgd-f32": ("qsgd(bucket=16)", heavy),
    "qsgd-nearest-f16": ("qsgd(levels=5,rounding=nearest)+zstd", heavy.astype(np.float16)),
    "minmax-f32": ("minmax(bits=4,bucket=10)", heavy),
    "minmax-stochastic-f64": ("minmax(rounding=stochastic)", heavy.astype(np.float64)),
    "terngrad-f32": ("terngrad", heavy),
    "sign-f32": ("sign", heavy),
    "sign-l1-bf16": ("sign(scale=l1)", heavy.astype(bfloat16)),
    "efsign-f32": ("efsign", heavy),
    "onebit-f32": ("onebit", heavy),
    "topk-qsgd-f32": ("topk(ratio=0.3)+qsgd(levels=4)", heavy),
    "qsgd-elias-f32": ("qsgd(bucket=8,coding=elias)", heavy),
    "fft-f32": ("fft(theta=0.5,block=16)", np.repeat(heavy, 3, axis=0)),
    "fft-global-none-f64": ("fft(theta=0.25,block=0,keep=global)+none", heavy.astype(np.float64)),
    "fft-fp16-bf16": ("fft(theta=0.6,block=8)+fp16", heavy.astype(bfloat16)),
    "powersgd-f32": ("powersgd(rank=2)", np.repeat(heavy, 4, axis=1)),
    "powersgd-conv-f16": ("powersgd(rank=1,min_compression_rate=1)", heavy.reshape(6, 7, 1, 1).astype(np.float16)),
}


def main(argv):
    force = "--force" in argv
    for name, (spec, arr) in FIXTURES.items():
        if (OUT / f"{name}.frame").exists() and not force:
            continue
        write_fixture(OUT, name, spec, arr)
        print(f"wrote {name}: {codec.get_codec(spec).spec}")


if __name__ == "__main__":
    main(sys.argv[1:])
