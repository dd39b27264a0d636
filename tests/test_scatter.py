"""codec.ops.scatter and codec.ops.store against NumPy references, every mode and dtype, and the
``scatter`` kernel family itself on every kernel backend (the ``backend`` fixture).

The contract: ``out (=|+=|-=) src`` is the exact result correctly rounded (nearest, ties to
even) to ``out``'s dtype.  The NumPy reference computes in float64 and is exact except where
the float64 sum itself was rounded onto a rounding boundary of the output format; those few
entries are recomputed with exact rational arithmetic.
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from codec import ops
from codec.kernels import module
from codec.modes import ADD, SET, SUB
from support.threads import HOST_TWINS, host_twins

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf/NaN test data

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
DTYPES = (F16, BF16, F32, F64)
WIDE = (F32, F64)
MODES = (SET, ADD, SUB)
CHUNK = 1 << 14  # indices per parallel chunk of the scatter kernel


def as64(x):
    return np.asarray(x).astype(np.float64)


def round_to(x64, dtype, ref16):
    """float64 values correctly rounded to ``dtype`` (float64 -> float32 by NumPy is correctly rounded)."""
    dtype = np.dtype(dtype)
    if dtype == F64:
        return x64.copy()
    if dtype == F32:
        return x64.astype(np.float32)
    return ref16(x64, dtype).view(dtype)


def combine_ref(a, b, mode, dtype, ref16, exact_round):
    """``a (=|+=|-=) b`` (any float arrays, same size) correctly rounded to ``dtype``."""
    a64, b64 = as64(a), as64(b)
    if mode == SET:
        return round_to(b64, dtype, ref16)
    if mode == SUB:
        b64 = -b64
    s = a64 + b64
    want = round_to(s, dtype, ref16)
    if np.dtype(dtype) != F64:
        # where the float64 sum was inexact and sits on a boundary of the target format, round exactly
        bb = s - a64
        err = (a64 - (s - bb)) + (b64 - bb)
        lo = round_to(np.nextafter(s, -np.inf), dtype, ref16)
        hi = round_to(np.nextafter(s, np.inf), dtype, ref16)
        u = {2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
        risky = np.flatnonzero(np.isfinite(s) & (err != 0) & (lo.view(u) != hi.view(u)))
        for i in risky:
            want[i] = exact_round(Fraction(float(a64[i])) + Fraction(float(b64[i])), dtype)
    return want


def assert_same(got, want):
    """Bit-identical (signed zeros too); any NaN matches any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    gn, wn = np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64))
    np.testing.assert_array_equal(gn, wn)
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    bad = np.flatnonzero((got.view(u) != want.view(u)) & ~wn)
    assert not bad.size, f"{bad.size} differ; first at {bad[0]}: got {got[bad[0]]!r}, want {want[bad[0]]!r}"


def data(rng, n, dtype, special=True):
    """Heavy-tailed values in ``dtype`` with some zeros, and (optionally) a few inf/NaN."""
    x = rng.standard_t(2, n) * 2.0 ** rng.integers(-24, 12, n)
    x[rng.random(n) < 0.02] = 0.0
    if special and n >= 50:
        x[rng.choice(n, 3, replace=False)] = [np.inf, -np.inf, np.nan]
    return x.astype(dtype)


# ---------------------------------------------------------------- store
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("src_dtype", DTYPES, ids=str)
def test_store_random(src_dtype, out_dtype, mode, ref16, exact_round):
    rng = np.random.default_rng(mode * 16 + DTYPES.index(src_dtype) * 4 + DTYPES.index(out_dtype))
    for n in (0, 1, 7, 65536 + 3):
        src, out = data(rng, n, src_dtype), data(rng, n, out_dtype)
        want = combine_ref(out, src, mode, out_dtype, ref16, exact_round)
        got = out.copy()
        ops.store(src, got, mode)
        assert_same(got, want)


@pytest.mark.parametrize("mode", (ADD, SUB))
@pytest.mark.parametrize("out_dtype", (F16, BF16, F32), ids=str)
@pytest.mark.parametrize("src_dtype", (F32, F64), ids=str)
def test_store_has_no_double_rounding(src_dtype, out_dtype, mode, ref16, exact_round):
    """Sums a hair off a tie of the output format: rounding the sum to float32 or float64
    first would land exactly on the tie and then round to even, the wrong way."""
    rng = np.random.default_rng(5)
    n = 4000
    bits = {F16: 11, BF16: 8, F32: 24}[out_dtype]
    a = (1.0 + rng.integers(0, 1 << (bits - 1), n) * 2.0 ** (1 - bits)) * 2.0 ** rng.integers(-3, 4, n)
    a = round_to(a, out_dtype, ref16)
    a64 = as64(a)
    _, e = np.frexp(a64)
    half_ulp = np.ldexp(1.0, e - bits - 1)  # half an ulp of the output format at a
    tiny = half_ulp * 2.0 ** -rng.integers(14, 40, n) * rng.choice([-1.0, 1.0], n)
    b = half_ulp + tiny if mode == ADD else -(half_ulp + tiny)
    b = b.astype(src_dtype)
    want = combine_ref(a, b, mode, out_dtype, ref16, exact_round)
    exact = np.array([exact_round(Fraction(float(x)) + (1 if mode == ADD else -1) * Fraction(float(y)), out_dtype) for x, y in zip(a64, as64(b))])
    assert_same(want, exact.astype(out_dtype) if out_dtype in WIDE else round_to(exact, out_dtype, ref16))
    got = a.copy()
    ops.store(b, got, mode)
    assert_same(got, want)


@pytest.mark.parametrize("out_dtype", (F16, BF16, F32), ids=str)
def test_store_set_from_float64_is_correctly_rounded(out_dtype, ref16):
    rng = np.random.default_rng(6)
    bits = {F16: 11, BF16: 8, F32: 24}[out_dtype]
    mid = (1.0 + (2 * rng.integers(0, 1 << (bits - 1), 3000) + 1) * 2.0**-bits) * 2.0 ** rng.integers(-5, 5, 3000)
    src = np.concatenate([mid * (1 + 2.0**-40), mid * (1 - 2.0**-40), mid])
    got = np.zeros(src.size, out_dtype)
    ops.store(src, got, SET)
    assert_same(got, round_to(src, out_dtype, ref16))


def test_store_rejects_mismatched_sizes():
    with pytest.raises(ValueError):
        ops.store(np.zeros(5, np.float32), np.zeros(4, np.float32), ADD)
    with pytest.raises(ValueError):
        ops.store(np.zeros(5, np.float32), np.zeros(6, np.float16), SET)


# ---------------------------------------------------------------- scatter
def scatter_ref(values, idx, out, mode, ref16, exact_round):
    want = np.zeros_like(out) if mode == SET else out.copy()
    want[idx] = combine_ref(out[idx], values, mode, out.dtype, ref16, exact_round)
    return want


SCATTER_SIZES = ((0, 0), (0, 10), (1, 1), (1, 100), (7, 30), (CHUNK - 1, 3 * CHUNK), (CHUNK, CHUNK), (CHUNK + 1, 5 * CHUNK), (3 * CHUNK + 7, 4 * CHUNK))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out_dtype", WIDE, ids=str)
@pytest.mark.parametrize("val_dtype", WIDE, ids=str)
def test_scatter_random(val_dtype, out_dtype, mode, ref16, exact_round):
    rng = np.random.default_rng(mode)
    for k, n in SCATTER_SIZES:
        idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
        values = data(rng, k, val_dtype)
        out = data(rng, n, out_dtype)
        want = scatter_ref(values, idx, out, mode, ref16, exact_round)
        got = out.copy()
        ops.scatter(values, idx, got, mode)
        assert_same(got, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out_dtype", (F16, BF16), ids=str)
def test_scatter_into_16_bit_outputs(out_dtype, mode, ref16, exact_round):
    rng = np.random.default_rng(11)
    for k, n in SCATTER_SIZES[:6]:
        idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
        for val_dtype in DTYPES:
            values = data(rng, k, val_dtype)
            out = data(rng, n, out_dtype)
            got = out.copy()
            ops.scatter(values, idx, got, mode)
            assert_same(got, scatter_ref(values, idx, out, mode, ref16, exact_round))


def test_scatter_unsorted_unique_and_index_dtypes(ref16, exact_round):
    rng = np.random.default_rng(12)
    n = 3 * CHUNK
    idx = rng.permutation(n)[: 2 * CHUNK + 5]
    values = data(rng, idx.size, np.float32)
    out = data(rng, n, np.float32)
    for mode in MODES:
        want = scatter_ref(values, idx, out, mode, ref16, exact_round)
        for it in (np.int64, np.int32, np.uint32, np.uint64):
            got = out.copy()
            ops.scatter(values, idx.astype(it), got, mode)
            assert_same(got, want)


def test_scatter_empty_index_set():
    out = np.arange(10, dtype=np.float32)
    ops.scatter(np.zeros(0, np.float32), np.zeros(0, np.int64), out, ADD)
    np.testing.assert_array_equal(out, np.arange(10))
    ops.scatter(np.zeros(0, np.float32), np.zeros(0, np.int64), out, SET)
    np.testing.assert_array_equal(out, np.zeros(10))
    ops.scatter(np.zeros(0, np.float64), np.zeros(0, np.int64), np.zeros(0, np.float64), SUB)


def test_scatter_rejects_bad_input():
    out = np.zeros(10, np.float32)
    with pytest.raises(IndexError):
        ops.scatter(np.ones(1, np.float32), np.array([10]), out, SET)
    with pytest.raises(IndexError):
        ops.scatter(np.ones(1, np.float32), np.array([-1]), out, ADD)
    with pytest.raises(ValueError):
        ops.scatter(np.ones(2, np.float32), np.array([1]), out, ADD)
    with pytest.raises(TypeError):
        ops.scatter(np.ones(1, np.float32), np.array([1.0]), out, ADD)


# ---------------------------------------------------------------- the scatter family, per backend
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", WIDE, ids=str)
def test_scatter_family_across_chunks(backend, dtype, mode, monkeypatch):
    """``out[idx] (=|+=|-=) values`` for unique ``idx`` in ``out``'s own dtype (one rounding,
    as NumPy's); SET zeroes the rest.  More than two parallel chunks of indices; on the CPU
    in both compilations, SET's zeroing by the kernel or in streamed spans on ``threads.each``
    (``support.threads.HOST_TWINS``)."""
    rng = np.random.default_rng(mode)
    n = 8 * CHUNK
    idx = np.sort(rng.choice(n, 2 * CHUNK + 5, replace=False)).astype(np.int64)
    values = rng.standard_normal(idx.size).astype(dtype)
    base = rng.standard_normal(n).astype(dtype)
    want = np.zeros(n, dtype) if mode == SET else base.copy()
    if mode == SUB:
        want[idx] -= values
    else:
        want[idx] = values if mode == SET else want[idx] + values
    for twin in HOST_TWINS if backend == "cpu" else (None,):
        if twin:
            host_twins(monkeypatch, twin)
        out = base.copy()
        module("scatter", backend).scatter(ops.readonly(values), ops.readonly(idx), out, mode)
        assert out.tobytes() == want.tobytes(), twin


@pytest.mark.parametrize("dtype", WIDE, ids=str)
@pytest.mark.parametrize("k", [0, 1, 7, 2 * CHUNK + 5])
def test_gather_family_and_ops_gather(backend, dtype, k):
    """``out[i] = src[idx[i]]`` (any order of positions, sorted or not), across parallel chunks;
    ``ops.gather`` returns the same host array."""
    rng = np.random.default_rng(k)
    n = max(1, 3 * k)
    src = rng.standard_normal(n).astype(dtype)
    src[0] = np.nan  # gathered as it is
    idx = rng.choice(n, k, replace=False).astype(np.int64)
    out = np.full(k, -1, dtype)
    module("scatter", backend).gather(ops.readonly(src), ops.readonly(idx), out)
    assert out.tobytes() == src[idx].tobytes()
    assert ops.gather(src, idx).tobytes() == src[idx].tobytes()
    for half in (np.float16, ops.bfloat16):  # 16-bit floats: their bits gathered
        h = src.astype(np.float32).astype(half)
        assert ops.gather(h, idx).tobytes() == h[idx].tobytes()


@pytest.mark.parametrize("dtype", WIDE, ids=str)
def test_put_family_leaves_the_rest(backend, dtype):
    """``out[idx] = values``, every other value of ``out`` untouched, across parallel chunks."""
    rng = np.random.default_rng(4)
    n = 4 * CHUNK
    base = rng.standard_normal(n).astype(dtype)
    idx = rng.choice(n, 2 * CHUNK + 3, replace=False).astype(np.int64)
    values = rng.standard_normal(idx.size).astype(dtype)
    want = base.copy()
    want[idx] = values
    out = base.copy()
    module("scatter", backend).put(ops.readonly(values), ops.readonly(idx), out)
    assert out.tobytes() == want.tobytes()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", WIDE, ids=str)
@pytest.mark.parametrize("val_dtype", WIDE, ids=str)
def test_scatter_segments_family_and_ops(backend, dtype, val_dtype, mode, monkeypatch):
    """``scatter_segments``: each tensor of a run (sizes 0, 1, odd, one past a chunk, no pairs
    at all) gets its share of the run's sorted pairs, as :func:`ops.scatter_checked` of its
    own pairs gives it; SET zeroes the rest of every tensor.  ``ops.scatter_segments`` calls
    it where the arrays share a float32/float64 dtype that takes the values, else declines
    (writing nothing)."""
    rng = np.random.default_rng(7 + mode)
    sizes = [0, 1, 5, 3, 0, CHUNK + 1, 2, 9]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    idx = np.sort(rng.choice(int(starts[-1]), 400, replace=False)).astype(np.int64)
    idx = idx[(idx < starts[3]) | (idx >= starts[4])]  # tensor 3 keeps nothing
    values = rng.standard_normal(idx.size).astype(val_dtype)
    base = [rng.standard_normal(n).astype(dtype) for n in sizes]
    want = [b.copy() for b in base]
    cut = np.searchsorted(idx, starts)
    for t, w in enumerate(want):
        ops.scatter_checked(values[cut[t] : cut[t + 1]], idx[cut[t] : cut[t + 1]] - starts[t], w, mode)
    takes = mode == SET or val_dtype == dtype or dtype == F64  # (float64 added into float32: scatter_checked rounds once)
    if takes:
        kernel = module("scatter", backend).scatter_segments
        for twin in HOST_TWINS if backend == "cpu" else (None,):
            if twin:
                host_twins(monkeypatch, twin)
            outs = [b.copy() for b in base]
            addrs = np.array([o.__array_interface__["data"][0] for o in outs], np.int64)
            kernel(ops.readonly(values), ops.readonly(idx), ops.readonly(cut.astype(np.int64)), ops.readonly(addrs), ops.readonly(starts), outs[0], mode)
            assert [o.tobytes() for o in outs] == [w.tobytes() for w in want], twin
    outs = [b.copy() for b in base]
    assert ops.scatter_segments(values, idx, starts, outs, mode) == takes
    assert [o.tobytes() for o in outs] == [(w if takes else b).tobytes() for w, b in zip(want, base)]


def test_scatter_segments_declines_what_scatter_does_not_take():
    """Mixed dtypes, a 16-bit array and a lone tensor are left to the caller, untouched."""
    idx, values, starts = np.array([0, 2]), np.ones(2, np.float32), np.array([0, 2, 4])
    for outs in ([np.zeros(2, np.float32), np.zeros(2, np.float64)], [np.zeros(2, np.float16)] * 2):
        assert not ops.scatter_segments(values, idx, starts, outs, SET)
        assert not any(o.any() for o in outs)
    assert not ops.scatter_segments(values, idx, starts[:2], [np.zeros(4, np.float32)], SET)


@pytest.mark.parametrize("dtype", WIDE, ids=str)
def test_a_large_zeroing_streams_and_zeroes_exactly_its_array(dtype):
    """A SET scatter of ``STREAM_MIN`` elements or more zeroes with streaming stores
    (codec/kernels/cpu/_stream.py; the CPU kernels only): a span with no pairs
    (``pairs_span``, as the zeroing before unsorted pairs runs it) writes exactly its array's
    items from every alignment and edge size, and ``scatter`` / ``scatter_segments`` of a
    large output equal the NumPy reference."""
    from codec.kernels.cpu._stream import STREAM_MIN, pairs_span

    for n in (0, 1, 7, 8, 9, 17, 1001):
        for at in range(8):  # the array's first item at every offset from a 32-byte boundary
            whole = np.full(n + 8, 3.0, dtype)
            pairs_span(whole[:0], np.empty(0, np.int64), whole[at : at + n], 0, n, 0, True)
            np.testing.assert_array_equal(whole, np.r_[np.full(at, 3.0), np.zeros(n), np.full(8 - at, 3.0)].astype(dtype))
    K = module("scatter", "cpu")
    rng = np.random.default_rng(3)
    sizes = [STREAM_MIN // 2 + 5, 3, STREAM_MIN // 2]
    idx = np.sort(rng.choice(sum(sizes), 1000, replace=False)).astype(np.int64)
    vals = rng.standard_normal(idx.size).astype(dtype)
    want = np.zeros(sum(sizes), dtype)
    want[idx] = vals
    out = np.full(sum(sizes), np.nan, dtype)
    K.scatter(vals, idx, out, SET)
    np.testing.assert_array_equal(out, want)
    outs = [np.full(n, np.nan, dtype) for n in sizes]
    assert ops.scatter_segments(vals, idx, np.r_[0, np.cumsum(sizes)], outs, SET)
    np.testing.assert_array_equal(np.concatenate(outs), want)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "cached"])
@pytest.mark.parametrize("dtype", WIDE, ids=str)
def test_a_large_set_scatter_writes_its_zeros_and_pairs_in_one_streamed_pass(dtype, stream, monkeypatch):
    """A SET scatter of more than ``ZERO_SPAN`` elements whose positions increase writes each
    span once (``_stream.pairs_threads``; ``ZERO_SPAN`` lowered to 64 here, so small arrays
    take that path), with streaming stores from ``STREAM_MIN`` elements (lowered to 0, or
    not): from every alignment of the array's first item, pairs in its unaligned head, at its
    ends, on each side of a span's cut, filling whole vectors, one to all of its items, equal
    to NumPy's, nothing written outside the array.  Positions that do not increase take the
    zeroing path (the same result)."""
    from codec.kernels.cpu import _stream

    monkeypatch.setattr(_stream, "ZERO_SPAN", 64)
    monkeypatch.setattr(_stream, "STREAM_MIN", 0 if stream else 1 << 62)
    K = module("scatter", "cpu")
    rng = np.random.default_rng(11)
    for n in (65, 200, 1001):
        cuts = [c for c in range(60, n, 64) for c in (c - 1, c, c + 1) if c < n]
        picks = [[], [0], [n - 1], list(range(16)), cuts, list(range(0, n, 3)), sorted(rng.choice(n, n // 7, replace=False)), list(range(n))]
        for at in range(8):  # the array's first item at every offset from a 32-byte boundary
            for pick in picks:
                idx = np.array(sorted(set(pick)), np.int64)
                vals = rng.standard_normal(idx.size).astype(dtype)
                want = np.zeros(n, dtype)
                want[idx] = vals
                for order in (idx, idx[::-1]) if idx.size > 1 else (idx,):
                    whole = np.full(n + 8, 3.0, dtype)
                    K.scatter(ops.readonly(vals if order is idx else vals[::-1].copy()), ops.readonly(order.copy()), whole[at : at + n], SET)
                    np.testing.assert_array_equal(whole, np.r_[np.full(at, 3.0), want, np.full(8 - at, 3.0)].astype(dtype))


def _sparse_payload(sizes, picks, dtype, rng):
    """A sparse many-tensor frame's payload as the index coder writes it (per tensor its index
    section, packed gaps or a bitmap, then its values raw), its index section table, where
    each tensor's values start and how many there are, and the values themselves."""
    from codec.pack import encode_indices

    pieces, table, at, counts, values, off = [], [], [], [], [], 0
    for n, idx in zip(sizes, picks):
        sec = encode_indices(idx, n)
        raw = np.frombuffer(bytes(sec.data), np.uint8)
        vals = rng.standard_t(2, idx.size).astype(dtype)
        table.append((int(sec.kind), sec.bits, sec.count, off, raw.size))
        pieces += [raw, vals.view(np.uint8)]
        at.append(off + raw.size)
        counts.append(idx.size)
        values.append(vals)
        off += raw.size + vals.nbytes
    data = np.concatenate(pieces) if pieces else np.empty(0, np.uint8)
    return data, np.array(table, np.int64).reshape(-1, 5), np.array(at, np.int64), np.array(counts, np.int64), values


@pytest.mark.parametrize("dtype", WIDE, ids=str)
def test_index_scatter_segments_reads_each_index_section_and_writes_its_pairs(dtype, monkeypatch):
    """``index_scatter_segments``: each tensor of a run (sizes 0, 1, odd, one past a chunk;
    its index section packed gaps or a bitmap, no pairs, every element) is zeroed and gets
    its own values at its index section's positions, as NumPy's ``out[pos] = values``; a
    section an encoder does not write (a position past its tensor, a bitmap's count, a
    values count that is not its positions', values past the payload) is refused, naming
    the tensor, before anything is written; every way of ``support.threads.HOST_TWINS``."""
    from codec.pack import SectionKind

    rng = np.random.default_rng(11)
    sizes = [0, 1, 9, 333, CHUNK + 1, 5, 64]
    picks = [np.empty(0, np.int64), np.array([0]), np.array([2, 3, 8]), np.sort(rng.choice(333, 300, replace=False)), np.sort(rng.choice(CHUNK + 1, 700, replace=False)), np.empty(0, np.int64), np.arange(64)]
    data, table, at, counts, values = _sparse_payload(sizes, picks, dtype, rng)
    assert {int(SectionKind.INDEX_BITMAP), int(SectionKind.INDEX_DELTA)} <= set(table[:, 0].tolist())
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    want = [np.zeros(n, dtype) for n in sizes]
    for w, p, v in zip(want, picks, values):
        w[p] = v
    kernel = module("scatter", "cpu").index_scatter_segments
    gap = int(np.flatnonzero(table[:, 0] == int(SectionKind.INDEX_DELTA))[-1])
    late = table.copy()
    late[gap, 2] += 1  # (one gap more than written: past the section's bytes)
    wrong_bits = table.copy()
    wrong_bits[gap, 1] = 57
    for twin in HOST_TWINS:
        host_twins(monkeypatch, twin)
        outs = [np.full(n, 7, dtype) for n in sizes]
        addrs = np.array([o.ctypes.data for o in outs], np.int64)
        run = lambda tab=table, a=at, c=counts, d=data: kernel(ops.readonly(d), ops.readonly(tab), ops.readonly(a), ops.readonly(c), ops.readonly(addrs), ops.readonly(starts), outs[0])
        for refused, tensor in ((lambda: run(tab=late), gap), (lambda: run(tab=wrong_bits), gap), (lambda: run(c=counts + (np.arange(len(sizes)) == 3)), 3), (lambda: run(a=at + (np.arange(len(sizes)) == 6) * 10**6), 6)):
            assert refused() == tensor, twin
            assert all((o == 7).all() for o in outs), "a refused frame writes nothing"
        beyond = data.copy()
        first = int(table[gap, 3])
        beyond[first : first + int(table[gap, 4])] = 0xFF  # (every gap at its widest: past the tensor)
        assert run(d=beyond) == gap and all((o == 7).all() for o in outs)
        assert run() == -1, twin
        assert [o.tobytes() for o in outs] == [w.tobytes() for w in want], twin
