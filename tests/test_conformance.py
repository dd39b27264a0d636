"""The conformance suite (codec.testing) over every registered codec and useful pipelines."""

from pathlib import Path

import numpy as np
import pytest

import codec
from codec import testing

FIXTURES = Path(__file__).parent / "fixtures"

# every registered id on its own, plus pipelines that combine stages
SPECS = [c["id"] for c in codec.list_codecs()] + [
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
]
ARRAYS = testing.sample_arrays()
ARRAY_IDS = [f"{a.dtype.name}{list(a.shape)}" for a in ARRAYS]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("arr", ARRAYS, ids=ARRAY_IDS)
def test_encode_decode(spec, arr):
    testing.check_encode_decode(spec, arr)
    testing.check_decode_out(spec, arr)
    testing.check_decode_add(spec, arr)


@pytest.mark.parametrize("spec", SPECS)
def test_config(spec):
    testing.check_config(spec)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("arr", ARRAYS, ids=ARRAY_IDS)
def test_error_feedback(spec, arr):
    testing.check_error_feedback(spec, arr)


@pytest.mark.parametrize("spec", SPECS)
def test_malformed(spec):
    arr = ARRAYS[4]  # heavy-tailed float32 (17, 31)
    testing.check_malformed(spec, arr, n_random=10_000)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("arr", [ARRAYS[1], ARRAYS[2], ARRAYS[-1]], ids=["0d", "one", "bf16"])
def test_malformed_small(spec, arr):
    testing.check_malformed(spec, arr, n_random=200)


def test_every_registered_codec_has_a_fixture():
    frozen = {p.stem for p in FIXTURES.glob("*.frame")}
    for c in codec.list_codecs():
        assert any(name.split("-")[0] == c["id"] for name in frozen), f"no frozen fixture for codec {c['id']!r}"


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.frame")))
def test_fixture_still_decodes(name):
    testing.check_fixture(FIXTURES, name)


def test_sample_arrays_cover_the_edges():
    sizes = {a.size for a in ARRAYS}
    dtypes = {a.dtype.name for a in ARRAYS}
    assert {0, 1, 1001} <= sizes and any(a.ndim == 0 for a in ARRAYS)
    assert dtypes == {"float16", "bfloat16", "float32", "float64"}
    assert np.any([np.abs(a.astype(np.float64)).max(initial=0) > 10 * np.abs(a.astype(np.float64)).std() for a in ARRAYS if a.size > 100])
