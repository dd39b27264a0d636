"""Allreducer(bucket_bytes=): consecutive tensors of one dtype fused into flat buckets, each
coded as one tensor; results split back into the tensors' shapes (COMM_SELF, serial)."""

import numpy as np
import pytest

import codec

MPI = pytest.importorskip("mpi4py.MPI")
from transport import Allreducer  # noqa: E402
from transport.layout import _buckets  # noqa: E402


def _tensors():
    rng = np.random.default_rng(5)
    return {
        "a": rng.standard_normal((10, 10)).astype(np.float32),  # 400 B
        "b": rng.standard_normal(5).astype(np.float32),  # 20 B  -> a..b
        "c": rng.standard_normal(3),  # float64: a new bucket
        "z": np.zeros(0, np.float64),  # joins c
        "d": rng.standard_normal(2000).astype(np.float32),  # 8000 B: larger than the cap, alone
        "e": rng.standard_normal((4, 4)).astype(np.float16),
        "f": rng.standard_normal(7).astype(np.float16),
    }


def test_groups_are_runs_of_one_dtype_within_the_cap():
    arrays = list(_tensors().values())
    assert _buckets(arrays, 1000) == [[0, 1], [2, 3], [4], [5, 6]]
    assert _buckets(arrays, 420) == [[0, 1], [2, 3], [4], [5, 6]]
    assert _buckets(arrays, 419) == [[0], [1], [2, 3], [4], [5, 6]]
    assert _buckets(arrays, 1) == [[i] for i in range(7)]  # every tensor over the cap is alone
    assert _buckets([], 100) == []


@pytest.mark.parametrize("spec", ["topk(ratio=0.1)", "qsgd(levels=4)", "fp16", "gtopk(ratio=0.1)"])
def test_buckets_are_coded_as_one_tensor_each(spec):
    x = _tensors()
    red = Allreducer(spec, MPI.COMM_SELF, bucket_bytes=1000)
    local = codec.get_codec(spec.replace("gtopk", "topk"))
    efs = codec.ErrorFeedback(local)
    for step in range(3):
        got = red.reduce(x)
        assert list(got) == list(x)
        assert list(red.stats.tensors) == ["a..b", "c..z", "d", "e..f"]
        for key, names in (("a..b", "ab"), ("c..z", "cz"), ("d", "d"), ("e..f", "ef")):
            flat = np.concatenate([x[n].reshape(-1) for n in names]) if len(names) > 1 else x[names]
            want = codec.decode(efs.encode(flat, key=(key, 0))).reshape(-1)
            have = np.concatenate([got[n].reshape(-1) for n in names]) if len(names) > 1 else got[names].reshape(-1)
            assert have.dtype == flat.dtype
            np.testing.assert_array_equal(have.view(np.uint8), want.view(np.uint8), err_msg=f"{spec} step {step} bucket {key}")
        for n, a in x.items():
            assert got[n].shape == a.shape and got[n].dtype == a.dtype


def test_bucket_bytes_is_checked():
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="bucket_bytes"):
            Allreducer("topk", MPI.COMM_SELF, bucket_bytes=bad)
    with pytest.raises(ValueError, match="bucket_bytes"):
        Allreducer("powersgd", MPI.COMM_SELF, bucket_bytes=1 << 20)


def test_bucket_bytes_is_part_of_the_config_check():
    a = Allreducer("topk", MPI.COMM_SELF, bucket_bytes=0)
    b = Allreducer("topk", MPI.COMM_SELF, bucket_bytes=1 << 20)
    from transport.layout import Layout as _Layout

    lay = _Layout(_tensors())
    assert a.describe(lay) != b.describe(lay)
