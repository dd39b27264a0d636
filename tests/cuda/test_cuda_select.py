"""The ``select`` family's CUDA twin against NumPy references (candidates in chunks with their
rows, counts, non-finite counts and lane sums; the samples; the row gather), and the
sparsifiers (topk, gaussiank, dgc, threshold, randomk) through device arrays: frames byte
for byte the host's, with and without error feedback, several chunks included, decodes into
device arrays the host's."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import codec
from codec.dtypes import readonly as ro
from codec.errors import NonFiniteError
from codec.kernels import module
from codec.kernels.cuda import _common

G = module("select", "cuda")
C = module("select", "cpu")


def data(n, dtype, seed=0, kind="mixed"):
    rng = np.random.default_rng(seed + n)
    if kind == "heavy":
        x = rng.standard_t(1.5, n) * 10.0 ** rng.integers(-6, 4, n)
    elif kind == "ties":
        x = rng.integers(-3, 4, n).astype(np.float64)  # many equal magnitudes and zeros
    else:
        x = np.where(rng.random(n) < 0.5, rng.standard_normal(n), rng.standard_t(2.0, n))
    return x.astype(dtype)


def ref_candidates(a, cut, chunk, cap, shift, width):
    """Per chunk: the first ``cap`` positions with ``not |a| < cut`` and finite, their values,
    the count of such, the non-finite count, and the float64 lane sums (``chunk_sums``)."""
    rows, counts, bad, sums = [], [], [], []
    for lo in range(0, a.size, chunk):
        part = a[lo : lo + chunk]
        mag = np.abs(part)
        fin = np.isfinite(part)
        hit = np.flatnonzero(~(mag < cut) & fin)
        rows.append(hit[:cap] + lo)
        counts.append(hit.size)
        bad.append(int((~fin).sum()))
        v = part.astype(np.float64) - shift
        r = v.size // width
        lanes = v[: r * width].reshape(r, width)
        cs, cq = np.zeros(width), np.zeros(width)
        for k in range(r):  # row by row: each lane in order
            cs += lanes[k]
            cq += lanes[k] * lanes[k]
        s = q = 0.0
        for j in range(width):
            s += cs[j]
            q += cq[j]
        for t in v[r * width :]:
            s += t
            q += t * t
        sums.append((s, q))
    return rows, np.array(counts, np.int64), np.array(bad, np.int64), np.array(sums).reshape(-1, 2)


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", [0, 1, 33, 300, 1001])
@pytest.mark.parametrize("form", (False, True), ids=("x", "x+r"))
def test_candidates_match_numpy_in_several_chunks(monkeypatch, n, dtype, form):
    """Chunks of 256 (several for n > 256, a short last one), rows with room for 5 finds (most
    chunks find more: their count says so), NaN and inf counted, not found; under error
    feedback ``acc = x + r`` written in the same pass."""
    monkeypatch.setattr(G, "CHUNK", 256)
    monkeypatch.setattr(_common, "SCAN_ITEMS", 7)
    x = data(n, dtype, kind="heavy")
    if n > 40:
        x[[7, 39]] = [np.nan, -np.inf]
    r = data(n, dtype, seed=1) if form else np.empty(0, dtype)
    a = (x + r) if form else x
    cut = dtype(1.0)
    nchunk = -(-n // 256)
    cap, width, shift = 5, 8, 0.25
    buf = cuda.device_array((nchunk, cap), np.int64)
    vals = cuda.device_array((nchunk, cap), dtype)
    counts, bad = cuda.to_device(np.zeros(nchunk, np.int64)), cuda.to_device(np.zeros(nchunk, np.int64))
    sums = cuda.to_device(np.zeros((nchunk, 2)))
    acc = cuda.to_device(np.zeros(n if form else 0, dtype))
    G.candidates(cuda.to_device(x), cuda.to_device(r), acc, cut, np.array([0, nchunk]), buf, vals, counts, bad, sums, shift, width)
    rows, want_counts, want_bad, want_sums = ref_candidates(a, cut, 256, cap, shift, width)
    got_buf, got_vals = buf.copy_to_host(), vals.copy_to_host()
    for c, row in enumerate(rows):
        assert np.array_equal(got_buf[c, : row.size], row), c
        assert np.array_equal(got_vals[c, : row.size], a[row]), c
    assert np.array_equal(counts.copy_to_host(), want_counts)
    assert np.array_equal(bad.copy_to_host(), want_bad)
    assert np.array_equal(sums.copy_to_host(), want_sums, equal_nan=True)  # the CPU's order, bit for bit
    if form:
        assert np.array_equal(acc.copy_to_host(), a, equal_nan=True)


@pytest.mark.parametrize("block", (256, 32))
@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_candidates_match_the_cpu_kernel(monkeypatch, block, dtype):
    """One chunk as the CPU kernel runs it (the library's CHUNK), both block shapes, with the
    sums the CPU kernel takes (LANES): rows, counts and sums identical."""
    from codec.layout import LANES

    monkeypatch.setattr(_common, "SCAN_BLOCK", block)
    n = 700
    x, r = data(n, dtype), data(n, dtype, seed=2)
    cut, chunks = dtype(0.8), np.array([0, 1])
    out = {}
    for name, kern, put in (("cpu", C, np.asarray), ("cuda", G, cuda.to_device)):
        buf, vals = put(np.zeros((1, n), np.int64)), put(np.zeros((1, n), dtype))
        counts, bad, sums, acc = put(np.zeros(1, np.int64)), put(np.zeros(1, np.int64)), put(np.zeros((1, 2))), put(np.zeros(n, dtype))
        inp = put if kern is G else ro  # (the CPU kernel's inputs read-only, as the stage passes them)
        kern.candidates(inp(x), inp(r), acc, cut, chunks, buf, vals, counts, bad, sums, 0.125, LANES)
        out[name] = [np.asarray(a if name == "cpu" else a.copy_to_host()) for a in (buf, vals, counts, bad, sums, acc)]
    m = int(out["cpu"][2][0])
    assert out["cuda"][2][0] == m > 0
    assert np.array_equal(out["cuda"][0][0, :m], out["cpu"][0][0, :m])
    assert np.array_equal(out["cuda"][1][0, :m], out["cpu"][1][0, :m])
    for k in (3, 4, 5):
        assert np.array_equal(out["cuda"][k], out["cpu"][k]), k


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", [1, 17, 300])
def test_samples_and_row_gather_match_numpy(n, dtype):
    x, r = data(n, dtype, kind="heavy"), data(n, dtype, seed=3)
    for rr in (r, np.empty(0, dtype)):
        a = x + rr if rr.size else x
        for stride in (1, 2, 7):
            m = -(-n // stride)
            out = cuda.device_array(m)
            G.strided_sample(cuda.to_device(x), cuda.to_device(rr), stride, out)
            assert np.array_equal(out.copy_to_host(), a[::stride].astype(np.float64))
        runs, line = max(1, n // 8), min(4, n)
        step = n // runs
        out = cuda.device_array((runs, line))
        G.line_sample(cuda.to_device(x), cuda.to_device(rr), step, out)
        want = np.array([np.abs(a[q * step : q * step + line].astype(np.float64)) for q in range(runs)])
        assert np.array_equal(out.copy_to_host(), want)
    buf = np.arange(4 * 6, dtype=np.int64).reshape(4, 6)
    vals = buf.astype(dtype) / 3
    counts, starts = np.array([2, 0, 6, 1]), np.array([0, 2, 2, 8])
    out, vout = cuda.device_array(9, np.int64), cuda.device_array(9, dtype)
    G.gather_rows(cuda.to_device(buf), cuda.to_device(vals), cuda.to_device(counts), cuda.to_device(starts), out, vout)
    want = np.concatenate([buf[c, : counts[c]] for c in range(4)])
    assert np.array_equal(out.copy_to_host(), want) and np.array_equal(vout.copy_to_host(), vals.reshape(-1)[want])


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("kind", ("mixed", "heavy", "ties"))
def test_kth_largest_matches_the_cpu_kernel(dtype, kind):
    """A sample's cut, the k-th largest magnitude (k from 1 to all; a NaN and an inf in the
    mixed sample): the CPU kernel's value bit for bit, and NumPy's."""
    for n in (1, 65, 300):
        x = data(n, dtype, kind=kind)
        if kind == "mixed" and n > 2:
            x[n // 2], x[1] = np.nan, -np.inf
        mags = np.sort(np.abs(x.astype(np.float64)))  # (a NaN sorts last: the largest)
        for k in sorted({1, max(1, n // 7), n}):
            got = np.float64(G.kth_largest(cuda.to_device(x), k))
            for want in (np.float64(C.kth_largest(x, k)), mags[n - k]):
                assert got.tobytes() == want.tobytes() or (np.isnan(got) and np.isnan(want)), (n, k, got, want)


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("items", (2, 128))
def test_topk_segments_match_the_cpu_kernel(monkeypatch, dtype, items):
    """Segments of 0, 1, 5, ... values, heavy-tailed or full of ties (small integers, zeros of
    both signs), k from 0 to all of them, one segment holding a NaN and one an inf: the same
    positions (ties to the lower index) and NaN/inf flags as the CPU kernel; several
    stretches per segment with ``items=2``."""
    monkeypatch.setattr(_common, "SCAN_ITEMS", items)
    rng = np.random.default_rng(items)
    sizes = [0, 1, 5, 40, 100, 37, 64, 9, 12]
    parts = [(rng.integers(-3, 4, n) * (1.0 if i % 3 else -1.0) if i % 2 else rng.standard_t(2, n) * 10.0 ** rng.integers(-3, 3, n)) for i, n in enumerate(sizes)]
    x = np.concatenate(parts).astype(dtype)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    x[starts[7] + 3] = np.nan
    x[starts[8] + 11] = -np.inf
    ks = np.array([0, 1, 2, 7, 30, 37, 10, 4, 5], np.int64)
    room = np.concatenate([[0], np.cumsum(ks)]).astype(np.int64)
    want, want_bad = np.full(room[-1], -1, np.int64), np.zeros(len(sizes), np.int64)
    C.topk_segments(ro(x), starts, ks, room, want, want_bad)
    out, bad = cuda.to_device(np.full(room[-1], -1, np.int64)), cuda.to_device(np.zeros(len(sizes), np.int64))
    G.topk_segments(cuda.to_device(x), cuda.to_device(starts), cuda.to_device(ks), cuda.to_device(room), out, bad)
    assert np.array_equal(bad.copy_to_host(), want_bad) and want_bad.tolist() == [0] * 7 + [1, 1]
    assert np.array_equal(out.copy_to_host()[: room[7]], want[: room[7]])


def test_twin_defines_the_cpu_contract():
    assert sorted(G.__all__) == sorted(C.__all__) and all(callable(getattr(G, n)) for n in G.__all__)


def _run_segments(dtype):
    """Segments of 0 to 200 values, heavy-tailed or full of ties, one holding a NaN."""
    rng = np.random.default_rng(7)
    sizes = np.array([0, 1, 5, 40, 100, 37, 64, 200])
    x = np.concatenate([(rng.integers(-3, 4, n) if i % 2 else rng.standard_t(2, n)) for i, n in enumerate(sizes)]).astype(dtype)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    x[starts[6] + 4] = np.nan
    ks = np.array([max(1, n // 10) if n else 0 for n in sizes], np.int64)
    return x, starts, sizes, ks


def _both(call, room_size, nseg):
    """``call(kern, put, out, counts, bad)`` on the CPU kernel and the twin: their outputs."""
    res = []
    for kern, put in ((C, np.asarray), (G, cuda.to_device)):
        out, counts, bad = put(np.full(room_size, -1, np.int64)), put(np.zeros(nseg, np.int64)), put(np.zeros(nseg, np.int64))
        call(kern, put, out, counts, bad)
        res.append([a if isinstance(a, np.ndarray) else a.copy_to_host() for a in (out, counts, bad)])
    return res


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_gaussiank_and_dgc_segments_match_the_cpu_kernels(dtype):
    """Each segment's moments, threshold and clamped count (gaussian-k), or sampled threshold,
    adaptation and top-k fallback (DGC), exactly as the CPU kernel: the same counts, NaN
    flags and positions."""
    from codec.layout import LANES

    x, starts, sizes, ks = _run_segments(dtype)
    shifts = np.array([float(x[a:b].astype(np.float64).mean()) if b > a else 0.0 for a, b in zip(starts[:-1], starts[1:])])
    zs = np.full(sizes.size, 1.7)
    groom = np.concatenate([[0], np.cumsum(np.minimum(sizes, 4 * ks // 3))]).astype(np.int64)
    m = np.maximum(np.ceil(0.3 * sizes), 4).astype(np.int64)
    strides = np.where(sizes <= m, 1, sizes // np.maximum(m, 1))
    drawn = -(-sizes // strides)
    picks = np.minimum(np.maximum(1, np.ceil(0.1 * drawn)), drawn).astype(np.int64)
    droom = np.concatenate([[0], np.cumsum(np.minimum(sizes, np.floor(1.3 * ks).astype(np.int64) + 1))]).astype(np.int64)
    cases = [
        (groom, lambda k, p, out, c, b: k.gaussiank_segments(p(x), p(starts), p(shifts), p(zs), LANES, p(ks), p(groom), out, c, b)),
        (droom, lambda k, p, out, c, b: k.dgc_segments(p(x), p(starts), p(ks), p(strides), p(picks), 10, p(droom), out, c, b)),
    ]
    for room, call in cases:
        (want, wcount, wbad), (got, gcount, gbad) = _both(call, room[-1], sizes.size)
        assert np.array_equal(gcount, wcount) and np.array_equal(gbad, wbad) and wbad.tolist() == [0] * 6 + [1, 0]
        for s in range(sizes.size):
            assert np.array_equal(got[room[s] : room[s] + wcount[s]], want[room[s] : room[s] + wcount[s]]), s


# ---------------------------------------------------------------- through the codecs
SPECS = [
    "topk(ratio=0.05)", "topk(k=3)", "gaussiank(ratio=0.05)", "dgc(ratio=0.05)", "threshold(value=1.5)",
    "randomk(ratio=0.05)", "topk(ratio=0.1)+fp16", "dgc(ratio=0.05)+qsgd+zstd", "randomk(ratio=0.1,scale=true)+bf16",
]


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n,kind", [(300, "heavy"), (301, "ties")])  # (the edge sizes: test_cuda_conformance.py)
@pytest.mark.parametrize("spec", SPECS)
def test_sparse_frames_and_decodes_match_the_host(spec, n, kind, dtype):
    c = codec.get_codec(spec)
    x = data(n, dtype, kind=kind)
    frame = c.encode(cuda.to_device(x))
    assert bytes(frame) == bytes(c.encode(x))
    want = c.decode(frame)
    out = cuda.device_array(n, dtype)
    assert c.decode(frame, out=out) is out
    assert np.array_equal(out.copy_to_host(), want)
    like = codec.decode(frame, like=cuda.to_device(np.zeros(1, dtype)))
    assert np.array_equal(like.copy_to_host(), want)
    base = data(n, dtype, seed=4)
    acc = cuda.to_device(base)
    c.decode_add(frame, acc, subtract=True)
    assert np.array_equal(acc.copy_to_host(), c.decode_add(frame, base.copy(), subtract=True))


@pytest.mark.parametrize("spec", ["topk(ratio=0.2)", "dgc(ratio=0.2)", "threshold(value=1000)", "gaussiank(ratio=0.2,exact=true)"])
def test_several_chunks_and_overfull_rows_give_the_host_frame(monkeypatch, spec):
    """With chunks of 128 values (the host's chunking and the twin's together), 1,000 values
    make eight chunks; heavy tails leave some chunk with more finds than its row's room, which
    then runs again alone: the frame is still the host's (made with the library's chunks)."""
    from codec import layout

    x = data(1000, np.float32, kind="heavy")
    x[:128] = np.linspace(1e3, 2e3, 128)  # every value of the first chunk is a find: its row overflows
    want = bytes(codec.get_codec(spec).encode(x))
    monkeypatch.setattr(layout, "CHUNK", 128)
    monkeypatch.setattr(G, "CHUNK", 128)
    runs = []
    real = G.candidates
    monkeypatch.setattr(G, "candidates", lambda x, r, acc, cut, chunks, *a: runs.append(tuple(chunks)) or real(x, r, acc, cut, chunks, *a))
    assert bytes(codec.get_codec(spec).encode(cuda.to_device(x))) == want
    assert runs[0] == (0, 8)
    if spec.startswith(("topk", "threshold")):  # their rows' room is tight enough to overflow
        assert (0, 1) in runs


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("spec", ["topk(ratio=0.05)", "gaussiank(ratio=0.05)", "dgc(ratio=0.05)+fp16", "threshold(value=1.0)", "randomk(ratio=0.05)"])
def test_error_feedback_on_the_device_matches_the_host(spec, dtype):
    """acc = x + residual formed in the candidates pass on the device, the sent values taken
    off it there: frames and residuals step by step the host's, residual on the device."""
    on_dev, on_host = codec.ErrorFeedback(spec), codec.ErrorFeedback(spec)
    for step in range(3):
        x = data(400, dtype, seed=step)
        assert bytes(on_dev.encode(cuda.to_device(x), key="w")) == bytes(on_host.encode(x, key="w")), step
        r = on_dev.residual("w")
        assert not isinstance(r, np.ndarray)
        assert np.array_equal(r.copy_to_host(), on_host.residual("w")), step


def test_nonfinite_and_all_zero_inputs_behave_as_on_the_host():
    x = data(300, np.float32)
    x[123] = np.nan
    for spec in ("topk(ratio=0.05)", "gaussiank", "dgc", "threshold(value=1.0)", "randomk(ratio=1)"):
        with pytest.raises(NonFiniteError, match=r"position \(123,\)"):
            codec.get_codec(spec).encode(cuda.to_device(x))
    ef = codec.ErrorFeedback("topk(ratio=0.05)")
    ef.encode(cuda.to_device(data(300, np.float32)), key="k")
    before = ef.residual("k").copy_to_host()
    with pytest.raises(NonFiniteError):
        ef.encode(cuda.to_device(x), key="k")
    assert np.array_equal(ef.residual("k").copy_to_host(), before)  # a failed step keeps it
    z = np.zeros(300, np.float32)
    z[[5, 9]] = [2.0, -1.0]  # fewer non-zeros than k: the zeros with the lowest indices fill in
    for spec in ("topk(ratio=0.05)", "threshold(value=0)"):
        assert bytes(codec.get_codec(spec).encode(cuda.to_device(z))) == bytes(codec.get_codec(spec).encode(z)), spec


@pytest.mark.parametrize("spec", ["dgc(ratio=0.05)", "topk(ratio=0.05)+fp16", "randomk(ratio=0.1)"])
def test_momentum_on_the_device_matches_the_host(spec):
    """DGC's momentum correction with momentum-factor masking on the device: frames, residuals
    and velocities step by step the host's; the velocity saved as a host array, loaded back
    and moved to the next gradient's device."""
    on_dev, on_host = codec.ErrorFeedback(spec, momentum=0.9), codec.ErrorFeedback(spec, momentum=0.9)
    for step in range(3):
        x = data(400, np.float32, seed=step)
        assert bytes(on_dev.encode(cuda.to_device(x), key="w")) == bytes(on_host.encode(x, key="w")), step
        assert np.array_equal(on_dev.residual("w").copy_to_host(), on_host.residual("w")), step
    state = on_dev.state_dict()
    assert isinstance(state["slots"][0]["velocity"], np.ndarray)
    assert np.array_equal(state["slots"][0]["velocity"], on_host.state_dict()["slots"][0]["velocity"])
    again = codec.ErrorFeedback(spec, momentum=0.9)
    again.load_state_dict(state)
    x = data(400, np.float32, seed=7)
    assert bytes(again.encode(cuda.to_device(x), key="w")) == bytes(on_host.encode(x, key="w"))
    assert np.array_equal(again.state_dict()["slots"][0]["velocity"], on_host.state_dict()["slots"][0]["velocity"])
