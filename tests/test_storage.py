"""gradcodec as a numcodecs codec and a zarr 3 codec (codec/storage/): numcodecs' own test
helpers on representative specs (frozen fixtures in tests/fixtures/numcodecs/), the entry
points found in a fresh process, and zarr arrays written and read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import codec

numcodecs = pytest.importorskip("numcodecs")
zarr = pytest.importorskip("zarr")
from numcodecs.tests.common import check_backwards_compatibility, check_config, check_encode_decode, check_repr  # noqa: E402

from codec.storage.ncodec import Gradcodec  # noqa: E402
from codec.storage.zarr3 import GradcodecZarr  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "numcodecs"
ROOT = Path(__file__).resolve().parent.parent


def _arrays():
    rng = np.random.default_rng(5)
    return [
        rng.standard_normal(1000).astype(np.float32),
        (rng.standard_t(2, (30, 17)) * 1e-3).astype(np.float64),
        rng.standard_normal((8, 9)).astype(np.float16),
        np.asfortranarray(rng.standard_normal((12, 5)).astype(np.float32)),
        np.zeros(0, np.float32),
    ]


@pytest.mark.parametrize("spec", ["none", "none+zstd", "none+crc32"])
def test_numcodecs_round_trip_lossless(spec):
    for arr in _arrays():
        check_encode_decode(arr, Gradcodec(spec=spec, dtype=arr.dtype.name))


@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.1)+fp16", "qsgd(levels=15)", "powersgd(rank=2)"])
def test_numcodecs_lossy_decodes_as_gradcodec(spec):
    c = numcodecs.get_codec({"id": "gradcodec", "spec": spec})
    for arr in _arrays()[:3]:
        frame = c.encode(arr)
        assert bytes(frame) == bytes(codec.get_codec(spec).encode(arr))
        assert np.array_equal(c.decode(frame), codec.decode(frame))
        out = bytearray(arr.nbytes)
        c.decode(frame, out=out)
        assert np.frombuffer(out, arr.dtype).tobytes() == codec.decode(frame).tobytes()


def test_numcodecs_config_and_repr(monkeypatch):
    for c in (Gradcodec(), Gradcodec(spec="topk( ratio = 0.01 )+fp16", dtype="float64", checksum=False)):
        check_config(c)
    assert Gradcodec(spec="topk( ratio = 0.05 )").spec == "topk(ratio=0.05)"  # the canonical spec
    from numcodecs.tests import common

    monkeypatch.setattr(common, "Gradcodec", Gradcodec, raising=False)  # (check_repr evaluates the statement there)
    check_repr("Gradcodec(spec='fp16', dtype='float32', checksum=True)")
    with pytest.raises(codec.CodecError, match="unknown codec or stage 'nope'"):
        numcodecs.get_codec({"id": "gradcodec", "spec": "nope"})
    with pytest.raises(codec.CodecError, match="dtype"):
        Gradcodec(dtype="int8")


def test_numcodecs_frozen_fixtures(monkeypatch):
    """numcodecs' backwards-compatibility check against frames written once (2026-11-30) and
    never regenerated: the directory must already hold them."""
    assert (FIXTURES / "fixture" / "gradcodec").is_dir(), "the frozen numcodecs fixtures are missing"
    monkeypatch.chdir(FIXTURES)
    arrays = _arrays()[:3]
    codecs = [Gradcodec(spec="none", dtype="float32"), Gradcodec(spec="none+zstd", dtype="float32")]
    for i, arr in enumerate(arrays):
        check_backwards_compatibility("gradcodec", [arr], codecs, prefix=f"a{i}")


def test_entry_points_in_a_fresh_process(tmp_path):
    """numcodecs and zarr find gradcodec by name in a process that never imported it."""
    x = np.random.default_rng(6).standard_normal((40, 16)).astype(np.float32)
    z = zarr.create_array(zarr.storage.LocalStore(tmp_path / "g.zarr"), shape=x.shape, chunks=(10, 16), dtype="float32",
                          serializer=GradcodecZarr(spec="fp16"), compressors=None)
    z[:] = x
    np.save(tmp_path / "x.npy", x)
    script = (
        "import json, sys, numpy as np, numcodecs, zarr\n"
        "x = np.load(sys.argv[1] + '/x.npy')\n"
        "c = numcodecs.get_codec({'id': 'gradcodec', 'spec': 'fp16'})\n"
        "z = zarr.open_array(zarr.storage.LocalStore(sys.argv[1] + '/g.zarr'), mode='r')\n"
        "print(json.dumps([type(c).__module__, bool(np.array_equal(c.decode(c.encode(x)), z[:])), 'codec.storage' in str(sorted(sys.modules))]))\n"
    )
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.splitlines()[-1]) == ["codec.storage.ncodec", True, True]


@pytest.mark.parametrize("spec", ["none", "fp16", "topk(ratio=0.2)", "minmax(bits=4)+zstd"])
def test_zarr_array_round_trip(spec):
    rng = np.random.default_rng(7)
    for dtype in (np.float32, np.float64, np.float16):
        x = rng.standard_normal((25, 12)).astype(dtype)
        store = zarr.storage.MemoryStore()
        z = zarr.create_array(store, shape=x.shape, chunks=(10, 12), dtype=dtype, serializer=GradcodecZarr(spec=spec))
        z[:] = x
        got = zarr.open_array(store, mode="r")[:]
        padded = np.concatenate([x, np.zeros((5, 12), dtype)])  # zarr codes whole chunks: the last one filled with 0
        want = np.concatenate([codec.decode(codec.get_codec(spec).encode(padded[i : i + 10])) for i in range(0, 30, 10)])[:25]
        assert got.dtype == x.dtype and np.array_equal(got, want), (spec, dtype)
        assert zarr.open_array(store, mode="r").metadata.to_dict()["codecs"][0] == {"name": "gradcodec", "configuration": {"spec": codec.get_codec(spec).spec, "checksum": True}}


def test_zarr_refuses_what_it_cannot_code():
    with pytest.raises(codec.CodecError, match="dtype: gradcodec codes float16, float32 or float64"):
        zarr.create_array(zarr.storage.MemoryStore(), shape=(4,), dtype="int32", serializer=GradcodecZarr())
    with pytest.raises(codec.CodecError, match="checksum"):
        GradcodecZarr(checksum="yes")
