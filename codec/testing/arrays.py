"""What the conformance checks run on and compare with: the sample arrays, the pipelines,
bitwise comparison of arrays and a unit in the last place."""

from __future__ import annotations

import numpy as np

from codec.dtypes import bfloat16

__all__ = ["DTYPES", "PIPELINES", "sample_arrays", "same", "diff_msg", "assert_identical", "ulp"]

DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), bfloat16)


#: pipelines that combine stages, which the conformance suite (tests/test_conformance.py) runs
#: besides every registered stage id on its own, and the fuzzer seeds its corpus from
PIPELINES = (
    "fp16+zstd",
    "bf16+crc32",
    "none+zstd(level=1)+crc32",
    "threshold(value=0.5)",
    "threshold(value=0.5)+fp16+zstd",
    "threshold(value=0.001)+bf16",
    "fp16(nonfinite=keep)",
    "topk(ratio=0.1)",
    "topk(k=3)+fp16+zstd",
    "gaussiank(ratio=0.05)",
    "gaussiank(ratio=0.05,exact=true)+bf16",
    "dgc(ratio=0.05,sample=0.5)",
    "randomk(ratio=0.1,seed=3,scale=true)",
    "randomk(ratio=0.3)+fp16",
    "adacomp(bin=7)",
    "adacomp+none",
    "adacomp+fp16+crc32",
    "topk(ratio=warmup(0.5,0.01,steps=2))",
    "rangefloat(bits=5,block=7,rounding=stochastic)",
    "rangefloat(bits=16,exp_bits=8)+zstd",
    "rangefloat(bits=3,exp_bits=1)",
    "fp8(format=e5m2,scale=true)",
    "fp8(scale=true,rounding=stochastic)",
    "qsgd(levels=3,bucket=7,rounding=nearest)+crc32",
    "qsgd(levels=300)+zstd",
    "minmax(bits=3,bucket=7,rounding=stochastic)",
    "minmax(bits=1,bucket=1)",
    "terngrad(clip=0)",
    "sign(scale=l1)",
    "topk(ratio=0.1)+qsgd",
    "topk(k=3)+rangefloat(bits=6)",
    "adacomp+rangefloat",
    "gaussiank(ratio=0.05)+minmax(bits=4)",
    "randomk(ratio=0.3)+terngrad",
    "threshold(value=0.5)+onebit",
    "qsgd(coding=elias)",
    "topk(ratio=0.1)+qsgd(levels=4,bucket=7,coding=elias)+zstd",
    "fft(theta=0)+none",
    "fft(theta=0.5,block=8)+none",
    "fft(theta=0.3,block=0)+fp16",
    "fft(theta=0.7,block=16,keep=global)+none+zstd",
    "fft(theta=exp(0.9,0.5,steps=3),block=7)+crc32",
    "fft(block=5)+qsgd(bucket=4)",
    "powersgd(rank=1)",
    "powersgd(rank=3,min_compression_rate=0)+bf16",
    "powersgd(warm_start=false,min_compression_rate=1)+rangefloat+zstd",
)


def sample_arrays(seed: int = 0) -> list[np.ndarray]:
    """Edge-case and real-looking arrays: empty, 0-d, one element, odd sizes, heavy tails, every dtype."""
    rng = np.random.default_rng(seed)
    heavy = (rng.standard_t(2, size=(17, 31)) * 1e-3).astype(np.float32)
    base = [
        np.zeros((0,), np.float32),
        np.array(0.75, np.float32),
        np.array([-2.5], np.float32),
        rng.standard_normal(1001).astype(np.float32),
        heavy,
        (rng.standard_normal((3, 4, 5, 7)) * 0.01).astype(np.float32),
        np.zeros(64, np.float32),
    ]
    out = list(base)
    for dt in DTYPES[1:]:
        out.append(heavy.astype(dt))
        out.append(base[3][:77].astype(dt))
    return out


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (NaN payloads and signed zeros included)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def diff_msg(got, want, what: str) -> str | None:
    """None when ``got`` and ``want`` are identical arrays (shape, dtype and every bit: NaN
    payload aside, signed zeros count); else a message naming ``what``, how many elements
    differ and the first few of them."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
    if got.tobytes() == want.tobytes():
        return None
    g = got.reshape(-1).astype(np.float64)
    w = want.reshape(-1).astype(np.float64)
    bad = np.flatnonzero(~(((g == w) & (np.signbit(g) == np.signbit(w))) | (np.isnan(g) & np.isnan(w))))
    return (
        f"{what}: {bad.size} of {g.size} elements differ; first at {bad[:5].tolist()}: "
        f"got {g[bad[:5]].tolist()}, want {w[bad[:5]].tolist()}"
    )


def assert_identical(got, want, what: str = "array") -> None:
    """Raise AssertionError with :func:`diff_msg`'s message unless the arrays are identical."""
    msg = diff_msg(got, want, what)
    assert msg is None, msg


_MANT = {"float16": (10, -14), "bfloat16": (7, -126), "float32": (23, -126), "float64": (52, -1022)}


def ulp(x: np.ndarray) -> np.ndarray:
    """One unit in the last place of each element of ``x`` in its own dtype (as float64)."""
    mant, emin = _MANT[x.dtype.name]
    mag = np.abs(x.astype(np.float64))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    e = np.where(mag > 0, np.maximum(e, emin), emin)
    return np.ldexp(1.0, (e - mant).astype(np.int64))
