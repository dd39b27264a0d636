"""What the seed corpus is made of: the specs (every registered codec, the conformance suite's
pipelines, :data:`EXTRA_PIPELINES`) and small arrays of every dtype.
"""

from __future__ import annotations

import numpy as np

import codec
from codec.dtypes import bfloat16


#: pipelines the fuzzer seeds from besides the conformance suite's (``codec.testing.PIPELINES``)
#: and the registered stage ids: every byte stage on a sparse and a transform codec
EXTRA_PIPELINES = (
    "topk(ratio=0.2)+fp16+zstd+crc32",
    "fft(theta=0.5,block=8)+rangefloat(bits=4)+crc32",
    "powersgd(rank=2)+fp16+zstd",
)


def select_value_pairs() -> list[str]:
    """Every registered select stage behind every registered value stage (and qsgd's Elias
    coding), the spec target's seeds besides :func:`seed_specs`: the oracle's round trip then
    checks that each pair's encoder writes only frames its decoder reads (issue 28)."""
    from codec.stage import registered

    stages = registered()
    selects = sorted(n for n, c in stages.items() if c.kind == "select")
    values = sorted(n for n, c in stages.items() if c.kind == "value") + ["qsgd(coding=elias)"]
    return [f"{s}+{v}" for s in selects for v in values]


def seed_specs() -> list[str]:
    """Every registered codec id, then the conformance suite's pipelines
    (``codec.testing.PIPELINES``), then :data:`EXTRA_PIPELINES` (no repeats, in that order)."""
    from codec.testing import PIPELINES

    out = [c["id"] for c in codec.list_codecs()]
    for s in (*PIPELINES, *EXTRA_PIPELINES):
        if s not in out:
            out.append(s)
    return out


DTYPES = (np.dtype(np.float16), bfloat16, np.dtype(np.float32), np.dtype(np.float64))


def seed_arrays(seed: int = 0, full: bool = True) -> list[np.ndarray]:
    """Small arrays of every dtype: size 0, 0-d, one element, odd 1-D, 2-D, heavy-tailed, a
    zero-size 2-D; ``full=False`` keeps one of each shape with the dtypes spread over them."""
    rng = np.random.default_rng(seed)
    shapes = [
        ("empty", lambda: np.zeros(0)),
        ("0d", lambda: np.array(0.75)),
        ("one", lambda: np.array([-2.5])),
        ("odd", lambda: rng.standard_normal(77)),
        ("2d", lambda: rng.standard_normal((5, 7)) * 0.01),
        ("heavy", lambda: rng.standard_t(2, size=(9, 13)) * 1e-3),
        ("empty2d", lambda: np.zeros((3, 0))),
        ("4d", lambda: rng.standard_normal((2, 3, 2, 3))),
    ]
    out = []
    for i, (_, make) in enumerate(shapes):
        dts = DTYPES if full else (DTYPES[i % len(DTYPES)], np.dtype(np.float32))
        base = make()
        for dt in dict.fromkeys(dts):
            out.append(np.ascontiguousarray(base.astype(dt)))
    return out
