"""torch tensors both ways (issue 31, first part): every ``out=`` takes a CPU tensor of any
supported dtype, bfloat16 included, and writes into its memory; ``like=`` a CPU tensor gives
tensors; ``encode_many`` takes ``(name, grad)`` pairs as ``named_parameters()`` gives them,
skipping the parameters without a gradient on request.  Skipped without torch (an optional
dependency); codec never imports it unless given a tensor (tests/test_api.py)."""

from __future__ import annotations

import numpy as np
import pytest

import codec
from codec.errors import CodecError

torch = pytest.importorskip("torch")

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _numpy(t):
    """A tensor's values as float64 NumPy (bfloat16 included)."""
    return t.detach().to(torch.float64).numpy()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.3)", "minmax(bits=4)", "none"])
def test_decode_into_a_tensor_writes_its_memory(spec, dtype):
    g = torch.randn(7, 5, dtype=torch.float32).to(dtype)
    frame = codec.get_codec(spec).encode(g)
    want = codec.decode(frame)  # the NumPy decode of the same frame
    out = torch.full((7, 5), 9.0, dtype=dtype)
    ptr = out.data_ptr()
    assert codec.decode(frame, out=out) is out and out.data_ptr() == ptr
    assert np.array_equal(_numpy(out), want.astype(np.float64))
    acc = torch.ones(7, 5, dtype=dtype)
    ref = np.ones((7, 5), want.dtype)
    assert codec.get_codec(spec).decode_add(frame, acc) is acc
    assert np.array_equal(_numpy(acc), codec.get_codec(spec).decode_add(frame, ref).astype(np.float64))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_like_a_tensor_gives_a_tensor(dtype):
    g = torch.randn(3, 4).to(dtype)
    frame = codec.get_codec("topk(k=5)").encode(g)
    got = codec.decode(frame, like=g)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype and tuple(got.shape) == (3, 4)
    assert np.array_equal(_numpy(got), codec.decode(frame).astype(np.float64))


def test_many_tensors_out_and_like():
    grads = {"w": torch.randn(6, 4), "b": torch.randn(6).to(torch.bfloat16), "h": torch.randn(5).half()}
    c = codec.get_codec("fp16")
    frame = c.encode_many(grads)
    want = codec.decode_many(frame)
    out = {k: torch.zeros_like(v) for k, v in grads.items()}
    assert codec.decode_many(frame, out=out) is out
    got = c.decode_many(frame, like=grads["w"])
    for k in grads:
        assert np.array_equal(_numpy(out[k]), want[k].astype(np.float64)), k
        assert isinstance(got[k], torch.Tensor) and got[k].dtype == grads[k].dtype, k
        assert np.array_equal(_numpy(got[k]), want[k].astype(np.float64)), k
    acc = {k: torch.ones_like(v) for k, v in grads.items()}
    codec.decode_add_many(frame, acc)
    ref = codec.decode_add_many(frame, {k: np.ones(v.shape, want[k].dtype) for k, v in grads.items()})
    assert all(np.array_equal(_numpy(acc[k]), ref[k].astype(np.float64)) for k in grads)


def test_named_parameters_gradients_and_skipping_the_missing():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    model[2].bias.requires_grad_(False)  # a parameter that gets no gradient
    model(torch.randn(8, 4)).sum().backward()
    c = codec.get_codec("topk(ratio=0.5)+fp16")
    with pytest.raises(TypeError, match=r"tensors\['2.bias'\]: None .*skip_missing=True"):
        c.encode_many((n, p.grad) for n, p in model.named_parameters())
    frame = c.encode_many(((n, p.grad) for n, p in model.named_parameters()), skip_missing=True)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert bytes(frame) == bytes(c.encode_many(grads))  # pairs are a dict in their order
    assert list(codec.decode_many(frame)) == ["0.weight", "0.bias", "2.weight"]
    assert c.max_frame_bytes_many(((n, p.grad) for n, p in model.named_parameters()), skip_missing=True) >= len(frame)
    ef = codec.ErrorFeedback(c)
    assert bytes(ef.encode_many([(n, p.grad) for n, p in model.named_parameters()], skip_missing=True)) == bytes(frame)
    codec.decode_many(frame, out={n: p.grad for n, p in model.named_parameters() if p.grad is not None})


def test_pairs_and_sequences_refused_as_they_should_be():
    c = codec.get_codec("fp16")
    x = np.ones(3, np.float32)
    with pytest.raises(CodecError, match="the name 'a' appears twice"):
        c.encode_many([("a", x), ("a", x)])
    with pytest.raises(CodecError, match=r"tensors\[1\]: None"):
        c.encode_many([x, None])
    assert len(codec.decode_many(c.encode_many([x, None, x], skip_missing=True))) == 2
    with pytest.raises(CodecError, match="an iterable must give \\(name, array\\) pairs"):
        c.encode_many(iter([x, x]))
    assert codec.decode_many(c.encode_many(iter([]))) == {}


def test_a_non_contiguous_tensor_is_refused_naming_out():
    frame = codec.get_codec("fp16").encode(np.ones((4, 4), np.float32))
    with pytest.raises(CodecError, match="out: a non-contiguous torch tensor"):
        codec.decode(frame, out=torch.zeros(4, 4).t())
    with pytest.raises(CodecError, match="out: dtype int32"):
        codec.decode(frame, out=torch.zeros(4, 4, dtype=torch.int32))


def test_the_transport_reduces_into_tensors():
    pytest.importorskip("mpi4py")
    from mpi4py import MPI

    from transport import Allreducer

    grads = {"w": torch.randn(5, 3), "b": torch.randn(3).to(torch.bfloat16)}
    for spec in ("topk(ratio=0.5)", "none", "powersgd(rank=1,min_compression_rate=0)"):
        want = Allreducer(spec, MPI.COMM_SELF).reduce(grads)  # (NumPy results)
        out = {k: torch.zeros_like(v) for k, v in grads.items()}
        assert Allreducer(spec, MPI.COMM_SELF).reduce(grads, out=out) is out
        for k in grads:
            assert np.array_equal(_numpy(out[k]), want[k].astype(np.float64)), (spec, k)
