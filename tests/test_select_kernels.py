"""The selection kernels (the ``select``, ``adacomp`` and ``randomk`` families, on every backend)
against plain NumPy, chunk by chunk.

The codecs built on them are checked against references of their semantics in
test_sparse.py; here each kernel's own contract is checked directly: rows and counts,
overfull rows, error-feedback formation, sums, non-finite counts, serial and parallel twins.
"""

import numpy as np
import pytest

from codec._jit import PARALLEL_MIN
from codec.dtypes import readonly as ro
from codec.kernels import module
from codec.layout import CHUNK, LANES
from codec.modes import ADD, SET, SUB
from codec.stages.select.magnitude import collect
from codec.stages.select.dgc import MIN_SAMPLE, RETRIES
from reference.sparse import topk
from support.threads import HOST_TWINS, host_twins

SIZES = [0, 1, 7, CHUNK - 1, CHUNK + 1, 3 * CHUNK + 17]
DTYPES = [np.float32, np.float64]


@pytest.fixture
def S(backend):
    """The ``select`` family's kernels on ``backend``."""
    return module("select", backend)


@pytest.fixture
def A(backend):
    """The ``adacomp`` family's kernels on ``backend``."""
    return module("adacomp", backend)


@pytest.fixture
def R(backend):
    """The ``randomk`` family's kernels on ``backend``."""
    return module("randomk", backend)


def data(kind, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(n)
    elif kind == "heavy":
        x = rng.standard_t(2, n) * 1e-3
    else:  # embedding-like: most rows exactly zero
        x = rng.standard_normal(n) * (rng.random(n) < 0.05)
    return x.astype(dtype)


def run_candidates(S, x, r, cut, cap, sums=False, shift=0.0):
    n = x.size
    nchunk = -(-n // CHUNK)
    acc = np.empty(n if r.size else 0, x.dtype)
    bad = np.zeros(nchunk, np.int64)
    sm = np.zeros((nchunk if sums else 0, 2))

    def run(chunks, buf, vals, counts):
        S.candidates(ro(x), ro(r), acc, x.dtype.type(cut), chunks, buf, vals, counts, bad, sm, shift, LANES)  # (inputs read-only, as the stages pass them)

    idx, vals = collect(run, nchunk, cap, x.dtype) if nchunk else (np.empty(0, np.int64), np.empty(0, x.dtype))
    return idx, vals, acc, bad, sm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", ["normal", "heavy", "embedding"])
@pytest.mark.parametrize("feedback", [False, True])
def test_candidates_match_numpy(S, kind, n, dtype, feedback):
    x = data(kind, n, dtype)
    r = data("heavy", n, dtype, seed=1) if feedback else np.empty(0, dtype)
    a = x + r if feedback else x
    cut = float(np.quantile(np.abs(a), 0.99)) if n else 1.0
    cut = cut or float(np.finfo(dtype).smallest_subnormal)
    for cap in (1, 64, max(1, n)):  # cap 1 and 64 make most rows overfull: the re-run path
        idx, vals, acc, bad, _ = run_candidates(S, x, r, cut, cap)
        want = np.flatnonzero(np.abs(a) >= dtype(cut))
        assert np.array_equal(idx, want)
        assert np.array_equal(vals, a[want])
        assert not bad.any()
        if feedback:
            assert np.array_equal(acc, a)  # formed in the same pass, rounded like NumPy's add


@pytest.mark.parametrize("dtype", DTYPES)
def test_candidates_sums_and_nonfinite(S, dtype):
    n = 2 * CHUNK + 5
    x = data("normal", n, dtype) + 1000
    idx, _, _, bad, sm = run_candidates(S, x, np.empty(0, dtype), np.inf, 8, sums=True, shift=1000.0)
    d = x.astype(np.float64) - 1000.0
    assert idx.size == 0
    np.testing.assert_allclose(sm.sum(0), [d.sum(), (d * d).sum()], rtol=1e-12, atol=1e-9)
    x[[3, CHUNK + 9, n - 1]] = [np.nan, np.inf, -np.inf]
    idx, _, _, bad, _ = run_candidates(S, x, np.empty(0, dtype), 0.5, 8)
    assert bad.tolist() == [1, 1, 1] and not np.isin([3, CHUNK + 9, n - 1], idx).any()


def ref_adacomp(dw, g, L):
    n = g.size
    pos, gmax = [], []
    for b in range(0, n, L):
        gb = np.abs(g[b : b + L])
        top = gb.max()
        gmax.append(top)
        h = np.abs(g[b : b + L] + dw[b : b + L])
        pos.extend((b + np.flatnonzero((g[b : b + L] != 0) & (h >= top))).tolist())
    return np.array(pos, np.int64), np.array(gmax, g.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 499, 501, 3 * CHUNK + 17])
@pytest.mark.parametrize("L", [1, 7, 50, 500, 5003])  # 5003: bins flagged in pieces (select._FLAGS)
@pytest.mark.parametrize("feedback", [False, True])
def test_adacomp_bins_match_numpy(A, n, L, dtype, feedback):
    dw = data("heavy", n, dtype)
    r = data("heavy", n, dtype, seed=5)
    g = (r + dw) if feedback else dw
    per_chunk = max(1, CHUNK // L)
    nbins = -(-n // L)
    nchunk = -(-nbins // per_chunk)
    gmax = np.empty(nbins, dtype)
    bad = np.zeros(nchunk, np.int64)
    out = np.empty(n, dtype)

    def run(chunks, buf, vals, counts):
        if feedback and chunks[1] - chunks[0] == nchunk:
            A.feedback_adacomp_bins(ro(dw), ro(r), out, L, per_chunk, chunks, buf, vals, counts, bad, gmax)
        else:
            A.adacomp_bins(ro(dw), ro(out if feedback else g), L, per_chunk, chunks, buf, vals, counts, bad, gmax)

    idx, vals = collect(run, nchunk, 3, dtype)  # cap 3: overfull rows re-run on the formed G
    want, want_gmax = ref_adacomp(dw, g, L)
    assert np.array_equal(idx, want)
    assert vals.dtype == g.dtype and np.array_equal(vals, g[want])  # each send's g, recorded as found
    assert np.array_equal(gmax, want_gmax)
    if feedback:
        assert np.array_equal(out, g)
    assert not bad.any()


def random_positions(R, out, n, seed=12345):
    u64 = np.uint64
    R.random_positions(out, u64(seed), u64(99), u64(3), u64((max(2, (n - 1).bit_length()) + 1) // 2), n)


def ref_kth_largest(sample, k):
    """The ``k``-th largest of ``|sample|`` as NumPy's partition finds it (a NaN the largest)."""
    mags = np.abs(np.asarray(sample, np.float64))
    return mags[np.argsort(mags, kind="stable")[mags.size - k]]


def kth_cases(dtype):
    """Samples a cut is taken from: random, heavy-tailed, ties, zeros of both signs, values
    below float32's normal range (or float64's), two values, NaN and inf; sizes around the
    radix select's sort threshold (64) and a few thousand."""
    rng = np.random.default_rng(7)
    for n in (1, 2, 63, 64, 65, 1001, 5003):
        yield data("normal", n, dtype)
        yield data("heavy", n, dtype)
        t = rng.integers(-3, 4, n).astype(dtype)
        yield t
        yield np.where(rng.random(n) < 0.5, dtype(0.0), dtype(-0.0))
        yield data("normal", n, dtype) * dtype(1e-40 if dtype == np.float32 else 1e-310)
        yield np.where(rng.random(n) < 0.5, dtype(1.0), dtype(2.0))
        x = data("heavy", n, dtype, seed=1)
        x[:: max(1, n // 5)] = np.nan
        x[1 :: max(2, n // 3)] = -np.inf
        yield x


@pytest.mark.parametrize("dtype", DTYPES)
def test_kth_largest_matches_numpy(S, dtype):
    """The cut of a sample: the k-th largest magnitude, bit for bit NumPy's (k from 1 to all)."""
    for x in kth_cases(dtype):
        for k in sorted({1, 2, max(1, x.size // 100), max(1, x.size // 2), x.size}):
            if k <= x.size:
                got, want = np.float64(S.kth_largest(x, k)), ref_kth_largest(x, k)
                assert got.tobytes() == want.tobytes() or (np.isnan(got) and np.isnan(want)), (x.size, k, got, want)


def test_random_positions_are_a_permutation_prefix(R):
    for n in (2, 3, 5, 17, 1000, 4097):
        out = np.empty(n, np.int64)
        random_positions(R, out, n)
        assert sorted(out.tolist()) == list(range(n))  # all k = n images: a permutation of [0, n)
        part = np.empty(n // 2, np.int64)
        random_positions(R, part, n)
        assert np.array_equal(part, out[: n // 2])  # each j maps independently of k


def test_serial_and_parallel_twins_agree():
    S = module("select", "cpu")  # the serial and parallel twins are the CPU jit wrapper's
    n = PARALLEL_MIN + 12_345
    x = data("heavy", n, np.float32)
    r = data("heavy", n, np.float32, seed=1)
    cut = np.float32(np.quantile(np.abs(x + r), 0.99))
    nchunk = -(-n // CHUNK)
    runs = []
    for twin in ("serial", "parallel"):
        buf = np.zeros((nchunk, 4096), np.int64)
        vals = np.zeros((nchunk, 4096), np.float32)
        counts, bad = np.zeros(nchunk, np.int64), np.zeros(nchunk, np.int64)
        sums = np.zeros((nchunk, 2))
        acc = np.empty(n, np.float32)
        getattr(S.candidates, twin)(ro(x), ro(r), acc, cut, np.array([0, nchunk]), buf, vals, counts, bad, sums, 0.0, LANES)
        pos = np.empty(5000, np.int64)
        u64 = np.uint64
        getattr(module("randomk", "cpu").random_positions, twin)(pos, u64(7), u64(1), u64(2), u64(((n - 1).bit_length() + 1) // 2), n)
        runs.append((buf.tobytes(), vals.tobytes(), counts.tobytes(), sums.tobytes(), acc.tobytes(), pos.tobytes()))
    assert runs[0] == runs[1]


def run_topk_segments(S, parts, ks, twin=None):
    sizes = [p.size for p in parts]
    starts = np.zeros(len(parts) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    flat = np.concatenate(parts) if parts else np.empty(0, np.float32)
    ks = np.array(ks, np.int64)
    out_starts = np.zeros(ks.size + 1, np.int64)
    np.cumsum(ks, out=out_starts[1:])
    out = np.full(int(out_starts[-1]), -1, np.int64)
    bad = np.zeros(ks.size, np.int64)  # as the codec passes it (segment_room)
    fn = S.topk_segments if twin is None else getattr(S.topk_segments, twin)
    fn(ro(flat), starts, ks, out_starts, out, bad)  # (the values read-only, as every stage passes them)
    return [out[out_starts[i] : out_starts[i + 1]] for i in range(ks.size)], bad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["normal", "heavy", "embedding"])
def test_topk_segments_match_numpy(S, kind, dtype):
    sizes = [0, 1, 2, 7, 100, 999, 1000, CHUNK + 3, 20_000]  # (from 16,384 elements the cut's sample is larger: LARGE_SEGMENT)
    parts = [data(kind, n, dtype, seed=i) for i, n in enumerate(sizes)]
    parts.append(np.zeros(50, dtype))  # all ties: the lowest indices
    parts.append(np.repeat(np.array([1.0, -1.0, 0.5], dtype), 40))  # ties of equal magnitude and sign
    ks = [min(n, k) for n, k in zip([p.size for p in parts], [0, 1, 1, 3, 10, 500, 1000, 17, 200, 7, 50])]
    got, bad = run_topk_segments(S, parts, ks)
    assert not bad.any()
    for p, k, g in zip(parts, ks, got):
        assert np.array_equal(g, topk(p, k)[0]), (p.size, k)
    with np.errstate(invalid="ignore"):
        nan = data(kind, 20, dtype)
        nan[7] = np.nan
        inf = data(kind, 20, dtype)
        inf[3] = -np.inf
    _, bad = run_topk_segments(S, [parts[3], nan, inf, parts[4]], [2, 2, 2, 2])
    assert bad.tolist() == [0, 1, 1, 0]
    _, bad = run_topk_segments(S, [nan, inf, nan, parts[4]], [0, 20, 19, 100])  # k = 0, k = n, the sample's own rank
    assert bad.tolist() == [1, 1, 1, 0]


def test_topk_segments_twins_agree():
    S = module("select", "cpu")
    parts = [data("heavy", n, np.float32, seed=n) for n in range(1, 400, 7)]
    ks = [max(1, p.size // 10) for p in parts]
    assert all(np.array_equal(a, b) for a, b in zip(run_topk_segments(S, parts, ks, "serial")[0], run_topk_segments(S, parts, ks, "parallel")[0]))


def run_dgc_segments(S, parts, ratio, sample):
    """dgc_segments with the per-segment numbers dgc.select_segments gives it."""
    import math

    sizes = np.array([p.size for p in parts], np.int64)
    starts = np.zeros(sizes.size + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    flat = np.concatenate(parts) if parts else np.empty(0, np.float32)
    ks = np.array([0 if n == 0 else min(n, max(1, math.floor(ratio * n))) for n in sizes.tolist()], np.int64)
    m = [max(math.ceil(sample * n), MIN_SAMPLE) for n in sizes.tolist()]
    strides = np.array([1 if n <= mm else n // mm for n, mm in zip(sizes.tolist(), m)], np.int64)
    drawn = -(-sizes // strides)
    picks = np.array([min(max(1, math.ceil(ratio * d)), d) for d in drawn.tolist()], np.int64)
    caps = np.minimum(sizes, np.floor(1.3 * ks).astype(np.int64) + 1)
    room = np.zeros(sizes.size + 1, np.int64)
    np.cumsum(caps, out=room[1:])
    out = np.full(int(room[-1]), -1, np.int64)
    counts = np.full(sizes.size, -1, np.int64)
    bad = np.zeros(sizes.size, np.int64)
    S.dgc_segments(flat, starts, ks, strides, picks, RETRIES, room, out, counts, bad)
    return [out[room[i] : room[i] + counts[i]] for i in range(sizes.size)], bad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["normal", "heavy", "embedding"])
@pytest.mark.parametrize("ratio, sample", [(0.01, 0.01), (0.1, 0.01), (0.3, 0.5), (0.001, 1.0)])
def test_dgc_segments_match_numpy(S, kind, dtype, ratio, sample):
    """Each segment exactly as the reference DGC selects in it alone: the sampled threshold,
    its x0.8 retries, the top-k above 1.3k, ties and all-zero segments included."""
    from reference.sparse import dgc

    sizes = [0, 1, 2, 7, 100, 999, 4097, 9000, CHUNK + 3]
    parts = [data(kind, n, dtype, seed=i) for i, n in enumerate(sizes)]
    parts.append(np.zeros(50, dtype))
    parts.append(np.repeat(np.array([1.0, -1.0, 0.5], dtype), 40))
    got, bad = run_dgc_segments(S, parts, ratio, sample)
    assert not bad.any()
    for p, g in zip(parts, got):
        assert np.array_equal(g, dgc(p, ratio, sample)[0]), (p.size, ratio)
    with np.errstate(invalid="ignore"):
        nan = data(kind, 20, dtype)
        nan[7] = np.nan
    _, bad = run_dgc_segments(S, [parts[3], nan, parts[4]], ratio, sample)
    assert bad.tolist() == [0, 1, 0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_order_statistic_narrowed_or_not(dtype):
    """``_largest`` (the cut of DGC's sample and of top-k's): the value np.partition gives,
    whether a large sample is narrowed to the values reaching a sub-sample's cut (rank from
    ``_NARROW_RANK``, sample from ``_NARROW_MIN``), or that cut misleads (the largest values
    exactly at the sub-sample's positions: too few reach it) and the whole sample is used."""
    from codec.kernels.cpu import _cut as select

    rng = np.random.default_rng(5)
    for m, stride in [(2047, 1), (2048, 1), (5000, 1), (3000, 3), (20_000, 2)]:
        n = m * stride
        heavy = (rng.standard_t(2, n) * rng.standard_t(3, n)).astype(dtype)
        misled = rng.random(n).astype(dtype)
        misled[:: stride * max(1, m // 512)] += 100  # the sub-sample's positions hold the largest
        ties = np.repeat(np.array([0.5, -0.5, 0.25], dtype), -(-n // 3))[:n]
        for x in (heavy, misled, ties):
            mags = np.abs(x[::stride].astype(np.float64))
            for c in sorted({1, select._NARROW_RANK - 1, select._NARROW_RANK, 60, 65, m // 16, m // 16 + 1, m}):
                want = np.partition(mags, m - c)[m - c]
                assert select._largest(x, 0, stride, m, c) == want, (m, stride, c)


def test_random_positions_segments_match_numpy(R):
    """Each segment draws its own positions from its own (seed, key, step), exactly as the
    reference draws them for that tensor alone, sorted (sizes 1, 2, odd, a power of two,
    large; k from 0 to n; drawn with and without the tabulated rounds, sorted through a bitmap
    and by Numba's sort): the draw's chunks of the output cross segments (a segment of more
    than a chunk, and one across a chunk's end)."""
    from codec.layout import feistel_half
    from reference.sparse import key_hash, randomk_positions

    cases = [(1, 1), (2, 1), (2, 2), (7, 3), (64, 64), (1000, 10), (100_000, 3), (4097, 500), (CHUNK + 3, 700), (5, 0), (9, 9), (3 * CHUNK + 5, CHUNK + 7), (1, 1), (300, 299)]
    keys = ["a", 3, None, "w.bias", 0, "x", "sparse", "y", 17, "z", "q", "big", "one", "last"]
    steps = [0, 1, 5, 2**40, 7, 0, 12, 3, 9, 1, 2, 4, 6, 8]
    sizes = np.array([n for n, _ in cases], np.int64)
    kstarts = np.concatenate([[0], np.cumsum([k for _, k in cases])]).astype(np.int64)
    out = np.full(int(kstarts[-1]), -1, np.int64)
    u64 = np.uint64
    R.random_positions_segments(out, kstarts, sizes, np.full(len(cases), 11, u64), np.array([key_hash(k) for k in keys], u64), np.array(steps, u64))
    for t, ((n, k), key, step) in enumerate(zip(cases, keys, steps)):
        got = out[kstarts[t] : kstarts[t + 1]]
        assert np.array_equal(got, randomk_positions(n, k, 11, key, step)), (n, k)


@pytest.mark.parametrize("mode", [SET, ADD, SUB])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=str)
def test_random_scatter_segments_match_numpy(R, dtype, mode, monkeypatch):
    """``random_scatter_segments`` writes each tensor's kept values at the positions the
    reference draws for it, into its own array, the rest zeroed with SET and kept with
    ADD/SUB, in both compilations with SET's zeroing by the kernel or in streamed spans on
    ``threads.each`` (``support.threads.HOST_TWINS``): sizes 0, 1, 2 and odd, k from 0 to
    n, a tensor of more pairs than a chunk and one across a chunk's end."""
    from reference.sparse import key_hash, randomk_positions

    cases = [(1, 1), (2, 1), (7, 3), (5, 0), (0, 0), (40_000, 20_000), (1000, 10), (3, 3), (20_000, 13_000)]
    keys, steps = ["a", None, 3, "b", "c", "big", 0, "d", "e"], [0, 1, 2**40, 3, 4, 5, 6, 7, 8]
    sizes = np.array([n for n, _ in cases], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    kstarts = np.concatenate([[0], np.cumsum([k for _, k in cases])]).astype(np.int64)
    rng = np.random.default_rng(mode)
    values = rng.standard_normal(int(kstarts[-1])).astype(dtype)
    base = [rng.standard_normal(n).astype(dtype) for n in sizes]
    want = [b.copy() for b in base]
    for t, ((n, k), key, step) in enumerate(zip(cases, keys, steps)):
        pos, kept = randomk_positions(n, k, 11, key, step), values[kstarts[t] : kstarts[t + 1]]
        if mode == SET:
            want[t][:] = 0
            want[t][pos] = kept
        else:
            want[t][pos] += kept if mode == ADD else -kept
    u64 = np.uint64
    args = (kstarts, sizes, np.full(len(cases), 11, u64), np.array([key_hash(k) for k in keys], u64), np.array(steps, u64))
    for twin in HOST_TWINS:
        host_twins(monkeypatch, twin)
        outs = [b.copy() for b in base]
        addrs = np.array([o.__array_interface__["data"][0] for o in outs], np.int64)
        R.random_scatter_segments(values, *args, addrs, starts, outs[0], mode)
        assert [o.tobytes() for o in outs] == [w.tobytes() for w in want], twin


def ref_gaussiank_segment(x, ratio):
    """Gaussian-k of one small tensor as the stage computes it: NumPy's mean as the shift,
    the lane sums of ``v - shift`` and their squares (docs/codecs.md, "Sums"), ``t = |mean| +
    z * std``, the clamped count of ``|v| > t``, then the reference top-k."""
    import math
    from statistics import NormalDist

    from reference.quant import lanes_sum
    from reference.sparse import gaussiank_bounds, topk

    w = np.asarray(x, np.float64)
    n = w.size
    if n == 0:
        return np.empty(0, np.int64)
    k = min(n, max(1, math.floor(ratio * n)))
    shift = float(w.mean())
    d = w - shift
    s, q = lanes_sum(d) / n, lanes_sum(d * d) / n
    t = abs(shift + s) + NormalDist().inv_cdf(1 - ratio / 2) * math.sqrt(max(0.0, q - s * s))
    lo, hi = gaussiank_bounds(k)
    return topk(x, min(max(int(np.count_nonzero(np.abs(w) > t)), lo), hi, n))[0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["normal", "heavy", "embedding"])
@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.4])
def test_gaussiank_segments_match_numpy(S, kind, dtype, ratio):
    import math
    from statistics import NormalDist

    sizes = [0, 1, 2, 7, 100, 999, 4097, CHUNK]
    parts = [data(kind, n, dtype, seed=i) for i, n in enumerate(sizes)]
    parts.append(np.zeros(50, dtype))
    parts.append((np.repeat(np.array([1.0, -1.0, 0.5], dtype), 40) + dtype(3)).astype(dtype))  # |mean| >> std
    sizes = np.array([p.size for p in parts], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = np.concatenate(parts)
    ks = np.array([0 if n == 0 else min(n, max(1, math.floor(ratio * n))) for n in sizes.tolist()], np.int64)
    shifts = np.array([float(p.astype(np.float64).mean()) if p.size else 0.0 for p in parts])
    zs = np.full(sizes.size, NormalDist().inv_cdf(1 - ratio / 2))
    caps = np.minimum(sizes, 4 * ks // 3)
    room = np.concatenate([[0], np.cumsum(caps)]).astype(np.int64)
    out = np.full(int(room[-1]), -1, np.int64)
    counts, bad = np.full(sizes.size, -1, np.int64), np.zeros(sizes.size, np.int64)
    S.gaussiank_segments(flat, starts, shifts, zs, LANES, ks, room, out, counts, bad)
    assert not bad.any()
    for t, p in enumerate(parts):
        assert np.array_equal(out[room[t] : room[t] + counts[t]], ref_gaussiank_segment(p, ratio)), (p.size, ratio)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bin_sums_add_as_numpy(A, dtype):
    """Each tensor's maxima added as ``np.sum(..., dtype=np.float64)`` adds them, bit for bit:
    sizes 0, 1, 7, a leaf (128), one over it, NumPy's buffer and around it, several buffers;
    heavy-tailed values over many magnitudes (so the order shows)."""
    rng = np.random.default_rng(4)
    sizes = [0, 1, 7, 8, 128, 129, 1000, 8191, 8192, 8193, 3 * 8192 + 77]
    x = np.abs(rng.standard_t(1, sum(sizes)) * 10.0 ** rng.integers(-8, 8, sum(sizes))).astype(dtype)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    out = np.full(len(sizes), np.nan)
    A.bin_sums(x, starts, out)
    want = [np.sum(x[a:b], dtype=np.float64) for a, b in zip(starts[:-1], starts[1:])]
    assert out.tobytes() == np.array(want).tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["normal", "heavy", "embedding"])
def test_adacomp_segments_match_numpy(A, kind, dtype):
    """Each segment's sends (its own bin length), values and bin maxima exactly as the
    reference AdaComp gives them for that tensor alone, without and with a residual."""
    from reference.sparse import adacomp

    sizes = [0, 1, 7, 50, 501, 999, 4097, CHUNK]
    lengths = [50, 500, 3, 50, 500, 7, 50, 500]
    parts = [data(kind, n, dtype, seed=i) for i, n in enumerate(sizes)]
    parts.append(np.zeros(60, dtype))
    lengths.append(50)
    parts.append(np.repeat(np.array([1.0, -1.0, 0.5], dtype), 40))
    lengths.append(500)
    sizes = np.array([p.size for p in parts], np.int64)
    lengths = np.array(lengths, np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    bstarts = np.concatenate([[0], np.cumsum(-(-sizes // lengths))]).astype(np.int64)
    flat = np.concatenate(parts)
    pos, vals = np.full(flat.size, -1, np.int64), np.zeros(flat.size, dtype)
    counts, bad = np.full(sizes.size, -1, np.int64), np.full(sizes.size, -1, np.int64)
    residuals = [data(kind, p.size, dtype, seed=50 + i) for i, p in enumerate(parts)]
    for feedback in (False, True):  # g = dw alone, and g = r + dw (error feedback's acc) beside its dw
        g = np.concatenate([np.add(r, p, dtype=dtype) for r, p in zip(residuals, parts)]) if feedback else flat
        gmax = np.full(int(bstarts[-1]), np.nan, dtype)
        A.adacomp_segments(ro(flat), ro(g), starts, lengths, bstarts, pos, vals, counts, bad, gmax)
        assert not bad.any()
        for t, p in enumerate(parts):
            want, _, _ = adacomp(p, residuals[t] if feedback else None, int(lengths[t]), value="none")
            got = pos[starts[t] : starts[t] + counts[t]]
            gt = g[starts[t] : starts[t + 1]]
            assert np.array_equal(got, want), (feedback, p.size, int(lengths[t]))
            assert np.array_equal(vals[starts[t] : starts[t] + counts[t]], gt[got])
            if p.size:
                want_max = np.abs(np.concatenate([gt, np.zeros(-p.size % lengths[t], dtype)])).reshape(-1, lengths[t]).max(1)
                assert np.array_equal(gmax[bstarts[t] : bstarts[t + 1]], want_max)
    nan = data(kind, 20, dtype)
    nan[5] = np.nan
    counts[:] = bad[:] = 0
    both = np.concatenate([parts[3], nan])
    A.adacomp_segments(ro(both), ro(both), np.array([0, 50, 70], np.int64), np.array([50, 50], np.int64), np.array([0, 1, 2], np.int64), pos, vals, counts, bad, gmax)
    assert bad[0] == 0 and bad[1] == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # the largest value's neighbour and multiples, on purpose
def test_thresholds_in_the_data_dtype_count_as_float64(dtype):
    """gaussiank_segments and dgc_segments compare magnitudes in the data's dtype: ``v > t``
    (float64 ``t``) exactly when ``v > _below(t)``, and ``v >= t`` exactly when ``v >=
    _above(t)``, for every value of the dtype: values exactly on, next to and between
    thresholds, subnormal, huge and beyond the dtype's range."""
    from codec.kernels.cpu import select

    rng = np.random.default_rng(3)
    vals = np.abs(data("heavy", 2000, dtype, seed=4))
    vals = np.concatenate([vals, [0.0, np.finfo(dtype).tiny, np.finfo(dtype).smallest_subnormal, np.finfo(dtype).max]]).astype(dtype)
    near = np.concatenate([np.nextafter(vals, dtype(np.inf)), np.nextafter(vals, dtype(0))]).astype(dtype)
    v = np.concatenate([vals, near])
    ts = list(vals.astype(np.float64)) + list(vals.astype(np.float64) * (1 + 2.0**-30)) + list(vals.astype(np.float64) * (1 - 2.0**-40))
    ts += [0.0, 1e-300, 1e300, float(rng.random()) * 1e-3, 3.4e38 * 1.5]
    for t in ts:
        b, a = select._below(v, t), select._above(v, t)
        assert float(dtype(b)) == b and (float(dtype(a)) == a or a == np.inf), (t, b, a)  # values of the dtype
        b, a = dtype(b), dtype(a)
        assert np.array_equal(v.astype(np.float64) > t, v > b), (t, b)
        assert np.array_equal(v.astype(np.float64) >= t, v >= a), (t, a)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [16, 17, 1000, 3 * CHUNK + 17])
def test_line_sample_matches_numpy(S, n, dtype):
    """line_sample: run q is |x + r| (summed in x's dtype; |x| for an empty r) of the line
    starting at q * step, in float64."""
    x, r = data("heavy", n, dtype, seed=1), data("normal", n, dtype, seed=2)
    for line in (1, 16):
        runs = max(1, n // (line * 4))
        step = n // runs
        want = np.abs(np.add(x[: runs * step].reshape(runs, step)[:, :line], r[: runs * step].reshape(runs, step)[:, :line]).astype(np.float64))
        out = np.full((runs, line), np.nan)
        S.line_sample(x, r, step, out)
        assert np.array_equal(out, want)
        S.line_sample(x, r[:0], step, out)
        assert np.array_equal(out, np.abs(x[: runs * step].reshape(runs, step)[:, :line].astype(np.float64)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 17, 1000, 3 * CHUNK + 17])
def test_strided_sample_matches_numpy(S, n, dtype):
    """strided_sample: ``(x + r)[::stride]`` summed in x's dtype (``x[::stride]`` for an empty
    r), signed, in float64: what DGC's threshold and gaussian-k's shift are taken from."""
    x, r = data("heavy", n, dtype, seed=3), data("normal", n, dtype, seed=4)
    for stride in (1, 2, 7, max(1, n // 3)):
        m = -(-n // stride)
        out = np.full(m, np.nan)
        S.strided_sample(x, r, stride, out)
        assert np.array_equal(out, np.add(x[::stride], r[::stride]).astype(np.float64))
        S.strided_sample(x, r[:0], stride, out)
        assert np.array_equal(out, x[::stride].astype(np.float64))
