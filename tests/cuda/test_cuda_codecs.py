"""Device arrays through the codecs that have a CUDA path (none, fp16, bf16, with or without
zstd), in the simulator: frames byte-identical to the host's, decode and decode_add into
device arrays identical to the host's, no host copy of the input, and clear errors."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import cuda

import codec
from codec.dtypes import bfloat16
from codec.errors import NonFiniteError

SPECS = ["none", "fp16", "bf16", "fp16(nonfinite=keep)", "bf16+zstd", "none+zstd"]
SHAPES = [(0,), (1,), (7,), (257,), (33, 17), (2, 3, 50)]


def data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed + int(np.prod(shape)))
    n = int(np.prod(shape))
    x = np.where(rng.random(n) < 0.5, rng.standard_normal(n), rng.standard_t(1.5, n) * 10.0 ** rng.integers(-9, 5, n))
    return x.astype(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("spec", SPECS)
def test_frames_and_decodes_match_the_host(spec, shape, dtype):
    c = codec.get_codec(spec)
    x = data(shape, dtype)
    if "keep" in spec and x.size >= 3:
        x.reshape(-1)[:3] = [np.inf, -np.inf, 65520.0]  # NaN payloads: see test_cuda_convert.same_values
    frame = c.encode(cuda.to_device(x))
    assert bytes(frame) == bytes(c.encode(x))  # byte for byte, the CRC-32C included
    buf = np.zeros(len(frame) + 9, np.uint8)
    assert bytes(c.encode(cuda.to_device(x), out=buf)) == bytes(frame)
    want = c.decode(frame)
    out = cuda.device_array(shape, dtype)
    assert c.decode(frame, out=out) is out
    assert np.array_equal(out.copy_to_host(), want, equal_nan=True)
    assert np.array_equal(out.copy_to_host().view(f"u{np.dtype(dtype).itemsize}"), want.view(f"u{np.dtype(dtype).itemsize}"))
    for subtract in (False, True):
        for acc_dtype in (np.float32, np.float64):
            base = data(shape, acc_dtype, seed=5)
            acc = cuda.to_device(base)
            c.decode_add(frame, acc, subtract=subtract)
            host = c.decode_add(frame, base.copy(), subtract=subtract)
            assert np.array_equal(acc.copy_to_host(), host, equal_nan=True), (subtract, acc_dtype)
    assert np.array_equal(codec.decode(frame), want, equal_nan=True)  # an ordinary frame


@pytest.mark.skipif(not numba.config.ENABLE_CUDASIM, reason="reads the simulator's host mirror of a device array")
def test_no_host_copy_of_the_input(monkeypatch):
    """Encoding copies the codes (or a sparsifier's counts, candidates and samples) to the
    host, never the input: every device-to-host copy is recorded (the simulator's arrays keep
    their memory in ``_ary``), and none is of the input's memory."""
    x = data((1000,), np.float32)
    d = cuda.to_device(x)
    copied = []
    real = type(d).copy_to_host

    def spy(self, *a, **k):
        copied.append(np.shares_memory(self._ary, d._ary))
        return real(self, *a, **k)

    monkeypatch.setattr(type(d), "copy_to_host", spy)
    monkeypatch.setattr(type(d), "__array__", lambda self, *a, **k: pytest.fail("the input went through __array__"), raising=False)
    for spec in ("fp16", "bf16", "fp16+zstd", "topk(ratio=0.05)", "gaussiank(ratio=0.05)", "dgc(ratio=0.05)", "randomk(ratio=0.05)", "adacomp"):
        copied.clear()
        frame = codec.get_codec(spec).encode(d)
        assert copied and not any(copied), spec  # the codes came back; the input never did
        assert bytes(frame) == bytes(codec.get_codec(spec).encode(x))


def test_device_input_errors_name_the_argument(host_only):
    c = codec.get_codec("fp16")
    with pytest.raises(TypeError, match=r"x: a device \(CUDA\) array, and int8 has no CUDA path"):
        codec.get_codec(host_only).encode(cuda.to_device(np.ones(5, np.float32)))
    with pytest.raises(TypeError, match="x: a device array of dtype bfloat16"):
        c.encode(cuda.to_device(np.ones(5, bfloat16)))
    with pytest.raises(ValueError, match="x: a device array must be C-contiguous"):
        c.encode(cuda.to_device(np.ones((5, 4), np.float32))[:, 1])
    with pytest.raises(TypeError, match="dtype: reinterprets host buffers"):
        c.encode(cuda.to_device(np.ones(4, np.float32)), dtype="float32")
    frame = c.encode(np.ones(5, np.float32))
    with pytest.raises(ValueError, match="out: has 4 elements"):
        c.decode(frame, out=cuda.device_array(4, np.float32))
    with pytest.raises(ValueError, match="out: dtype float64 does not match"):
        c.decode(frame, out=cuda.device_array(5, np.float64))
    with pytest.raises(TypeError, match=r"out: a device \(CUDA\) array, and int8"):
        codec.get_codec(host_only).decode(codec.get_codec(host_only).encode(np.ones(50, np.float32)), out=cuda.device_array(50, np.float32))
    with pytest.raises(NonFiniteError, match=r"position \(3,\)"):
        c.encode(cuda.to_device(np.array([0, 1, 2, np.nan, 4], np.float32)))


# ---------------------------------------------------------------- error feedback on the device
@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("spec", ["fp16", "bf16", "none", "fp16+zstd", "bf16(nonfinite=keep)"])
def test_error_feedback_on_the_device_matches_the_host(spec, dtype):
    """Step by step, the device step's frames and residuals are the host step's (float32 fp16
    and bf16 through the fused twin, the rest through the generic step on the device); the
    residual stays on the device; state_dict holds host arrays, which load and carry on."""
    on_dev, on_host = codec.ErrorFeedback(spec), codec.ErrorFeedback(spec)
    for step in range(4):
        x = (data((40, 9), dtype, seed=step) * 1e-3).astype(dtype)  # within fp16's range
        frame = on_dev.encode(cuda.to_device(x), key="w")
        assert bytes(frame) == bytes(on_host.encode(x, key="w")), step
        r = on_dev.residual("w")
        assert cuda.is_cuda_array(r) if hasattr(cuda, "is_cuda_array") else type(r).__module__.startswith("numba.cuda")
        assert np.array_equal(r.copy_to_host(), on_host.residual("w")), step
    state = on_dev.state_dict()
    assert isinstance(state["slots"][0]["residual"], np.ndarray)
    again = codec.ErrorFeedback(spec)
    again.load_state_dict(state)
    x = (data((40, 9), dtype, seed=9) * 1e-3).astype(dtype)
    assert bytes(again.encode(cuda.to_device(x), key="w")) == bytes(on_host.encode(x, key="w"))
    assert np.array_equal(again.residual("w").copy_to_host(), on_host.residual("w"))
    assert again.step("w") == on_host.step("w") == 5


def test_error_feedback_key_follows_its_gradient():
    """A key's residual moves with its gradients (one copy), host to device and back."""
    ef, ref = codec.ErrorFeedback("fp16"), codec.ErrorFeedback("fp16")
    for step, where in enumerate(["host", "device", "device", "host", "device"]):
        x = (data((300,), np.float32, seed=step) * 1e-3).astype(np.float32)
        got = ef.encode(cuda.to_device(x) if where == "device" else x, key=0)
        assert bytes(got) == bytes(ref.encode(x, key=0)), step
        r = ef.residual(0)
        assert (where == "device") == (not isinstance(r, np.ndarray))


def test_error_feedback_on_the_device_keeps_the_residual_on_error(host_only):
    ef = codec.ErrorFeedback("fp16")
    ef.encode(cuda.to_device(np.full(5, 1 / 3, np.float32)), key="k")
    before = ef.residual("k").copy_to_host()
    with pytest.raises(NonFiniteError, match=r"position \(3,\)"):
        ef.encode(cuda.to_device(np.array([0, 0, 0, np.nan, 0], np.float32)), key="k")
    assert np.array_equal(ef.residual("k").copy_to_host(), before) and ef.step("k") == 1
    with pytest.raises(TypeError, match="int8 has no CUDA path"):
        codec.ErrorFeedback(host_only).encode(cuda.to_device(np.ones(5, np.float32)), key="k")


def test_float32_half_step_on_the_device_is_the_fused_one(monkeypatch):
    from codec.kernels.cuda import convert

    calls = []
    real = convert.half_feedback
    monkeypatch.setattr(convert, "half_feedback", lambda *a: calls.append(1) or real(*a))
    ef = codec.ErrorFeedback("bf16")
    for step in range(2):
        ef.encode(cuda.to_device(np.full(300, 0.1 * (step + 1), np.float32)), key="k")
    assert len(calls) == 2


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16+zstd"])
def test_decode_like_a_device_array_allocates_on_the_device(spec, host_only):
    x = data((33, 17), np.float32)
    frame = codec.get_codec(spec).encode(x)
    like = cuda.to_device(np.zeros(3, np.float32))
    for got in (codec.decode(frame, like=like), codec.get_codec(spec).decode(frame, like=like)):
        assert not isinstance(got, np.ndarray) and tuple(got.shape) == (33, 17)
        assert np.array_equal(got.copy_to_host(), codec.decode(frame), equal_nan=True)
    assert isinstance(codec.decode(frame, like=np.zeros(3)), np.ndarray)  # a host like: a host array
    with pytest.raises(TypeError, match=r"like: a device \(CUDA\) array, and int8 has no CUDA path"):
        codec.decode(codec.get_codec(host_only).encode(np.ones(100, np.float32)), like=like)
    with pytest.raises(TypeError, match="like: a frame of bfloat16 cannot decode to a device array yet"):
        codec.decode(codec.get_codec("fp16").encode(np.ones(4, bfloat16)), like=like)


def test_decode_like_a_torch_cuda_tensor_gives_a_torch_tensor():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    x = torch.randn(1000, device="cuda")
    frame = codec.get_codec("bf16").encode(x)
    assert bytes(frame) == bytes(codec.get_codec("bf16").encode(x.cpu().numpy()))
    got = codec.decode(frame, like=x)
    assert isinstance(got, torch.Tensor) and got.device == x.device and got.dtype == torch.float32
    assert np.array_equal(got.cpu().numpy(), codec.decode(frame))
    out = torch.empty_like(x)
    codec.decode(frame, out=out)
    assert torch.equal(out, got)


def test_torch_cuda_dlpack_capsules_and_buckets():
    """On a GPU: a torch CUDA tensor's DLPack capsule is viewed (codec.dlpack), and views of
    one torch buffer are one span (codec.device.span, through from_cuda_array_interface)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    from torch.utils import dlpack as torch_dlpack

    x = torch.randn(1000, device="cuda")
    c = codec.get_codec("topk(ratio=0.05)")
    want = bytes(c.encode(x.cpu().numpy()))
    assert bytes(c.encode(torch_dlpack.to_dlpack(x))) == want
    out = torch.zeros_like(x)
    codec.decode(c.encode(x), out=torch_dlpack.to_dlpack(out))
    assert np.array_equal(out.cpu().numpy(), codec.decode(want))
    bucket = torch.randn(3000, device="cuda")
    views = [bucket[a:b] for a, b in ((0, 500), (500, 520), (520, 3000))]
    from codec.device import as_device_array, span

    whole = span([as_device_array(v) for v in views])
    assert whole is not None and whole.size == 3000
    assert np.array_equal(whole.copy_to_host(), bucket.cpu().numpy())


#: the sparsifiers, one tensor or a run of them: their positions and values stay on the device
PICKED = ("topk(ratio=0.1)", "topk(ratio=0.1)+fp16", "gaussiank(ratio=0.1)", "dgc(ratio=0.1)", "threshold(value=1.5)", "randomk(ratio=0.1)", "randomk(ratio=0.1,scale=true)", "adacomp", "adacomp(bin=50)", "fft(theta=0.9)", "fft(theta=0.9,keep=global)")


def copies(monkeypatch, d):
    """The byte counts of every device-to-host copy made from now on (a list that fills)."""
    copied = []
    real = type(d).copy_to_host
    monkeypatch.setattr(type(d), "copy_to_host", lambda self, *a, **k: copied.append(self.nbytes) or real(self, *a, **k))
    return copied


@pytest.mark.skipif(not numba.config.ENABLE_CUDASIM, reason="counts the simulator's device-to-host copies")
def test_bytes_an_encode_copies_to_the_host(monkeypatch):
    """What a device encode copies to the host is its frame's content and a few numbers: the
    codes (quantizers, 16-bit floats, PowerSGD's P and Q); a sparsifier's index section and
    coded values, made on the device, and a few counts, cuts and flags (8 bytes each; one per
    chunk of 65,536 values) -- never the input, its sample, its candidates, its picked
    positions as int64 or values before they are coded, AdaComp's bin maxima, or anything of
    the input's size.  (The sparsifiers' sample and cut once came back whole: 160,000 bytes
    for a Gaussian-k frame of 1,165; then their candidates: 2,424 bytes for a top-k frame of
    1,113.)  Here a tenth of the values is kept: their int64 positions alone would be 800 bytes
    more than the bound."""
    n = 1000  # (the simulator: at 4,000 values a minifloat encode took 200 s of thread polling, at 1,000 under a second)
    x = data((n,), np.float32)
    d = cuda.to_device(x)
    copied = copies(monkeypatch, d)
    coded = ("fp16", "fp8", "rangefloat(bits=4)", "minmax(bits=4)", "qsgd", "terngrad", "sign", "onebit")
    for spec in PICKED + coded + ("powersgd",):
        copied.clear()
        arr = d.reshape(20, 50) if spec == "powersgd" else d
        frame = codec.get_codec(spec).encode(arr)
        assert sum(copied) <= len(frame) + 160, (spec, len(frame), sorted(copied))


@pytest.mark.skipif(not numba.config.ENABLE_CUDASIM, reason="counts the simulator's device-to-host copies")
def test_bytes_a_many_tensor_encode_copies_to_the_host(monkeypatch):
    """The same for a run of tensors coded at once (the segmented selections): the frame's
    content and a few numbers per tensor (counts, flags, widths, scales)."""
    sizes = (300, 50, 1000, 7, 640)
    xs = [data((m,), np.float32) for m in sizes]
    ds = [cuda.to_device(v) for v in xs]
    copied = copies(monkeypatch, ds[0])
    for spec in PICKED:
        copied.clear()
        frame = codec.get_codec(spec).encode_many(ds)
        assert sum(copied) <= len(frame) + 48 * len(sizes) + 64, (spec, len(frame), sorted(copied))
        if not spec.startswith("fft"):  # (fft: within its tolerance, tested elsewhere)
            assert bytes(frame) == bytes(codec.get_codec(spec).encode_many(xs)), spec
