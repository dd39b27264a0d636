"""Many tensors through device arrays: encode_many (per tensor and joint) gives the host's
frame byte for byte; decode_many and decode_add_many write device arrays as the host's;
mixed host and device tensors, and codecs without a CUDA path, are refused by name."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import cuda

import codec
import codec.pack

SPECS = ["fp16", "none+zstd", "bf16", "topk(ratio=0.1)", "gaussiank(ratio=0.1)", "dgc(ratio=0.1)+fp16", "threshold(value=1.0)",
         "randomk(ratio=0.2)", "adacomp+zstd", "rangefloat(bits=5,block=16)", "minmax(bits=3,bucket=16)", "qsgd(bucket=16)+zstd", "powersgd"]


def tensors(dtype=np.float32):
    rng = np.random.default_rng(5)
    return {
        "conv": (rng.standard_t(2, (2, 3, 4, 5))).astype(dtype),  # AdaComp's convolution bins
        "bias": rng.standard_normal(7).astype(dtype),
        "empty": np.zeros((0, 3), dtype),
        "fc": rng.standard_normal((9, 23)).astype(dtype),
    }


@pytest.mark.parametrize("joint", (False, True), ids=("per-tensor", "joint"))
@pytest.mark.parametrize("spec", SPECS)
def test_many_tensors_on_the_device_match_the_host(spec, joint):
    c = codec.get_codec(spec)
    host = tensors()
    dev = {k: cuda.to_device(v) for k, v in host.items()}
    frame = c.encode_many(dev, keys=None if joint else list(range(4)), step=3, joint=joint)
    assert bytes(frame) == bytes(c.encode_many(host, keys=None if joint else list(range(4)), step=3, joint=joint))
    want = codec.decode_many(frame)
    outs = {k: cuda.device_array(v.shape, v.dtype) for k, v in host.items()}
    assert codec.decode_many(frame, out=outs) is outs
    for k in host:
        assert np.array_equal(outs[k].copy_to_host(), want[k]), k
    base = {k: np.random.default_rng(9).standard_normal(v.shape) for k, v in host.items()}  # float64: rounded once
    acc = {k: cuda.to_device(v) for k, v in base.items()}
    codec.decode_add_many(frame, acc, subtract=True)
    codec.decode_add_many(frame, base, subtract=True)
    for k in host:
        assert np.array_equal(acc[k].copy_to_host(), base[k]), k


def test_float64_tensors_and_a_list():
    host = list(tensors(np.float64).values())
    dev = [cuda.to_device(v) for v in host]
    for spec in ("fp16", "topk(ratio=0.2)"):
        c = codec.get_codec(spec)
        assert bytes(c.encode_many(dev)) == bytes(c.encode_many(host)), spec


def test_fft_runs_decode_within_the_tolerance():
    """A many-tensor fft frame made from device tensors decodes (on the host and into device
    arrays) within fft's device tolerance of the host frame's decode, tensor by tensor."""
    from codec.testing import device_tolerance

    host = tensors()
    dev = {k: cuda.to_device(v) for k, v in host.items()}
    c = codec.get_codec("fft(theta=0.5,block=16)")
    tol = device_tolerance(c)
    want = codec.decode_many(c.encode_many(host))
    got = codec.decode_many(c.encode_many(dev))
    out = {k: cuda.device_array(v.shape, v.dtype) for k, v in host.items()}
    codec.decode_many(c.encode_many(host), out=out)
    for k, x in host.items():
        for a in (got[k], out[k].copy_to_host()):
            assert np.linalg.norm((a - want[k]).astype(np.float64)) <= tol * np.linalg.norm(x.astype(np.float64)), k


def test_mixed_and_unsupported_inputs_are_refused(host_only):
    host = tensors()
    mixed = dict(host, bias=cuda.to_device(host["bias"]))
    with pytest.raises(TypeError, match="tensors: mixes device and host arrays"):
        codec.get_codec("fp16").encode_many(mixed)
    dev = {k: cuda.to_device(v) for k, v in host.items()}
    with pytest.raises(TypeError, match=r"tensors: a device \(CUDA\) array, and int8 has no CUDA path"):
        codec.get_codec(host_only).encode_many(dev)
    frame = codec.get_codec(host_only).encode_many(host)
    with pytest.raises(TypeError, match=r"out: a device \(CUDA\) array, and int8"):
        codec.decode_many(frame, out={k: cuda.device_array(v.shape, v.dtype) for k, v in host.items()})
    with pytest.raises(ValueError, match=r"out\['bias'\]: has 6 elements"):
        codec.decode_many(codec.get_codec("fp16").encode_many(host), out=dict({k: cuda.device_array(v.shape, v.dtype) for k, v in host.items()}, bias=cuda.device_array(6, np.float32)))
    with pytest.raises(TypeError, match="mixes device and host arrays"):
        codec.decode_many(codec.get_codec("fp16").encode_many(host), out=dict(host, bias=cuda.device_array(7, np.float32)))
    with pytest.raises(TypeError, match="mixes device and host arrays"):
        codec.ErrorFeedback("fp16").encode_many(mixed)


@pytest.mark.parametrize("joint", (False, True), ids=("per-tensor", "joint"))
@pytest.mark.parametrize("spec,momentum", [("fp16", 0), ("topk(ratio=0.1)", 0), ("adacomp", 0), ("randomk(ratio=0.2)+bf16", 0), ("gaussiank(ratio=0.1)", 0), ("dgc(ratio=0.1)", 0.9)])
def test_error_feedback_over_many_device_tensors_matches_the_host(spec, momentum, joint):
    """Each tensor's step (or the joint one) on the device, DGC's momentum included: frames
    and residuals step by step the host's; the residuals stay on the device."""
    on_dev, on_host = codec.ErrorFeedback(spec, momentum=momentum), codec.ErrorFeedback(spec, momentum=momentum)
    for step in range(2):
        host = {k: v * (step + 1) for k, v in tensors().items()}
        dev = {k: cuda.to_device(v) for k, v in host.items()}
        assert bytes(on_dev.encode_many(dev, joint=joint)) == bytes(on_host.encode_many(host, joint=joint)), step
        for key in ([None] if joint else list(host)):
            r = on_dev.residual(key)
            assert not isinstance(r, np.ndarray)
            assert np.array_equal(r.copy_to_host(), on_host.residual(key)), (step, key)


@pytest.fixture
def launches(monkeypatch):
    """Counts the simulator's kernel launches (``FakeCUDAKernel[...]``) by kernel name."""
    import collections

    from numba.cuda.simulator import kernel

    counts = collections.Counter()
    real = kernel.FakeCUDAKernel.__getitem__

    def counted(self, cfg):
        counts[self.fn.__name__] += 1
        return real(self, cfg)

    monkeypatch.setattr(kernel.FakeCUDAKernel, "__getitem__", counted)
    return counts


#: (spec, momentum, launches a run's step may take).  A sparsifier's include making its
#: index sections on the device (widths, bytes) and gathering its values there; DGC's add
#: the momentum and its masking; random-k's, the draw (a bitmap marked, counted and read
#: back in order) and the check that the kept values are finite (two counts); AdaComp's, its
#: gradients' concatenation beside ``acc``, its scales' sums and its sign bits.
RUN_STEPS = [("topk(ratio=0.1)+fp16", 0, 8), ("dgc(ratio=0.1)", 0.9, 11), ("randomk(ratio=0.2)", 0, 14), ("fp16", 0, 6), ("bf16+zstd", 0.5, 8),
             ("adacomp", 0.9, 13)]


@pytest.mark.parametrize("spec,momentum,budget", RUN_STEPS)
def test_error_feedback_runs_on_the_device_take_one_step_per_run(spec, momentum, budget, launches):
    """ErrorFeedback.encode_many of a run of small device tensors (codec.runs.feedback_runs:
    a sparsifier's of at least 8, an elementwise codec's of at least 2, whose host step is
    fused per tensor) takes the run's step at once (codec.feedback.runstep), DGC's momentum
    included: frames, residuals and velocities
    step by step the host's (each tensor's own step), the run's residuals one device buffer
    from the first step on, and a step's launches as many for 12 tensors as for 8."""
    on_dev, on_host = codec.ErrorFeedback(spec, momentum=momentum), codec.ErrorFeedback(spec, momentum=momentum)
    rng = np.random.default_rng(11)
    sizes = [7, 0, 130, 1, 64, 9, 33, 2, 40, 17, 5, 21]
    counts, banks = [], []
    for step in range(3):  # the third step: residuals and spares each one buffer, nothing allocated
        host = {f"w{i}": (rng.standard_t(2, n) * 10.0 ** rng.integers(-3, 2)).astype(np.float32) for i, n in enumerate(sizes)}
        dev = {k: cuda.to_device(v) for k, v in host.items()}
        launches.clear()
        assert bytes(on_dev.encode_many(dev)) == bytes(on_host.encode_many(host)), step
        counts.append(sum(launches.values()))
        assert len({id(on_dev._slots[k].at[0]) for k in host}) == 1, step  # the run's residuals: slices of one buffer
        banks.append(id(on_dev._slots["w0"].at[0]))
        for k in host:
            assert np.array_equal(on_dev.residual(k).copy_to_host(), on_host.residual(k)), (step, k)
            if momentum:
                assert np.array_equal(on_dev._slots[k].velocity.copy_to_host(), on_host._slots[k].velocity), (step, k)
    assert counts[0] <= budget and len(set(counts)) == 1, counts
    assert banks[2] == banks[0] != banks[1], banks  # the third step's acc went into the first step's buffer, the spares
    launches.clear()
    codec.ErrorFeedback(spec, momentum=momentum).encode_many([cuda.to_device(rng.standard_normal(n).astype(np.float32)) for n in sizes[:8]])
    assert sum(launches.values()) == counts[0], dict(launches)


def test_fft_runs_take_one_step_on_the_device(launches):
    """fft's error-feedback run on the device (every block of the run transformed, selected
    and inverted at once): frames and residuals bit for bit each tensor's own device step,
    within fft's device tolerance of the host's, and as many launches for 12 tensors as for 8."""
    from codec.testing import device_tolerance

    spec = "fft(theta=0.5,block=16)"
    together, alone, on_host = codec.ErrorFeedback(spec), codec.ErrorFeedback(spec), codec.ErrorFeedback(spec)
    tol = device_tolerance(codec.get_codec(spec))
    rng = np.random.default_rng(12)
    sizes = [7, 0, 130, 1, 64, 9, 33, 2, 40, 17, 5, 21]
    counts = []
    for step in range(2):
        host = {f"w{i}": (rng.standard_t(2, n)).astype(np.float32) for i, n in enumerate(sizes[:8])}
        dev = {k: cuda.to_device(v) for k, v in host.items()}
        launches.clear()
        got = codec.decode_many(together.encode_many(dev))
        counts.append(sum(launches.values()))
        want = codec.decode_many(on_host.encode_many(host))
        for k, x in host.items():
            assert got[k].tobytes() == codec.decode(alone.encode(dev[k], key=k)).tobytes(), (step, k)
            assert np.array_equal(together.residual(k).copy_to_host(), alone.residual(k).copy_to_host()), (step, k)
            assert np.linalg.norm(got[k] - want[k]) <= tol * (step + 2) * np.linalg.norm(x), (step, k)
    launches.clear()
    codec.ErrorFeedback(spec).encode_many([cuda.to_device(rng.standard_normal(n).astype(np.float32)) for n in sizes])
    assert sum(launches.values()) == counts[0] == counts[1] <= 20, (counts, dict(launches))


@pytest.mark.parametrize("joint", (False, True), ids=("per-tensor", "joint"))
def test_loaded_host_residuals_follow_many_device_tensors(joint):
    """A state saved (host arrays) and loaded carries on with device tensors in encode_many:
    the residuals move to the device once, and frames and residuals are the host's."""
    rng = np.random.default_rng(4)
    sizes = [5, 40, 9, 1, 60, 12, 3, 30, 500]  # a run of eight, then one alone
    ts = [[rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(2)]
    ref = codec.ErrorFeedback("topk(ratio=0.1)")
    ref.encode_many(ts[0], joint=joint)
    again = codec.ErrorFeedback("topk(ratio=0.1)")
    again.load_state_dict(ref.state_dict())
    assert bytes(again.encode_many([cuda.to_device(t) for t in ts[1]], joint=joint)) == bytes(ref.encode_many(ts[1], joint=joint))
    for key in ([None] if joint else range(len(sizes))):
        assert not isinstance(again.residual(key), np.ndarray)
        assert np.array_equal(again.residual(key).copy_to_host(), ref.residual(key)), key


@pytest.mark.parametrize("spec", ["topk(ratio=0.1)", "randomk(ratio=0.2)+fp16", "fp16", "gaussiank(ratio=0.1)"])
@pytest.mark.parametrize("joint", (False, True), ids=("per-tensor", "joint"))
def test_tensors_lying_end_to_end_are_read_and_written_at_once(spec, joint, launches):
    """Device tensors that are views of one buffer (a framework's gradient bucket) are one
    span (codec.device.span): encode_many reads a run where it lies, and decode_many /
    decode_add_many write a run (or a joint frame) with one launch, where separate arrays
    take one per tensor; results are the host's either way."""
    c = codec.get_codec(spec)
    rng = np.random.default_rng(8)
    sizes = [40, 0, 7, 130, 1, 64, 9, 33, 2, 21]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    host = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    bucket = cuda.to_device(np.concatenate(host))
    views = [bucket[a:b] for a, b in zip(starts, starts[1:])]
    frame = c.encode_many(views, joint=joint)
    assert bytes(frame) == bytes(c.encode_many(host, joint=joint))
    want = codec.decode_many(frame)
    base = rng.standard_normal(starts[-1]).astype(np.float32)
    wanted_sum = [b + w for b, w in zip(np.split(base, starts[1:-1]), want)]
    per_call = {}
    for kind in ("bucket", "separate"):
        out_bucket = cuda.device_array(starts[-1], np.float32)
        outs = [out_bucket[a:b] for a, b in zip(starts, starts[1:])] if kind == "bucket" else [cuda.device_array(n, np.float32) for n in sizes]
        launches.clear()
        codec.decode_many(frame, out=outs)
        decoded = sum(launches.values())
        for o, w in zip(outs, want):
            assert np.array_equal(o.copy_to_host(), w), kind
        for o, b in zip(outs, np.split(base, starts[1:-1])):
            if b.size:  # (the simulator refuses an empty copy's strides)
                o.copy_to_device(b)
        launches.clear()
        codec.decode_add_many(frame, outs)
        per_call[kind] = (decoded, sum(launches.values()))
        for o, w in zip(outs, wanted_sum):
            assert np.array_equal(o.copy_to_host(), w), kind
    assert per_call["bucket"][0] <= 2 and per_call["bucket"][1] <= 2, per_call
    assert per_call["separate"][1] > per_call["bucket"][1], per_call


@pytest.mark.parametrize("spec", ["fp16", "bf16+zstd", "topk(ratio=0.1)", "dgc(ratio=0.1)+fp16"])
def test_float16_device_tensors_are_the_hosts(spec):
    """float16 device tensors: encode_many (per tensor and joint), decode_many and
    decode_add_many into float16 device arrays, and error feedback (an elementwise codec's run
    step on the device, each tensor's own step on the host; DGC with momentum) give the
    host's frames, arrays and residuals."""
    rng = np.random.default_rng(6)
    sizes = [5, 40, 9, 1, 60, 12, 3, 30, 300]
    momentum = 0.9 if spec.startswith("dgc") else 0.0
    on_dev, on_host = codec.ErrorFeedback(spec, momentum=momentum), codec.ErrorFeedback(spec, momentum=momentum)
    for step in range(2):
        host = [(rng.standard_t(2, n) * 1e-2).astype(np.float16) for n in sizes]
        dev = [cuda.to_device(t) for t in host]
        assert bytes(on_dev.encode_many(dev)) == bytes(on_host.encode_many(host)), step
        for k in range(len(sizes)):
            assert np.array_equal(on_dev.residual(k).copy_to_host(), on_host.residual(k)), (step, k)
    c = codec.get_codec(spec)
    for joint in (False, True):
        frame = c.encode_many(dev, joint=joint)
        assert bytes(frame) == bytes(c.encode_many(host, joint=joint)), joint
        outs = [cuda.device_array(n, np.float16) for n in sizes]
        codec.decode_many(frame, out=outs)
        for o, w in zip(outs, codec.decode_many(frame)):
            assert o.copy_to_host().tobytes() == w.tobytes(), joint
        base = [(rng.standard_normal(n)).astype(np.float16) for n in sizes]
        acc = [cuda.to_device(b) for b in base]
        codec.decode_add_many(frame, acc, subtract=True)
        codec.decode_add_many(frame, base, subtract=True)
        for a, b in zip(acc, base):
            assert a.copy_to_host().tobytes() == b.tobytes(), joint


def test_sparse_pairs_added_into_device_arrays_cross_the_link_sparse(monkeypatch):
    """A sparse run added into separate float16 device arrays is densified on the device (only
    the kept values and positions cross to it, not a float32 copy of each tensor), and
    float64 values added into a float32 device array send their positions once."""
    rng = np.random.default_rng(8)
    host = [rng.standard_normal(n).astype(np.float32) for n in (300, 40, 900, 20, 500)]
    c = codec.get_codec("topk(ratio=0.05)")
    frame = c.encode_many(host)
    kept = sum(p.size for p, _ in codec.decode_sparse_many(frame))
    outs = [cuda.to_device(np.ones(a.size, np.float16)) for a in host]
    moved = []
    real = cuda.to_device
    monkeypatch.setattr(cuda, "to_device", lambda a, *r, **k: (moved.append(np.asarray(a).nbytes), real(a, *r, **k))[1])
    c.decode_add_many(frame, outs)
    assert sum(moved) <= kept * (8 + 4), moved  # int64 positions and float32 values, nothing dense
    base = [np.ones(a.size, np.float16) for a in host]
    c.decode_add_many(frame, base)
    assert all(o.copy_to_host().tobytes() == b.tobytes() for o, b in zip(outs, base))
    x = rng.standard_normal(2000)  # float64
    f64 = codec.get_codec("topk(ratio=0.05)").encode(x)
    acc = real(np.ones(x.size, np.float32))
    moved.clear()
    monkeypatch.setattr(codec.pack, "DEVICE_SECTION", 1 << 20)  # positions read on the host: they cross
    c.decode_add(f64, acc)
    assert sum(moved) == 100 * 8 + 100 * 4, moved  # the positions once, the rounded values once
    want = np.ones(x.size, np.float32)
    c.decode_add(f64, want)
    assert np.array_equal(acc.copy_to_host(), want)


@pytest.mark.skipif(not numba.config.ENABLE_CUDASIM, reason="reads the simulator's host mirror of a device array")
@pytest.mark.parametrize("spec", ["fp16", "topk(ratio=0.1)+fp16", "randomk(ratio=0.2)"])
def test_many_tensors_make_no_host_copy_of_the_input(spec, monkeypatch):
    """encode_many and ErrorFeedback.encode_many (momentum included) of device tensors, apart
    and as views of one buffer (read where they lie), copy codes, counts and candidates to the
    host, never the tensors: every device-to-host copy is recorded and none overlaps them.
    (gaussian-k's run shifts, NumPy's mean of each tensor, copy a run once: docs/api.md.)"""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    rng = np.random.default_rng(12)
    sizes = [5, 40, 9, 1, 60, 12, 3, 30, 500]
    host = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    bucket = cuda.to_device(np.concatenate(host))
    at = np.concatenate([[0], np.cumsum(sizes)])
    inputs = {"apart": [cuda.to_device(t) for t in host], "bucket": [bucket[a:b] for a, b in zip(at, at[1:])]}
    copied = []
    real = FakeCUDAArray.copy_to_host
    monkeypatch.setattr(FakeCUDAArray, "copy_to_host", lambda self, *a, **k: copied.append(self._ary) or real(self, *a, **k))
    for kind, ts in inputs.items():
        ef, ref = codec.ErrorFeedback(spec, momentum=0.9), codec.ErrorFeedback(spec, momentum=0.9)
        for step in range(2 if kind == "bucket" else 1):  # (the second step reads the residuals as one buffer)
            copied.clear()
            frames = [codec.get_codec(spec).encode_many(ts), ef.encode_many(ts)]
            assert copied and not any(np.shares_memory(c, t._ary) for c in copied for t in ts), (kind, step)
            assert [bytes(f) for f in frames] == [bytes(codec.get_codec(spec).encode_many(host)), bytes(ref.encode_many(host))], (kind, step)


@pytest.mark.parametrize("spec", ["topk(ratio=0.1)", "randomk(ratio=0.2)"])
def test_a_sparse_run_added_into_float16_views_of_one_buffer_is_the_hosts(spec):
    """decode_add_many of a float32 sparse frame into float16 device views of one buffer (a
    span) adds the whole decoded tensor once, as every 16-bit output does: a -0.0 the frame
    does not touch becomes +0.0, as on the host."""
    rng = np.random.default_rng(13)
    sizes = [40, 7, 130, 1, 64, 9, 33, 2, 21]
    frame = codec.get_codec(spec).encode_many([rng.standard_normal(n).astype(np.float32) for n in sizes])
    at = np.concatenate([[0], np.cumsum(sizes)])
    bucket = cuda.to_device(np.full(at[-1], -0.0, np.float16))
    views = [bucket[a:b] for a, b in zip(at, at[1:])]
    host = [np.full(n, -0.0, np.float16) for n in sizes]
    codec.decode_add_many(frame, views)
    codec.decode_add_many(frame, host)
    assert bucket.copy_to_host().tobytes() == np.concatenate(host).tobytes()


def test_a_key_new_to_a_run_starts_its_velocity_from_zeros():
    """With momentum, a run whose keys have velocities except a new one (one buffer no more)
    gathers them with zeros for the new key: the host's frames, residuals and velocities."""
    rng = np.random.default_rng(14)
    on_dev, on_host = codec.ErrorFeedback("randomk(ratio=0.2)", momentum=0.9), codec.ErrorFeedback("randomk(ratio=0.2)", momentum=0.9)
    for count in (8, 9, 9):
        host = {f"w{i}": rng.standard_normal(10 + i).astype(np.float32) for i in range(count)}
        assert bytes(on_dev.encode_many({k: cuda.to_device(v) for k, v in host.items()})) == bytes(on_host.encode_many(host)), count
        for k in host:
            assert np.array_equal(on_dev._slots[k].velocity.copy_to_host(), on_host._slots[k].velocity), (count, k)
