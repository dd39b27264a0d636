"""The conformance suite (codec.testing) over every registered codec and useful pipelines."""

from pathlib import Path

import numpy as np
import pytest

import codec
from codec import testing

FIXTURES = Path(__file__).parent / "fixtures"

# every registered id on its own, plus pipelines that combine stages (codec.testing.PIPELINES)
SPECS = [c["id"] for c in codec.list_codecs()] + list(testing.PIPELINES)
ARRAYS = testing.sample_arrays()
ARRAY_IDS = [f"{a.dtype.name}{list(a.shape)}" for a in ARRAYS]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("arr", ARRAYS, ids=ARRAY_IDS)
def test_encode_decode(spec, arr):
    testing.check_encode_decode(spec, arr)
    testing.check_decode_out(spec, arr)
    testing.check_encode_out(spec, arr)
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


#: frozen many-tensor frames (format v2), written once on 2026-11-28 (``testing.write_many_fixture``):
#: nine by the encoder of 3f72896, before derived counts (adacomp, top-k+fp16, joint top-k, qsgd,
#: fp16, rangefloat+zstd, random-k, PowerSGD; table and hash forms, named and list layouts, mixed
#: dtypes, an empty tensor), and ``derived-*`` with flags bit 6 (adacomp, top-k+fp16, DGC)
MANY = FIXTURES / "many"


def test_many_fixtures_exist():
    frames = {p.stem: p.read_bytes() for p in MANY.glob("*.many")}
    assert len(frames) >= 12
    assert {n for n, f in frames.items() if f[5] & 0x40} == {n for n in frames if n.startswith("derived-")}  # both forms kept


@pytest.mark.parametrize("name", sorted(p.stem for p in MANY.glob("*.many")))
def test_many_fixture_still_decodes(name):
    testing.check_many_fixture(MANY, name)


def test_sample_arrays_cover_the_edges():
    sizes = {a.size for a in ARRAYS}
    dtypes = {a.dtype.name for a in ARRAYS}
    assert {0, 1, 1001} <= sizes and any(a.ndim == 0 for a in ARRAYS)
    assert dtypes == {"float16", "bfloat16", "float32", "float64"}
    assert np.any([np.abs(a.astype(np.float64)).max(initial=0) > 10 * np.abs(a.astype(np.float64)).std() for a in ARRAYS if a.size > 100])
